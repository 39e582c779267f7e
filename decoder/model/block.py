"""The transformer block: attention and a feed-forward network, each on a residual branch.

Three layouts, chosen by the config:

- pre-norm (GPT-2 and every large model since): ``x + attn(norm1(x))``, then
  ``x + ffn(norm2(x))``. The residual stream itself is never normalised, so the gradient
  reaches the embeddings along an identity path, and training is stable without warmup
  tricks (Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture").
- post-norm (the original Transformer, GPT-1, BERT): ``norm1(x + attn(x))``, then
  ``norm2(x + ffn(x))``. Kept for the lessons' comparison.
- parallel (GPT-J, PaLM): ``x + attn(norm1(x)) + ffn(norm1(x))``. Both branches read the
  same input, so they can run at the same time; we follow PaLM and GPT-J in sharing one norm
  (GPT-NeoX keeps two), so a parallel block has no ``norm2``.

Every block has the same config, except that ``config.window_pattern`` may make some layers
windowed and others full (``ModelConfig.layer_window``). The attention layers read their
settings from the config (``from_config``), which checked them once, when it was made.

The feed-forward is GPT-2's MLP, Llama's SwiGLU or a mixture of experts (decoder/model/moe.py).

Left out on purpose: dropout here (attention and the FFN apply their own residual dropout).
"""

from __future__ import annotations

from decoder.model.attention import CausalSelfAttention, KVCache
from decoder.model.config import ModelConfig
from decoder.model.mla import MultiHeadLatentAttention
from decoder.model.moe import MoE
from minigrad import Tensor
from minigrad.nn import MLP, LayerNorm, Module, RMSNorm, SwiGLU


def make_norm(config: ModelConfig) -> Module:
    """The norm the config asks for: LayerNorm (GPT-2) or RMSNorm (Llama), n_embd wide.

    >>> type(make_norm(ModelConfig(norm="rms", n_embd=8, n_head=2))).__name__
    'RMSNorm'
    """
    if config.norm == "layer":
        return LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)
    return RMSNorm(config.n_embd, eps=config.norm_eps)


def make_ffn(config: ModelConfig) -> Module:
    """The feed-forward the config asks for: GPT-2's MLP (with the GELU form of
    ``gelu_approximate``), Llama's SwiGLU or a mixture of SwiGLU experts (decoder/model/moe.py).

    >>> type(make_ffn(ModelConfig(ffn="moe", n_embd=8, n_head=2))).__name__
    'MoE'
    """
    C, bias, dropout = config.n_embd, config.bias, config.dropout
    if config.ffn == "moe":
        return MoE(
            C,
            config.n_experts,
            config.top_k,
            config.moe_hidden,
            config.n_shared_experts,
            bias,
            dropout,
        )
    if config.ffn == "gelu":
        return MLP(C, config.ffn_hidden, bias, dropout, approximate=config.gelu_approximate)
    return SwiGLU(C, config.ffn_hidden, bias, dropout)


class Block(Module):
    """One transformer layer, the ``layer``-th (0-based): ``forward(x, cache)`` maps (B, T, C)
    to (B, T, C)."""

    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        self.norm_position = config.norm_position
        self.parallel = config.parallel_block
        self.norm1 = make_norm(config)
        if config.attention == "mla":
            self.attn = MultiHeadLatentAttention.from_config(config)
        else:
            self.attn = CausalSelfAttention.from_config(config, layer)
        if not self.parallel:  # a parallel block shares norm1 between its two branches
            self.norm2 = make_norm(config)
        self.ffn = make_ffn(config)

    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        if self.parallel:
            h = self.norm1(x)  # one norm feeds both branches, as in PaLM
            return x + self.attn(h, cache) + self.ffn(h)
        if self.norm_position == "pre":
            x = x + self.attn(self.norm1(x), cache)
            return x + self.ffn(self.norm2(x))
        # post-norm: the sum is normalised, so the residual stream passes through every norm
        x = self.norm1(x + self.attn(x, cache))
        return self.norm2(x + self.ffn(x))
