"""Known-wrong answers to lesson 16's exercises: each a mistake a learner makes."""

from __future__ import annotations

import json

import numpy as np
import safetensors.numpy
from safetensors import safe_open
from solutions import (
    lesson16,
)

from decoder.hf.pretrained import to_ours
from minigrad.serialization import bfloat16_to_float32, open_safetensors


def read_header_shapes_as_lists(path):
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    return {n: (e["dtype"], e["shape"]) for n, e in header.items()}  # [5, 3] != (5, 3)


def read_header_library(path):
    with open_safetensors(path) as f:
        return {n: (f.dtype(n), f.shape(n)) for n in f}


_DTYPES = {"float32": "F32", "float16": "F16", "int64": "I64", "float64": "F64"}


def read_header_safe_open(path):
    with safe_open(path, framework="np") as f:  # the Rust reader parses the header for you
        names = list(f.keys())
        f.metadata()
        return {n: (f.get_slice(n).get_dtype(), tuple(f.get_slice(n).get_shape())) for n in names}


def read_header_safe_open_keys(path):
    f = safe_open(path, "np")  # no with: only the methods the Rust class exposes
    return {n: (_DTYPES[str(f.get_tensor(n).dtype)], f.get_tensor(n).shape) for n in f.keys()}


def read_header_load_file(path):
    arrays = safetensors.numpy.load_file(path)  # reads every byte, to learn what the header says
    return {n: (_DTYPES[str(a.dtype)], a.shape) for n, a in arrays.items()}


def split_c_attn_untransposed(weight, bias):
    weights, biases = lesson16.split_c_attn(weight, bias)
    return [w.T for w in weights], biases  # each third left in Conv1D's (in, out)


def split_c_attn_interleaved(weight, bias):
    """Reads q, k, v as interleaved columns (q0 k0 v0 q1 ...), not three blocks side by side."""
    return [weight[:, k::3].T for k in range(3)], [bias[k::3] for k in range(3)]


def split_c_attn_library(weight, bias):
    parts = [(k, 3) for k in range(3)]
    return [to_ours(weight, p, rows=0) for p in parts], [to_ours(bias, p, rows=0) for p in parts]


def bfloat16_by_value(bits):
    return bits.astype(np.float32)  # the integer 16256, not the number 1.0 its bits encode


def bfloat16_as_float16(bits):
    return bits.view(np.float16).astype(np.float32)  # float16 splits the bits 5/10, not 8/7


def bfloat16_library(bits):
    return bfloat16_to_float32(bits)


WRONG = [
    ("read_header", read_header_shapes_as_lists),
    ("read_header", read_header_library),
    ("read_header", read_header_safe_open),
    ("read_header", read_header_safe_open_keys),
    ("read_header", read_header_load_file),
    ("split_c_attn", split_c_attn_untransposed),
    ("split_c_attn", split_c_attn_interleaved),
    ("split_c_attn", split_c_attn_library),
    ("bfloat16_to_float32", bfloat16_by_value),
    ("bfloat16_to_float32", bfloat16_as_float16),
    ("bfloat16_to_float32", bfloat16_library),
]
