"""CPU training in row shards (decoder.training.step): a micro-batch run as ``TrainConfig.shards``
row shards, shard 0 here and the others in worker processes (decoder.training.shards), takes the
step the unsharded micro-batch takes, up to float rounding (the sums run in another order), on every
run the same to the bit, and the same bits where the shards run one after another here (fewer cores
than shards, or no fork); ``shard_count`` falls back to one shard wherever sharding could change a
number; a step that raises leaves the workers as they were and the BLAS with its own thread count.
The worker processes' own failures are tests/decoder/test_shard_workers.py's.

The comparisons use SGD in float32 (a step linear in the gradients, so rounding stays rounding)
and AdamW in float64 (Adam divides by the gradients' size: a float32 rounding flip in a
near-zero gradient moves a weight by up to lr, and would hide a real difference in the noise).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import minigrad as mg
from decoder.cli import parse_overrides
from decoder.model.config import ModelConfig
from decoder.model.model import IGNORE_INDEX, Decoder
from decoder.training import shards as shards_module
from decoder.training import step as step_module
from decoder.training.config import TrainConfig, build_configs
from decoder.training.mixed_precision import LossScaler
from decoder.training.step import TrainingDiverged, lm_loss, shard_count, train_step
from minigrad import cpu_tuning
from minigrad.nn import Dropout
from minigrad.optim import SGD, AdamW, param_groups_for_decay
from tests.decoder.shard_fixtures import no_workers_left, sharding  # noqa: F401 (autouse)

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


def batch(config: ModelConfig, rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (rows, config.block_size)  # (B, T)
    return rng.integers(0, config.vocab_size, shape), rng.integers(0, config.vocab_size, shape)


def trained(
    config: ModelConfig,
    x: np.ndarray,
    y: np.ndarray,
    shards: int,
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
    cfg = TrainConfig(shards=shards, grad_accum_steps=grad_accum_steps, grad_clip=1.0)
    rows = len(y) // grad_accum_steps
    assert shard_count(model, cfg, y[:rows]) == min(shards, rows), "sharding is off"
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
@pytest.mark.summation_order
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("rows", [4, 5])  # 5: shards of 3 and 2 rows, weighted 3/5 and 2/5
def test_two_shards_take_the_unsharded_steps_float32(name, rows):
    x, y = batch(CONFIGS[name], rows)
    one, two = trained(CONFIGS[name], x, y, 1), trained(CONFIGS[name], x, y, 2)
    assert_same_run(one, two, rtol=1e-5, atol=1e-6)


@pytest.mark.summation_order
@pytest.mark.parametrize("name", ["shakespeare-gelu", "swiglu-rope-rms"])
@pytest.mark.parametrize("rows", [4, 5])
def test_two_shards_take_the_unsharded_steps_float64_adamw(name, rows):
    x, y = batch(CONFIGS[name], rows)
    one = trained(CONFIGS[name], x, y, 1, float64=True)
    two = trained(CONFIGS[name], x, y, 2, float64=True)
    assert_same_run(one, two, rtol=1e-10, atol=1e-12)


@pytest.mark.summation_order
@pytest.mark.parametrize("name", ["shakespeare-gelu", "swiglu-rope-rms"])
@pytest.mark.parametrize("rows", [4, 6])  # 6: micro-batches of 3 rows, shards of 2 and 1
def test_two_shards_with_gradient_accumulation(name, rows):
    x, y = batch(CONFIGS[name], rows)
    one = trained(CONFIGS[name], x, y, 1, grad_accum_steps=2, float64=True)
    two = trained(CONFIGS[name], x, y, 2, grad_accum_steps=2, float64=True)
    assert_same_run(one, two, rtol=1e-10, atol=1e-12)


@pytest.mark.summation_order
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
    got = train_step(model, SGD(model.parameters(), lr=0.0), x, y, TrainConfig(shards=2), 1)
    assert got == pytest.approx(expected, rel=1e-12, abs=0)


# ---- the same numbers on every run -----------------------------------------------------------
def test_two_shards_are_bit_identical_run_to_run():
    x, y = batch(SHAKESPEARE, 8)
    first = trained(SHAKESPEARE, x, y, 2)
    for _ in range(2):
        assert_identical_run(first, trained(SHAKESPEARE, x, y, 2))


def no_workers(*args, **kwargs):
    raise AssertionError("a shard went to a worker process where they run in turn")


@pytest.mark.parametrize("why", ["one core", "no fork"])
@pytest.mark.parametrize("float64", [False, True])
def test_where_no_workers_run_the_shards_run_in_turn_to_the_same_bits(monkeypatch, why, float64):
    if not shards_module.fork_available():
        pytest.skip("no fork here: the shards always run in turn")
    x, y = batch(SHAKESPEARE, 5)
    in_workers = trained(SHAKESPEARE, x, y, 2, float64=float64)
    assert len(shards_module._current.procs) == 1, "the shards did not run in a worker"
    shards_module._current.close()
    if why == "one core":
        monkeypatch.setattr(step_module, "cpu_count", lambda: 1)
    else:
        monkeypatch.setattr(step_module, "fork_available", lambda: False)
    monkeypatch.setattr(step_module, "workers_for", no_workers)
    in_turn = trained(SHAKESPEARE, x, y, 2, float64=float64)
    assert_identical_run(in_workers, in_turn)


# ---- shard_count says 1 wherever sharding could change a number -------------------------------
def fresh(**overrides) -> Decoder:
    mg.manual_seed(0)
    return Decoder(ModelConfig(**{**TINY.__dict__, **overrides}))


Y4 = np.zeros((4, TINY.block_size), dtype=np.int64)  # (B, T): four rows of targets
TWO = TrainConfig(shards=2)


def test_shard_count_shards_a_plain_micro_batch():
    assert shard_count(fresh(), TWO, Y4) == 2
    assert shard_count(fresh(), TrainConfig(shards=3), Y4) == 3
    assert shard_count(fresh(), TrainConfig(shards=8), Y4) == 4  # at most one shard per row


@pytest.mark.parametrize(
    "case",
    ["shards=1", "one row", "dist", "scaler", "another loss", "moe", "an empty shard"],
)
def test_shard_count_is_1(case):
    model, cfg, y = fresh(), TWO, Y4
    kwargs = {}
    if case == "shards=1":
        cfg = TrainConfig(shards=1)
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
    train_step(model, SGD(model.parameters(), lr=0.1), x, y, TrainConfig(shards=1), step=1)
    with pytest.raises(AssertionError, match="sharded"):  # and the spy would have seen one
        train_step(model, SGD(model.parameters(), lr=0.1), x, y, TWO, step=1)


# ---- a failing step: the workers as they were, the BLAS count given back ----------------------
def test_a_nan_loss_raises_with_two_shards_and_leaves_the_weights_and_workers_alone():
    x, y = batch(TINY, 4)
    model = fresh()
    optimizer = SGD(model.parameters(), lr=0.1)
    train_step(model, optimizer, x, y, TWO, step=1)
    workers = shards_module._current
    model.lm_head.weight.data[...] = np.nan  # in shared memory: the worker's loss is NaN too
    weights = [p.data.copy() for p in model.parameters()]
    with pytest.raises(TrainingDiverged, match="at step 2"):
        train_step(model, optimizer, x, y, TWO, step=2)
    for p, before in zip(model.parameters(), weights, strict=True):
        np.testing.assert_array_equal(p.data, before)  # NaN where it was: equal_nan by default
    # every shard answered before the error: the same workers serve the next step
    assert shards_module._current is workers
    assert all(proc.is_alive() for proc in workers.procs)


@pytest.mark.skipif(
    not cpu_tuning.blas_threads_settable(), reason="NumPy's BLAS here is not a settable OpenBLAS"
)
def test_each_shard_runs_on_a_one_thread_blas_and_the_step_gives_the_count_back(
    monkeypatch, tmp_path
):
    if cpu_tuning.cpu_count() < 2 or not shards_module.fork_available():
        pytest.skip("no workers here: the shards run in turn, with the BLAS's own count")
    get = cpu_tuning._blas[1]
    before = get()
    log = tmp_path / "blas.log"  # the worker's loss runs in another process: it writes here

    def counting_loss(model, x, y):
        with open(log, "a") as f:
            f.write(f"{get()}\n")
        return lm_loss(model, x, y)

    monkeypatch.setattr(step_module, "lm_loss", counting_loss)
    model = fresh()
    x, y = batch(TINY, 4)
    train_step(model, SGD(model.parameters(), lr=0.1), x, y, TWO, 1, loss_fn=counting_loss)
    assert Path(log).read_text().split() == ["1", "1"]  # this process's shard and the worker's
    assert get() == before
    model.lm_head.weight.data[...] = np.nan  # and after a step that raises
    with pytest.raises(TrainingDiverged):
        train_step(model, SGD(model.parameters(), lr=0.1), x, y, TWO, 2, loss_fn=counting_loss)
    assert get() == before


# ---- the setting --------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_shards_must_be_a_positive_whole_number(bad):
    with pytest.raises(ValueError, match="TrainConfig.shards"):
        TrainConfig(shards=bad)


def test_shards_defaults_to_2_and_parses_from_the_command_line():
    assert TrainConfig().shards == 2
    assert not hasattr(TrainConfig(), "threads")  # the old name is gone, not an alias
    assert parse_overrides(["--shards=1"]) == {"shards": "1"}
    _, train_cfg = build_configs("shakespeare-char", parse_overrides(["--shards", "3"]))
    assert train_cfg.shards == 3 and isinstance(train_cfg.shards, int)
    with pytest.raises(ValueError, match="shards"):
        build_configs("shakespeare-char", {"shards": "0"})
