"""The shard workers (decoder.training.shards): a worker's error or death reaches the trainer as a
clear RuntimeError, not a hang; an error in the trainer's own shard (Ctrl-C included) stops the
workers; after any of these the next step starts new workers and takes the right step; the workers
follow the model between steps (a parameter's array replaced, a parameter frozen, a LoRA applied,
train/eval mode); their memory is reported while they run; one shard starts none.

"The right step" is the unsharded step's gradients on the same weights, in float64 to 1e-12.
A fault is put in one process only with a loss that checks ``os.getpid()`` against the
trainer's, on a batch marked with the POISON token (the same loss runs in both processes: it
was there before the fork).
"""

from __future__ import annotations

import multiprocessing
import os
import signal

import numpy as np
import pytest

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.training import shards as shards_module
from decoder.training import step as step_module
from decoder.training.config import TrainConfig
from decoder.training.step import lm_loss, train_step
from minigrad.nn.lora import apply_lora
from minigrad.optim import SGD
from tests.decoder.shard_fixtures import no_workers_left, sharding  # noqa: F401 (autouse)

pytestmark = pytest.mark.skipif(
    not shards_module.fork_available(), reason="no fork here: the shards run in turn"
)

TINY = ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)
POISON = 10  # a token the clean batches never hold: the faulty losses fail on it
ONE, TWO = TrainConfig(shards=1), TrainConfig(shards=2)


def fresh(seed: int = 0) -> Decoder:
    mg.manual_seed(seed)
    return Decoder(TINY).double()


def batch(rows: int = 4, poison_rows: slice | None = None) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.integers(0, POISON, (rows, TINY.block_size))  # (B, T)
    y = rng.integers(0, POISON, (rows, TINY.block_size))
    if poison_rows is not None:
        x[poison_rows, 0] = POISON
    return x, y


def step(model: Decoder, x, y, cfg: TrainConfig = TWO, loss_fn=lm_loss) -> list:
    """One train_step that leaves the weights alone (lr 0); the gradients it left."""
    train_step(model, SGD(model.parameters(), lr=0.0), x, y, cfg, step=1, loss_fn=loss_fn)
    return [None if p.grad is None else p.grad.copy() for p in model.parameters()]


def assert_steps_right(model: Decoder, loss_fn=lm_loss) -> None:
    """A two-shard step's gradients are the unsharded step's on the same weights."""
    x, y = batch()
    sharded = step(model, x, y, TWO, loss_fn)
    assert shards_module._current is not None, "the step ran in no worker"
    unsharded = step(model, x, y, ONE, loss_fn)
    names = [name for name, _ in model.named_parameters()]
    for name, got, want in zip(names, sharded, unsharded, strict=True):
        if want is None:
            assert got is None, name
        else:
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=name)


def worker_procs() -> list:
    return list(shards_module._current.procs)


def assert_ended(procs: list) -> None:
    for proc in procs:
        proc.join(timeout=10)
        assert proc.exitcode is not None, f"{proc.name} is still running"


def faulty(where: str, fault):
    """lm_loss, but ``fault()`` on a POISON batch in the trainer ("trainer") or a worker."""
    trainer = os.getpid()

    def loss_fn(model, x, y):
        here = "trainer" if os.getpid() == trainer else "worker"
        if here == where and (x == POISON).any():
            fault()
        return lm_loss(model, x, y)

    return loss_fn


def raise_value_error():
    raise ValueError("poisoned shard")


# ---- a failure in a worker or in the trainer's shard -------------------------------------------
@pytest.mark.summation_order
def test_a_workers_error_reaches_the_trainer_with_its_traceback(monkeypatch):
    loss_fn = faulty("worker", raise_value_error)
    monkeypatch.setattr(step_module, "lm_loss", loss_fn)  # shard_count shards lm_loss only
    model = fresh()
    step(model, *batch(), loss_fn=loss_fn)
    old = worker_procs()
    with pytest.raises(RuntimeError, match="shard worker 1 failed") as info:
        step(model, *batch(poison_rows=slice(2, None)), loss_fn=loss_fn)  # the worker's rows
    assert "Traceback" in str(info.value) and "ValueError: poisoned shard" in str(info.value)
    assert shards_module._current is None, "the failed workers are still the current ones"
    assert_ended(old)
    assert_steps_right(model, loss_fn)  # with new workers
    assert {p.pid for p in worker_procs()}.isdisjoint(p.pid for p in old)


@pytest.mark.summation_order
@pytest.mark.parametrize("when", ["mid-step", "between steps"])
def test_a_worker_that_dies_gives_a_clear_error_and_the_next_step_new_workers(monkeypatch, when):
    loss_fn = faulty("worker", lambda: os._exit(1))
    monkeypatch.setattr(step_module, "lm_loss", loss_fn)
    model = fresh()
    step(model, *batch(), loss_fn=loss_fn)
    old = worker_procs()
    if when == "mid-step":
        with pytest.raises(RuntimeError, match="shard worker 1 died"):
            step(model, *batch(poison_rows=slice(2, None)), loss_fn=loss_fn)
        assert shards_module._current is None
    else:  # killed while idle (the OOM killer): workers_for sees it and starts new ones
        os.kill(old[0].pid, signal.SIGKILL)
        old[0].join(timeout=10)
    assert_ended(old)
    assert_steps_right(model, loss_fn)
    assert {p.pid for p in worker_procs()}.isdisjoint(p.pid for p in old)


@pytest.mark.summation_order
@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_an_error_in_the_trainers_shard_stops_the_workers(monkeypatch, error):
    def fault():
        raise error("poisoned shard")

    loss_fn = faulty("trainer", fault)
    monkeypatch.setattr(step_module, "lm_loss", loss_fn)
    model = fresh()
    step(model, *batch(), loss_fn=loss_fn)
    old = worker_procs()
    with pytest.raises(error, match="poisoned shard"):
        step(model, *batch(poison_rows=slice(0, 2)), loss_fn=loss_fn)  # the trainer's rows
    # the worker's reply to that step must not be read as the next step's: new workers
    assert shards_module._current is None
    assert_ended(old)
    assert_steps_right(model, loss_fn)


def test_close_ends_the_workers_by_eof():
    # each worker closes its inherited copies of the trainer's pipe ends, or it never sees EOF
    model = fresh()
    step(model, *batch())
    old = worker_procs()
    shards_module._current.close()
    for proc in old:
        proc.join(timeout=10)
        assert proc.exitcode == 0, f"{proc.name} exited with {proc.exitcode}"


# ---- the workers follow the model between steps ----------------------------------------------
@pytest.mark.summation_order
@pytest.mark.parametrize("how", ["assigned", "load_state_dict"])
def test_a_parameter_replaced_between_steps_reaches_the_workers(how):
    model = fresh()
    step(model, *batch())
    pids = [p.pid for p in worker_procs()]
    if how == "assigned":  # a new array, not a write into the shared one
        weight = model.blocks[0].attn.wq.weight
        weight.data = weight.data.copy() * 0.5 + 0.25
    else:
        model.load_state_dict(fresh(seed=1).state_dict())
    assert_steps_right(model)
    assert [p.pid for p in worker_procs()] == pids, "new workers for new values alone"


@pytest.mark.summation_order
@pytest.mark.parametrize("change", ["freeze", "lora"])
def test_a_structure_change_between_steps_starts_new_workers(change):
    model = fresh()
    step(model, *batch())
    old = worker_procs()
    if change == "freeze":
        model.blocks[0].attn.wk.weight.requires_grad_(False)
    else:
        apply_lora(model, r=2, rng=np.random.default_rng(0))
    assert_steps_right(model)
    assert_ended(old)
    assert {p.pid for p in worker_procs()}.isdisjoint(p.pid for p in old)


def test_train_and_eval_mode_reach_the_workers():
    def mode_loss(model, x, y):  # tells the modes apart without dropout's random numbers
        return lm_loss(model, x, y) * (2.0 if model.training else 1.0)

    model = fresh().train()
    x, y = batch()
    xs, ys, scales = np.array_split(x, 2), np.array_split(y, 2), [0.5, 0.5]
    workers = shards_module.workers_for(model, 2, mode_loss)  # forked in train mode
    training = workers.run(xs, ys, scales)
    model.eval()
    assert workers.run(xs, ys, scales)[1] == pytest.approx(training[1] / 2, rel=1e-12)
    model.train()
    assert workers.run(xs, ys, scales)[1] == training[1]


# ---- memory, and no workers for one shard -----------------------------------------------------
def test_the_workers_peak_memory_is_reported_while_they_run():
    assert shards_module.workers_peak_rss_bytes() == 0
    model = fresh()
    step(model, *batch())
    assert shards_module.workers_peak_rss_bytes() > 0
    shards_module._current.close()
    assert shards_module.workers_peak_rss_bytes() == 0


def test_one_shard_starts_no_worker():
    model = fresh()
    step(model, *batch(), cfg=ONE)
    assert shards_module._current is None
    assert not multiprocessing.active_children()
