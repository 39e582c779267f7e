"""Reference answers to lesson 16 (loading a real model): ``read_header``, ``split_c_attn``
and ``bfloat16_to_float32``.

Reveal them in the notebook with ``%load solutions/lesson16.py``.
"""

from __future__ import annotations

import json

import numpy as np


def read_header(path: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{name: (dtype, shape)} of every tensor in a safetensors file, reading only its header.

    >>> import os, tempfile
    >>> from minigrad.serialization import save_safetensors
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> save_safetensors(path, {"w": np.zeros((2, 3), np.float32)}, {"step": "1"})
    >>> read_header(path)
    {'w': ('F32', (2, 3))}
    """
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")  # the header's length: 8 bytes, little-endian
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)  # string metadata, not a tensor
    return {name: (e["dtype"], tuple(e["shape"])) for name, e in header.items()}


def split_c_attn(weight: np.ndarray, bias: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """GPT-2's fused ``c_attn`` (a Conv1D: weight (C, 3C), bias (3C,)) as our three Linears:
    ([W_Q, W_K, W_V] each (C, C) as (out, in), [b_Q, b_K, b_V] each (C,)).

    >>> ws, bs = split_c_attn(np.arange(12.0).reshape(2, 6), np.arange(6.0))
    >>> ws[0].tolist(), bs[2].tolist()
    ([[0.0, 6.0], [1.0, 7.0]], [4.0, 5.0])
    """
    C = weight.shape[0]
    # x @ weight computes [q | k | v] side by side: each third of the columns is one projection
    weights = [weight[:, k * C : (k + 1) * C].T for k in range(3)]  # (C, C) (in, out) -> (out, in)
    biases = [bias[k * C : (k + 1) * C] for k in range(3)]
    return weights, biases


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values, given as their uint16 bit patterns, as float32 with the same values.

    >>> bfloat16_to_float32(np.array([0x3F80, 0xC040], dtype=np.uint16))
    array([ 1., -3.], dtype=float32)
    """
    # a bfloat16 is the top 16 bits of a float32: put them back on top, zeros below
    return (bits.astype(np.uint32) << 16).view(np.float32)
