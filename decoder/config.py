"""Configuration: the model's shape (ModelConfig), the training recipe (TrainConfig), named
presets, and type-checked ``--key=value`` overrides.

Both configs are plain dataclasses with a default and a one-line reason per field, as
nanoGPT's ``GPTConfig``. A checkpoint stores them (``asdict``) beside the weights, so a saved
run can always be rebuilt. Overrides are parsed against the field's type, never ``exec``'d.
Left out on purpose: YAML/TOML config files (a preset plus overrides covers our runs).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import sys
from dataclasses import dataclass, field
from typing import Any

from decoder.attention import check_attention
from decoder.mla import check_mla
from decoder.positional import check_rope_scaling
from decoder.tokenizer import TOKENIZERS
from minigrad.backend import DEVICES, MATMUL_PRECISIONS, DeviceUnavailableError, get_xp
from minigrad.functional.activations import GELU_FORMS

FFNS = ("gelu", "swiglu", "moe")
NORMS = ("layer", "rms")
NORM_POSITIONS = ("pre", "post")
ATTENTIONS = ("mha", "mla")
DTYPES = ("float32", "float64", "float16")  # float16: mixed precision, float32 masters


@dataclass
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
    pos: str = "learned"  # one of decoder.positional.POSITIONS
    rope_theta: float = 10000.0  # RoPE's base wavelength (the RoFormer paper's value)
    rope_scaling: str | None = None  # "linear", "ntk" or "yarn": RoPE run past its training
    rope_factor: float = 1.0  # how many times the training context the scaling stretches to
    rope_original_context: int | None = None  # the training context (YaRN's ramp needs it)
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
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.ffn_hidden is None:
            # swiglu has three matrices, so 2/3 of 4x keeps the parameter count of gelu's two
            hidden = 4 * self.n_embd if self.ffn == "gelu" else int(8 * self.n_embd / 3)
            self.ffn_hidden = (hidden + 7) // 8 * 8  # a multiple of 8, kind to matmul kernels
        if self.moe_hidden is None:
            self.moe_hidden = self.ffn_hidden
        if self.norm_eps is None:  # PyTorch's LayerNorm default; Llama's RMSNorm
            self.norm_eps = 1e-5 if self.norm == "layer" else 1e-6
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError naming the first invalid field or combination."""
        _check_fields(self)
        _choice("ffn", self.ffn, FFNS)
        _choice("gelu_approximate", self.gelu_approximate, GELU_FORMS)
        if self.ffn != "gelu" and self.gelu_approximate != "tanh":
            raise ValueError(
                f"gelu_approximate={self.gelu_approximate!r} is for the GELU of ffn='gelu', but "
                f"ffn={self.ffn!r} has none: set --ffn=gelu or drop it"
            )
        _choice("norm", self.norm, NORMS)
        _choice("norm_position", self.norm_position, NORM_POSITIONS)
        check_attention(self.n_embd, self.n_head, self.n_kv_head, self.pos, self.attn_impl)
        if self.rope_scaling is not None and self.pos != "rope":
            raise ValueError(
                f"rope_scaling={self.rope_scaling!r} stretches RoPE, but pos={self.pos!r}: "
                f"set pos='rope' or leave rope_scaling at None"
            )
        check_rope_scaling(self.rope_scaling, self.rope_factor, self.rope_original_context)
        _choice("attention", self.attention, ATTENTIONS)
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


@dataclass
class TrainConfig:
    batch_size: int = 12  # sequences per micro-batch (per rank under --ddp)
    grad_accum_steps: int = 1  # micro-batches summed into each optimiser step
    shards: int = 2  # CPU: each micro-batch runs as this many row shards, one process each
    max_iters: int = 2000  # optimiser steps
    lr: float = 1e-3  # peak learning rate, reached after warmup
    min_lr: float = 1e-4  # the floor of the cosine decay (lr / 10, as Chinchilla suggests)
    warmup_iters: int = 100  # linear warmup steps
    lr_decay_iters: int | None = None  # steps of cosine decay; None means max_iters
    beta1: float = 0.9  # AdamW's first-moment decay
    beta2: float = 0.99  # a little below 0.999, because each step sees few tokens
    weight_decay: float = 0.1  # on matrices only (see minigrad.optim)
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    eval_interval: int = 250  # steps between evaluations (and checkpoints)
    eval_iters: int = 20  # batches averaged per evaluation
    log_interval: int = 10  # steps between progress-bar updates of the loss
    seed: int = 1337  # seeds weights, batches and dropout
    device: str = "cpu"  # "cpu" or "cuda"
    dtype: str = "float32"  # parameters and activations; "float16": mixed precision
    matmul_precision: str = "highest"  # GPU float32 products: "high" allows TF32 (nanoGPT's)
    tokenizer: str = "char"  # "char", "bpe" (trained here) or "gpt2" (tiktoken)
    bpe_vocab_size: int = 512  # vocabulary size when tokenizer == "bpe"
    sample_tokens: int = 300  # tokens printed as a sample at the end
    sample_prompt: str = "\n"  # the prompt of that sample
    dpo_beta: float = 0.1  # DPO's KL weight (decoder.dpo): small lets the policy move far

    def __post_init__(self) -> None:
        if self.lr_decay_iters is None:
            self.lr_decay_iters = self.max_iters
        _check_fields(self)
        _choice("device", self.device, DEVICES)
        _choice("dtype", self.dtype, DTYPES)
        _choice("matmul_precision", self.matmul_precision, MATMUL_PRECISIONS)
        _choice("tokenizer", self.tokenizer, TOKENIZERS)
        if self.min_lr > self.lr:
            raise ValueError(
                f"TrainConfig.min_lr={self.min_lr} is above lr={self.lr}: the cosine decay "
                f"ends at min_lr, so it must be in [0, lr]"
            )
        if self.warmup_iters > self.lr_decay_iters:
            raise ValueError(
                f"TrainConfig.warmup_iters={self.warmup_iters} is longer than lr_decay_iters="
                f"{self.lr_decay_iters} (which defaults to max_iters): lower --warmup_iters too"
            )


@dataclass
class Preset:
    description: str
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)


# The architecture comparison's columns (issue 17) at shakespeare-char's size, data and budget
SHAKESPEARE_SHAPE = dict(block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
SHAKESPEARE_TRAIN = dict(batch_size=12, max_iters=2000, lr=1e-3, min_lr=1e-4, warmup_iters=100)
LLAMA_LAYOUT = dict(n_kv_head=2, pos="rope", norm="rms", ffn="swiglu")  # GQA, RoPE, ...

PRESETS: dict[str, Preset] = {
    "shakespeare-char": Preset(
        "nanoGPT's CPU Shakespeare run: 4 layers, 4 heads, 128 wide, context 64, 2000 steps, "
        "exact GELU (nanoGPT's nn.GELU())",
        model=dict(**SHAKESPEARE_SHAPE, gelu_approximate="none"),  # nanoGPT's MLP: nn.GELU()
        train=dict(batch_size=12, max_iters=2000, lr=1e-3, min_lr=1e-4, warmup_iters=100),
    ),
    "shakespeare-char-modern": Preset(
        "the same budget with RoPE, RMSNorm, SwiGLU and grouped-query attention (2 KV heads)",
        model=dict(
            block_size=64,
            n_layer=4,
            n_head=4,
            n_kv_head=2,
            n_embd=128,
            dropout=0.0,
            pos="rope",
            norm="rms",
            ffn="swiglu",
        ),  # fmt: skip
        train=dict(batch_size=12, max_iters=2000, lr=1e-3, min_lr=1e-4, warmup_iters=100),
    ),
    "baby-gpt": Preset(
        "nanoGPT's GPU Shakespeare run: 6 layers, 6 heads, 384 wide, context 256, 5000 steps, "
        "exact GELU (nanoGPT's nn.GELU()), TF32 products (its allow_tf32)",
        model=dict(
            block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.2, gelu_approximate="none"
        ),
        train=dict(
            batch_size=64,
            max_iters=5000,
            lr=1e-3,
            min_lr=1e-4,
            warmup_iters=100,
            eval_iters=200,
            device="cuda",
            matmul_precision="high",  # TF32, as nanoGPT's train.py allows it
        ),  # fmt: skip
    ),
    "tiny": Preset(
        "seconds on a laptop: for tests and lessons",
        model=dict(block_size=32, n_layer=2, n_head=2, n_embd=32),
        train=dict(
            batch_size=8,
            max_iters=100,
            lr=3e-3,
            min_lr=3e-4,
            warmup_iters=10,
            eval_interval=50,
            eval_iters=5,
            sample_tokens=100,
        ),  # fmt: skip
    ),
    "gpt2": Preset(
        "GPT-2 as the comparison table has it: learned positions, GELU, biases, tied head, "
        "LayerNorm after each residual sum (post-norm; GPT-2's released code is pre-norm: "
        "see gpt2-pre)",
        model=dict(**SHAKESPEARE_SHAPE, bias=True, norm_position="post"),
        train=dict(SHAKESPEARE_TRAIN),
    ),
    "gpt2-pre": Preset(
        "GPT-2 as its released code is: the gpt2 preset with the norm before each branch",
        model=dict(**SHAKESPEARE_SHAPE, bias=True),
        train=dict(SHAKESPEARE_TRAIN),
    ),
    "gpt3": Preset(
        "GPT-3: gpt2-pre with dense and locally banded layers alternating (a 16-token "
        "window on every second layer) and an untied head",
        model=dict(
            **SHAKESPEARE_SHAPE, bias=True, window=16, window_pattern="FW", tie_weights=False
        ),
        train=dict(SHAKESPEARE_TRAIN),
    ),
    "llama3": Preset(
        "Llama 3: grouped-query attention (2 KV heads), RoPE with theta 500000, SwiGLU, "
        "RMSNorm, pre-norm, tied head (as Llama 3.2's small models)",
        model=dict(**SHAKESPEARE_SHAPE, **LLAMA_LAYOUT, rope_theta=500000.0),
        train=dict(SHAKESPEARE_TRAIN),
    ),
    "mistral": Preset(
        "Mistral 7B: Llama's layout (GQA, RoPE, SwiGLU, RMSNorm, pre-norm) with a 16-token "
        "sliding window on every layer and an untied head; each layer's cache rolls at 16 "
        "tokens, and stacked windows reach back 4 x 16 = 64 positions",
        model=dict(**SHAKESPEARE_SHAPE, **LLAMA_LAYOUT, window=16, tie_weights=False),
        train=dict(SHAKESPEARE_TRAIN),
    ),
    "deepseek-v2": Preset(
        "DeepSeek-V2: multi-head latent attention (a 64-wide latent and 16 rotary dims "
        "cached per token), RoPE stretched by YaRN from 16 to 64 positions (DeepSeek-V2's "
        "4K to 160K, factor 40, in small), an MoE of 8 fine-grained routed SwiGLU experts "
        "(top 2) beside 2 shared ones, RMSNorm, pre-norm, untied head",
        model=dict(
            **SHAKESPEARE_SHAPE,
            pos="rope",
            norm="rms",
            attention="mla",
            rope_scaling="yarn",
            rope_factor=4.0,
            rope_original_context=16,
            ffn="moe",
            n_experts=8,
            top_k=2,
            n_shared_experts=2,
            moe_hidden=32,
            tie_weights=False,
        ),  # fmt: skip
        train=dict(SHAKESPEARE_TRAIN),
    ),
    "granite": Preset(
        "IBM Granite 3: Llama's layout (GQA, RoPE with theta 10000, SwiGLU, RMSNorm, tied "
        "head); its muP multipliers of embeddings, residuals, attention and logits are left out",
        model=dict(**SHAKESPEARE_SHAPE, **LLAMA_LAYOUT),
        train=dict(SHAKESPEARE_TRAIN),
    ),
}
DEFAULT_PRESET = "shakespeare-char"


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
    **dict.fromkeys(("n_embd", "ffn_hidden", "batch_size", "max_iters"), AT_LEAST_1),
    **dict.fromkeys(("n_experts", "top_k", "moe_hidden"), AT_LEAST_1),
    **dict.fromkeys(("n_shared_experts", "moe_aux_weight"), AT_LEAST_0),
    **dict.fromkeys(("grad_accum_steps", "shards"), AT_LEAST_1),
    **dict.fromkeys(("lr_decay_iters", "eval_interval", "eval_iters", "log_interval"), AT_LEAST_1),
    **dict.fromkeys(("lr", "min_lr", "warmup_iters", "weight_decay"), AT_LEAST_0),
    **dict.fromkeys(("grad_clip", "sample_tokens"), AT_LEAST_0),
    **dict.fromkeys(("rope_theta", "norm_eps", "dpo_beta"), POSITIVE),
    **dict.fromkeys(("dropout", "beta1", "beta2"), FRACTION),
    "seed": (0, 2**63, True, False),  # NumPy's generators take non-negative seeds
    "bpe_vocab_size": (256, math.inf, True, False),  # the 256 byte tokens come first
}


def _check_fields(config: Any) -> None:
    """Raise a ValueError naming the first field of ``config`` whose value has the wrong type
    or lies outside its range in RANGES (NaN and infinities included).

    >>> TrainConfig(grad_clip=float("nan"))
    Traceback (most recent call last):
    ValueError: TrainConfig.grad_clip must be a finite float in [0, inf), got nan
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
        if f.name not in RANGES:
            continue
        low, high, low_in, high_in = RANGES[f.name]
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


def _choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {choices}")


def parse_value(name: str, text: str, annotation: str) -> Any:
    """Parse an override's text by its field's annotation (a string, as dataclasses keep it).

    >>> parse_value("n_layer", "6", "int"), parse_value("bias", "true", "bool")
    (6, True)
    >>> parse_value("n_kv_head", "none", "int | None") is None
    True
    """
    kinds = [k.strip() for k in annotation.split("|")]
    if "None" in kinds and text.lower() in ("none", "null"):
        return None
    kind = next(k for k in kinds if k != "None")
    try:
        if kind == "bool":
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        return {"int": int, "float": float, "str": str}[kind](text)
    except ValueError:
        raise ValueError(f"--{name}={text!r}: expected a value of type {kind}") from None


def build_configs(
    preset: str = DEFAULT_PRESET, overrides: dict[str, str] | None = None, **extra: Any
) -> tuple[ModelConfig, TrainConfig]:
    """A preset's configs with ``overrides`` (text, as from the command line) applied.

    Each key must be a field of ModelConfig or TrainConfig; ``extra`` takes typed values.

    >>> m, t = build_configs("tiny", {"n_layer": "3", "lr": "0.01"})
    >>> m.n_layer, t.lr
    (3, 0.01)
    >>> build_configs("shakespeare-char", {"ffn": "swiglu"})[0].gelu_approximate  # no GELU
    'tanh'
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: choose one of {sorted(PRESETS)}")
    p = PRESETS[preset]
    model_kw, train_kw = dict(p.model), dict(p.train)
    model_fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    train_fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    typed = {
        k: parse_value(k, v, _field(k, model_fields, train_fields).type)
        for k, v in (overrides or {}).items()
    }
    given = {**typed, **extra}
    for key, value in given.items():
        _field(key, model_fields, train_fields)
        (model_kw if key in model_fields else train_kw)[key] = value
    if model_kw.get("ffn", "gelu") != "gelu" and "gelu_approximate" not in given:
        # subtle: the preset's GELU form goes with the MLP that --ffn replaced, so that
        # `--ffn=moe` on shakespeare-char (exact GELU) is not refused for a GELU it no longer has
        model_kw.pop("gelu_approximate", None)
    return ModelConfig(**model_kw), TrainConfig(**train_kw)


def device_or_cpu(train_cfg: TrainConfig, requested: bool) -> TrainConfig:
    """``train_cfg`` with a device this machine can run. Where CUDA cannot run, a "cuda" that
    only a preset (or the resumed run) chose becomes "cpu", with a note on stderr; one the user
    ``requested`` raises DeviceUnavailableError, whose message says how to install CuPy.

    >>> device_or_cpu(TrainConfig(device="cpu"), requested=True).device
    'cpu'
    """
    try:
        get_xp(train_cfg.device)  # imports CuPy for "cuda"
    except DeviceUnavailableError as e:
        if requested:
            raise
        print(
            f"note: {e} Training on the CPU instead; pass --device=cpu to choose it "
            "yourself, or --device=cuda to insist on the GPU.",
            file=sys.stderr,
        )
        return dataclasses.replace(train_cfg, device="cpu")
    return train_cfg


def _field(key: str, model_fields: dict, train_fields: dict) -> dataclasses.Field:
    if key in model_fields:
        return model_fields[key]
    if key in train_fields:
        return train_fields[key]
    known = ", ".join(sorted([*model_fields, *train_fields]))
    raise ValueError(f"unknown setting {key!r}; the settings are: {known}")
