"""Checks of lesson 16 (loading a real model): ``read_header``, ``split_c_attn`` and
``bfloat16_to_float32``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from exercises import fresh_seed

from decoder.hf.pretrained import K, Q, V, to_ours
from minigrad.serialization import save_safetensors


def test_read_header(fn):
    g = np.random.default_rng(fresh_seed())  # new every run
    shape = tuple(int(n) for n in g.integers(1, 6, int(g.integers(1, 4))))
    dtype, code = [(np.float64, "F64"), (np.int32, "I32"), (np.uint8, "U8")][int(g.integers(3))]
    drawn = f"blocks.{int(g.integers(100))}.w"
    arrays = {
        drawn: np.zeros(shape, dtype),
        "wte.weight": np.zeros((5, 3), np.float32),
        "h.0.attn.bias": np.zeros((1, 1, 2, 2), np.float16),
        "step": np.zeros((), np.int64),  # 0-d: shape ()
        "empty": np.zeros((0, 4), np.float32),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "model.safetensors")
        save_safetensors(path, arrays, {"format": "pt"})
        got = fn(path)
    assert "__metadata__" not in got, "__metadata__ holds the file's strings, not a tensor"
    want = {"wte.weight": ("F32", (5, 3)), "h.0.attn.bias": ("F16", (1, 1, 2, 2))}
    want |= {"step": ("I64", ()), "empty": ("F32", (0, 4)), drawn: (code, shape)}
    assert got == want, f"got {got}, want {want} (shapes as tuples)"


def test_split_c_attn(fn):
    C = 4
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((C, 3 * C)).astype(np.float32)  # Conv1D: (in, out)
    bias = rng.standard_normal(3 * C).astype(np.float32)
    weights, biases = fn(weight, bias)
    assert len(weights) == 3 and len(biases) == 3, "three weights and three biases: Q, K, V"
    for name, layout, w, b in zip("QKV", (Q, K, V), weights, biases, strict=True):
        assert w.shape == (C, C) and b.shape == (C,), f"W_{name} {w.shape}, b_{name} {b.shape}"
        np.testing.assert_array_equal(w, to_ours(weight, layout, rows=0), err_msg=f"W_{name}")
        np.testing.assert_array_equal(b, to_ours(bias, layout, rows=0), err_msg=f"b_{name}")
    # the meaning: our three Linears (y = x W^T + b) compute what GPT-2's one Conv1D computes
    x = rng.standard_normal((2, C)).astype(np.float32)
    ours = np.concatenate([x @ w.T + b for w, b in zip(weights, biases, strict=True)], axis=-1)
    np.testing.assert_allclose(ours, x @ weight + bias, rtol=1e-5, atol=1e-6)


def test_bfloat16_to_float32(fn):
    special = np.array(
        [0.0, -0.0, 1.0, -3.0, np.inf, -np.inf, np.nan, 3.3895314e38, 1e-40, -2.5e-39],
        dtype=np.float32,
    )  # signed zeros, infinities, NaN, bfloat16's largest, subnormals
    rng = np.random.default_rng(0)
    values = np.concatenate([special, rng.standard_normal(50).astype(np.float32) * 1e3])
    # the values a bfloat16 can hold: float32s whose low 16 bits are zero
    exact = (values.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).reshape(6, 10)
    bits = (exact.view(np.uint32) >> 16).astype(np.uint16)  # their bfloat16 bit patterns
    got = np.asarray(fn(bits))
    zero_d = np.asarray(fn(bits[0, 2].reshape(())))
    assert got.dtype == np.float32, f"got dtype {got.dtype}, want float32"
    assert got.shape == bits.shape, f"got shape {got.shape}, want {bits.shape}: keep the shape"
    np.testing.assert_array_equal(got, exact, err_msg="the values the bits encode")  # NaN too
    assert (np.signbit(got) == np.signbit(exact)).all(), "-0.0 keeps its sign: 0x8000 is -0.0"
    assert zero_d.shape == () and zero_d == 1.0, f"a 0-d array stays 0-d: got {zero_d!r}"
