"""Hugging Face checkpoints: load GPT-2 and Llama-family models into a ``Decoder``, save back.

A Hugging Face model directory holds ``config.json`` (the architecture and its sizes) and the
weights, as ``model.safetensors`` or as shards listed in ``model.safetensors.index.json``.
Loading takes three explicit steps, each refusing what it cannot honour by name:

1. ``config_from_hf`` (decoder/hf/config.py): ``config.json`` -> ``ModelConfig``. Every
   field is translated, checked against the one value we implement, or listed as not
   changing the outputs (``IGNORED_FIELDS``: token ids, init scale, caching switches). Any
   other field is an error naming it: a model is never built with a setting silently dropped.
2. The name map, one readable table per family (``GPT2_NAMES``, ``LLAMA_NAMES``): our
   parameter, theirs, and how the layout differs. GPT-2 is written with ``Conv1D`` layers,
   which store W as (in, out), the transpose of a Linear's (out, in), and fuses W_Q, W_K,
   W_V into one ``c_attn`` of 3 C outputs. The Llama family (Mistral, Qwen2) uses Linear
   layers with our layout, and rotate-half RoPE as ours (decoder/model/positional.py).
3. ``load_weights``: each tensor is read through a memory map and copied into the model,
   converted to float32 (bfloat16 by its bits), one at a time.

``save_pretrained`` writes the same layout back for a model the format can express, so
``transformers`` loads it, with a ``tokenizer.json`` for a character tokenizer, a byte-level
BPE (ours or tiktoken's), or one read from a file (decoder/hf/export.py; a bias-free GPT-2
layout is written with zero biases).
``resolve_source`` turns a hub name (``gpt2``) into a directory through ``huggingface_hub``
(the optional extra ``hub``), with an offline error that says what to download and where.
The tokenizer comes with the model (``load_pretrained``): a character tokenizer.json written
here, else tiktoken's ``gpt2`` for GPT-2, the ``tokenizer.json`` beside the weights for the
Llama family (decoder/hf/tokenizer.py).

Sliding windows (Mistral's, Qwen2's) are translated with the config (decoder/hf/config.py).
Left out on purpose: quantised weights, the RoPE scalings decoder/hf/config.py does not
translate (longrope, dynamic NTK past the context), and the other architectures.
Follows the layouts of Hugging Face transformers' ``modeling_gpt2.py`` and
``modeling_llama.py``, and picoGPT's GPT-2 loader.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from decoder.hf.config import PretrainedError, config_from_hf, config_to_hf
from decoder.hf.export import (
    byte_bpe_tokenizer_json,
    char_tokenizer_json,
    check_exportable,
    read_char_tokenizer,
    with_zero_biases,
)
from decoder.hf.tokenizer import HFTokenizer
from decoder.model.memory import check_memory, memory_floor
from decoder.model.model import Decoder, build_model
from decoder.text.bpe import BPETokenizer
from decoder.text.data import changed_since, sha256_differs, sha256_file
from decoder.text.tokenizer import CharTokenizer, TiktokenTokenizer
from minigrad.backend import to_numpy
from minigrad.fileio import atomic_write, parse_json
from minigrad.serialization import SafetensorsFile, open_safetensors, save_safetensors

CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
TOKENIZER_JSON = "tokenizer.json"
HF_FILES = (CONFIG, WEIGHTS, TOKENIZER_JSON)  # what save_pretrained (and a merge) writes
CHECKSUMS = "sha256.json"  # a merge's record of those files' SHA-256, checked on loading
HUB_FILES = [CONFIG, WEIGHTS, INDEX, "model-*.safetensors", TOKENIZER_JSON]
# Buffers some checkpoints carry that are functions of the config, not weights:
# GPT-2's causal mask ("h.0.attn.bias", "h.0.attn.masked_bias") and Llama's RoPE frequencies.
BUFFER_NAMES = re.compile(r"(^|\.)h\.\d+\.attn\.(masked_)?bias$|\.rotary_emb\.inv_freq$")


# ---- the name maps ---------------------------------------------------------------------------
# Layouts: AS_IS copies; CONV1D transposes GPT-2's (in, out) Conv1D weight to our (out, in);
# (k, 3) takes the k-th third of the last axis (GPT-2's fused c_attn: q, k, v), then
# transposes a weight; ROWS keeps the first block_size rows (a context cropped on loading).
AS_IS, CONV1D, ROWS = "as is", "Conv1D", "rows"
Q, K, V = (0, 3), (1, 3), (2, 3)

# fmt: off
GPT2_NAMES = [
    # ours                          GPT-2's (GPT2LMHeadModel)        layout
    ("tok_emb.weight",              "wte.weight",                    AS_IS),
    ("pos_emb.weight",              "wpe.weight",                    ROWS),
    ("blocks.{i}.norm1.weight",     "h.{i}.ln_1.weight",             AS_IS),
    ("blocks.{i}.norm1.bias",       "h.{i}.ln_1.bias",               AS_IS),
    ("blocks.{i}.attn.wq.weight",   "h.{i}.attn.c_attn.weight",      Q),
    ("blocks.{i}.attn.wk.weight",   "h.{i}.attn.c_attn.weight",      K),
    ("blocks.{i}.attn.wv.weight",   "h.{i}.attn.c_attn.weight",      V),
    ("blocks.{i}.attn.wq.bias",     "h.{i}.attn.c_attn.bias",        Q),
    ("blocks.{i}.attn.wk.bias",     "h.{i}.attn.c_attn.bias",        K),
    ("blocks.{i}.attn.wv.bias",     "h.{i}.attn.c_attn.bias",        V),
    ("blocks.{i}.attn.wo.weight",   "h.{i}.attn.c_proj.weight",      CONV1D),
    ("blocks.{i}.attn.wo.bias",     "h.{i}.attn.c_proj.bias",        AS_IS),
    ("blocks.{i}.norm2.weight",     "h.{i}.ln_2.weight",             AS_IS),
    ("blocks.{i}.norm2.bias",       "h.{i}.ln_2.bias",               AS_IS),
    ("blocks.{i}.ffn.w1.weight",    "h.{i}.mlp.c_fc.weight",         CONV1D),
    ("blocks.{i}.ffn.w1.bias",      "h.{i}.mlp.c_fc.bias",           AS_IS),
    ("blocks.{i}.ffn.w2.weight",    "h.{i}.mlp.c_proj.weight",       CONV1D),
    ("blocks.{i}.ffn.w2.bias",      "h.{i}.mlp.c_proj.bias",         AS_IS),
    ("norm_f.weight",               "ln_f.weight",                   AS_IS),
    ("norm_f.bias",                 "ln_f.bias",                     AS_IS),
    ("lm_head.weight",              "lm_head.weight",                AS_IS),  # untied only
]
GPT2_PREFIX = "transformer."  # GPT2LMHeadModel's body; the hub's own gpt2 file has none

LLAMA_NAMES = [
    # ours                          the Llama family's (also Mistral, Qwen2)          layout
    ("tok_emb.weight",              "model.embed_tokens.weight",                      AS_IS),
    ("blocks.{i}.norm1.weight",     "model.layers.{i}.input_layernorm.weight",        AS_IS),
    ("blocks.{i}.attn.wq.weight",   "model.layers.{i}.self_attn.q_proj.weight",       AS_IS),
    ("blocks.{i}.attn.wk.weight",   "model.layers.{i}.self_attn.k_proj.weight",       AS_IS),
    ("blocks.{i}.attn.wv.weight",   "model.layers.{i}.self_attn.v_proj.weight",       AS_IS),
    ("blocks.{i}.attn.wo.weight",   "model.layers.{i}.self_attn.o_proj.weight",       AS_IS),
    ("blocks.{i}.attn.wq.bias",     "model.layers.{i}.self_attn.q_proj.bias",         AS_IS),
    ("blocks.{i}.attn.wk.bias",     "model.layers.{i}.self_attn.k_proj.bias",         AS_IS),
    ("blocks.{i}.attn.wv.bias",     "model.layers.{i}.self_attn.v_proj.bias",         AS_IS),
    ("blocks.{i}.attn.wo.bias",     "model.layers.{i}.self_attn.o_proj.bias",         AS_IS),
    ("blocks.{i}.norm2.weight",     "model.layers.{i}.post_attention_layernorm.weight", AS_IS),
    ("blocks.{i}.ffn.w1.weight",    "model.layers.{i}.mlp.gate_proj.weight",          AS_IS),
    ("blocks.{i}.ffn.w3.weight",    "model.layers.{i}.mlp.up_proj.weight",            AS_IS),
    ("blocks.{i}.ffn.w2.weight",    "model.layers.{i}.mlp.down_proj.weight",          AS_IS),
    ("blocks.{i}.ffn.w1.bias",      "model.layers.{i}.mlp.gate_proj.bias",            AS_IS),
    ("blocks.{i}.ffn.w3.bias",      "model.layers.{i}.mlp.up_proj.bias",              AS_IS),
    ("blocks.{i}.ffn.w2.bias",      "model.layers.{i}.mlp.down_proj.bias",            AS_IS),
    ("norm_f.weight",               "model.norm.weight",                              AS_IS),
    ("lm_head.weight",              "lm_head.weight",                                 AS_IS),
]
# fmt: on
NAMES = {"gpt2": GPT2_NAMES, "llama": LLAMA_NAMES}


def name_map(names: list[str], family: str, n_layer: int) -> dict[str, tuple[str, Any]]:
    """Our parameter names -> (their name, layout), for the parameters a model has.

    >>> name_map(["blocks.0.attn.wk.weight"], "gpt2", n_layer=1)
    {'blocks.0.attn.wk.weight': ('h.0.attn.c_attn.weight', (1, 3))}
    """
    table = {}
    for ours, theirs, layout in NAMES[family]:
        for i in range(n_layer) if "{i}" in ours else [None]:
            table[ours.format(i=i)] = (theirs.format(i=i), layout)
    unmapped = [n for n in names if n not in table]
    if unmapped:
        raise PretrainedError(
            f"the model holds {unmapped}, which the {family} layout has no place for (a LoRA "
            f"adapter? merge it first with minigrad.nn.lora.merge_lora)"
        )
    return {n: table[n] for n in names}


def to_ours(array: np.ndarray, layout: Any, rows: int) -> np.ndarray:
    """Their tensor in our layout (a view where it can be: nothing is copied here); ``rows``
    is the block_size that ROWS crops to.

    >>> to_ours(np.arange(6).reshape(1, 6), Q, rows=1)  # GPT-2's c_attn: (C, 3C) -> W_Q (C, C)
    array([[0],
           [1]])
    """
    if layout == CONV1D:
        return array.T  # (in, out) -> (out, in)
    if layout == ROWS:
        return array[:rows]  # (n_positions, C) -> (block_size, C)
    if isinstance(layout, tuple):
        k, parts = layout
        n = array.shape[-1] // parts
        part = array[..., k * n : (k + 1) * n]  # (C, 3C) -> (C, C) or (3C,) -> (C,)
        return part.T if part.ndim == 2 else part
    return array


# ---- reading a directory ---------------------------------------------------------------------
def resolve_source(source: str | os.PathLike) -> Path:
    """A local model directory, or a hub name (``gpt2``, ``Qwen/Qwen2-0.5B``) downloaded
    into the Hugging Face cache by ``huggingface_hub``; the directory either way."""
    path = Path(source)
    if path.is_dir():
        return path
    name = os.fspath(source)
    looks_local = path.is_absolute() or name.startswith(".") or name.count("/") > 1
    if looks_local or not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name):
        raise PretrainedError(f"{name}: no such directory (and not a Hugging Face hub name)")
    how = (
        f"download {', '.join(HUB_FILES)} (those that exist) from "
        f"https://huggingface.co/{name}/tree/main into one directory and pass its path"
    )
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise PretrainedError(
            f"{name!r} is not a directory, and downloading it from the Hugging Face hub needs "
            f"huggingface_hub: pip install -e '.[hub]'; or {how}"
        ) from None
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_FILES))
    except Exception as e:  # offline, no such repository, a gated model: all say the same
        raise PretrainedError(
            f"could not download {name!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
            f"On a machine with network access, {how}"
        ) from e


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG
    if not path.is_file():
        raise PretrainedError(f"{directory}: no {CONFIG}; is this a Hugging Face model directory?")
    try:
        hf = parse_json(path.read_bytes())
    except ValueError as e:  # not JSON, or nested too deep
        raise PretrainedError(f"{path}: {e}") from None
    if not isinstance(hf, dict):
        raise PretrainedError(f"{path}: not a JSON object")
    return hf


def write_checksums(directory: Path) -> None:
    """Record the SHA-256 of the directory's HF_FILES in CHECKSUMS (decoder.post.lora's merge
    does: the merged weights stay tied to the tokenizer they were trained with)."""
    record = {n: sha256_file(directory / n) for n in HF_FILES if (directory / n).is_file()}
    with atomic_write(directory / CHECKSUMS, text=True) as f:
        json.dump(record, f, indent=1)


def check_checksums(directory: Path) -> None:
    """Raise PretrainedError for a file that CHECKSUMS records (if the directory has one) and
    that changed since; MINIGRAD_NO_VERIFY=1 skips it (decoder.text.data.sha256_differs)."""
    path = directory / CHECKSUMS
    if not path.is_file():
        return
    try:
        record = parse_json(path.read_bytes())
    except ValueError as e:  # not JSON, or nested too deep
        raise PretrainedError(f"{path}: {e}") from None
    if not isinstance(record, dict):
        raise PretrainedError(f"{path}: a {type(record).__name__}, not file name -> SHA-256")
    for name, recorded in record.items():
        if name in HF_FILES and not (directory / name).is_file():
            raise PretrainedError(f"{directory / name}: missing, though {CHECKSUMS} lists it")
        if name in HF_FILES and sha256_differs(directory / name, recorded):
            raise PretrainedError(
                f"{directory / name}: {changed_since(path)}; put it back or merge again"
            )


def weight_files(directory: Path) -> dict[str, list[str]]:
    """Each weight file -> the tensor names the index assigns it (None: all it holds).

    A sharded model lists its shards in ``model.safetensors.index.json``; every shard it
    names must exist.
    """
    index = directory / INDEX
    if (directory / WEIGHTS).is_file():
        return {WEIGHTS: None}
    if not index.is_file():
        raise PretrainedError(f"{directory}: neither {WEIGHTS} nor {INDEX}")
    try:
        weight_map = parse_json(index.read_bytes())["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise PretrainedError(f"{index}: not a safetensors index with a weight_map ({e})") from None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise PretrainedError(
            f"{index}: its weight_map is a {type(weight_map).__name__}, not an object mapping "
            f"each tensor name to its shard's file name; download the index again"
        )
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        shards.setdefault(shard, []).append(name)
    missing = sorted(s for s in shards if not (directory / s).is_file())
    if missing:
        raise PretrainedError(
            f"{index} lists the shards {missing}, missing from {directory}: download them too"
        )
    return shards


def load_weights(model: Decoder, directory: Path, family: str) -> None:
    """Copy the directory's weights into ``model`` (on the CPU), one tensor at a time.

    Every name and shape is checked before anything is copied: a missing tensor, one the
    model has no place for, or a shape that does not match config.json raises
    PretrainedError and leaves the model as it was.

    Why one tensor at a time, through a memory map (minigrad.serialization.open_safetensors):
    the process never holds the file's weights and the model's at once. Measured on GPT-2 small
    (475 MiB of float32 weights): copying peaks 147 MiB (its largest tensor, the token
    embedding) above the built model, from float32 or bfloat16 files. Building the ``Decoder``
    first peaks at twice its weights: its random init draws float64 normals.
    """
    params = dict(model.named_parameters())  # the tied lm_head appears once, as tok_emb
    rows = model.config.block_size
    with contextlib.ExitStack() as stack:
        files = _open_weights(directory, stack)
        prefixed = family == "gpt2" and any(n.startswith(GPT2_PREFIX) for n in files)
        mapping = {
            ours: (GPT2_PREFIX + theirs if prefixed and theirs != "lm_head.weight" else theirs, how)
            for ours, (theirs, how) in name_map(list(params), family, model.config.n_layer).items()
        }
        wanted = {theirs for theirs, _ in mapping.values()}
        missing = sorted(wanted - set(files))
        # a tied model's lm_head.weight, when a file carries it, equals tok_emb's (one that
        # differs unties the model: from_pretrained's _head_of_its_own)
        tied_head = {"lm_head.weight"} if model.config.tie_weights else set()
        unexpected = sorted(
            n for n in set(files) - wanted - tied_head if not BUFFER_NAMES.search(n)
        )
        if missing or unexpected:
            raise PretrainedError(
                f"{directory}: the weights do not match config.json: missing {missing}, "
                f"unexpected {unexpected}"
            )
        for ours, (theirs, layout) in mapping.items():
            # subtle: a zero-strided stand-in gives to_ours' shape without reading the tensor
            stand_in = np.broadcast_to(np.empty(()), files[theirs].shape(theirs))
            shape = to_ours(stand_in, layout, rows).shape
            if shape != params[ours].shape:
                raise PretrainedError(
                    f"{theirs} has shape {files[theirs].shape(theirs)}, which gives {ours} the "
                    f"shape {shape}, but config.json makes it {params[ours].shape}: the weights "
                    f"belong to another config"
                )
        for ours, (theirs, layout) in mapping.items():
            params[ours].data[...] = to_ours(files[theirs][theirs], layout, rows)  # to float32
            files[theirs].release(theirs)  # its pages leave memory: one tensor's at a time


def _open_weights(directory: Path, stack: contextlib.ExitStack) -> dict[str, SafetensorsFile]:
    """Each tensor's name -> its open (memory-mapped) file, the shards checked against the
    index; ``stack`` closes the files."""
    files = {}
    for shard, listed in weight_files(directory).items():
        f = stack.enter_context(open_safetensors(directory / shard))
        absent = sorted(set(listed or ()) - set(f))
        if absent:
            raise PretrainedError(f"{directory / INDEX} puts {absent} in {shard}, which lacks them")
        files.update(dict.fromkeys(f, f))
    return files


def _head_of_its_own(directory: Path, family: str) -> bool:
    """Whether the weights carry an ``lm_head.weight`` other than the token embedding: with
    tie_word_embeddings set, transformers then keeps the file's head (untied, with a warning),
    and so does this loader. One equal to the embedding changes nothing: the tie stays."""
    with contextlib.ExitStack() as stack:
        files = _open_weights(directory, stack)
        if "lm_head.weight" not in files:
            return False
        embedding = {"gpt2": "wte.weight", "llama": "model.embed_tokens.weight"}[family]
        embedding = next((n for n in files if n.endswith(embedding)), None)
        if embedding is None:  # load_weights names what is missing
            return False
        head = files["lm_head.weight"]["lm_head.weight"]
        return not np.array_equal(head, files[embedding][embedding])


def from_pretrained(
    source: str | os.PathLike, device: str = "cpu", block_size: int | None = None
) -> Decoder:
    """A ``Decoder`` with the weights of a Hugging Face model directory (or hub name),
    in float32 and eval mode on ``device``.

    ``block_size`` crops the context below the model's own (max_position_embeddings): our
    RoPE tables and KV caches are sized by it, which for a 32k-token model is gigabytes.
    """
    directory = resolve_source(source)
    check_checksums(directory)  # a merged model's files, its tokenizer among them
    config, family = config_from_hf(read_config(directory))
    if block_size is not None:
        if not 1 <= block_size <= config.block_size:
            raise PretrainedError(
                f"block_size={block_size}: the model was trained for contexts of at most "
                f"{config.block_size} tokens; choose 1..{config.block_size}"
            )
        config = dataclasses.replace(config, block_size=block_size)
    if config.tie_weights and _head_of_its_own(directory, family):
        config = dataclasses.replace(config, tie_weights=False)  # as transformers: the file's
    fixes = {
        "block_size": f"crop its context of {config.block_size} positions with --block-size "
        f"(block_size= from Python)",
        "n_embd": "the model is too large for this machine",
    }
    check_memory(memory_floor(config, itemsize=4), "cpu", fixes)  # built on the CPU first
    model = build_model(config)
    load_weights(model, directory, family)
    model.to(device)
    model.eval()
    return model


def load_pretrained(
    source: str | os.PathLike, device: str = "cpu", block_size: int | None = None
) -> tuple[Decoder, Any]:
    """The model and its tokenizer, as decoder.generate and decoder.post.lora use them."""
    directory = resolve_source(source)
    model = from_pretrained(directory, device, block_size)
    path = directory / TOKENIZER_JSON
    chars = read_char_tokenizer(path) if path.is_file() else None
    if chars is not None:  # a character model saved here (decoder.hf.export)
        tokenizer = chars
    elif model.config.pos == "learned":  # GPT-2's byte-level BPE is tiktoken's gpt2 encoding
        try:
            tokenizer = TiktokenTokenizer("gpt2")
        except RuntimeError as e:  # offline: the message says what to download, and where
            raise PretrainedError(str(e)) from e
    else:
        tokenizer = HFTokenizer(directory / TOKENIZER_JSON)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise PretrainedError(
            f"{directory}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
            f"vocab_size={model.config.vocab_size}: they do not belong together"
        )
    return model, tokenizer


# ---- writing ---------------------------------------------------------------------------------
def save_pretrained(model: Decoder, directory: str | os.PathLike, tokenizer: Any = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (float32), and the ``tokenizer.json`` of
    ``tokenizer`` where one is given, so that ``transformers`` loads the model; refuse
    (PretrainedError) a model the format cannot express, naming the field (decoder.hf.export
    says what is written for a model without biases and for a character tokenizer)."""
    check_exportable(model.config)
    params = {n: to_numpy(p.data).astype(np.float32) for n, p in model.named_parameters()}
    config, params = with_zero_biases(model.config, params)
    hf, family = config_to_hf(config)
    tokenizer_json = _tokenizer_json(tokenizer, family)  # refused before anything is written
    mapping = name_map(list(params), family, config.n_layer)
    prefix = GPT2_PREFIX if family == "gpt2" else ""
    pieces: dict[str, list] = {}  # their name -> the parts of it, in order
    for ours, (theirs, layout) in mapping.items():
        array = params[ours]
        name = theirs if theirs == "lm_head.weight" else prefix + theirs
        if layout == CONV1D or (isinstance(layout, tuple) and array.ndim == 2):
            array = array.T  # our (out, in) -> Conv1D's (in, out)
        pieces.setdefault(name, []).append((layout[0] if isinstance(layout, tuple) else 0, array))
    arrays = {
        name: np.concatenate([a for _, a in sorted(parts, key=lambda p: p[0])], axis=-1)
        for name, parts in pieces.items()
    }  # GPT-2's c_attn: q, k, v side by side along the outputs
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_safetensors(directory / WEIGHTS, arrays, {"format": "pt"})  # transformers wants "pt"
    with atomic_write(directory / CONFIG, text=True) as f:
        json.dump({**hf, "dtype": "float32"}, f, indent=2)
    if tokenizer_json is not None:
        with atomic_write(directory / TOKENIZER_JSON, text=True) as f:
            f.write(tokenizer_json)
    return directory


def _tokenizer_json(tokenizer: Any, family: str) -> str | None:
    """The text of ``tokenizer``'s tokenizer.json, or None where the model needs none (no
    tokenizer given, or tiktoken's gpt2 beside a GPT-2, which load_pretrained uses)."""
    if tokenizer is None or (family == "gpt2" and isinstance(tokenizer, TiktokenTokenizer)):
        return None
    if isinstance(tokenizer, CharTokenizer):
        spec = char_tokenizer_json(tokenizer)
    elif isinstance(tokenizer, HFTokenizer):  # read from a tokenizer.json: that file, as it is
        return Path(tokenizer.path).read_text(encoding="utf-8")
    elif isinstance(tokenizer, BPETokenizer):
        spec = byte_bpe_tokenizer_json(tokenizer.ranks, tokenizer.pattern, tokenizer.special_tokens)
    elif isinstance(tokenizer, TiktokenTokenizer):
        encoding = tokenizer.encoding
        spec = byte_bpe_tokenizer_json(
            encoding._mergeable_ranks, encoding._pat_str, encoding._special_tokens
        )
    else:
        kind = tokenizer.to_dict().get("type", type(tokenizer).__name__)
        raise PretrainedError(
            f"a {kind!r} tokenizer has no tokenizer.json writer here (characters, byte-level "
            f"BPE and files read from a tokenizer.json have): save the model with tokenizer=None"
        )
    return json.dumps(spec, ensure_ascii=False, indent=2)
