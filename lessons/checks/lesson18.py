"""Checks of lesson 18 (architectures side by side): ``kv_bytes_per_token`` against
decoder/model/mla.py's count, ``load_balancing_loss`` against the aux loss decoder/model/moe.py's
MoE layer computes, ``greedy_accept`` against decoder/model/decoding.py's speculative sampling rule
at temperature 0; each with the function that would answer it off limits."""

from __future__ import annotations

import numpy as np
from exercises import forbidden

import minigrad as mg
from decoder.model import decoding, mla
from decoder.model.moe import MoE
from decoder.training.config import build_configs
from minigrad.ops import routing


def test_kv_bytes_per_token(fn):
    cases = [(p, {}) for p in ("gpt2", "gpt3", "llama3", "mistral", "deepseek-v2", "granite")]
    cases += [("llama3", dict(n_kv_head=1, n_layer=3)), ("deepseek-v2", dict(kv_lora_rank=24))]
    for preset, overrides in cases:
        config = build_configs(preset, **overrides)[0]
        for dtype_bytes in (4, 2):
            with forbidden(fn, mla, "cache_floats_per_token", "count the cached numbers yourself"):
                got = fn(config, dtype_bytes)
            want = mla.cache_floats_per_token(config) * dtype_bytes
            assert got == want, (
                f"{preset} {overrides or ''} at {dtype_bytes} bytes a number: got {got}, want "
                f"{want} (attention={config.attention!r}, n_kv_head={config.n_kv_head} of "
                f"n_head={config.n_head}: which numbers does one token leave in each layer?)"
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
        with forbidden(fn, routing, "topk_indices", "pick each token's k experts yourself"):
            got = float(fn(probs, k))
        want = float(moe.aux_loss.data)
        assert np.isclose(got, want, rtol=1e-9), (
            f"{n} tokens, {n_experts} experts, top {k}: got {got:.6f}, MoE's aux_loss is "
            f"{want:.6f} (f counts the N k (token, expert) pairs; P is the mean probability)"
        )
    ties = np.full((2, 4), 0.25)  # every expert equally likely: ties go to the lower index
    got = float(fn(ties, 2))
    assert np.isclose(got, 1.0), f"uniform probabilities: got {got}, want 1.0 (E sum f P)"


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
        with forbidden(fn, decoding, "accept_drafts", "compare the drafts yourself"):
            got = [int(t) for t in fn(list(drafts), list(choices))]
        assert got == want, (
            f"drafts {drafts}, the target's greedy tokens {choices}: got {got}, want {want} "
            f"(keep drafts up to the first mismatch, then the target's token at that place)"
        )
