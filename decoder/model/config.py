"""The model's shape: ModelConfig, and the checks that refuse a setting no layer can honour.

ModelConfig is a plain dataclass with a default and a one-line reason per field, as nanoGPT's
``GPTConfig``. It checks itself once, when it is made, and is frozen (a change is a new config,
``dataclasses.replace``, checked again), so the Decoder and its layers trust it. A checkpoint
stores it (``asdict``) beside the weights, so a saved model can always be rebuilt; the
training recipe, the presets and the ``--key=value`` overrides are decoder.training.config's.
``check_fields`` and ``check_choice`` are the type, range and choice checks both configs share.
Left out on purpose: YAML/TOML config files (a preset plus overrides covers our runs).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

from decoder.model.attention import check_attention
from decoder.model.mla import check_mla
from decoder.model.positional import check_rope_scaling
from minigrad.functional.activations import GELU_FORMS

FFNS = ("gelu", "swiglu", "moe")
NORMS = ("layer", "rms")
NORM_POSITIONS = ("pre", "post")
ATTENTIONS = ("mha", "mla")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 65  # tiny Shakespeare has 65 distinct characters
    block_size: int = 64  # the context length: the most tokens the model attends over
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # query heads per attention layer
    n_kv_head: int | None = None  # key/value heads (GQA); None means n_head (multi-head)
    n_embd: int = 128  # the residual stream's width
    ffn: str = "gelu"  # "gelu": GPT-2's MLP; "swiglu": Llama's gated unit; "moe": experts
    ffn_hidden: int | None = None  # hidden width; None: 4 * n_embd (gelu), ~8/3 * n_embd (else)
    gelu_approximate: str = "tanh"  # ffn="gelu"'s GELU: "tanh" GPT-2's form, "none" exact (erf)
    n_experts: int = 8  # routed SwiGLU experts of an ffn="moe" layer (Mixtral has 8)
    top_k: int = 2  # experts each token is routed to (Mixtral's 2)
    n_shared_experts: int = 0  # always-on experts beside the routed ones (DeepSeekMoE)
    moe_hidden: int | None = None  # each expert's hidden width; None: ffn_hidden (Mixtral's)
    moe_aux_weight: float = 0.01  # weight of the load-balancing loss (Switch Transformer's)
    norm: str = "layer"  # "layer": LayerNorm (GPT-2); "rms": RMSNorm (Llama)
    norm_position: str = "pre"  # "pre": norm inside the residual branch (GPT-2 and later)
    parallel_block: bool = False  # attention and FFN side by side, as in PaLM and Falcon
    pos: str = "learned"  # one of decoder.model.positional.POSITIONS
    rope_theta: float = 10000.0  # RoPE's base wavelength (the RoFormer paper's value)
    rope_scaling: str | None = None  # one of positional.ROPE_SCALINGS: RoPE past its training
    rope_factor: float = 1.0  # how many times the training context the scaling stretches to
    rope_original_context: int | None = None  # the training context (yarn's, llama3's ramp)
    dropout: float = 0.0  # on attention weights, residual branches and embeddings
    bias: bool = False  # biases in Linear and LayerNorm; nanoGPT finds them unnecessary
    qkv_bias: bool = False  # biases on W_Q, W_K, W_V even where `bias` is off (Qwen2)
    norm_eps: float | None = None  # added to the norms' variance; None: 1e-5 layer, 1e-6 rms
    tie_weights: bool = True  # lm_head shares the token embedding matrix (Press & Wolf 2017)
    attn_impl: str = "auto"  # "naive", "dense", "flash" or "auto" (F.scaled_dot_product_attention)
    window: int | None = None  # sliding-window attention (Mistral): each token sees its last W
    window_pattern: str = "W"  # per layer, repeated: W windowed, F full ("WF" alternates them)
    attention: str = "mha"  # "mha": heads from wq, wk, wv (GQA by n_kv_head); "mla": DeepSeek-V2
    kv_lora_rank: int = 64  # MLA: width d_c of the latent c_KV, all that its cache keeps
    q_lora_rank: int | None = None  # MLA: width of the query latent; None: queries from x
    rope_head_dim: int = 16  # MLA: d_R, the rotary part of each query and of the shared key
    nope_head_dim: int | None = None  # MLA: per-head non-rotary q and k width; None: head_size
    v_head_dim: int | None = None  # MLA: per-head value width; None: head_size

    def __post_init__(self) -> None:
        # subtle: frozen, so the defaults that depend on other fields are set past __setattr__
        fill = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        if self.n_kv_head is None:
            fill("n_kv_head", self.n_head)
        if self.ffn_hidden is None:
            # swiglu has three matrices, so 2/3 of 4x keeps the parameter count of gelu's two
            hidden = 4 * self.n_embd if self.ffn == "gelu" else int(8 * self.n_embd / 3)
            fill("ffn_hidden", (hidden + 7) // 8 * 8)  # a multiple of 8, kind to matmul kernels
        if self.moe_hidden is None:
            fill("moe_hidden", self.ffn_hidden)
        if self.norm_eps is None:  # PyTorch's LayerNorm default; Llama's RMSNorm
            fill("norm_eps", 1e-5 if self.norm == "layer" else 1e-6)
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError naming the first invalid field or combination."""
        check_fields(self, RANGES)
        check_choice("ffn", self.ffn, FFNS)
        check_choice("gelu_approximate", self.gelu_approximate, GELU_FORMS)
        if self.ffn != "gelu" and self.gelu_approximate != "tanh":
            raise ValueError(
                f"gelu_approximate={self.gelu_approximate!r} is for the GELU of ffn='gelu', but "
                f"ffn={self.ffn!r} has none: set --ffn=gelu or drop it"
            )
        check_choice("norm", self.norm, NORMS)
        check_choice("norm_position", self.norm_position, NORM_POSITIONS)
        check_attention(self.n_embd, self.n_head, self.n_kv_head, self.pos, self.attn_impl)
        if self.rope_scaling is not None and self.pos != "rope":
            raise ValueError(
                f"rope_scaling={self.rope_scaling!r} stretches RoPE, but pos={self.pos!r}: "
                f"set pos='rope' or leave rope_scaling at None"
            )
        check_rope_scaling(self.rope_scaling, self.rope_factor, self.rope_original_context)
        check_choice("attention", self.attention, ATTENTIONS)
        if self.attention == "mla":
            _check_mla(self)
        if not self.window_pattern or set(self.window_pattern) - set("WF"):
            raise ValueError(
                f"window_pattern={self.window_pattern!r} must be a non-empty string of W "
                f"(a windowed layer) and F (a full one), repeated over the layers: e.g. 'W' "
                f"(all windowed, Mistral) or 'WF' (alternating, as GPT-3's banded layers)"
            )
        if self.parallel_block and self.norm_position == "post":
            raise ValueError("parallel_block=True needs norm_position='pre' (PaLM's layout)")
        _check_moe_fields(self)
        if self.top_k > self.n_experts:
            raise ValueError(
                f"top_k={self.top_k} routes each token to more experts than n_experts="
                f"{self.n_experts}: lower --top_k or raise --n_experts"
            )

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (0-based), or None where it attends fully.

        >>> [ModelConfig(window=16, window_pattern="WF").layer_window(i) for i in range(3)]
        [16, None, 16]
        """
        windowed = self.window_pattern[layer % len(self.window_pattern)] == "W"
        return self.window if windowed else None

    @property
    def context_limit(self) -> int | None:
        """The most positions one sequence may span: block_size, or None (no limit) where
        every layer is windowed and positions are relative (RoPE, ALiBi or none). Then each
        layer's rolling cache keeps only its window, and generation runs on past block_size.

        >>> ModelConfig(window=8, pos="rope").context_limit is None
        True
        """
        windowed = all(self.layer_window(i) is not None for i in range(self.n_layer))
        return None if windowed and self.pos in ("rope", "alibi", "none") else self.block_size


# The allowed range of every numeric field, as (low, high, low_inclusive, high_inclusive);
# fields of type int must also be whole numbers, and every value must be finite.
AT_LEAST_1 = (1, math.inf, True, False)
AT_LEAST_0 = (0, math.inf, True, False)
POSITIVE = (0, math.inf, False, False)
FRACTION = (0, 1, True, False)  # [0, 1): dropout, Adam's betas
RANGES: dict[str, tuple[float, float, bool, bool]] = {
    **dict.fromkeys(("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head"), AT_LEAST_1),
    **dict.fromkeys(("window", "rope_original_context"), AT_LEAST_1),  # a query sees itself
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank", "rope_head_dim", "v_head_dim"), AT_LEAST_1),
    "nope_head_dim": AT_LEAST_0,  # 0: every query and key dimension rotary
    **dict.fromkeys(("n_embd", "ffn_hidden"), AT_LEAST_1),
    **dict.fromkeys(("n_experts", "top_k", "moe_hidden"), AT_LEAST_1),
    **dict.fromkeys(("n_shared_experts", "moe_aux_weight"), AT_LEAST_0),
    **dict.fromkeys(("rope_theta", "norm_eps"), POSITIVE),
    "dropout": FRACTION,
}


def check_fields(config: Any, ranges: dict[str, tuple[float, float, bool, bool]]) -> None:
    """Raise a ValueError naming the first field of ``config`` whose value has the wrong type
    or lies outside its range in ``ranges`` (NaN and infinities included).

    >>> ModelConfig(dropout=float("nan"))
    Traceback (most recent call last):
    ValueError: ModelConfig.dropout must be a finite float in [0, 1), got nan
    """
    owner = type(config).__name__
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value is None and "None" in f.type:  # an optional field left unset
            continue
        kind = f.type.split("|")[0].strip()
        wrong_type = {
            "int": not isinstance(value, numbers.Integral) or isinstance(value, bool),
            "float": not isinstance(value, numbers.Real) or isinstance(value, bool),
            "bool": not isinstance(value, bool),
            "str": not isinstance(value, str),
        }[kind]
        if wrong_type:
            raise ValueError(f"{owner}.{f.name} must be of type {kind}, got {value!r}")
        if f.name not in ranges:
            continue
        low, high, low_in, high_in = ranges[f.name]
        inside = (low <= value if low_in else low < value) and (
            value <= high if high_in else value < high
        )
        if not (math.isfinite(value) and inside):
            left, right = "[" if low_in else "(", "]" if high_in else ")"
            raise ValueError(
                f"{owner}.{f.name} must be a finite {kind} in {left}{low}, {high}{right}, "
                f"got {value!r}"
            )


def _check_mla(config: ModelConfig) -> None:
    """Raise a ValueError naming the first setting that attention='mla' cannot take."""
    if config.pos != "rope":
        raise ValueError(
            f"attention='mla' carries positions in its decoupled rotary dimensions, so pos must "
            f"be 'rope', got pos={config.pos!r}"
        )
    refused = {
        "window": (config.window is not None, "window=None (no sliding window for MLA yet)"),
        "bias": (config.bias or config.qkv_bias, "bias=False and qkv_bias=False"),
        "n_kv_head": (config.n_kv_head != config.n_head, "n_kv_head=None (every head reads "
                      "the one shared latent)"),
        "attn_impl": (config.attn_impl in ("dense", "flash"), "attn_impl='auto' or 'naive' "
                      "(MLA computes its own scores, from the latent and the rotary parts)"),
    }  # fmt: skip
    for name, (bad, fix) in refused.items():
        if bad:
            raise ValueError(f"attention='mla' does not take this {name}: set {fix}")
    hs = config.head_size
    check_mla(
        config.n_embd,
        config.n_head,
        config.kv_lora_rank,
        config.rope_head_dim,
        config.q_lora_rank,
        hs if config.nope_head_dim is None else config.nope_head_dim,
    )


MOE_FIELDS = ("n_experts", "top_k", "n_shared_experts", "moe_hidden", "moe_aux_weight")


def _check_moe_fields(config: ModelConfig) -> None:
    """Refuse experts' settings changed from their defaults on a model without experts, where
    they would do nothing (``--top_k`` is the router's, not sampling's).

    >>> ModelConfig(top_k=1)
    Traceback (most recent call last):
    ValueError: top_k=1 is for the experts of ffn='moe', but ffn='gelu': set --ffn=moe or drop it
    """
    if config.ffn == "moe":
        return
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    defaults["moe_hidden"] = config.ffn_hidden  # what None becomes
    changed = [
        f"{n}={getattr(config, n)!r}" for n in MOE_FIELDS if getattr(config, n) != defaults[n]
    ]
    if changed:
        raise ValueError(
            f"{', '.join(changed)} is for the experts of ffn='moe', but ffn="
            f"{config.ffn!r}: set --ffn=moe or drop it"
        )


def check_choice(name: str, value: Any, choices: tuple) -> None:
    """Raise a ValueError unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {choices}")
