"""Causal self-attention for the decoder, with grouped-query heads and a KV cache.

    x (B, T, C) -> wq, wk, wv -> heads -> [RoPE] -> [cache] -> attention [ALiBi] -> wo -> (B, T, C)

``CausalSelfAttention`` projects x to n_head query heads and n_kv_head key/value heads
(n_kv_head = n_head is multi-head attention, 1 is multi-query, anything between is
grouped-query), applies RoPE or ALiBi when the layer's position scheme is one of those, and
calls ``F.scaled_dot_product_attention`` (minigrad/functional/attention.py), which holds the
math and its three implementations (naive, dense and flash). Learned and sinusoidal
positions are added to the embeddings by the model, so for those (and "none") this layer
sees no positions.

``KVCache`` keeps the keys and values of the tokens already seen, so generation feeds one new
token per step instead of the whole context: the new token's query attends over the cached
keys, with the causal mask aligned to the end (the last query sees every key). A layer with a
sliding ``window`` W (Mistral) keeps a rolling cache of its last W - 1 tokens only: its memory
stops growing, and a model whose every layer is windowed generates past its block_size.

Left out on purpose: cross-attention, padding masks, and gradients through the cache (it is
for inference).
Follows nanoGPT's ``CausalSelfAttention`` (Karpathy) and Meta's Llama reference code (the
names wq, wk, wv, wo; GQA; the cache), with Ainslie et al. (2023) for grouped-query heads and
Jiang et al. (2023), Mistral 7B, for the sliding window and its rolling cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from decoder.model.positional import POSITIONS, RoPE, alibi_slopes, rope_settings
from minigrad import creation
from minigrad.backend import device_of, get_xp
from minigrad.functional.attention import IMPLS, check_window, scaled_dot_product_attention
from minigrad.nn import Dropout, Linear, Module
from minigrad.tensor import Tensor

if TYPE_CHECKING:  # for annotations only: decoder.model.config imports this module
    from decoder.model.config import ModelConfig


class KVCache:
    """Preallocated keys and values (B, n_kv_head, capacity, hs) of the tokens seen so far.

    ``length`` tokens have been seen (the position of the next one). ``append(k, v)`` stores
    the new tokens' keys and values and returns every key and value their queries may need,
    ready for attention (no gradient).

    Full attention (``window`` None): capacity = block_size, filled in order; the returned
    Tensors are views of the filled prefix (use them before the next ``reset``); appending
    past block_size raises. Sliding window W: a rolling buffer of the last W - 1 tokens (a
    query sees W keys, and the W-th is its own, which comes with it). ``append`` returns the
    held tokens followed by the new ones (a copy), then keeps the last W - 1 of them; it never
    fills up. ``value_size`` (default head_size) lets the values have another width: multi-head
    latent attention (decoder/model/mla.py) keeps its latents c_KV as the keys and its shared
    rotary keys as the values.

    >>> cache = KVCache(batch_size=1, n_kv_head=2, block_size=8, head_size=4)
    >>> import minigrad as mg
    >>> k, v = cache.append(mg.zeros(1, 2, 3, 4), mg.zeros(1, 2, 3, 4))
    >>> k.shape, cache.length
    ((1, 2, 3, 4), 3)
    >>> rolling = KVCache(batch_size=1, n_kv_head=2, block_size=8, head_size=4, window=3)
    >>> for _ in range(4):  # 12 tokens: each append returns the 2 held and its own 3
    ...     k, v = rolling.append(mg.zeros(1, 2, 3, 4), mg.zeros(1, 2, 3, 4))
    >>> k.shape, rolling.length, rolling.k.shape
    ((1, 2, 5, 4), 12, (1, 2, 2, 4))
    """

    def __init__(
        self,
        batch_size: int,
        n_kv_head: int,
        block_size: int,
        head_size: int,
        dtype: Any = np.float32,
        device: str = "cpu",
        window: int | None = None,
        value_size: int | None = None,
    ):
        check_window(window)
        xp = get_xp(device)
        capacity = block_size if window is None else window - 1
        value_size = head_size if value_size is None else value_size
        self.k = xp.zeros((batch_size, n_kv_head, capacity, head_size), dtype=dtype)
        self.v = xp.zeros((batch_size, n_kv_head, capacity, value_size), dtype=dtype)
        self.window = window
        self.length = 0

    @property
    def block_size(self) -> int:
        """How many tokens the cache holds at most: block_size, or W - 1 for a window."""
        return self.k.shape[2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, n_kv_head, T_new, hs); return all keys and values so far,
        (B, n_kv_head, length + T_new, hs) (the held ones, for a rolling cache)."""
        B, n_kv, block_size, hs = self.k.shape
        T_new = k.shape[2]
        expected = (B, n_kv, T_new, hs)
        expected_v = (B, n_kv, T_new, self.v.shape[3])
        if k.shape != expected or v.shape != expected_v:
            shapes = f"k and v of shape (B, n_kv_head, T_new, hs) = {expected}"
            if expected_v != expected:
                shapes = f"k of shape {expected} and v of shape {expected_v}"
            raise ValueError(
                f"KVCache.append: expected {shapes} for this cache, got {k.shape} and "
                f"{v.shape}; build the cache with the layer's new_cache(batch_size)"
            )
        if device_of(k.data) != device_of(self.k):
            raise ValueError(
                f"KVCache.append: the cache is on {device_of(self.k)!r} but k is on "
                f"{device_of(k.data)!r}; build the cache with device={device_of(k.data)!r}"
            )
        if self.window is not None:
            return self._roll(k, v)
        end = self.length + T_new
        if end > block_size:
            raise ValueError(
                f"KVCache overflow: it holds {self.length} of block_size={block_size} tokens "
                f"and cannot take {T_new} more; reset() it, or recompute over the last "
                f"block_size tokens without the cache"
            )
        self.k[:, :, self.length : end] = k.data
        self.v[:, :, self.length : end] = v.data
        self.length = end
        # views of the filled prefix: (B, n_kv, block_size, hs) -> (B, n_kv, length, hs)
        return Tensor(self.k[:, :, :end]), Tensor(self.v[:, :, :end])

    def _roll(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The rolling ``append``: held tokens + new ones out, the last W - 1 of them kept."""
        xp = get_xp(device_of(self.k))
        capacity = self.block_size
        held = min(self.length, capacity)  # the buffer's first `held` slots, oldest first
        k_all = xp.concatenate([self.k[:, :, :held], k.data], axis=2)  # (B, n_kv, S, hs)
        v_all = xp.concatenate([self.v[:, :, :held], v.data], axis=2)  # S = held + T_new
        S = k_all.shape[2]
        keep = min(capacity, S)
        # subtle: k_all is a fresh array, so writing the buffer from it cannot clobber it
        self.k[:, :, :keep] = k_all[:, :, S - keep :]
        self.v[:, :, :keep] = v_all[:, :, S - keep :]
        self.length += k.shape[2]
        return Tensor(k_all), Tensor(v_all)

    def reset(self) -> None:
        """Forget every token (the arrays are kept and overwritten by later appends)."""
        self.length = 0

    def __repr__(self) -> str:
        B, n_kv, block_size, hs = self.k.shape
        window = "" if self.window is None else f", window={self.window}"
        return (
            f"KVCache(batch_size={B}, n_kv_head={n_kv}, block_size={block_size}, "
            f"head_size={hs}, length={self.length}{window})"
        )


class CausalSelfAttention(Module):
    """Masked multi-head self-attention: x (B, T, C) -> (B, T, C), each token seeing only
    itself and the tokens before it.

    ``n_kv_head`` (default n_head) key/value heads are shared by groups of n_head / n_kv_head
    query heads. ``bias`` puts biases on all four projections, ``qkv_bias`` on W_Q, W_K and
    W_V only (Qwen2). ``pos`` is the model's position scheme: "rope" rotates q and k here,
    "alibi" biases the scores here; the others are added to the embeddings by the model.
    ``dropout`` applies to the attention weights (naive and flash paths; ``impl="auto"`` picks
    naive while training with dropout) and to the output (``resid_dropout``). ``window`` W
    makes it sliding-window attention: each token sees its last W positions, itself included,
    and its cache rolls. ``rope_scaling``, ``rope_factor`` and ``rope_original_context`` stretch
    RoPE (decoder/model/positional.py, ``rope_frequencies``). The settings are checked here
    (``check_attention``), except with ``checked=True``: ``from_config`` passes settings that
    ModelConfig checked when it was made.

    >>> import minigrad as mg
    >>> attn = CausalSelfAttention(n_embd=16, n_head=4, n_kv_head=2, pos="rope", block_size=8)
    >>> attn(mg.randn(2, 5, 16)).shape
    (2, 5, 16)
    """

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        n_kv_head: int | None = None,
        bias: bool = False,
        qkv_bias: bool = False,
        dropout: float = 0.0,
        pos: str = "learned",
        block_size: int = 1024,
        rope_theta: float = 10000.0,
        impl: str = "auto",
        window: int | None = None,
        rope_scaling: str | None = None,
        rope_factor: float = 1.0,
        rope_original_context: int | None = None,
        checked: bool = False,
    ):
        super().__init__()
        n_kv_head = n_head if n_kv_head is None else n_kv_head
        if not checked:
            check_attention(n_embd, n_head, n_kv_head, pos, impl)
            check_window(window)
        hs = n_embd // n_head
        self.n_embd, self.n_head, self.n_kv_head, self.head_size = n_embd, n_head, n_kv_head, hs
        self.pos, self.block_size, self.impl, self.window = pos, block_size, impl, window
        qkv_bias = bias or qkv_bias  # Qwen2: biases on the input projections, none on W_O
        self.wq = Linear(n_embd, n_head * hs, bias=qkv_bias)
        self.wk = Linear(n_embd, n_kv_head * hs, bias=qkv_bias)  # fewer kv heads: smaller wk, wv
        self.wv = Linear(n_embd, n_kv_head * hs, bias=qkv_bias)
        self.wo = Linear(n_head * hs, n_embd, bias=bias)
        self.dropout = dropout  # on the attention weights
        # the attention-dropout mask's generator, seeded from the global one (as Dropout's)
        self.rng = np.random.default_rng(int(creation.default_rng().integers(2**63)))
        self.resid_dropout = Dropout(dropout)
        self.rope = None
        if pos == "rope":
            scaling = (rope_scaling, rope_factor, rope_original_context)
            # a windowed layer's rolling cache may take it past block_size
            self.rope = RoPE(hs, block_size, rope_theta, *scaling, extrapolate=window is not None)
        slopes = alibi_slopes(n_head).astype(np.float32) if pos == "alibi" else None
        self.register_buffer("slopes", slopes, persistent=False)  # (nh,) or None

    @classmethod
    def from_config(cls, config: ModelConfig, layer: int = 0) -> CausalSelfAttention:
        """The attention of layer ``layer`` (0-based) of a model of ``config``."""
        return cls(
            config.n_embd,
            config.n_head,
            config.n_kv_head,
            bias=config.bias,
            qkv_bias=config.qkv_bias,
            dropout=config.dropout,
            pos=config.pos,
            impl=config.attn_impl,
            window=config.layer_window(layer),
            **rope_settings(config),
            checked=True,
        )

    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C). With a cache, x holds the T tokens after the cached ones."""
        B, T, C = x.shape
        if C != self.n_embd:
            raise ValueError(
                f"CausalSelfAttention: expected x (B, T, {self.n_embd}), got {x.shape}"
            )
        nh, n_kv, hs = self.n_head, self.n_kv_head, self.head_size
        q = self.wq(x).reshape(B, T, nh, hs).transpose(0, 2, 1, 3)  # (B, T, C) -> (B, nh, T, hs)
        k = self.wk(x).reshape(B, T, n_kv, hs).transpose(0, 2, 1, 3)  # -> (B, n_kv, T, hs)
        v = self.wv(x).reshape(B, T, n_kv, hs).transpose(0, 2, 1, 3)  # -> (B, n_kv, T, hs)
        offset = 0 if cache is None else cache.length  # absolute position of x's first token
        if self.rope is not None:
            q, k = self.rope(q, offset), self.rope(k, offset)
        if cache is not None:
            # subtle: RoPE ran first, so the cache holds keys already rotated at their own
            # positions and never needs them rotated again.
            k, v = cache.append(k, v)  # -> (B, n_kv, S, hs): every key x's queries may see
        y = scaled_dot_product_attention(
            q,
            k,
            v,
            causal=True,
            alibi_slopes=self.slopes,
            dropout_p=self.dropout,
            training=self.training,
            rng=self.rng,
            impl=self.impl,
            window=self.window,
        )  # (B, nh, T, hs)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, nh * hs)  # (B, nh, T, hs) -> (B, T, C)
        return self.resid_dropout(self.wo(y))

    def new_cache(self, batch_size: int, device: str | None = None) -> KVCache:
        """An empty KVCache sized for this layer, in its dtype and (by default) on its device."""
        weight = self.wk.weight
        return KVCache(
            batch_size,
            self.n_kv_head,
            self.block_size,
            self.head_size,
            dtype=weight.dtype,
            device=weight.device if device is None else device,
            window=self.window,
        )

    def extra_repr(self) -> str:
        return (
            f"n_embd={self.n_embd}, n_head={self.n_head}, n_kv_head={self.n_kv_head}, "
            f"pos={self.pos!r}, impl={self.impl!r}"
            + ("" if self.window is None else f", window={self.window}")
        )


def check_attention(n_embd: int, n_head: int, n_kv_head: int, pos: str, impl: str) -> None:
    """Raise a ValueError naming the first invalid setting of CausalSelfAttention: the one
    copy of these rules, which ModelConfig.validate also calls.

    >>> check_attention(16, n_head=4, n_kv_head=3, pos="rope", impl="auto")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: n_head (4) must be a multiple of n_kv_head (3): each key/value head serves ...
    """
    if n_head < 1 or n_kv_head < 1:
        raise ValueError(f"n_head ({n_head}) and n_kv_head ({n_kv_head}) must be at least 1")
    if n_embd % n_head:
        raise ValueError(
            f"n_embd ({n_embd}) must be divisible by n_head ({n_head}): each head gets "
            f"n_embd / n_head dimensions"
        )
    if n_head % n_kv_head:
        raise ValueError(
            f"n_head ({n_head}) must be a multiple of n_kv_head ({n_kv_head}): each key/value "
            f"head serves an equal group of query heads"
        )
    if pos not in POSITIONS:
        raise ValueError(f"unknown position scheme pos={pos!r}: use one of {POSITIONS}")
    if pos == "rope" and (n_embd // n_head) % 2:
        raise ValueError(
            f"pos='rope' rotates pairs of dimensions, so the head size n_embd / n_head "
            f"({n_embd // n_head}) must be even"
        )
    if impl not in IMPLS:
        raise ValueError(f"unknown attention impl={impl!r}: use one of {IMPLS}")
