"""Gradient accumulation: k micro-batches of b rows take the step one batch of k * b takes
(float64, dropout off), in decoder.training.step.train_step and in the training loop, and a resumed
accumulating run repeats the uninterrupted one."""

import numpy as np
import pytest

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.training.config import TrainConfig, build_configs
from decoder.training.loop import train
from decoder.training.step import train_step
from minigrad.optim import AdamW, param_groups_for_decay
from tests.support.numerics import assert_close

from .test_train import TEXT

MODEL = ModelConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, bias=True)


@pytest.fixture(autouse=True)
def _token_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))  # keep ids out of ~/.cache


def model_and_optimizer(seed: int = 0) -> tuple[Decoder, AdamW]:
    mg.manual_seed(seed)
    model = Decoder(MODEL).double()
    return model, AdamW(param_groups_for_decay(model, 0.1), lr=1e-2, weight_decay=0.1)


def stepped(k: int, x: np.ndarray, y: np.ndarray, grad_clip: float) -> tuple[Decoder, float]:
    """A fresh model after one train_step on (x, y) in k micro-batches."""
    model, optimizer = model_and_optimizer()
    cfg = TrainConfig(grad_accum_steps=k, grad_clip=grad_clip, dtype="float64")
    return model, train_step(model, optimizer, x, y, cfg, step=1)


@pytest.mark.summation_order
@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("grad_clip", [0.0, 0.05])  # 0.05 clips: the norm is about 1
def test_k_micro_batches_take_the_step_of_one_batch(k, grad_clip):
    rng = np.random.default_rng(1)
    x = rng.integers(0, MODEL.vocab_size, size=(8, MODEL.block_size))  # (B, T)
    y = rng.integers(0, MODEL.vocab_size, size=(8, MODEL.block_size))
    whole, whole_loss = stepped(1, x, y, grad_clip)
    accumulated, accumulated_loss = stepped(k, x, y, grad_clip)
    assert accumulated_loss == pytest.approx(whole_loss, rel=1e-12, abs=0)
    start, _ = model_and_optimizer()
    named = zip(whole.named_parameters(), accumulated.parameters(), start.parameters(), strict=True)
    # 8 / k rows at a time sum in another order than 8 (other BLAS kernels, then the
    # micro-batches' sum): float64 rounding, which AdamW amplifies where a gradient is about
    # zero (it divides by the gradient's own size), up to 8e-15 seen on weights of about 0.02;
    # so 1e-12 absolute, as tests/decoder/test_shards.py's float64 steps: a wrong micro-batch
    # or scale moves a gradient by its own size and a weight by about lr = 1e-2
    for (name, p_whole), p_acc, p_start in named:
        assert_close(p_acc.grad, p_whole.grad, rtol=1e-10, atol=1e-12, err_msg=name)
        assert_close(p_acc.data, p_whole.data, rtol=1e-10, atol=1e-12, err_msg=name)
        assert not np.array_equal(p_acc.data, p_start.data), f"{name} did not move"


def test_a_batch_that_does_not_split_evenly_is_refused():
    model, optimizer = model_and_optimizer()
    x = np.zeros((6, MODEL.block_size), dtype=np.int64)
    with pytest.raises(ValueError, match="6 rows does not split into grad_accum_steps=4"):
        train_step(model, optimizer, x, x, TrainConfig(grad_accum_steps=4), step=1)


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_grad_accum_steps_must_be_a_positive_whole_number(bad):
    with pytest.raises(ValueError, match="grad_accum_steps"):
        TrainConfig(grad_accum_steps=bad)


def run_configs(**extra):
    base = dict(max_iters=6, warmup_iters=2, eval_interval=3, eval_iters=2, block_size=16)
    base["sample_tokens"] = 0
    return build_configs("tiny", **{**base, "dtype": "float64", **extra})


@pytest.mark.summation_order
def test_an_accumulating_run_repeats_the_run_with_the_whole_batch(tmp_path):
    whole = train(*run_configs(batch_size=8), TEXT, tmp_path / "whole", progress=False)
    accumulated = train(
        *run_configs(batch_size=2, grad_accum_steps=4), TEXT, tmp_path / "acc", progress=False
    )
    # the training losses only: an evaluation scores batches of batch_size rows, 2 here, 8 there
    np.testing.assert_allclose(accumulated["losses"], whole["losses"], rtol=1e-12)


def test_an_accumulating_run_resumes_exactly(tmp_path):
    cfgs = run_configs(batch_size=2, grad_accum_steps=2, dropout=0.1, dtype="float32")
    whole = train(*cfgs, TEXT, tmp_path / "whole", progress=False)
    first = train(*cfgs, TEXT, tmp_path / "split", progress=False, until=4)
    rest = train(*cfgs, TEXT, tmp_path / "split", resume=True, progress=False)
    assert first["losses"] + rest["losses"] == whole["losses"]  # bitwise


def test_a_fine_tune_accumulates_as_the_base_run_did(tmp_path, monkeypatch):
    """A fine-tune keeps the base run's batch settings: each step takes batch_size *
    grad_accum_steps windows (the loop's rule), and its loss moves."""
    import decoder.training.loop
    from decoder.post.lora import finetune

    cfgs = run_configs(batch_size=1, grad_accum_steps=2, max_iters=2)
    train(*cfgs, TEXT, tmp_path / "base", progress=False)
    rows = []

    def counted_step(model, optimizer, x, y, *args, **kwargs):
        rows.append(len(x))
        return train_step(model, optimizer, x, y, *args, **kwargs)

    monkeypatch.setattr(decoder.training.loop, "train_step", counted_step)
    result = finetune(tmp_path / "base", TEXT, tmp_path / "lora", max_iters=3, progress=False)
    assert rows == [2, 2, 2]  # 2 rows a step, 1 per micro-batch
    assert result["val_loss_after"] != result["val_loss_before"]
