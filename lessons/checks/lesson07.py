"""Checks of lesson 7 (the model and its loss): ``cross_entropy_grad`` and
``count_parameters``."""

from __future__ import annotations

import numpy as np
from exercises import fresh_seed

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.training.config import build_configs
from minigrad import functional as F

# What each answer may call in the library: the config's one derived field. cross_entropy_grad
# is NumPy (autograd would compute the gradient it asks for); count_parameters must not build
# the model it counts.
ALLOWED = {"count_parameters": ("decoder.model.config.ModelConfig.head_size",)}


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


def random_config(rng: np.random.Generator) -> ModelConfig:
    """A small ModelConfig of the kind count_parameters covers (attention="mha", ffn "gelu" or
    "swiglu"), every field the count depends on drawn at random."""
    while True:
        n_head = int(rng.choice([1, 2, 3, 4]))
        n_kv_head = int(rng.choice([d for d in range(1, n_head + 1) if n_head % d == 0]))
        parallel = bool(rng.random() < 0.3)
        fields = dict(
            vocab_size=int(rng.integers(2, 300)),
            block_size=int(rng.integers(1, 100)),
            n_layer=int(rng.integers(1, 4)),
            n_head=n_head,
            n_kv_head=n_kv_head,
            n_embd=n_head * int(rng.integers(1, 9)),
            ffn=str(rng.choice(["gelu", "swiglu"])),
            ffn_hidden=None if rng.random() < 0.5 else int(rng.integers(1, 80)),
            norm=str(rng.choice(["layer", "rms"])),
            norm_position="pre" if parallel or rng.random() < 0.6 else "post",
            parallel_block=parallel,
            pos=str(rng.choice(["learned", "sinusoidal", "rope", "alibi", "none"])),
            bias=bool(rng.random() < 0.5),
            qkv_bias=bool(rng.random() < 0.5),
            tie_weights=bool(rng.random() < 0.5),
        )
        try:
            return ModelConfig(**fields)
        except ValueError:  # RoPE with an odd head size: draw again
            continue


def test_count_parameters(fn):
    rng = np.random.default_rng(fresh_seed())  # new configs each run
    small = dict(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32)
    configs = [
        build_configs("shakespeare-char", vocab_size=65)[0],
        build_configs("shakespeare-char-modern", vocab_size=65)[0],  # RoPE, RMSNorm, SwiGLU, GQA
        ModelConfig(**small, bias=True, tie_weights=False, pos="sinusoidal"),
        ModelConfig(**small, norm_position="post", norm="rms", ffn="swiglu", bias=True),
        ModelConfig(
            **small, parallel_block=True, n_kv_head=1, pos="alibi", ffn_hidden=48, bias=True
        ),
        ModelConfig(**small, qkv_bias=True, n_kv_head=2),  # Qwen2: biases on wq, wk, wv only
        *(random_config(rng) for _ in range(12)),
    ]
    for c in configs:
        want = Decoder(c).num_parameters()
        got = fn(c)
        assert got == want, f"{got} != {want}, the parameters of Decoder({c})"
    gpt2 = ModelConfig(
        vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, bias=True
    )
    assert fn(gpt2) == 124_439_808, "GPT-2 small has 124,439,808 parameters"
