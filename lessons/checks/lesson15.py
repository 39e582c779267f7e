"""Checks of lesson 15 (LoRA): ``merged_weight``, ``block_diagonal`` and
``lora_trainable_count``."""

from __future__ import annotations

import numpy as np
from exercises import fresh_seed

from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from minigrad.nn import Linear
from minigrad.nn.lora import LoRAHeadLinear, LoRALinear, apply_lora

ALLOWED = {
    # the layer's parts: Tensor methods (.numpy(), .T, @) and the base's settings, not its
    # forward, merge() or delta_weight()
    "merged_weight": (
        "minigrad.tensor.Tensor",
        "minigrad.nn.lora.LoRALinear.weight",
        "minigrad.nn.lora.LoRALinear.in_features",
        "minigrad.nn.lora.LoRALinear.out_features",
    ),
    "lora_trainable_count": ("decoder.model.config.ModelConfig.head_size",),  # n_embd // n_head
}


def fresh_rng() -> np.random.Generator:
    """A generator seeded anew on every run, so no answer can learn the checked cases."""
    return np.random.default_rng(fresh_seed())


def test_merged_weight(fn):
    g = fresh_rng()
    cases = [(16, 8, 2, 16.0), (8, 24, 3, 16.0)]
    cases += [(*g.integers(2, 40, 2).tolist(), int(g.integers(1, 6)), float(g.uniform(1, 32)))]
    for n_in, n_out, r, alpha in cases:
        layer = LoRALinear(Linear(n_in, n_out).double(), r=r, alpha=alpha, rng=g)
        layer.B.data[...] = g.standard_normal(layer.B.shape)
        layer.base.bias.data[...] = g.standard_normal(n_out)  # a bias is not part of W
        got = np.asarray(fn(layer))
        where = f"LoRALinear({n_in} -> {n_out}, r={r}, alpha={alpha:.3g})"
        assert got.shape == (n_out, n_in), f"{where}: expected {(n_out, n_in)}, got {got.shape}"
        assert not layer.merged, "do not merge the layer"
        layer.merge()
        assert np.allclose(got, layer.base.weight.numpy()), f"{where}: differs from merge()'s"


def test_block_diagonal(fn):
    g = fresh_rng()
    drawn_h, drawn_r, d = (int(v) for v in g.integers(1, 6, 3))
    cases = [(4, 2, 32, 32), (2, 3, 8, 12), (1, 2, 6, 4), (drawn_h, drawn_r, 40, drawn_h * d)]
    for h, r, n_in, m in cases:
        layer = LoRAHeadLinear(Linear(n_in, m).double(), n_head=h, r=r, alpha=4, rng=g)
        layer.B.data[...] = g.standard_normal(layer.B.shape)
        B_shape = layer.B.shape
        got = np.asarray(fn(layer.B.numpy()))
        assert got.shape == (h * r, m), f"B of {B_shape}: expected {(h * r, m)}, got {got.shape}"
        want = layer.delta_weight() / layer.scale
        assert np.allclose(layer.A.numpy() @ got, want), "A @ block_diagonal(B) is not Delta W / s"
        assert np.count_nonzero(got) == layer.B.size, "entries outside the blocks must be 0"


def test_lora_trainable_count(fn):
    small = dict(vocab_size=30, block_size=8, n_layer=2, n_embd=32)
    g = fresh_rng()
    names = ["wq", "wk", "wv", "wo", "w1", "w2", "w3"]
    drawn = []
    for per_head in (False, False, True):  # configs no fixed table can hold
        n_head = int(g.choice([2, 4, 8]))
        n_kv_head = int(g.choice([d for d in (1, 2, 4, 8) if n_head % d == 0]))
        ffn = str(g.choice(["gelu", "swiglu"]))
        config = ModelConfig(
            vocab_size=int(g.integers(10, 60)),
            block_size=8,
            n_layer=int(g.integers(1, 4)),
            n_head=n_head,
            n_kv_head=n_kv_head,
            n_embd=n_head * int(g.choice([4, 6, 8])),
            ffn=ffn,
        )
        pool = names[:4] if per_head else names[: 7 if ffn == "swiglu" else 6]
        targets = tuple(t for t in pool if g.random() < 0.5) or (pool[0],)
        drawn.append((config, targets, int(g.integers(1, 5)), per_head))
    cases = drawn + [
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
        got = fn(config, targets, r, per_head)
        assert got == want, (
            f"{got} != {want} for targets {targets}, r={r}, per_head={per_head} on n_layer="
            f"{config.n_layer}, n_embd={config.n_embd}, n_head={config.n_head}, n_kv_head="
            f"{config.n_kv_head}, ffn={config.ffn!r} (ffn_hidden={config.ffn_hidden})"
        )
