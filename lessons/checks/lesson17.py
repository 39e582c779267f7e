"""Checks of lesson 17 (training past one process): ``global_mean_grad``, ``zero_slices`` and
``update_scale``, each against the library (a float64 model's gradients, decoder.training.dist's
ZeRO-1 slices, decoder.training.mixed_precision's LossScaler), with the function that would answer
it off limits."""

from __future__ import annotations

from itertools import pairwise
from types import SimpleNamespace

import numpy as np
from exercises import fresh_seed

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.training.dist import DataParallel
from decoder.training.mixed_precision import LossScaler

REFUSED = {"global_mean_grad": (np.average,)}  # weight the ranks' means yourself


def fresh_rng() -> np.random.Generator:
    """A generator seeded anew on every run, so no answer can learn the checked cases."""
    return np.random.default_rng(fresh_seed())


def flat_grad(model: Decoder, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Every parameter's gradient of the mean loss over the rows of ``x``, end to end."""
    model.zero_grad()
    _, loss = model(x, y)
    loss.backward()
    return np.concatenate([p.grad.ravel() for p in model.parameters()])


def test_global_mean_grad(fn):
    mg.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=16))
    model = model.double()
    batch = np.random.default_rng(0).integers(0, 13, size=(2, 9, 8))  # (x|y, rows, T)
    whole = flat_grad(model, batch[0], batch[1])
    cut = np.sort(fresh_rng().choice(np.arange(1, 9), size=2, replace=False))
    drawn = np.diff([0, *cut.tolist(), 9]).tolist()  # 9 rows over 3 ranks, cut at random
    for rows in ([4, 5], [1, 3, 5], [9], [2, 2, 2, 3], drawn):
        ends = np.cumsum([0, *rows])
        grads = [flat_grad(model, batch[0][a:b], batch[1][a:b]) for a, b in pairwise(ends)]
        got = np.asarray(fn(grads, rows))
        assert got.shape == whole.shape, f"ranks of {rows} rows: shape {got.shape}"
        np.testing.assert_allclose(
            got,
            whole,
            rtol=1e-10,
            atol=1e-14,
            err_msg=f"ranks of {rows} rows: not the gradient of the mean over all "
            f"{sum(rows)} rows (a rank with more rows carries more of the mean)",
        )


def library_slices(sizes: list[int], n_ranks: int, rank: int) -> list[tuple[int, int, int]]:
    """decoder.training.dist's slices of ``rank``, from a DataParallel built without MPI."""
    dist = object.__new__(DataParallel)  # _pieces reads only the rank and the size
    dist.rank, dist.size = rank, n_ranks
    params = [SimpleNamespace(data=np.empty(n)) for n in sizes]
    optimizer = SimpleNamespace(param_groups=[{"params": params}])
    return [(i, lo, hi) for i, _, _, _, (lo, hi) in dist._pieces(optimizer)]


def test_zero_slices(fn):
    cases = [([10, 1, 7, 6], 3), ([3, 4], 2), ([5], 4), ([4, 4], 1), ([1, 1, 1, 1, 1], 2)]
    g = fresh_rng()
    cases += [(g.integers(1, 30, int(g.integers(1, 7))).tolist(), int(g.integers(1, 6)))]
    for sizes, n_ranks in cases:
        got = [[tuple(int(v) for v in s) for s in fn(sizes, n_ranks, r)] for r in range(n_ranks)]
        owners = [np.zeros(n, dtype=int) for n in sizes]
        for pieces in got:
            for i, lo, hi in pieces:
                owners[i][lo:hi] += 1
        for i, owned in enumerate(owners):
            assert (owned == 1).all(), (
                f"sizes {sizes}, {n_ranks} ranks: elements {np.flatnonzero(owned != 1).tolist()} "
                f"of parameter {i} are held by {owned[owned != 1].tolist()} ranks; each element "
                "belongs to exactly one rank"
            )
        shard = -(-sum(sizes) // n_ranks)
        for r, pieces in enumerate(got):
            held = sum(hi - lo for _, lo, hi in pieces)
            assert held <= shard, (
                f"sizes {sizes}, {n_ranks} ranks: rank {r} holds {held} elements; equal slices "
                f"of ceil({sum(sizes)} / {n_ranks}) = {shard} keep every rank's memory at 1/N"
            )
            want = library_slices(sizes, n_ranks, r)
            assert pieces == want, f"sizes {sizes}, {n_ranks} ranks, rank {r}: {pieces} != {want}"


def test_update_scale(fn):
    flags = [True, True, True, True, False, True, True, False, False, True, True, True, True]
    g = fresh_rng()
    flags += (g.random(30) < 0.8).tolist()  # a run no fixed table holds
    for growth_interval in (1, 3, int(g.integers(2, 6))):
        scaler = LossScaler("float16", init_scale=1024.0, growth_interval=growth_interval)
        scale, clean = scaler.scale, scaler.clean_steps
        for i, finite in enumerate(flags):
            grad = np.array([1.0, 2.0 if finite else np.inf])
            take = scaler.update([SimpleNamespace(grad=grad)])
            scale, clean, step = fn(scale, clean, finite, growth_interval)
            want = (scaler.scale, scaler.clean_steps, take)
            assert (scale, clean, step) == want, (
                f"growth_interval {growth_interval}, step {i} ({'clean' if finite else 'overflow'}"
                f"): got (scale, clean_steps, take) = {(scale, clean, step)}, want {want}"
            )
