"""Position information for the decoder: four schemes, plus "none", and their tables for plots.

Attention by itself is blind to order: permute the tokens and each output moves with its
token, unchanged. Two families fix that:

- Added to the token embeddings, once, before the first block (used by decoder/model/model.py):
  ``LearnedPositions`` (GPT-2: a trained (block_size, C) table) and ``SinusoidalPositions``
  (the original Transformer: a fixed table of sines and cosines, ``sinusoidal_table``).
- Applied inside every attention layer (used by decoder/model/attention.py): ``RoPE`` rotates
  queries and keys by an angle proportional to their position, so q_i . k_j depends on i - j
  only (``rope_tables``); ALiBi adds -slope * |i - j| to the scores (``alibi_slopes``,
  ``alibi_bias``).

RoPE stretches to contexts longer than the training one by changing its frequencies
(``rope_frequencies``): "linear" position interpolation, the "ntk"-aware change of base,
"yarn", which interpolates only the slow pairs and scales the scores by a temperature (as the
paper writes it; "yarn-code" as its authors' code and transformers compute it, which the YaRN
checkpoints need), and "llama3", Llama 3.1's ramp of the same shape without the temperature.

Every scheme has a helper returning plain NumPy arrays for the lessons' plots.
Left out on purpose: interleaved-pair RoPE (GPT-J, Meta's Llama code), dynamic (per-length)
NTK scaling, and T5's learned relative buckets.
Follows Vaswani et al. (2017), Radford et al. (2019), Su et al., "RoFormer" (2021),
Press et al., "Train Short, Test Long" (ALiBi, 2022), Chen et al., "Extending Context Window
of Large Language Models via Positional Interpolation" (2023), bloc97's "NTK-Aware Scaled
RoPE" (2023) and Peng et al., "YaRN: Efficient Context Window Extension of Large Language
Models" (2023), and Meta's Llama 3.1 (2024, its ``apply_scaling``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from minigrad.backend import xp_of
from minigrad.nn import INIT_STD, Module, normal_parameter
from minigrad.tensor import Tensor, concatenate

if TYPE_CHECKING:  # for annotations only: decoder.model.config imports this module
    from decoder.model.config import ModelConfig

POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")
ROPE_SCALINGS = ("linear", "ntk", "yarn", "yarn-code", "llama3")  # or None: RoPE as trained
# YaRN's ramp (the paper's alpha and beta, its values for Llama): pairs turning fewer than
# YARN_ALPHA times over the original context are interpolated, more than YARN_BETA times kept.
YARN_ALPHA, YARN_BETA = 1.0, 32.0
# Llama 3.1's ramp (its low_freq_factor and high_freq_factor), the same shape as YaRN's
LLAMA3_LOW, LLAMA3_HIGH = 1.0, 4.0
RAMPS = {"yarn": (YARN_ALPHA, YARN_BETA), "llama3": (LLAMA3_LOW, LLAMA3_HIGH)}
NEEDS_ORIGINAL_CONTEXT = (*RAMPS, "yarn-code")  # the scalings whose ramp counts turns over it


def _check_span(name: str, T: int, offset: int, block_size: int) -> None:
    """Raise unless positions offset .. offset + T - 1 fit in a table of block_size rows."""
    if offset < 0 or offset + T > block_size:
        raise ValueError(
            f"{name}: positions {offset}..{offset + T - 1} do not fit block_size={block_size}: "
            f"the sequence (plus the cache offset) must hold at most block_size tokens; crop "
            f"the input or build the model with a larger block_size"
        )


# ---- added to the embeddings -----------------------------------------------------------------
def sinusoidal_table(block_size: int, n_embd: int) -> np.ndarray:
    """The original Transformer's position table (block_size, n_embd), float32.

    Column 2i holds sin(pos / 10000^(2i / n_embd)) and column 2i + 1 the cosine of the same
    angle: wavelengths from 2 pi to 10000 * 2 pi, so nearby positions differ in the fast
    columns and distant ones in the slow columns.

    >>> sinusoidal_table(3, 4).round(3)
    array([[ 0.   ,  1.   ,  0.   ,  1.   ],
           [ 0.841,  0.54 ,  0.01 ,  1.   ],
           [ 0.909, -0.416,  0.02 ,  1.   ]], dtype=float32)
    """
    pos = np.arange(block_size)[:, None]  # (block_size, 1)
    freqs = 10000.0 ** (-np.arange(0, n_embd, 2) / n_embd)  # (ceil(n_embd / 2),)
    angles = pos * freqs  # (block_size, ceil(n_embd / 2))
    table = np.zeros((block_size, n_embd))
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles[:, : n_embd // 2])  # an odd n_embd has one sine more
    return table.astype(np.float32)


class LearnedPositions(Module):
    """A trained table of position vectors (GPT-2): ``forward(T, offset)`` gives rows
    offset .. offset + T - 1, shape (T, n_embd), to add to the token embeddings.

    >>> LearnedPositions(16, 8)(T=4, offset=2).shape
    (4, 8)
    """

    def __init__(self, block_size: int, n_embd: int):
        super().__init__()
        self.block_size, self.n_embd = block_size, n_embd
        self.weight = normal_parameter((block_size, n_embd), INIT_STD)

    def forward(self, T: int, offset: int = 0) -> Tensor:
        _check_span("LearnedPositions", T, offset, self.block_size)
        return self.weight[offset : offset + T]  # (block_size, C) -> (T, C)

    def extra_repr(self) -> str:
        return f"{self.block_size}, {self.n_embd}"


class SinusoidalPositions(Module):
    """The fixed sinusoidal table (a non-trainable buffer): ``forward(T, offset)`` gives
    rows offset .. offset + T - 1, shape (T, n_embd).

    >>> SinusoidalPositions(16, 8).num_parameters()
    0
    """

    def __init__(self, block_size: int, n_embd: int):
        super().__init__()
        self.block_size, self.n_embd = block_size, n_embd
        # not persistent: it is a function of the config, so checkpoints need not carry it
        self.register_buffer("table", sinusoidal_table(block_size, n_embd), persistent=False)

    def forward(self, T: int, offset: int = 0) -> Tensor:
        _check_span("SinusoidalPositions", T, offset, self.block_size)
        return self.table[offset : offset + T]  # (block_size, C) -> (T, C)

    def extra_repr(self) -> str:
        return f"{self.block_size}, {self.n_embd}"


# ---- rotary embeddings -----------------------------------------------------------------------
def rope_frequencies(
    head_size: int,
    theta: float = 10000.0,
    scaling: str | None = None,
    factor: float = 1.0,
    original_context: int | None = None,
) -> tuple[np.ndarray, float]:
    """RoPE's angular frequencies (head_size / 2,) float64, one per pair, and the factor that
    multiplies cos and sin (1, except YaRN's temperature).

    Pair i turns by theta_i = theta^(-2i / hs) per position. To run a model trained on
    ``original_context`` positions on ``factor`` times as many:
      - "linear" (position interpolation): theta_i / factor, every pair slowed alike;
      - "ntk" (NTK-aware): the base becomes theta * factor^(hs / (hs - 2)), so the fastest
        pair is kept and the slowest is interpolated by exactly ``factor``;
      - "yarn" (NTK-by-parts + temperature): with r_i = original_context / wavelength_i the
        turns pair i makes over the original context, and the ramp
        gamma_i = clip((r_i - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA), 0, 1),
        theta_i <- (1 - gamma_i) theta_i / factor + gamma_i theta_i: slow pairs (few turns,
        never seen past one cycle) interpolated, fast pairs (many turns) left as they are.
        cos and sin are multiplied by sqrt(1 / t) = 0.1 ln(factor) + 1, so every score
        q . k is divided by the temperature t;
      - "yarn-code": YaRN as its authors' code and Hugging Face transformers compute it (the
        YaRN checkpoints on the hub use it): the same temperature and ends of the ramp, but the
        ramp runs linearly over the pair index i, between the pairs that turn YARN_BETA and
        YARN_ALPHA times over the original context (rounded outwards to whole pairs), where
        the paper's runs linearly over the turns r_i: the pairs in between are stretched
        differently (``_pair_ramp``);
      - "llama3" (Llama 3.1 and 3.2): YaRN's ramp between LLAMA3_LOW and LLAMA3_HIGH turns,
        without the temperature.

    >>> rope_frequencies(4)[0].tolist()  # theta^0 and theta^(-1/2)
    [1.0, 0.01]
    >>> [f.round(4).tolist() for f, _ in (rope_frequencies(4, scaling=s, factor=4) for s in
    ...     ("linear", "ntk"))]
    [[0.25, 0.0025], [1.0, 0.0025]]
    >>> f, m = rope_frequencies(4, scaling="yarn", factor=4, original_context=64)
    >>> f.round(4).tolist(), round(m, 4)  # ~10 turns over 64: 30% kept; 0.1: interpolated
    ([0.4722, 0.0025], 1.1386)
    """
    if head_size % 2:
        raise ValueError(
            f"RoPE rotates pairs of dimensions: head_size must be even, got {head_size}"
        )
    if not (math.isfinite(theta) and theta > 0):
        raise ValueError(
            f"RoPE's theta is the base of its wavelengths: it must be a finite number > 0 "
            f"(10000 in RoFormer and Llama), got {theta}"
        )
    check_rope_scaling(scaling, factor, original_context)
    exponents = np.arange(0, head_size, 2) / head_size  # (hs/2,) 2i / hs
    if scaling == "ntk":
        # subtle: hs / (hs - 2) makes the last pair's exponent (hs - 2) / hs cancel it exactly
        theta = theta * factor ** (head_size / max(head_size - 2, 1))
    freqs = theta**-exponents  # (hs/2,) one per pair
    if scaling == "linear":
        return freqs / factor, 1.0
    if scaling in RAMPS:
        low, high = RAMPS[scaling]
        turns = original_context * freqs / (2 * math.pi)  # r_i = L / wavelength_i
        gamma = np.clip((turns - low) / (high - low), 0.0, 1.0)  # (hs/2,)
        freqs = (1 - gamma) * freqs / factor + gamma * freqs
        return freqs, 0.1 * math.log(factor) + 1.0 if scaling == "yarn" else 1.0
    if scaling == "yarn-code":
        kept = 1 - _pair_ramp(head_size, theta, original_context)  # (hs/2,) 1: as trained
        return kept * freqs + (1 - kept) * freqs / factor, 0.1 * math.log(factor) + 1.0
    return freqs, 1.0


def _pair_ramp(head_size: int, theta: float, original_context: int) -> np.ndarray:
    """ "yarn-code"'s share of interpolation per pair, (hs/2,) in [0, 1]: 0 up to the pair
    that turns YARN_BETA times over ``original_context``, 1 from the one that turns YARN_ALPHA
    times, linear in the pair index between (transformers' ``_compute_yarn_parameters``).

    >>> _pair_ramp(8, 10000.0, 64).tolist()  # pair 0 turns ~10 times, pair 3 ~0.01 times
    [0.0, 0.5, 1.0, 1.0]
    """

    def pair_turning(turns: float) -> float:  # the (fractional) i with r_i = turns
        return (
            head_size * math.log(original_context / (turns * 2 * math.pi)) / (2 * math.log(theta))
        )

    low = max(math.floor(pair_turning(YARN_BETA)), 0)
    high = min(math.ceil(pair_turning(YARN_ALPHA)), head_size - 1)
    high = high if high > low else low + 0.001  # subtle: transformers' guard against 0 / 0
    return np.clip((np.arange(head_size // 2) - low) / (high - low), 0.0, 1.0)


def rope_settings(config: ModelConfig) -> dict:
    """The RoPE settings of an attention layer of a model of ``config``, as its keywords."""
    return dict(
        block_size=config.block_size,
        rope_theta=config.rope_theta,
        rope_scaling=config.rope_scaling,
        rope_factor=config.rope_factor,
        rope_original_context=config.rope_original_context,
    )


def check_rope_scaling(scaling: str | None, factor: float, original_context: int | None) -> None:
    """Raise a ValueError naming the first impossible RoPE-scaling setting: the one copy of
    these rules, which ModelConfig.validate also calls.

    >>> check_rope_scaling("yarn", 4.0, None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: rope_scaling='yarn' needs rope_original_context, ...
    """
    if scaling is not None and scaling not in ROPE_SCALINGS:
        raise ValueError(f"unknown rope_scaling={scaling!r}: use None or one of {ROPE_SCALINGS}")
    if not (math.isfinite(factor) and factor >= 1):
        raise ValueError(
            f"rope_factor={factor} must be a finite number >= 1: how many times longer than "
            f"the training context the model will run"
        )
    if scaling is None and factor != 1:
        raise ValueError(
            f"rope_factor={factor} has no effect without rope_scaling: set rope_scaling to "
            f"one of {ROPE_SCALINGS}, or leave rope_factor at 1"
        )
    if scaling in NEEDS_ORIGINAL_CONTEXT and original_context is None:
        raise ValueError(
            f"rope_scaling={scaling!r} needs rope_original_context, the context length the model "
            "was trained at (its ramp counts each pair's turns over that length)"
        )


def rope_tables(
    head_size: int,
    block_size: int,
    theta: float = 10000.0,
    scaling: str | None = None,
    factor: float = 1.0,
    original_context: int | None = None,
    start: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of RoPE's angles, each (block_size, head_size) float32, rotate-half layout,
    for positions start .. start + block_size - 1 (frequencies from ``rope_frequencies``).

    Pair i (dimensions i and i + hs/2) turns by pos * theta_i; both halves of a row hold the
    same angles, so ``x * cos + rotate_half(x) * sin`` needs no reshaping.

    >>> cos, sin = rope_tables(head_size=4, block_size=3)
    >>> cos.shape, sin[1].round(3)  # position 1: angles 1 and 1/100
    ((3, 4), array([0.841, 0.01 , 0.841, 0.01 ], dtype=float32))
    """
    freqs, attention_factor = rope_frequencies(head_size, theta, scaling, factor, original_context)
    angles = np.arange(start, start + block_size)[:, None] * freqs  # (block_size, hs/2)
    angles = np.concatenate([angles, angles], axis=1)  # (block_size, hs/2) -> (block_size, hs)
    cos, sin = attention_factor * np.cos(angles), attention_factor * np.sin(angles)
    return cos.astype(np.float32), sin.astype(np.float32)


class RoPE(Module):
    """Rotary position embedding (RoFormer): rotate each pair of dimensions of q and k by an
    angle proportional to the position, so that q_i . k_j depends on i - j only.

    Pairing convention: "rotate-half", as GPT-NeoX and Hugging Face's Llama: dimension d is
    paired with d + hs/2 (not with its neighbour d + 1, as GPT-J and Meta's Llama code do).
    For x = (x1, x2), the two halves,
        rope(x, pos) = x * cos + (-x2, x1) * sin,
    which turns each pair (x1[i], x2[i]) by the angle pos * theta^(-2i / hs). The two
    conventions give models of equal quality but are not interchangeable for loaded weights.

    ``forward(x, offset)`` rotates x (B, h, T, hs) at absolute positions offset .. offset+T-1,
    built from Tensor ops so autograd differentiates it (a rotation: the gradient is rotated
    back by the same angle). ``scaling``, ``factor`` and ``original_context`` stretch it to
    longer contexts (see ``rope_frequencies``). Positions past block_size are refused unless
    ``extrapolate`` (a sliding-window layer, whose rolling cache runs on past the context):
    then their rows are computed when asked for.

    >>> import minigrad as mg
    >>> RoPE(head_size=8, block_size=16)(mg.randn(2, 4, 5, 8), offset=3).shape
    (2, 4, 5, 8)
    """

    def __init__(
        self,
        head_size: int,
        block_size: int,
        theta: float = 10000.0,
        scaling: str | None = None,
        factor: float = 1.0,
        original_context: int | None = None,
        extrapolate: bool = False,
    ):
        super().__init__()
        self.head_size, self.block_size, self.theta = head_size, block_size, theta
        self.scaling = dict(scaling=scaling, factor=factor, original_context=original_context)
        self.extrapolate = extrapolate
        cos, sin = rope_tables(head_size, block_size, theta, **self.scaling)
        self.register_buffer("cos", cos, persistent=False)  # (block_size, hs)
        self.register_buffer("sin", sin, persistent=False)  # (block_size, hs)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        T, hs = x.shape[-2], x.shape[-1]
        if hs != self.head_size:
            raise ValueError(f"RoPE built for head_size={self.head_size}, got x of shape {x.shape}")
        if self.extrapolate and offset >= 0 and offset + T > self.block_size:
            args = (self.head_size, T, self.theta)
            cos, sin = rope_tables(*args, **self.scaling, start=offset)  # 2 x (T, hs), fresh
            cos, sin = (Tensor(xp_of(x.data).asarray(t, dtype=x.dtype)) for t in (cos, sin))
        else:
            _check_span("RoPE", T, offset, self.block_size)
            cos = self.cos[offset : offset + T]  # (block_size, hs) -> (T, hs)
            sin = self.sin[offset : offset + T]  # (block_size, hs) -> (T, hs)
        half = hs // 2
        x1, x2 = x[..., :half], x[..., half:]  # (B, h, T, hs) -> 2 x (B, h, T, hs/2)
        rotated = concatenate(
            [-x2, x1], axis=-1
        )  # -> (B, h, T, hs): each pair turned by 90 degrees
        return x * cos + rotated * sin  # (T, hs) tables broadcast over B and h

    def extra_repr(self) -> str:
        text = f"head_size={self.head_size}, block_size={self.block_size}, theta={self.theta}"
        return text if self.scaling["scaling"] is None else f"{text}, {self.scaling}"


# ---- ALiBi -----------------------------------------------------------------------------------
def alibi_slopes(n_head: int) -> np.ndarray:
    """ALiBi's per-head slopes (n_head,), float64, as in the paper's reference code.

    For a power of two n: the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8). Otherwise
    take the slopes of the largest power of two p < n, then every other slope of 2p for the
    remaining n - p heads (so the slopes keep filling in between the same range).

    >>> alibi_slopes(4).tolist()
    [0.25, 0.0625, 0.015625, 0.00390625]
    >>> alibi_slopes(6).tolist()  # 4 heads' slopes, then 8 heads' slopes 1 and 3
    [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]
    """
    if n_head < 1:
        raise ValueError(f"alibi_slopes: n_head must be at least 1, got {n_head}")

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    p = 2 ** math.floor(math.log2(n_head))
    slopes = power_of_two_slopes(p) + power_of_two_slopes(2 * p)[0::2][: n_head - p]
    return np.array(slopes)


def alibi_bias(n_head: int, T: int, S: int | None = None) -> np.ndarray:
    """The bias ALiBi adds to the attention scores, (n_head, T, S), for plots.

    bias[h, i, j] = -slope[h] * |(S - T + i) - j|: queries are the last T of S positions
    (S defaults to T). The causal mask later hides j > S - T + i, so only the past counts.

    >>> (alibi_bias(1, T=2, S=3)[0] * 256).tolist()  # one head: slope 2^-8
    [[-1.0, -0.0, -1.0], [-2.0, -1.0, -0.0]]
    """
    S = T if S is None else S
    if S < T:
        raise ValueError(f"alibi_bias: need S >= T (queries are the last T keys), got T={T}, S={S}")
    distance = np.abs((S - T + np.arange(T))[:, None] - np.arange(S)[None, :])  # (T, S)
    return -alibi_slopes(n_head)[:, None, None] * distance  # (nh, 1, 1) * (T, S) -> (nh, T, S)
