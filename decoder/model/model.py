"""The decoder-only transformer (GPT): token ids in, next-token logits out, and sampling.

    ids (B, T) -> tok_emb (+ pos_emb) -> dropout -> blocks -> norm_f -> lm_head -> (B, T, V)

One ``Decoder`` covers GPT-2 (learned positions, LayerNorm, GELU MLP, pre-norm), the Llama
family's choices (RoPE, RMSNorm, SwiGLU, grouped-query attention) and Mixtral's and
DeepSeek's mixture-of-experts feed-forward (decoder/model/moe.py) through ``ModelConfig``.
Positions come in two kinds: learned and sinusoidal tables are *added* to the token
embeddings here; RoPE and ALiBi act inside attention (decoder/model/attention.py).

Initialisation follows GPT-2 (as nanoGPT's ``_init_weights``): every Linear and Embedding
weight normal with std 0.02, biases zero, and the projections that write into the residual
stream (``attn.wo`` and ``ffn.w2``, each expert's w2 in a mixture) scaled by 1 / sqrt(2
n_layer), because each of the 2 n_layer residual branches adds its output to the same stream
and the variances add up.

With ``tie_weights`` the output layer reuses the token embedding matrix (Press & Wolf 2017):
``lm_head.weight is tok_emb.weight``, one Parameter that receives the sum of both uses'
gradients. ``Module`` lists it once (as ``tok_emb.weight``) in ``parameters()``,
``num_parameters()`` and ``state_dict()``, and ``load_state_dict`` copies into it in place,
so a load keeps the tie.

Post-norm models have no ``norm_f`` (it is None): their last block already ends with a norm,
as in the original Transformer and GPT-1.

``generate`` samples one sequence (batch size 1) and yields the tokens as they come; see its
docstring for the KV cache (rolling for sliding-window layers). The sampling rules
(temperature, top-k, top-p), beam search and speculative decoding are in
decoder/model/decoding.py; Hugging Face checkpoints load through decoder.hf.pretrained. Left
out on purpose: batched generation, and computing the logits of the last position only.
Follows nanoGPT's ``model.py`` (Karpathy) and Meta's Llama reference code for the names.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from decoder.model.attention import KVCache
from decoder.model.block import Block, make_norm
from decoder.model.config import ModelConfig
from decoder.model.decoding import beam_search, check_sampling, inference, sample_token
from decoder.model.positional import LearnedPositions, SinusoidalPositions
from minigrad import functional as F
from minigrad.backend import device_of, to_numpy
from minigrad.nn import (
    INIT_STD,
    Dropout,
    Embedding,
    Linear,
    Module,
    ModuleList,
    normal_parameter,
)
from minigrad.tensor import Tensor

IGNORE_INDEX = -100  # cross_entropy's default: targets that add no loss and no gradient


class Decoder(Module):
    """A GPT-style language model built from a ``ModelConfig``.

    >>> model = Decoder(ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    >>> logits, loss = model([[1, 2, 3]])
    >>> logits.shape, loss
    ((1, 3, 11), None)
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        C = config.n_embd
        self.tok_emb = Embedding(config.vocab_size, C)
        # positions added to the embeddings; rope and alibi live in attention, "none" has none
        positions = {"learned": LearnedPositions, "sinusoidal": SinusoidalPositions}
        kind = positions.get(config.pos)
        self.pos_emb = kind(config.block_size, C) if kind else None
        self.drop = Dropout(config.dropout)
        self.blocks = ModuleList(Block(config, layer) for layer in range(config.n_layer))
        self.norm_f = make_norm(config) if config.norm_position == "pre" else None
        self.lm_head = Linear(C, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.tok_emb.weight  # one Parameter, two uses
        # GPT-2's scaled init of the residual projections: 2 n_layer branches add into x
        std = INIT_STD / math.sqrt(2 * config.n_layer)
        for block in self.blocks:
            for name, proj in block.named_modules():  # ffn.w2, or every expert's w2
                if name == "attn.wo" or name.endswith("w2"):
                    proj.weight = normal_parameter(proj.weight.shape, std)

    @property
    def device(self) -> str:
        return self.tok_emb.weight.device

    # ---- the forward pass ------------------------------------------------------------------
    def forward(
        self, ids: Any, targets: Any = None, caches: list[KVCache] | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, V) for integer ids (B, T), and the mean cross-entropy against
        ``targets`` (B, T) when given (else None; targets of -100 are left out of the mean).
        In training mode a mixture-of-experts model adds its routers' load-balancing loss,
        ``moe_aux_weight`` times their sum (decoder/model/moe.py); eval mode returns the
        cross-entropy alone.

        With ``caches`` (from ``new_caches``), ids are the next T tokens after those already
        cached: positions start at the cache length, and each block's cache grows by T.
        Positions run to block_size at most, unless every layer is windowed (see
        ``ModelConfig.context_limit``).
        """
        ids = self._as_ids(ids, "ids")
        B, T = ids.shape
        offset = 0
        if caches is not None:
            if len(caches) != len(self.blocks):
                raise ValueError(
                    f"got {len(caches)} caches for {len(self.blocks)} blocks: "
                    f"make them with model.new_caches(batch_size)"
                )
            offset = caches[0].length
        block_size = self.config.context_limit
        if block_size is not None and offset + T > block_size:
            held = f"the cache holds {offset} tokens, and {offset} + " if caches else ""
            raise ValueError(
                f"{held}T={T} tokens exceed the context, block_size={block_size}: "
                f"crop the input to its last {block_size - offset} tokens"
            )
        x = self.tok_emb(ids)  # (B, T) -> (B, T, C)
        if self.pos_emb is not None:
            x = x + self.pos_emb(T, offset)  # (T, C) broadcasts over the batch
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])
        if self.norm_f is not None:
            x = self.norm_f(x)
        logits = self.lm_head(x)  # (B, T, C) -> (B, T, V)
        if targets is None:
            return logits, None
        targets = self._as_ids(targets, "targets", check_range=False)
        if targets.shape != (B, T):
            raise ValueError(f"targets have shape {targets.shape}, but ids have {(B, T)}")
        V = logits.shape[-1]
        loss = F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))
        if self.training and self.config.ffn == "moe":  # the routers' balance is trained too
            aux = sum(block.ffn.aux_loss for block in self.blocks)
            loss = loss + self.config.moe_aux_weight * aux
        return logits, loss

    def _as_ids(self, ids: Any, what: str, check_range: bool = True) -> Tensor:
        """``ids`` (a Tensor, an array or nested lists) as an int64 (B, T) Tensor, after
        checking that every id is in the vocabulary.

        The Tensor stays where the ids are: the embedding and the loss check them again and
        move them to the model's device, so ids from the host are checked without a GPU sync.
        """
        data = ids.data if isinstance(ids, Tensor) else ids
        if not hasattr(data, "dtype"):
            data = np.asarray(data)
        if data.dtype.kind not in "iu":
            raise TypeError(f"{what} must be integer token ids, got dtype {data.dtype}")
        if data.ndim != 2:
            raise ValueError(
                f"{what} must have shape (B, T), got {data.shape}: for one sequence, "
                f"wrap it as [ids] (or ids[None])"
            )
        V = self.config.vocab_size
        # subtle: host ids only: ids already on the device are checked by the embedding, and
        # checking them here as well would copy two more numbers to the host
        if check_range and data.size and device_of(data) == "cpu":
            lo, hi = int(data.min()), int(data.max())
            if lo < 0 or hi >= V:
                raise ValueError(
                    f"token id {lo if lo < 0 else hi} is outside the vocabulary: ids must be "
                    f"in [0, vocab_size) with vocab_size={V}; was the text encoded with "
                    f"another tokenizer?"
                )
        return Tensor(data.astype(np.int64, copy=False))

    def new_caches(self, batch_size: int) -> list[KVCache]:
        """One empty KV cache per block, in the model's dtype and on its device."""
        return [block.attn.new_cache(batch_size) for block in self.blocks]

    def num_parameters(
        self, exclude_embeddings: bool = False, *, trainable_only: bool = False
    ) -> int:
        """How many numbers the model holds, the tied matrix once.

        ``exclude_embeddings`` leaves out the lookup tables (token and learned position
        embeddings), as Kaplan et al. (2020) count N for their scaling laws: about
        12 n_layer n_embd^2. An untied ``lm_head`` is a matmul and stays counted. (nanoGPT's
        ``get_num_params`` leaves out the position table only.)
        """
        total = super().num_parameters(trainable_only=trainable_only)
        if exclude_embeddings:
            tables = [self.tok_emb.weight]
            if isinstance(self.pos_emb, LearnedPositions):
                tables.append(self.pos_emb.weight)
            total -= sum(p.size for p in tables if p.requires_grad or not trainable_only)
        return total

    def num_active_parameters(self) -> int:
        """Parameters that one token uses: all of them, less the routed experts a
        mixture-of-experts layer does not send it to (its n_experts - top_k).

        >>> moe = Decoder(ModelConfig(n_layer=1, n_embd=8, ffn="moe", n_experts=4, top_k=1))
        >>> moe.num_parameters() - moe.num_active_parameters()  # 3 idle experts of 3 * 8 * 24
        1728
        """
        return self.num_parameters() - sum(
            block.ffn.num_parameters() - block.ffn.num_active_parameters()
            for block in self.blocks
            if self.config.ffn == "moe"
        )

    def router_stats(self) -> dict[str, Any] | None:
        """The last forward's routing, or None without experts: ``aux_loss`` (its weighted sum
        over layers, as the training loss adds it) and ``expert_share`` (each expert's share
        of the token-expert assignments, averaged over layers; 1 / n_experts when balanced).
        """
        if self.config.ffn != "moe" or self.blocks[0].ffn.aux_loss is None:
            return None
        moes = [block.ffn for block in self.blocks]
        aux = sum(float(moe.aux_loss.item()) for moe in moes)
        share = np.mean([to_numpy(moe.expert_share) for moe in moes], axis=0)
        return {"aux_loss": self.config.moe_aux_weight * aux, "expert_share": share.tolist()}

    # ---- sampling --------------------------------------------------------------------------
    def generate(
        self,
        ids: Any,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        use_cache: bool = True,
        beam_width: int = 1,
        length_penalty: float = 1.0,
        stop_token: int | None = None,
    ) -> Iterator[int]:
        """Continue the prompt ``ids`` (shape (T,) or (1, T): one sequence), yielding each new
        token id (an int) as soon as it is sampled; ``stop_token``, once yielded, ends it.

        ``temperature`` 0 picks the most likely token (greedy); otherwise the logits are
        divided by it (< 1 sharper, > 1 flatter), cut to the ``top_k`` most likely tokens
        and/or to the nucleus of mass ``top_p``, and sampled with a NumPy Generator seeded by
        ``seed``. Each step runs without a graph and in eval mode; the modules' previous
        modes are restored before each token is yielded.

        With ``use_cache``, the prompt (cropped to its last block_size tokens) is run once to
        fill the KV caches, then each step feeds only the newest token. Once a cache is full
        (block_size tokens), generation falls back to recomputing the last block_size tokens
        every step, exactly as ``use_cache=False`` does throughout: rolling the cache of a
        full-attention layer (or shifting learned positions) would keep keys computed at
        positions that the cropped window has shifted. A model with no context limit (every
        layer windowed, relative positions: ``ModelConfig.context_limit``) has rolling caches
        only: it neither crops nor recomputes, however long it runs.

        ``beam_width`` above 1 runs beam search instead of sampling (decoder/model/decoding.py),
        with ``length_penalty``: the whole continuation is found first, then yielded.

        Settings are checked here, at the call, not at the first token.
        """
        data = ids.data if isinstance(ids, Tensor) else ids
        prompt = to_numpy(data) if hasattr(data, "dtype") else np.asarray(data)  # on the CPU
        if prompt.ndim == 2 and prompt.shape[0] == 1:
            prompt = prompt[0]
        if prompt.ndim != 1:
            raise ValueError(
                f"generate samples one sequence: ids must have shape (T,) or (1, T), "
                f"got {prompt.shape}"
            )
        if prompt.size == 0:
            raise ValueError("generate needs a prompt of at least one token, got none")
        self._as_ids(prompt[None], "ids")  # check the dtype and the vocabulary now
        check_sampling(temperature, top_k, top_p)
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if beam_width != 1:
            if (temperature, top_k, top_p) != (1.0, None, None) or not use_cache:
                raise ValueError(
                    "beam search ranks continuations by the model's own probabilities and "
                    "always uses the cache: leave temperature at 1, top_k, top_p unset and "
                    "use_cache on, or set beam_width=1 to sample"
                )
            tokens = beam_search(
                self, prompt.tolist(), max_new_tokens, beam_width, length_penalty, stop_token
            )
            return iter(tokens)
        settings = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        return self._sample(prompt.tolist(), max_new_tokens, settings, seed, use_cache, stop_token)

    def _sample(
        self,
        context: list[int],
        max_new_tokens: int,
        settings: dict,
        seed: int | None,
        use_cache: bool,
        stop_token: int | None,
    ) -> Iterator[int]:
        rng = np.random.default_rng(seed)
        limit = self.config.context_limit
        crop = slice(None) if limit is None else slice(-limit, None)  # the tokens it can see
        caches = None
        for _ in range(max_new_tokens):
            with inference(self):
                if use_cache and caches is None:  # prefill: the whole cropped prompt at once
                    caches = self.new_caches(1)
                    logits, _ = self([context[crop]], caches=caches)
                elif use_cache and (limit is None or caches[0].length < limit):  # newest token
                    logits, _ = self([context[-1:]], caches=caches)
                else:  # no cache, or a full one: recompute over the last block_size tokens
                    logits, _ = self([context[crop]])
            token = sample_token(to_numpy(logits.data[0, -1]), rng=rng, **settings)
            context = context[crop] + [token]  # older tokens can never be seen again
            yield token
            if token == stop_token:
                return


def build_model(config: ModelConfig, dtype: str = "float32", device: str = "cpu") -> Decoder:
    """A new Decoder of ``config``, its weights drawn from minigrad's global generator, in
    ``dtype`` (float64 for a float64 run; float32 otherwise, a float16 run's master weights
    included) on ``device``: how every trainer and loader makes its model.

    >>> build_model(ModelConfig(n_layer=1, n_head=2, n_embd=8), "float64").tok_emb.weight.dtype
    dtype('float64')
    """
    model = Decoder(config)
    if dtype == "float64":
        model.double()
    return model.to(device)
