"""Checks of lesson 18 (architectures side by side): ``kv_bytes_per_token`` against
decoder/model/mla.py's count, ``load_balancing_loss`` against the aux loss decoder/model/moe.py's
MoE layer computes, ``greedy_accept`` against decoder/model/decoding.py's speculative sampling rule
at temperature 0; each with the function that would answer it off limits."""

from __future__ import annotations

import numpy as np
from exercises import fresh_seed

import minigrad as mg
from decoder.model import decoding, mla
from decoder.model.config import ModelConfig
from decoder.model.moe import MoE
from decoder.training.config import build_configs
from minigrad.ops.routing import topk_indices

ALLOWED = {"kv_bytes_per_token": ("decoder.model.config.ModelConfig.head_size",)}


def fresh_rng() -> np.random.Generator:
    """A generator seeded anew on every run, so no answer can learn the checked cases."""
    return np.random.default_rng(fresh_seed())


def random_config(g: np.random.Generator) -> ModelConfig:
    """A small config no table of presets holds: MHA, GQA, MQA or MLA, any sizes."""
    n_head = int(g.choice([2, 4, 6, 8]))
    settings = dict(
        vocab_size=50,
        block_size=16,
        n_layer=int(g.integers(1, 9)),
        n_head=n_head,
        n_embd=n_head * int(g.choice([8, 12, 16])),
        pos="rope",
    )
    if g.random() < 0.3:
        rank, rope = int(g.choice([8, 16, 24, 40])), int(g.choice([4, 8]))
        return ModelConfig(**settings, attention="mla", kv_lora_rank=rank, rope_head_dim=rope)
    n_kv_head = int(g.choice([d for d in range(1, n_head + 1) if n_head % d == 0]))
    window = int(g.integers(2, 16)) if g.random() < 0.3 else None  # a window caches as much
    return ModelConfig(**settings, n_kv_head=n_kv_head, window=window)


def test_kv_bytes_per_token(fn):
    cases = [(p, {}) for p in ("gpt2", "gpt3", "llama3", "mistral", "deepseek-v2", "granite")]
    cases += [("llama3", dict(n_kv_head=1, n_layer=3)), ("deepseek-v2", dict(kv_lora_rank=24))]
    configs = [(f"{p} {o or ''}", build_configs(p, **o)[0]) for p, o in cases]
    g = fresh_rng()
    configs += [("a random config", random_config(g)) for _ in range(4)]
    for name, config in configs:
        for dtype_bytes in (4, 2):
            got = fn(config, dtype_bytes)
            want = mla.cache_floats_per_token(config) * dtype_bytes
            assert got == want, (
                f"{name} at {dtype_bytes} bytes a number: got {got}, want {want} (n_layer="
                f"{config.n_layer}, n_embd={config.n_embd}, kv_lora_rank={config.kv_lora_rank}, "
                f"rope_head_dim={config.rope_head_dim}, window={config.window}, attention="
                f"{config.attention!r}, n_kv_head={config.n_kv_head} of n_head={config.n_head}: "
                f"which numbers does one token leave in each layer?)"
            )


def test_load_balancing_loss(fn):
    mg.manual_seed(0)
    rng = np.random.default_rng(0)
    for n_experts, k, n in ((4, 1, 6), (8, 2, 10), (8, 2, 1), (5, 3, 7)):
        moe = MoE(n_embd=8, n_experts=n_experts, top_k=k, hidden=4).double()
        x = rng.standard_normal((n, 8))
        moe(mg.Tensor(x))
        logits = x @ moe.router.weight.data.T  # (N, C) -> (N, E): the router, without bias
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        got = float(fn(probs, k))
        want = float(moe.aux_loss.data)
        assert np.isclose(got, want, rtol=1e-9), (
            f"{n} tokens, {n_experts} experts, top {k}: got {got:.6f}, MoE's aux_loss is "
            f"{want:.6f} (f counts the N k (token, expert) pairs; P is the mean probability)"
        )
    ties = np.full((2, 4), 0.25)  # every expert equally likely: any choice gives 1.0
    got = float(fn(ties, 2))
    assert np.isclose(got, 1.0), f"uniform probabilities: got {got}, want 1.0 (E sum f P)"
    # ties that matter: the tied experts have different mean probabilities P, so which one
    # the tie goes to changes f and the loss. The library's top-k sends ties to the lower index.
    g = fresh_rng()
    drawn = g.dirichlet(np.ones(5), size=6)  # rows 3-5 give experts 1 and 3 different P
    drawn[:3, [1, 3]] = drawn[:3].max(-1, keepdims=True)  # rows 0-2: 1 and 3 tie for the top
    drawn /= drawn.sum(-1, keepdims=True)
    for probs, k in (
        (np.array([[0.4, 0.4, 0.2], [0.1, 0.3, 0.6]]), 1),
        (np.array([[0.3, 0.3, 0.3, 0.1], [0.1, 0.2, 0.3, 0.4]]), 2),
        (drawn, 1),
    ):
        N, E = probs.shape
        share = np.bincount(topk_indices(probs, k).ravel(), minlength=E) / (N * k)
        want = float(E * (share * probs.mean(0)).sum())
        got = float(fn(probs.copy(), k))
        assert np.isclose(got, want, rtol=1e-9), (
            f"tied probabilities {probs.round(4).tolist()}, top {k}: got {got:.6f}, want "
            f"{want:.6f}: a tie goes to the lower expert index (as the library's top-k)"
        )


def test_greedy_accept(fn):
    rng = np.random.default_rng(0)
    cases = [
        ([5, 7, 9], [5, 7, 2, 4]),
        ([1, 2], [1, 2, 3]),
        ([4], [6, 6]),
        ([3, 1, 3], [2, 1, 3, 0]),
    ]
    cases += [
        (rng.integers(0, 3, k).tolist(), rng.integers(0, 3, k + 1).tolist())
        for k in (1, 2, 4, 6)
        for _ in range(5)
    ]
    for drafts, choices in cases:
        # the library's rule with one-hot distributions: temperature 0 for both models
        p, q = np.eye(10)[choices], np.eye(10)[drafts]
        want = decoding.accept_drafts(p, q, list(drafts), np.random.default_rng(0))
        got = [int(t) for t in fn(list(drafts), list(choices))]
        assert got == want, (
            f"drafts {drafts}, the target's greedy tokens {choices}: got {got}, want {want} "
            f"(keep drafts up to the first mismatch, then the target's token at that place)"
        )
