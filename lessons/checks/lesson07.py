"""Checks of lesson 7 (the model and its loss): ``cross_entropy_grad`` and
``count_parameters``."""

from __future__ import annotations

import numpy as np
from exercises import forbidden

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.training.config import build_configs
from minigrad import functional as F


def test_cross_entropy_grad(fn):
    g = np.random.default_rng(3)
    for scale in (1.0, 1000.0):
        logits = mg.tensor(scale * g.standard_normal((6, 9)), dtype="float64", requires_grad=True)
        targets = g.integers(0, 9, size=6)
        F.cross_entropy(logits, targets).backward()
        got = np.asarray(fn(logits.numpy().copy(), targets))
        assert got.shape == (6, 9), f"expected shape (6, 9), got {got.shape}"
        assert np.all(np.isfinite(got)), f"not finite for logits of scale {scale}"
        assert np.allclose(got, logits.grad, atol=1e-10), (
            f"differs from F.cross_entropy (scale {scale})"
        )


def test_count_parameters(fn):
    small = dict(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32)
    configs = [
        build_configs("shakespeare-char", vocab_size=65)[0],
        build_configs("shakespeare-char-modern", vocab_size=65)[0],  # RoPE, RMSNorm, SwiGLU, GQA
        ModelConfig(**small, bias=True, tie_weights=False, pos="sinusoidal"),
        ModelConfig(**small, norm_position="post", norm="rms", ffn="swiglu", bias=True),
        ModelConfig(
            **small, parallel_block=True, n_kv_head=1, pos="alibi", ffn_hidden=48, bias=True
        ),
    ]
    expected = [Decoder(c).num_parameters() for c in configs]
    gpt2 = ModelConfig(
        vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, bias=True
    )
    with forbidden(fn, Decoder, "__init__", "count from the config, without building the model"):
        for c, want in zip(configs, expected, strict=True):
            got = fn(c)
            assert got == want, f"{got} != {want} for {c}"
        assert fn(gpt2) == 124_439_808, "GPT-2 small has 124,439,808 parameters"
