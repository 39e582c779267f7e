"""The training recipe (TrainConfig), the named presets, and building both configs from a
preset with type-checked ``--key=value`` overrides.

TrainConfig is a plain dataclass with a default and a one-line reason per field, as
ModelConfig (decoder.model.config) is. A checkpoint stores both (``asdict``) beside the
weights, so a saved run can always be rebuilt. Overrides are parsed against the field's
type, never ``exec``'d.

``device_or_cpu`` is the one device rule of the five commands: the device asked for with
``--device``, which must be able to run; else the one the run or checkpoint was trained on
("cpu" for a new Hugging Face base), or the CPU with a note where CUDA cannot run.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field
from typing import Any

from decoder.model.config import (
    AT_LEAST_0,
    AT_LEAST_1,
    FRACTION,
    POSITIVE,
    ModelConfig,
    check_choice,
    check_fields,
)
from decoder.text.tokenizer import TOKENIZERS
from minigrad.backend import DEVICES, MATMUL_PRECISIONS, DeviceUnavailableError, get_xp

DTYPES = ("float32", "float64", "float16")  # float16: mixed precision, float32 masters


@dataclass
class TrainConfig:
    """How a model is trained; every field is checked against its type and range.

    >>> TrainConfig(grad_clip=float("nan"))
    Traceback (most recent call last):
    ValueError: TrainConfig.grad_clip must be a finite float in [0, inf), got nan
    """

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
    dpo_beta: float = 0.1  # DPO's KL weight (decoder.post.dpo): small lets the policy move far

    def __post_init__(self) -> None:
        if self.lr_decay_iters is None:
            self.lr_decay_iters = self.max_iters
        check_fields(self, RANGES)
        check_choice("device", self.device, DEVICES)
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("matmul_precision", self.matmul_precision, MATMUL_PRECISIONS)
        check_choice("tokenizer", self.tokenizer, TOKENIZERS)
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


def device_or_cpu(device: str, requested: bool) -> str:
    """``device`` where this machine can run it. Where CUDA cannot run, a "cuda" that only a
    preset, the resumed run or the base checkpoint chose becomes "cpu", with a note on stderr;
    one the user ``requested`` (--device) raises DeviceUnavailableError, whose message says how
    to install CuPy.

    >>> device_or_cpu("cpu", requested=True)
    'cpu'
    """
    try:
        get_xp(device)  # imports CuPy for "cuda"
    except DeviceUnavailableError as e:
        if requested:
            raise
        print(
            f"note: {e} Running on the CPU instead; pass --device=cpu to choose it "
            "yourself, or --device=cuda to insist on the GPU.",
            file=sys.stderr,
        )
        return "cpu"
    return device


# The allowed range of every numeric field (decoder.model.config.check_fields)
RANGES: dict[str, tuple[float, float, bool, bool]] = {
    **dict.fromkeys(("batch_size", "max_iters", "grad_accum_steps", "shards"), AT_LEAST_1),
    **dict.fromkeys(("lr_decay_iters", "eval_interval", "eval_iters", "log_interval"), AT_LEAST_1),
    **dict.fromkeys(("lr", "min_lr", "warmup_iters", "weight_decay"), AT_LEAST_0),
    **dict.fromkeys(("grad_clip", "sample_tokens"), AT_LEAST_0),
    "dpo_beta": POSITIVE,
    **dict.fromkeys(("beta1", "beta2"), FRACTION),
    "seed": (0, 2**63, True, False),  # NumPy's generators take non-negative seeds
    "bpe_vocab_size": (256, math.inf, True, False),  # the 256 byte tokens come first
}


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
        "sliding window on every layer and an untied head; a query sees its own token and the "
        "15 before it (each layer holds at most 16 keys and values), so the 4 stacked windows "
        "reach back 4 x (16 - 1) = 60 positions",
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
        "head); its muP multipliers of embeddings, residuals, attention and logits are left out, "
        "so it is the same model and run as shakespeare-char-modern (kept as the table's column)",
        model=dict(**SHAKESPEARE_SHAPE, **LLAMA_LAYOUT),
        train=dict(SHAKESPEARE_TRAIN),
    ),
}
DEFAULT_PRESET = "shakespeare-char"


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


def _field(key: str, model_fields: dict, train_fields: dict) -> dataclasses.Field:
    if key in model_fields:
        return model_fields[key]
    if key in train_fields:
        return train_fields[key]
    known = ", ".join(sorted([*model_fields, *train_fields]))
    raise ValueError(f"unknown setting {key!r}; the settings are: {known}")
