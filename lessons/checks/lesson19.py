"""Checks of lesson 19 (from a base model to an assistant): ``masked_targets`` against
decoder.post.chat's ``pad_batch``, ``response_logp`` against cross_entropy, and ``dpo_loss``
against decoder.post.losses's fused DPO loss, each with the function that would answer it
off limits."""

from __future__ import annotations

import math

import numpy as np

import minigrad as mg
from decoder.model.model import IGNORE_INDEX
from decoder.post import losses
from decoder.post.chat import pad_batch
from minigrad import functional as F


def test_masked_targets(fn):
    rng = np.random.default_rng(0)
    cases = [([2, 7, 3, 8, 9, 4], 3), ([2, 3, 4], 2), ([2, 5, 5, 3, 4], 4)]
    cases += [(rng.integers(0, 50, n).tolist(), int(rng.integers(2, n))) for n in range(3, 12)]
    for ids, n_prompt in cases:
        want_x, want_y = pad_batch([(ids, n_prompt)], pad_id=0)
        x, y = fn(list(ids), n_prompt)
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape == (len(ids) - 1,), (
            f"a turn of {len(ids)} ids has {len(ids) - 1} inputs and targets, got {x.shape}, "
            f"{y.shape}"
        )
        assert np.array_equal(x, want_x[0]), f"ids {ids}: inputs {x.tolist()}, want {want_x[0]}"
        assert np.array_equal(y, want_y[0]), (
            f"ids {ids}, prompt of {n_prompt}: targets {y.tolist()}, want {want_y[0].tolist()} "
            f"(target t is token t + 1; the first response token is target n_prompt - 1)"
        )
    y = np.asarray(fn([2, 7, 3, 8, 9, 4], 3)[1])
    assert (y == IGNORE_INDEX).sum() == 2, "the prompt's 3 tokens predict 2 prompt tokens"


def test_response_logp(fn):
    rng = np.random.default_rng(1)
    N, T, V = 3, 6, 11
    logits = rng.standard_normal((N, T, V)) * 3
    y = rng.integers(0, V, (N, T))
    y[0, :2] = IGNORE_INDEX  # a prompt
    y[1, 4:] = IGNORE_INDEX  # padding
    y[2, :] = IGNORE_INDEX  # a row with no response at all
    want = -F.cross_entropy(mg.tensor(logits), y, reduction="none").numpy().sum(axis=-1)
    got = np.asarray(fn(logits.copy(), y.copy()), dtype=np.float64)
    big = np.asarray(fn(logits * 1000, y), dtype=np.float64)
    assert got.shape == (N,), f"one log-likelihood per row: shape {got.shape}, want ({N},)"
    assert np.allclose(got, want, atol=1e-6), (
        f"got {got}, want {want}: the sum (not the mean) of log p(target) over kept targets"
    )
    assert got[2] == 0.0, "a row whose targets are all ignored has log-likelihood 0"
    assert np.all(np.isfinite(big)), "logits of 1000s: subtract the row's max before exp"


def test_dpo_loss(fn):
    rng = np.random.default_rng(2)
    pc, pr, rc, rr = (-rng.uniform(5, 40, 8) for _ in range(4))
    for beta in (0.1, 0.5, 2.0):
        args = (mg.tensor(a, dtype="float64") for a in (pc, pr, rc, rr))
        want = losses.dpo_loss(*args, beta=beta)
        got = float(fn(pc, pr, rc, rr, beta))
        assert math.isclose(got, want.item(), rel_tol=1e-9), (
            f"beta={beta}: got {got}, want {want.item()}: the mean of "
            f"-log sigmoid(beta ((pc - rc) - (pr - rr)))"
        )
    same = fn(pc, pr, pc, pr, 0.1)
    assert math.isclose(same, math.log(2)), "a policy equal to its reference has loss log 2"
    one = np.array([0.0])
    far = fn(one - 1e4, one, one, one, 1.0)  # z = -10000: a confidently wrong ranking
    assert math.isclose(far, 1e4), f"z = -1e4 must give a loss of 1e4, got {far} (overflow?)"
    assert fn(one + 1e4, one, one, one, 1.0) < 1e-300, "z = +1e4 gives a loss of ~0"
