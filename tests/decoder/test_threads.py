"""CPU training in threads (decoder.step): a micro-batch run as ``TrainConfig.threads`` row
shards takes the step the unsharded micro-batch takes, up to float rounding (the sums run in
another order), on every run the same to the bit; ``shard_count`` falls back to one shard
wherever sharding could change a number; a failing step leaves no shard running and the BLAS
with its own thread count.

The comparisons use SGD in float32 (a step linear in the gradients, so rounding stays rounding)
and AdamW in float64 (Adam divides by the gradients' size: a float32 rounding flip in a
near-zero gradient moves a weight by up to lr, and would hide a real difference in the noise).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import minigrad as mg
from decoder import step as step_module
from decoder.chat import IGNORE_INDEX
from decoder.config import ModelConfig, TrainConfig, build_configs
from decoder.mixed_precision import LossScaler
from decoder.model import Decoder
from decoder.step import TrainingDiverged, lm_loss, shard_count, train_step
from decoder.train import parse_overrides
from minigrad import backend
from minigrad.nn import Dropout
from minigrad.optim import SGD, AdamW, param_groups_for_decay

TINY = ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)
# shakespeare-char's shape, shrunk: 65 characters, 2 blocks, 32 wide, 16 tokens of context
SHAKESPEARE = ModelConfig(vocab_size=65, block_size=16, n_layer=2, n_head=4, n_embd=32)
LLAMA = ModelConfig(
    vocab_size=65,
    block_size=16,
    n_layer=2,
    n_head=4,
    n_embd=32,
    ffn="swiglu",
    pos="rope",
    norm="rms",
)
CONFIGS = {"tiny": TINY, "shakespeare-gelu": SHAKESPEARE, "swiglu-rope-rms": LLAMA}


@pytest.fixture(autouse=True)
def sharding(monkeypatch):
    """Sharding on wherever this runs: a BLAS whose count we cannot set, or one core, would
    otherwise turn it off (or run the shards one after another), and the tests would compare
    the unsharded step with itself. (Here the BLAS count is only not changed, not wrong.)"""
    if not backend.blas_threads_settable():
        monkeypatch.setattr(step_module, "blas_threads_settable", lambda: True)
    if backend.cpu_count() < 2:
        monkeypatch.setattr(step_module, "cpu_count", lambda: 2)


def batch(config: ModelConfig, rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (rows, config.block_size)  # (B, T)
    return rng.integers(0, config.vocab_size, shape), rng.integers(0, config.vocab_size, shape)


def trained(
    config: ModelConfig,
    x: np.ndarray,
    y: np.ndarray,
    threads: int,
    steps: int = 3,
    grad_accum_steps: int = 1,
    float64: bool = False,
) -> tuple[list[float], Decoder]:
    """A fresh seeded model after ``steps`` train_steps on (x, y): (the losses, the model).
    SGD in float32, AdamW in float64 (see the module's docstring)."""
    mg.manual_seed(0)
    model = Decoder(config)
    if float64:
        model.double()
        optimizer = AdamW(param_groups_for_decay(model, 0.1), lr=1e-2, weight_decay=0.1)
    else:
        optimizer = SGD(model.parameters(), lr=0.5)
    cfg = TrainConfig(threads=threads, grad_accum_steps=grad_accum_steps, grad_clip=1.0)
    rows = len(y) // grad_accum_steps
    assert shard_count(model, cfg, y[:rows]) == min(threads, rows), "sharding is off"
    losses = [train_step(model, optimizer, x, y, cfg, step=i + 1) for i in range(steps)]
    return losses, model


def assert_same_run(a, b, rtol: float, atol: float) -> None:
    (losses_a, model_a), (losses_b, model_b) = a, b
    np.testing.assert_allclose(losses_b, losses_a, rtol=rtol, atol=atol, err_msg="losses")
    named = zip(model_a.named_parameters(), model_b.parameters(), strict=True)
    for (name, p_a), p_b in named:
        np.testing.assert_allclose(p_b.grad, p_a.grad, rtol=rtol, atol=atol, err_msg=name)
        np.testing.assert_allclose(p_b.data, p_a.data, rtol=rtol, atol=atol, err_msg=name)


def assert_identical_run(a, b) -> None:
    (losses_a, model_a), (losses_b, model_b) = a, b
    assert losses_a == losses_b
    named = zip(model_a.named_parameters(), model_b.parameters(), strict=True)
    for (name, p_a), p_b in named:
        assert np.array_equal(p_a.data, p_b.data), name
        assert np.array_equal(p_a.grad, p_b.grad), name


# ---- two shards take the unsharded step ------------------------------------------------------
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("rows", [4, 5])  # 5: shards of 3 and 2 rows, weighted 3/5 and 2/5
def test_two_threads_take_the_one_thread_steps_float32(name, rows):
    x, y = batch(CONFIGS[name], rows)
    one, two = trained(CONFIGS[name], x, y, 1), trained(CONFIGS[name], x, y, 2)
    assert_same_run(one, two, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["shakespeare-gelu", "swiglu-rope-rms"])
@pytest.mark.parametrize("rows", [4, 5])
def test_two_threads_take_the_one_thread_steps_float64_adamw(name, rows):
    x, y = batch(CONFIGS[name], rows)
    one = trained(CONFIGS[name], x, y, 1, float64=True)
    two = trained(CONFIGS[name], x, y, 2, float64=True)
    assert_same_run(one, two, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["shakespeare-gelu", "swiglu-rope-rms"])
@pytest.mark.parametrize("rows", [4, 6])  # 6: micro-batches of 3 rows, shards of 2 and 1
def test_two_threads_with_gradient_accumulation(name, rows):
    x, y = batch(CONFIGS[name], rows)
    one = trained(CONFIGS[name], x, y, 1, grad_accum_steps=2, float64=True)
    two = trained(CONFIGS[name], x, y, 2, grad_accum_steps=2, float64=True)
    assert_same_run(one, two, rtol=1e-10, atol=1e-12)


def test_ignored_targets_weight_each_shard_by_its_targets_not_its_rows():
    # the SFT case: the prompts' targets are -100; the first shard keeps 3 targets, the second
    # all 32, so equal weights (or weights by rows) would give the first's 3 ten times too much
    config = SHAKESPEARE
    x, y = batch(config, 4)
    y[0, :] = IGNORE_INDEX
    y[1, 3:] = IGNORE_INDEX
    y[2, :5] = IGNORE_INDEX  # and some in the second shard
    one = trained(config, x, y, 1, float64=True)
    two = trained(config, x, y, 2, float64=True)
    assert_same_run(one, two, rtol=1e-10, atol=1e-12)
    # and the loss is the mean over the micro-batch's targets, as the unsharded forward says
    mg.manual_seed(0)
    model = Decoder(config).double()
    expected = lm_loss(model, x, y).item()
    mg.manual_seed(0)
    model = Decoder(config).double()
    got = train_step(model, SGD(model.parameters(), lr=0.0), x, y, TrainConfig(threads=2), 1)
    assert got == pytest.approx(expected, rel=1e-12, abs=0)


# ---- the same numbers on every run -----------------------------------------------------------
def test_two_threads_are_bit_identical_run_to_run():
    x, y = batch(SHAKESPEARE, 8)
    first = trained(SHAKESPEARE, x, y, 2)
    for _ in range(2):
        assert_identical_run(first, trained(SHAKESPEARE, x, y, 2))


def test_on_fewer_cores_than_shards_the_shards_run_in_turn_to_the_same_bits(monkeypatch):
    x, y = batch(SHAKESPEARE, 5)
    threaded = trained(SHAKESPEARE, x, y, 2)

    class NoPool:  # the fallback must not hand a shard to a thread
        _max_workers = 64

        def submit(self, *args, **kwargs):
            raise AssertionError("a shard was submitted to a thread on one core")

    monkeypatch.setattr(step_module, "cpu_count", lambda: 1)
    monkeypatch.setattr(step_module, "_pool", NoPool())
    in_turn = trained(SHAKESPEARE, x, y, 2)
    assert_identical_run(threaded, in_turn)


# ---- shard_count says 1 wherever sharding could change a number -------------------------------
def fresh(**overrides) -> Decoder:
    mg.manual_seed(0)
    return Decoder(ModelConfig(**{**TINY.__dict__, **overrides}))


Y4 = np.zeros((4, TINY.block_size), dtype=np.int64)  # (B, T): four rows of targets
TWO = TrainConfig(threads=2)


def test_shard_count_shards_a_plain_micro_batch():
    assert shard_count(fresh(), TWO, Y4) == 2
    assert shard_count(fresh(), TrainConfig(threads=3), Y4) == 3
    assert shard_count(fresh(), TrainConfig(threads=8), Y4) == 4  # at most one shard per row


@pytest.mark.parametrize(
    "case",
    ["threads=1", "one row", "dist", "scaler", "another loss", "moe", "an empty shard"],
)
def test_shard_count_is_1(case):
    model, cfg, y = fresh(), TWO, Y4
    kwargs = {}
    if case == "threads=1":
        cfg = TrainConfig(threads=1)
    elif case == "one row":
        y = Y4[:1]
    elif case == "dist":
        kwargs["dist"] = object()  # any DataParallel: the ranks hold the cores
    elif case == "scaler":
        kwargs["scaler"] = LossScaler()
    elif case == "another loss":
        kwargs["loss_fn"] = lambda model, x, y: lm_loss(model, x, y)  # the same math, unknown
    elif case == "moe":
        model = fresh(ffn="moe", n_experts=2, top_k=1)
    elif case == "an empty shard":
        y = Y4.copy()
        y[:2] = IGNORE_INDEX  # the first shard's rows have no target to average over
    assert shard_count(model, cfg, y, **kwargs) == 1


def test_shard_count_is_1_where_the_blas_count_cannot_be_set(monkeypatch):
    monkeypatch.setattr(step_module, "blas_threads_settable", lambda: False)
    assert shard_count(fresh(), TWO, Y4) == 1


def test_shard_count_is_1_on_another_device(monkeypatch):
    model = fresh()
    monkeypatch.setattr(Decoder, "device", property(lambda self: "cuda"))
    assert shard_count(model, TWO, Y4) == 1


def test_shard_count_is_1_with_a_dropout_layer_while_training_only():
    model = fresh()
    dropouts = [m for m in model.modules() if isinstance(m, Dropout)]
    assert dropouts, "the model has no Dropout layer to switch on"
    dropouts[-1].p = 0.1  # one layer's own p, with config.dropout still 0
    model.train()
    assert shard_count(model, TWO, Y4) == 1
    model.eval()  # no random numbers drawn in eval
    assert shard_count(model, TWO, Y4) == 2


def test_shard_count_is_1_with_attention_dropout_while_training_only():
    model = fresh(dropout=0.1)
    for m in model.modules():
        if isinstance(m, Dropout):  # leave only the dropout drawn inside the attention op
            m.p = 0.0
    model.train()
    assert shard_count(model, TWO, Y4) == 1
    model.eval()
    assert shard_count(model, TWO, Y4) == 2


def test_an_unsharded_case_runs_the_plain_step(monkeypatch):
    def no_sharding(*args, **kwargs):
        raise AssertionError("a micro-batch was sharded where shard_count said 1")

    monkeypatch.setattr(step_module, "_sharded_pass", no_sharding)
    model = fresh()
    x, y = batch(TINY, 4)
    train_step(model, SGD(model.parameters(), lr=0.1), x, y, TrainConfig(threads=1), step=1)
    with pytest.raises(AssertionError, match="sharded"):  # and the spy would have seen one
        train_step(model, SGD(model.parameters(), lr=0.1), x, y, TWO, step=1)


# ---- a failing step: no shard left running, the BLAS count given back --------------------------
def shard_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("decoder-shard")}


def test_a_nan_loss_raises_with_two_threads_and_leaves_the_weights_and_threads_alone():
    x, y = batch(TINY, 4)
    model = fresh()
    optimizer = SGD(model.parameters(), lr=0.1)
    train_step(model, optimizer, x, y, TWO, step=1)  # the pool's threads, made once
    threads_before = shard_threads()
    model.lm_head.weight.data[...] = np.nan
    weights = [p.data.copy() for p in model.parameters()]
    with pytest.raises(TrainingDiverged, match="at step 2"):
        train_step(model, optimizer, x, y, TWO, step=2)
    for p, before in zip(model.parameters(), weights, strict=True):
        np.testing.assert_array_equal(p.data, before)  # NaN where it was: equal_nan by default
    assert shard_threads() <= threads_before, "a failing step started new shard threads"
    pool = step_module._pool
    assert pool._work_queue.empty(), "a shard is still queued after the step raised"


def test_a_shard_that_raises_is_not_left_running_past_the_step(monkeypatch):
    # the first shard (this thread) fails at once; the other, slower, must have finished
    # before train_step gives the error back, or it would write gradients into the next step
    finished = threading.Event()

    def failing_loss(model, x, y):
        if threading.current_thread() is threading.main_thread():
            raise ValueError("shard 0 failed")
        time.sleep(0.2)
        finished.set()
        return lm_loss(model, x, y)

    monkeypatch.setattr(step_module, "lm_loss", failing_loss)
    model = fresh()
    x, y = batch(TINY, 4)
    with pytest.raises(ValueError, match="shard 0 failed"):
        train_step(model, SGD(model.parameters(), lr=0.1), x, y, TWO, 1, loss_fn=failing_loss)
    assert finished.is_set(), "train_step returned while a shard was still running"


@pytest.mark.skipif(
    not backend.blas_threads_settable(), reason="NumPy's BLAS here is not a settable OpenBLAS"
)
def test_each_shard_runs_on_a_one_thread_blas_and_the_step_gives_the_count_back(monkeypatch):
    if backend.cpu_count() < 2:
        pytest.skip("one core: the shards run in turn, with the BLAS's own count")
    get = backend._blas[1]
    before = get()
    seen = []

    def counting_loss(model, x, y):
        seen.append(get())
        return lm_loss(model, x, y)

    monkeypatch.setattr(step_module, "lm_loss", counting_loss)
    model = fresh()
    x, y = batch(TINY, 4)
    train_step(model, SGD(model.parameters(), lr=0.1), x, y, TWO, 1, loss_fn=counting_loss)
    assert seen == [1, 1]
    assert get() == before
    model.lm_head.weight.data[...] = np.nan  # and after a step that raises
    with pytest.raises(TrainingDiverged):
        train_step(model, SGD(model.parameters(), lr=0.1), x, y, TWO, 2, loss_fn=counting_loss)
    assert get() == before


# ---- the setting --------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_threads_must_be_a_positive_whole_number(bad):
    with pytest.raises(ValueError, match="TrainConfig.threads"):
        TrainConfig(threads=bad)


def test_threads_defaults_to_2_and_parses_from_the_command_line():
    assert TrainConfig().threads == 2
    assert parse_overrides(["--threads=1"]) == {"threads": "1"}
    _, train_cfg = build_configs("shakespeare-char", parse_overrides(["--threads", "3"]))
    assert train_cfg.threads == 3 and isinstance(train_cfg.threads, int)
    with pytest.raises(ValueError, match="threads"):
        build_configs("shakespeare-char", {"threads": "0"})
