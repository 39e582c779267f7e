"""decoder.train: exact resume, NaN handling, logs, and the checks made when resuming."""

import json

import numpy as np
import pytest

import decoder.train as tr
from decoder.checkpoint import CheckpointError, load_checkpoint
from decoder.config import build_configs
from decoder.train import TrainingDiverged, train


def make_text(seed: int = 0, n_words: int = 1500) -> str:
    """A small learnable corpus: random short sentences over a few words."""
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "me"]
    rng = np.random.default_rng(seed)
    lines = [
        " ".join(rng.choice(words, size=rng.integers(3, 8))) + "." for _ in range(n_words // 5)
    ]
    return "\n".join(lines) + "\n"


TEXT = make_text()


@pytest.fixture(autouse=True)
def _token_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))  # keep ids out of ~/.cache


def configs(**extra):
    # dropout > 0: a resume must also restore every Dropout's generator
    base = dict(
        max_iters=12,
        eval_interval=4,
        eval_iters=2,
        batch_size=4,
        block_size=16,
        dropout=0.1,
        sample_tokens=0,
    )
    return build_configs("tiny", **{**base, **extra})


def test_resume_repeats_the_uninterrupted_run(tmp_path):
    model_cfg, train_cfg = configs()
    whole = train(model_cfg, train_cfg, TEXT, tmp_path / "whole", progress=False)
    first = train(model_cfg, train_cfg, TEXT, tmp_path / "split", progress=False, until=6)
    assert first["step"] == 6 and load_checkpoint(tmp_path / "split").step == 6
    rest = train(model_cfg, train_cfg, TEXT, tmp_path / "split", resume=True, progress=False)
    assert len(whole["losses"]) == 12 and rest["step"] == 12
    assert first["losses"] + rest["losses"] == whole["losses"]  # bitwise
    assert rest["val_loss"] == whole["val_loss"] and rest["train_loss"] == whole["train_loss"]
    rows = [json.loads(line) for line in (tmp_path / "split" / "log.jsonl").open()]
    assert [r["step"] for r in rows] == [0, 4, 8, 12]
    whole_rows = [json.loads(line) for line in (tmp_path / "whole" / "log.jsonl").open()]
    assert [r["val_loss"] for r in rows] == [r["val_loss"] for r in whole_rows]


def test_training_lowers_the_loss_and_writes_the_run(tmp_path):
    model_cfg, train_cfg = configs(max_iters=40, eval_interval=20, dropout=0.0)
    result = train(model_cfg, train_cfg, TEXT, tmp_path, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").open()]
    assert [r["step"] for r in rows] == [0, 20, 40]
    assert set(rows[0]) == {"step", "train_loss", "val_loss", "lr", "tokens_per_s", "time"}
    assert rows[-1]["val_loss"] < rows[0]["val_loss"] - 0.5  # ~ln(V) at the start
    assert result["val_loss"] == rows[-1]["val_loss"] and result["tokens_per_s"] > 0
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert load_checkpoint(tmp_path).step == 40


def test_a_nan_loss_stops_the_run_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    class Poisoned(tr.Decoder):
        calls = 0

        def forward(self, ids, targets=None, caches=None):
            logits, loss = super().forward(ids, targets, caches)
            if self.training:
                Poisoned.calls += 1
                if Poisoned.calls == 7:  # the 7th training step
                    loss = loss * float("nan")
            return logits, loss

    monkeypatch.setattr(tr, "Decoder", Poisoned)
    model_cfg, train_cfg = configs()
    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 7.*checkpoint of step 4"):
        train(model_cfg, train_cfg, TEXT, tmp_path, progress=False)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.step == 4 and all(np.isfinite(w).all() for w in ckpt.weights.values())


@pytest.mark.filterwarnings("ignore:overflow", "ignore:invalid value")
def test_a_huge_learning_rate_diverges_with_the_step_named(tmp_path):
    model_cfg, train_cfg = configs(lr=1e9, min_lr=1e8, warmup_iters=0, grad_clip=0.0)
    with pytest.raises(TrainingDiverged, match=r"at step \d+: training stopped"):
        train(model_cfg, train_cfg, TEXT, tmp_path, progress=False)


def test_resume_refuses_another_model_or_other_text(tmp_path):
    model_cfg, train_cfg = configs(max_iters=4, warmup_iters=2)
    train(model_cfg, train_cfg, TEXT, tmp_path, progress=False)
    other_cfg, _ = configs(max_iters=4, warmup_iters=2, n_layer=3)
    with pytest.raises(CheckpointError, match=r"n_layer: 2 -> 3"):
        train(other_cfg, train_cfg, TEXT, tmp_path, resume=True, progress=False)
    with pytest.raises(CheckpointError, match="trained on other text"):
        train(model_cfg, train_cfg, TEXT + "more", tmp_path, resume=True, progress=False)
    with pytest.raises(CheckpointError, match="no checkpoint here"):
        train(model_cfg, train_cfg, TEXT, tmp_path / "empty", resume=True, progress=False)


def test_parse_overrides():
    assert tr.parse_overrides(["--lr=1e-3", "--max-iters", "5"]) == {"lr": "1e-3", "max_iters": "5"}
    with pytest.raises(ValueError, match="--lr needs a value"):
        tr.parse_overrides(["--lr"])
    with pytest.raises(ValueError, match="unexpected argument 'oops'"):
        tr.parse_overrides(["oops"])
