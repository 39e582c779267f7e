"""Checks of lesson 15 (LoRA): ``merged_weight``, ``block_diagonal`` and
``lora_trainable_count``."""

from __future__ import annotations

import numpy as np
from exercises import forbidden

from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from minigrad.nn import Linear
from minigrad.nn.lora import LoRAHeadLinear, LoRALinear, apply_lora


def test_merged_weight(fn):
    g = np.random.default_rng(4)
    for n_in, n_out, r in [(16, 8, 2), (8, 24, 3)]:
        layer = LoRALinear(Linear(n_in, n_out).double(), r=r, alpha=16, rng=g)
        layer.B.data[...] = g.standard_normal(layer.B.shape)
        with forbidden(fn, LoRALinear, "delta_weight", "compute s (A B)^T from A, B and scale"):
            with forbidden(fn, LoRALinear, "merge", "do not merge the layer"):
                got = np.asarray(fn(layer))
        assert got.shape == (n_out, n_in), f"expected shape {(n_out, n_in)}, got {got.shape}"
        assert not layer.merged, "do not merge the layer"
        layer.merge()
        assert np.allclose(got, layer.base.weight.numpy()), "differs from what merge() gives"


def test_block_diagonal(fn):
    g = np.random.default_rng(5)
    for h, r, n_in, m in [(4, 2, 32, 32), (2, 3, 8, 12), (1, 2, 6, 4)]:
        layer = LoRAHeadLinear(Linear(n_in, m).double(), n_head=h, r=r, alpha=4, rng=g)
        layer.B.data[...] = g.standard_normal(layer.B.shape)
        got = np.asarray(fn(layer.B.numpy()))
        assert got.shape == (h * r, m), f"expected shape {(h * r, m)}, got {got.shape}"
        want = layer.delta_weight() / layer.scale
        assert np.allclose(layer.A.numpy() @ got, want), "A @ block_diagonal(B) is not Delta W / s"
        assert np.count_nonzero(got) == layer.B.size, "entries outside the blocks must be 0"


def test_lora_trainable_count(fn):
    small = dict(vocab_size=30, block_size=8, n_layer=2, n_embd=32)
    cases = [
        (ModelConfig(**small, n_head=4), ("wq", "wv"), 4, False),
        (ModelConfig(**small, n_head=4), ("wq", "wk", "wv", "wo", "w1", "w2"), 2, False),
        (ModelConfig(**small, n_head=4, n_kv_head=2, ffn="swiglu"), ("wk", "w1", "w3"), 3, False),
        (ModelConfig(**small, n_head=4), ("wq", "wv"), 2, True),
        (ModelConfig(**small, n_head=8, n_kv_head=2, bias=True), ("wq", "wk", "wv", "wo"), 1, True),
    ]
    for config, targets, r, per_head in cases:
        model = Decoder(config)
        heads = {
            "wq": config.n_head,
            "wk": config.n_kv_head,
            "wv": config.n_kv_head,
            "wo": config.n_head,
        }
        apply_lora(model, targets, r=r, per_head=per_head, n_head=heads if per_head else None)
        want = model.num_parameters(trainable_only=True)
        with forbidden(fn, Decoder, "__init__", "count from the config, without a model"):
            got = fn(config, targets, r, per_head)
        assert got == want, f"{got} != {want} for targets {targets}, r={r}, per_head={per_head}"
