"""Multi-head latent attention (DeepSeek-V2): keys and values from one small shared latent.

    x (B, T, C) -> wkv_a -> [c_KV (d_c) | k^R (d_R)]       one latent and one rotary key per token
    c_KV -> wkv_b -> per head [k^C (d_nope) | v (d_v)]      up-projections W_UK and W_UV
    x -> [wq_a -> c_Q] -> wq_b -> per head [q^C (d_nope) | q^R (d_R)]
    score_h(t, s) = (q^C_h(t) . k^C_h(s) + RoPE(q^R_h)(t) . RoPE(k^R)(s)) / sqrt(d_nope + d_R)

Section 2.1 of "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language
Model" (DeepSeek-AI, 2024), equations 9 to 19. Multi-head attention caches 2 nh hs numbers
per token and grouped-query attention 2 n_kv hs; MLA caches only c_KV and the shared rotary
key, d_c + d_R numbers (``cache_floats_per_token``). RoPE cannot act on the latent (a rotation
between W_UK and the query would depend on the position and could not be folded away), so a
few decoupled dimensions carry the positions: a per-head rotary query and one rotary key
shared by all heads.

Two ways to compute the same attention:
- explicit (training): up-project every cached latent to per-head keys and values, then
  ordinary attention. Each generated token re-expands the whole cache: O(S d_c nh d).
- absorbed (generation, the default with a cache): W_UK moves to the query side,
  q^C_h . (W_UK_h c) = (W_UK_h^T q^C_h) . c, and W_UV after the weighted sum,
  sum_s p_s W_UV_h c_s = W_UV_h (sum_s p_s c_s), so attention runs on the latents themselves
  and the cache is never expanded: O(S nh d_c) per token.

Names follow DeepSeek's reference code (wq_a, wq_b, wkv_a, wkv_b, wo). Left out on purpose:
the RMSNorms that DeepSeek's code puts on c_Q and c_KV (the paper's equations have none),
biases, sliding windows, ALiBi and the other position schemes (the decoupled RoPE is the
point), and the flash path (values and keys have different widths, which F's attention does
not take; the scores here are ordinary Tensor ops). With rope_scaling='yarn', YaRN's
temperature sits in the RoPE tables, so it reaches only the rotary part of each score;
DeepSeek-V2's code applies it to the whole score (its softmax scale), so a loaded DeepSeek
model would need that moved.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from decoder.model.attention import KVCache
from decoder.model.positional import RoPE, rope_settings
from minigrad import creation
from minigrad.backend import xp_of
from minigrad.functional.dropout import dropout
from minigrad.functional.softmax import softmax
from minigrad.nn import Dropout, Linear, Module
from minigrad.tensor import Tensor

if TYPE_CHECKING:  # for annotations only: decoder.model.config imports this module
    from decoder.model.config import ModelConfig


class MultiHeadLatentAttention(Module):
    """Causal multi-head latent attention: x (B, T, C) -> (B, T, C).

    ``kv_lora_rank`` is d_c, the latent's width; ``q_lora_rank`` the query latent's (None:
    queries straight from x, as DeepSeek-V2-Lite); ``rope_head_dim`` d_R, ``nope_head_dim``
    and ``v_head_dim`` the per-head widths (None: n_embd / n_head). ``forward(x, cache,
    absorb)`` uses the absorbed form where ``absorb`` is True (default: with a cache).

    >>> import minigrad as mg
    >>> mla = MultiHeadLatentAttention(16, 4, kv_lora_rank=8, rope_head_dim=4, block_size=8)
    >>> mla(mg.randn(2, 5, 16)).shape, mla.new_cache(2).k.shape  # the cache: latents only
    ((2, 5, 16), (2, 1, 8, 8))
    """

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        kv_lora_rank: int,
        rope_head_dim: int,
        q_lora_rank: int | None = None,
        nope_head_dim: int | None = None,
        v_head_dim: int | None = None,
        dropout: float = 0.0,
        block_size: int = 1024,
        rope_theta: float = 10000.0,
        rope_scaling: str | None = None,
        rope_factor: float = 1.0,
        rope_original_context: int | None = None,
        checked: bool = False,
    ):
        super().__init__()
        hs = n_embd // n_head if n_head else 0
        nope_head_dim = hs if nope_head_dim is None else nope_head_dim
        v_head_dim = hs if v_head_dim is None else v_head_dim
        if not checked:  # from_config: ModelConfig checked them when it was made
            check_mla(n_embd, n_head, kv_lora_rank, rope_head_dim, q_lora_rank, nope_head_dim)
        self.n_embd, self.n_head, self.block_size = n_embd, n_head, block_size
        self.kv_lora_rank, self.q_lora_rank, self.rope_head_dim = (
            kv_lora_rank,
            q_lora_rank,
            rope_head_dim,
        )
        self.nope_head_dim, self.v_head_dim = nope_head_dim, v_head_dim
        q_width = n_head * (nope_head_dim + rope_head_dim)  # [q^C | q^R] for every head
        self.wq_a = None if q_lora_rank is None else Linear(n_embd, q_lora_rank, bias=False)
        self.wq_b = Linear(n_embd if q_lora_rank is None else q_lora_rank, q_width, bias=False)
        self.wkv_a = Linear(n_embd, kv_lora_rank + rope_head_dim, bias=False)  # W_DKV | W_KR
        self.wkv_b = Linear(kv_lora_rank, n_head * (nope_head_dim + v_head_dim), bias=False)
        self.wo = Linear(n_head * v_head_dim, n_embd, bias=False)
        self.scale = 1.0 / math.sqrt(nope_head_dim + rope_head_dim)  # the paper's eq. 17
        scaling = (rope_scaling, rope_factor, rope_original_context)
        self.rope = RoPE(rope_head_dim, block_size, rope_theta, *scaling)
        self.dropout = dropout  # on the attention weights
        self.rng = np.random.default_rng(int(creation.default_rng().integers(2**63)))
        self.resid_dropout = Dropout(dropout)

    @classmethod
    def from_config(cls, config: ModelConfig) -> MultiHeadLatentAttention:
        """The attention of a model of ``config`` (attention="mla")."""
        return cls(
            config.n_embd,
            config.n_head,
            config.kv_lora_rank,
            config.rope_head_dim,
            q_lora_rank=config.q_lora_rank,
            nope_head_dim=config.nope_head_dim,
            v_head_dim=config.v_head_dim,
            dropout=config.dropout,
            **rope_settings(config),
            checked=True,
        )

    def forward(
        self, x: Tensor, cache: KVCache | None = None, absorb: bool | None = None
    ) -> Tensor:
        """x (B, T, C) -> (B, T, C). With a cache, x holds the T tokens after the cached ones."""
        B, T, C = x.shape
        if C != self.n_embd:
            raise ValueError(
                f"MultiHeadLatentAttention: expected x (B, T, {self.n_embd}), got {x.shape}"
            )
        nh, dn, dr, dv, dc = (
            self.n_head, self.nope_head_dim, self.rope_head_dim, self.v_head_dim, self.kv_lora_rank
        )  # fmt: skip
        absorb = cache is not None if absorb is None else absorb
        c_q = x if self.wq_a is None else self.wq_a(x)  # (B, T, C) -> (B, T, q_lora_rank)
        q = self.wq_b(c_q).reshape(B, T, nh, dn + dr).transpose(0, 2, 1, 3)  # (B, nh, T, dn+dr)
        q_nope, q_pe = q[..., :dn], q[..., dn:]  # (B, nh, T, dn), (B, nh, T, dr)
        kv_a = self.wkv_a(x)  # (B, T, C) -> (B, T, dc + dr)
        c_kv = kv_a[..., :dc].reshape(B, 1, T, dc)  # (B, T, dc) -> (B, 1, T, dc)
        k_pe = kv_a[..., dc:].reshape(B, 1, T, dr)  # (B, T, dr) -> (B, 1, T, dr): one for all
        offset = 0 if cache is None else cache.length  # absolute position of x's first token
        q_pe, k_pe = self.rope(q_pe, offset), self.rope(k_pe, offset)
        if cache is not None:
            c_kv, k_pe = cache.append(c_kv, k_pe)  # -> (B, 1, S, dc), (B, 1, S, dr)
        S = c_kv.shape[2]
        rope_scores = q_pe @ k_pe.swapaxes(
            -1, -2
        )  # (B, nh, T, dr) @ (B, 1, dr, S) -> (B, nh, T, S)
        if absorb:
            w_uk, w_uv = self.up_projections()  # (nh, dn, dc), (nh, dv, dc)
            q_latent = q_nope @ w_uk  # (B, nh, T, dn) @ (nh, dn, dc) -> (B, nh, T, dc)
            scores = q_latent @ c_kv.swapaxes(-1, -2) + rope_scores  # -> (B, nh, T, S)
            att = self._weights(scores, T, S)
            y_latent = att @ c_kv  # (B, nh, T, S) @ (B, 1, S, dc) -> (B, nh, T, dc)
            y = y_latent @ w_uv.swapaxes(-1, -2)  # (B, nh, T, dc) @ (nh, dc, dv) -> (B, nh, T, dv)
        else:
            kv = self.wkv_b(c_kv.reshape(B, S, dc))  # (B, S, dc) -> (B, S, nh * (dn + dv))
            kv = kv.reshape(B, S, nh, dn + dv).transpose(0, 2, 1, 3)  # -> (B, nh, S, dn + dv)
            k_nope, v = kv[..., :dn], kv[..., dn:]  # (B, nh, S, dn), (B, nh, S, dv)
            scores = q_nope @ k_nope.swapaxes(-1, -2) + rope_scores  # -> (B, nh, T, S)
            y = self._weights(scores, T, S) @ v  # (B, nh, T, S) @ (B, nh, S, dv) -> (B, nh, T, dv)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, nh * dv)  # (B, nh, T, dv) -> (B, T, nh * dv)
        return self.resid_dropout(self.wo(y))

    def up_projections(self) -> tuple[Tensor, Tensor]:
        """W_UK (nh, d_nope, d_c) and W_UV (nh, d_v, d_c): wkv_b's weight split by head."""
        nh, dn, dc = self.n_head, self.nope_head_dim, self.kv_lora_rank
        w = self.wkv_b.weight.reshape(nh, -1, dc)  # (nh * (dn + dv), dc) -> (nh, dn + dv, dc)
        return w[:, :dn], w[:, dn:]

    def _weights(self, scores: Tensor, T: int, S: int) -> Tensor:
        """Scaled, causally masked (aligned to the end, as with a cache) softmax weights."""
        xp = xp_of(scores.data)
        i_abs = (S - T + xp.arange(T))[:, None]  # (T, 1) each query's position among the keys
        hidden = xp.arange(S)[None, :] > i_abs  # (T, S)
        att = softmax((scores * self.scale).masked_fill(hidden, -math.inf), axis=-1)
        if self.training and self.dropout > 0:
            att = dropout(att, self.dropout, training=True, rng=self.rng)
        return att

    def new_cache(self, batch_size: int, device: str | None = None) -> KVCache:
        """An empty cache of latents: c_KV (B, 1, block_size, d_c) as its keys and the shared
        rotary key (B, 1, block_size, d_R) as its values."""
        weight = self.wkv_a.weight
        return KVCache(
            batch_size,
            1,
            self.block_size,
            self.kv_lora_rank,
            dtype=weight.dtype,
            device=weight.device if device is None else device,
            value_size=self.rope_head_dim,
        )

    def extra_repr(self) -> str:
        return (
            f"n_embd={self.n_embd}, n_head={self.n_head}, kv_lora_rank={self.kv_lora_rank}, "
            f"q_lora_rank={self.q_lora_rank}, rope_head_dim={self.rope_head_dim}, "
            f"nope_head_dim={self.nope_head_dim}, v_head_dim={self.v_head_dim}"
        )


def check_mla(
    n_embd: int,
    n_head: int,
    kv_lora_rank: int,
    rope_head_dim: int,
    q_lora_rank: int | None,
    nope_head_dim: int,
) -> None:
    """Raise a ValueError naming the first impossible MLA setting.

    >>> check_mla(16, 4, kv_lora_rank=8, rope_head_dim=3, q_lora_rank=None, nope_head_dim=4)
    Traceback (most recent call last):
    ValueError: rope_head_dim (3) must be even: RoPE rotates pairs of dimensions
    """
    if n_head < 1:
        raise ValueError(f"n_head ({n_head}) must be at least 1")
    for name, value in (("kv_lora_rank", kv_lora_rank), ("rope_head_dim", rope_head_dim)):
        if value < 1:
            raise ValueError(f"{name} ({value}) must be at least 1 for attention='mla'")
    if rope_head_dim % 2:
        raise ValueError(
            f"rope_head_dim ({rope_head_dim}) must be even: RoPE rotates pairs of dimensions"
        )
    if q_lora_rank is not None and q_lora_rank < 1:
        raise ValueError(f"q_lora_rank ({q_lora_rank}) must be at least 1, or None (no latent)")
    if nope_head_dim < 0:
        raise ValueError(f"nope_head_dim ({nope_head_dim}) must be at least 0")


def cache_floats_per_token(config: Any) -> int:
    """Numbers one token adds to the KV caches of the whole model (times the dtype's bytes
    for memory): MHA and GQA 2 n_kv_head head_size per layer, MLA kv_lora_rank +
    rope_head_dim per layer.

    >>> from decoder.model.config import ModelConfig
    >>> settings = dict(n_layer=2, n_head=8, n_embd=256, pos="rope")
    >>> [cache_floats_per_token(ModelConfig(**settings, **kw)) for kw in (
    ...     {}, dict(n_kv_head=2), dict(attention="mla", kv_lora_rank=64, rope_head_dim=16))]
    [1024, 256, 160]
    """
    if config.attention == "mla":
        return config.n_layer * (config.kv_lora_rank + config.rope_head_dim)
    return config.n_layer * 2 * config.n_kv_head * config.head_size
