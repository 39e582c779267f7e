"""Checks of lesson 10 (debugging habits): ``grad_rms`` and ``update_ratios``."""

from __future__ import annotations

import math

import numpy as np
from exercises import fresh_seed

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from minigrad.optim import AdamW


def small_model() -> Decoder:
    mg.manual_seed(0)
    return Decoder(ModelConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16))


def random_case() -> tuple[tuple[int, ...], float, np.random.Generator]:
    """A shape and an offset drawn per run: arrays whose mean is far from 0, where the RMS and
    the std differ by far more than rounding."""
    rng = np.random.default_rng(fresh_seed())
    shape = tuple(int(n) for n in rng.integers(1, 7, size=rng.integers(1, 4)))
    return shape, float(rng.uniform(0.5, 3.0) * rng.choice([-1, 1])), rng


def rms64(a: np.ndarray) -> float:
    return math.sqrt(float(np.mean(np.square(a.astype(np.float64)))))


def test_grad_rms(fn):
    model = small_model()
    x = np.arange(16).reshape(2, 8) % 20
    _, loss = model(x, (x + 1) % 20)
    loss.backward()
    model.tok_emb.weight.grad = None  # one parameter without a gradient
    got = fn(list(model.named_parameters()))
    names = [name for name, _ in model.named_parameters()]
    assert sorted(got) == sorted(names), "one entry per parameter name"
    assert got["tok_emb.weight"] == 0.0, "a parameter without a gradient has RMS 0"
    for name, p in model.named_parameters():
        if p.grad is not None:
            want = math.sqrt(float(np.mean(p.grad.astype(np.float64) ** 2)))
            assert math.isclose(got[name], want, rel_tol=1e-5), (
                f"{name}: got {got[name]}, want sqrt(mean(g^2)) = {want} (the RMS, not the std)"
            )
    shape, offset, rng = random_case()
    w = mg.tensor(np.zeros(shape, dtype=np.float32), requires_grad=True)
    w.grad = (offset + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    got, want = fn([("w", w)])["w"], rms64(w.grad)
    assert math.isclose(got, want, rel_tol=1e-5), (
        f"a gradient of shape {shape} around {offset:.2f}: got {got}, want sqrt(mean(g^2)) = "
        f"{want} (the RMS, not the std)"
    )


def test_update_ratios(fn):
    model = small_model()
    opt = AdamW(model.parameters(), lr=1e-2)
    x = np.arange(16).reshape(2, 8) % 20
    before = {name: p.numpy().copy() for name, p in model.named_parameters()}
    _, loss = model(x, (x + 1) % 20)
    loss.backward()
    opt.step()
    after = {name: p.numpy().copy() for name, p in model.named_parameters()}
    got = fn(before, after)

    def rms(a):
        return float(np.sqrt(np.mean(np.square(a))))

    for name in before:
        if rms(before[name]) == 0:
            assert got[name] == math.inf, f"{name} was all zeros: its ratio is inf"
            continue
        want = math.log10(rms(after[name] - before[name]) / rms(before[name]))
        assert math.isclose(got[name], want, rel_tol=1e-6, abs_tol=1e-9), (
            f"{name}: got {got[name]:.4f}, want log10(rms(update) / rms(weights)) = {want:.4f}"
        )
    shape, offset, rng = random_case()
    old = offset + 0.1 * rng.standard_normal(shape)
    new = old + 1e-3 * (offset + rng.standard_normal(shape))  # a step with a mean of its own
    got, want = fn({"w": old}, {"w": new})["w"], math.log10(rms64(new - old) / rms64(old))
    assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9), (
        f"weights of shape {shape} around {offset:.2f}: got {got:.4f}, want "
        f"log10(rms(update) / rms(weights)) = {want:.4f} (the RMS, not the std)"
    )
    one = fn({"w": np.array([1.0, -1.0])}, {"w": np.array([1.001, -1.001])})["w"]
    assert math.isclose(one, -3.0, abs_tol=1e-6), f"a step of 0.001 on weights of 1: got {one}"
