"""Hugging Face ``config.json`` <-> ``ModelConfig``: the first step of loading a Hugging Face
checkpoint (decoder.hf.pretrained), and the last of saving one.

``config_from_hf`` translates every field, checks it against the one value we implement, or
lists it as not changing the outputs (``IGNORED_FIELDS``: token ids, init scale, caching
switches). Any other field is an error naming it: a model is never built with a setting
silently dropped. ``config_to_hf`` writes the fields back for a model the format can express,
and refuses one whose fields would not come back unchanged.

Mistral's ``sliding_window`` becomes our ``window`` on every layer, and Qwen2's per-layer
``layer_types`` (or its older ``max_window_layers``) our ``window_pattern``; a Llama-layout
model windowed on every layer saves as a MistralForCausalLM. RoPE scaling of the types
``linear`` and ``llama3`` (Llama 3.1 and 3.2) becomes our ``rope_scaling`` of the same name
(decoder.model.positional), ``yarn`` our ``yarn-code`` (transformers ramps over the pair
index, as YaRN's authors' code does; our ``yarn`` follows the paper, over the turns), and
``dynamic`` plain RoPE: dynamic NTK changes the frequencies only for inputs longer than
``max_position_embeddings``, which is the loaded model's context, so within it the two are the
same function (saved back, it is written as plain RoPE). Follows the configs of Hugging Face
transformers' ``GPT2Config`` and ``LlamaConfig``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from decoder.model.config import ModelConfig
from decoder.model.positional import (
    LLAMA3_HIGH,
    LLAMA3_LOW,
    NEEDS_ORIGINAL_CONTEXT,
    YARN_ALPHA,
    YARN_BETA,
)

# architecture -> (family, model_type) for the ones we load and save
ARCHITECTURES = {
    "GPT2LMHeadModel": ("gpt2", "gpt2"),
    "LlamaForCausalLM": ("llama", "llama"),
    "MistralForCausalLM": ("llama", "mistral"),
    "Qwen2ForCausalLM": ("llama", "qwen2"),
}
# Fields that do not change a causal LM's outputs: token ids, init, output switches, metadata.
IGNORED_FIELDS = {
    "architectures", "model_type", "transformers_version", "_name_or_path", "dtype",
    "torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range",
    "use_cache", "output_attentions", "output_hidden_states", "return_dict", "id2label",
    "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder",
    "task_specific_params", "tokenizer_class", "n_ctx", "pretraining_tp",
    # GPT-2's sequence-classification head (GPT2DoubleHeadsModel), absent from GPT2LMHeadModel
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout",
    # GPT-2: an fp16 overflow guard (the same math)
    "reorder_and_upcast_attn",
}  # fmt: skip


class PretrainedError(ValueError):
    """A Hugging Face model directory that cannot be loaded or a model that cannot be saved."""


# ---- config.json -> ModelConfig --------------------------------------------------------------
def config_from_hf(hf: Mapping[str, Any]) -> tuple[ModelConfig, str]:
    """Translate a Hugging Face ``config.json`` into a ModelConfig: (config, family).

    Raises PretrainedError naming the architecture or the first field we cannot honour.

    >>> gpt2 = {"architectures": ["GPT2LMHeadModel"], "vocab_size": 50257, "n_positions": 1024,
    ...         "n_layer": 12, "n_head": 12, "n_embd": 768}
    >>> config, family = config_from_hf(gpt2)
    >>> family, config.pos, config.bias, config.ffn_hidden, config.dropout
    ('gpt2', 'learned', True, 3072, 0.1)
    """
    archs = hf.get("architectures") or []
    known = [a for a in archs if a in ARCHITECTURES]
    if not known:
        raise PretrainedError(
            f"config.json names the architectures {archs} (model_type "
            f"{hf.get('model_type')!r}); this loader reads {sorted(ARCHITECTURES)}"
        )
    family, _ = ARCHITECTURES[known[0]]
    fields = _Fields(hf)
    kw = _gpt2_fields(fields) if family == "gpt2" else _llama_fields(fields, known[0])
    left = sorted(set(hf) - fields.read - IGNORED_FIELDS)
    if left:
        raise PretrainedError(
            f"config.json sets {left}, which this loader cannot honour for {known[0]}; a model "
            f"built without them would compute something else"
        )
    return ModelConfig(**kw), family


class _Fields:
    """config.json's fields, remembering which were read (the rest must be ignorable)."""

    def __init__(self, hf: Mapping[str, Any]):
        self.hf, self.read = hf, set()

    def get(self, name: str, default: Any = None) -> Any:
        self.read.add(name)
        value = self.hf.get(name)
        return default if value is None else value

    def need(self, name: str) -> int:
        """A size the model's shape needs: a positive integer, no default."""
        value = self.get(name)
        if value is None:
            raise PretrainedError(f"config.json lacks {name}, which the model's shape needs")
        if type(value) is not int or value < 1:
            raise PretrainedError(
                f"config.json sets {name}={value!r}, but a size is a whole number >= 1 "
                f"(written without quotes); the file was edited or damaged"
            )
        return value

    def require(self, name: str, allowed: tuple, default: Any = None, why: str = "") -> Any:
        value = self.get(name, default)
        if value not in allowed:
            raise PretrainedError(
                f"config.json sets {name}={value!r}; this loader implements {allowed} only"
                + (f" ({why})" if why else "")
            )
        return value


# GPT-2's activation_function (a name in transformers' ACT2FN) -> our gelu_approximate, and
# back: gelu_new (GPT-2's released checkpoints) and gelu_pytorch_tanh are the tanh form, gelu
# the exact erf form (nanoGPT's nn.GELU())
GELU_FROM_HF = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}
GELU_TO_HF = {"tanh": "gelu_new", "none": "gelu"}


def _gpt2_fields(f: _Fields) -> dict[str, Any]:
    act = f.require("activation_function", tuple(GELU_FROM_HF), "gelu_new")
    f.require("scale_attn_weights", (True,), True)
    f.require("scale_attn_by_inverse_layer_idx", (False,), False)
    f.require("add_cross_attention", (False,), False)
    drops = {name: f.get(name, 0.1) for name in ("attn_pdrop", "resid_pdrop", "embd_pdrop")}
    if len(set(drops.values())) > 1:
        raise PretrainedError(f"config.json sets different dropouts {drops}; ours is one rate")
    return dict(
        vocab_size=f.need("vocab_size"),
        block_size=f.need("n_positions"),
        n_layer=f.need("n_layer"),
        n_head=f.need("n_head"),
        n_embd=f.need("n_embd"),
        ffn_hidden=f.get("n_inner"),  # None: 4 n_embd, as GPT-2's default
        norm_eps=f.get("layer_norm_epsilon", 1e-5),
        tie_weights=f.get("tie_word_embeddings", True),
        dropout=drops["attn_pdrop"],
        pos="learned",
        norm="layer",
        ffn="gelu",
        gelu_approximate=GELU_FROM_HF[act],
        bias=True,
    )


def _llama_fields(f: _Fields, arch: str) -> dict[str, Any]:
    n_embd, n_head = f.need("hidden_size"), f.need("num_attention_heads")
    f.require("hidden_act", ("silu",), "silu")
    f.require("use_mrope", (False,), False, "Qwen2-VL's multimodal rotary")
    f.require("attention_dropout", (0, 0.0), 0.0, "dropout only on the attention weights")
    f.require("head_dim", (n_embd // n_head,), n_embd // n_head, "hidden_size / heads")
    window, window_pattern = _sliding_window(f, arch)
    block_size = f.need("max_position_embeddings")
    qkv_bias = arch == "Qwen2ForCausalLM"  # Qwen2's q, k, v projections always have biases
    attention_bias, mlp_bias = f.get("attention_bias", False), f.get("mlp_bias", False)
    if attention_bias != mlp_bias:
        raise PretrainedError(
            f"config.json sets attention_bias={attention_bias} but mlp_bias={mlp_bias}; our "
            f"`bias` puts biases on every Linear or none"
        )
    return dict(
        vocab_size=f.need("vocab_size"),
        block_size=block_size,
        n_layer=f.need("num_hidden_layers"),
        n_head=n_head,
        n_kv_head=f.get("num_key_value_heads", n_head),
        n_embd=n_embd,
        ffn_hidden=f.need("intermediate_size"),
        norm_eps=f.get("rms_norm_eps", 1e-6),
        **_rope(f),
        tie_weights=f.get("tie_word_embeddings", False),
        pos="rope",
        norm="rms",
        ffn="swiglu",
        bias=attention_bias,
        qkv_bias=qkv_bias,
        window=window,
        window_pattern=window_pattern,
    )


# rope_type -> (our rope_scaling, the fields it reads beside factor, and their fixed values)
ROPE_TYPES = {
    "default": (None, {}),
    "linear": ("linear", {}),
    "dynamic": (None, {}),  # plain RoPE within max_position_embeddings (the docstring says why)
    "yarn": ("yarn-code", {"beta_fast": YARN_BETA, "beta_slow": YARN_ALPHA, "truncate": True}),
    "llama3": ("llama3", {"low_freq_factor": LLAMA3_LOW, "high_freq_factor": LLAMA3_HIGH}),
}
HF_ROPE_TYPE = {ours: theirs for theirs, (ours, _) in ROPE_TYPES.items() if ours is not None}


def _rope(f: _Fields) -> dict[str, Any]:
    """Our rope_* fields from a Llama-family config.json's rope_theta and rope_scaling (or
    transformers 5's rope_parameters, which holds both)."""
    rope = {"rope_theta": f.get("rope_theta", 10000.0), **(f.get("rope_scaling") or {})}
    rope.update(f.get("rope_parameters") or {})
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    theta = float(rope.pop("rope_theta"))
    if rope_type not in ROPE_TYPES:
        raise PretrainedError(
            f"config.json asks for RoPE scaling {rope_type!r} ({rope}); this loader implements "
            f"{sorted(ROPE_TYPES)}"
        )
    scaling, fixed = ROPE_TYPES[rope_type]
    original = rope.pop("original_max_position_embeddings", None)
    factor = float(rope.pop("factor", 1.0))
    if rope_type == "dynamic" and original not in (None, f.get("max_position_embeddings")):
        raise PretrainedError(
            f"config.json's dynamic RoPE scaling starts at original_max_position_embeddings="
            f"{original}, inside max_position_embeddings={f.get('max_position_embeddings')}: "
            f"this loader implements it only where the two are the same (plain RoPE within)"
        )
    unknown = {k: v for k, v in rope.items() if fixed.get(k, object()) != v}
    if unknown:
        raise PretrainedError(
            f"config.json's RoPE scaling {rope_type!r} sets {unknown}, which this loader cannot "
            f"honour{f' (it implements {fixed})' if fixed else ''}"
        )
    return dict(
        rope_theta=theta,
        rope_scaling=scaling,
        rope_factor=factor if scaling else 1.0,
        rope_original_context=original if scaling in NEEDS_ORIGINAL_CONTEXT else None,
    )


def _rope_to_hf(c: ModelConfig) -> dict[str, Any]:
    """config.json's rope fields for ``c``: rope_scaling only where it scales, of a type
    transformers and ``_rope`` share."""
    if c.rope_scaling is None:
        return {"rope_theta": c.rope_theta}
    if c.rope_scaling not in HF_ROPE_TYPE:
        raise PretrainedError(
            f"rope_scaling={c.rope_scaling!r}: the Llama family's config.json shares only "
            f"{sorted(HF_ROPE_TYPE)} with our RoPE scalings"
        )
    rope_type = HF_ROPE_TYPE[c.rope_scaling]
    scaling = {"rope_type": rope_type, "factor": c.rope_factor, **ROPE_TYPES[rope_type][1]}
    if c.rope_scaling in NEEDS_ORIGINAL_CONTEXT:
        scaling["original_max_position_embeddings"] = c.rope_original_context
    return {"rope_theta": c.rope_theta, "rope_scaling": scaling}


def _sliding_window(f: _Fields, arch: str) -> tuple[int | None, str]:
    """(window, window_pattern) of a Llama-family config.json. Mistral windows every layer;
    Llama none, whatever its sliding_window says (transformers ignores it there); Qwen2 only
    with use_sliding_window, then the layers from max_window_layers on (its ``layer_types``
    says so per layer in transformers 5). Both mask as ours: a query sees itself and the
    window - 1 keys before it."""
    window = f.get("sliding_window")
    n_layer = f.need("num_hidden_layers")
    if arch == "Qwen2ForCausalLM":
        if not f.get("use_sliding_window", False):
            window = None  # Qwen2 names a window but uses it only when use_sliding_window is set
        full = f.get("max_window_layers", n_layer)  # read even when unused: it changes nothing
        full = n_layer if window is None else full
        kinds = ["full_attention"] * full + ["sliding_attention"] * (n_layer - full)
    elif arch == "LlamaForCausalLM":
        window = None  # transformers' Llama reads no window (a field other tools leave there)
        kinds = ["full_attention"] * n_layer
    else:
        kinds = ["full_attention" if window is None else "sliding_attention"] * n_layer
    kinds = f.get("layer_types", kinds)
    letters = {"full_attention": "F", "sliding_attention": "W"}
    unknown = sorted(set(kinds) - set(letters))
    if unknown or len(kinds) != n_layer or (window is None and "sliding_attention" in kinds):
        raise PretrainedError(
            f"config.json sets layer_types {kinds} with sliding_window={window}: this loader "
            f"reads one of {sorted(letters)} per layer ({n_layer}), sliding ones needing a window"
        )
    if window is None or "sliding_attention" not in kinds:
        return None, "W"  # every layer full: ModelConfig's defaults
    pattern = "".join(letters[k] for k in kinds)
    # the shortest pattern that repeats to it ("WW" -> "W"), as a preset writes it
    n = next(n for n in range(1, n_layer + 1) if (pattern[:n] * n_layer)[:n_layer] == pattern)
    return window, pattern[:n]


# ---- ModelConfig -> config.json --------------------------------------------------------------
def config_to_hf(config: ModelConfig) -> tuple[dict[str, Any], str]:
    """The ``config.json`` of a model the format can express: (fields, family).

    Raises PretrainedError naming the settings no supported architecture has: the fields
    must come back unchanged through ``config_from_hf`` (the attention kernel aside).
    """
    hf, family = _config_to_hf(config)
    back = dataclasses.asdict(config_from_hf(hf)[0])
    lost = {
        k: v for k, v in dataclasses.asdict(config).items() if k != "attn_impl" and back[k] != v
    }
    if lost:
        raise PretrainedError(
            f"{hf['architectures'][0]}'s config.json cannot express {lost}; "
            f"a model saved without them would compute something else"
        )
    return hf, family


def _config_to_hf(config: ModelConfig) -> tuple[dict[str, Any], str]:
    c = config
    shared = {"vocab_size": c.vocab_size, "tie_word_embeddings": c.tie_weights}
    if c.norm_position != "pre" or c.parallel_block:
        raise PretrainedError(
            f"norm_position={c.norm_position!r}, parallel_block={c.parallel_block}: GPT-2 and "
            f"the Llama family are pre-norm, sequential blocks"
        )
    gpt2 = (c.pos, c.norm, c.ffn) == ("learned", "layer", "gelu")
    llama = (c.pos, c.norm, c.ffn) == ("rope", "rms", "swiglu")
    if gpt2 and c.bias and c.n_kv_head == c.n_head:
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            **shared,
            "n_positions": c.block_size,
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "n_embd": c.n_embd,
            "n_inner": c.ffn_hidden,
            "activation_function": GELU_TO_HF[c.gelu_approximate],
            "layer_norm_epsilon": c.norm_eps,
            "attn_pdrop": c.dropout,
            "resid_pdrop": c.dropout,
            "embd_pdrop": c.dropout,
        }, "gpt2"
    if llama and c.dropout == 0:
        arch = "Qwen2ForCausalLM" if c.qkv_bias and not c.bias else "LlamaForCausalLM"
        every_layer_windowed = all(c.layer_window(i) is not None for i in range(c.n_layer))
        if arch == "LlamaForCausalLM" and not c.bias and every_layer_windowed:
            arch = "MistralForCausalLM"  # Llama's layout with a window on every layer
        # other window patterns fall to config_to_hf's round trip, which names them
        window = {"sliding_window": c.window} if arch == "MistralForCausalLM" else {}
        return {
            "architectures": [arch],
            "model_type": ARCHITECTURES[arch][1],
            **shared,
            "max_position_embeddings": c.block_size,
            "num_hidden_layers": c.n_layer,
            "num_attention_heads": c.n_head,
            "num_key_value_heads": c.n_kv_head,
            "hidden_size": c.n_embd,
            "intermediate_size": c.ffn_hidden,
            "hidden_act": "silu",
            "rms_norm_eps": c.norm_eps,
            **_rope_to_hf(c),
            **window,
            **(
                {} if arch == "Qwen2ForCausalLM" else {"attention_bias": c.bias, "mlp_bias": c.bias}
            ),
        }, "llama"
    raise PretrainedError(
        f"no Hugging Face architecture here has pos={c.pos!r}, norm={c.norm!r}, ffn={c.ffn!r}, "
        f"bias={c.bias}, qkv_bias={c.qkv_bias}, n_kv_head={c.n_kv_head} of n_head={c.n_head}, "
        f"dropout={c.dropout}: GPT-2 is ('learned', 'layer', 'gelu') with biases and "
        f"multi-head attention; the Llama family ('rope', 'rms', 'swiglu') without dropout"
    )
