"""decoder.training.loop.train: exact resume, NaN handling, logs, the run directory, the sample, and
the checks made when resuming."""

import dataclasses
import json
import os

import numpy as np
import pytest
from matplotlib.figure import Figure

import decoder.training.run as tr
from decoder.cli import parse_overrides
from decoder.text.data import TokenDataset
from decoder.training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from decoder.training.config import build_configs
from decoder.training.log import plot_losses, read_log
from decoder.training.loop import train
from decoder.training.rundir import RunDirError, claim_dir
from decoder.training.step import TrainingDiverged, estimate_loss


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

    monkeypatch.setattr("decoder.model.model.Decoder", Poisoned)  # what build_model builds
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
    assert parse_overrides(["--lr=1e-3", "--max-iters", "5"]) == {"lr": "1e-3", "max_iters": "5"}
    with pytest.raises(ValueError, match="--lr needs a value"):
        parse_overrides(["--lr"])
    with pytest.raises(ValueError, match="unexpected argument 'oops'"):
        parse_overrides(["oops"])


# ---- the run directory --------------------------------------------------------------------------
def test_a_new_run_refuses_a_previous_run_unless_told_to_overwrite_it(tmp_path):
    model_cfg, train_cfg = configs(max_iters=4, warmup_iters=2)
    train(model_cfg, train_cfg, TEXT, tmp_path, progress=False)
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    with pytest.raises(RunDirError, match=r"holds a previous run \(.*latest.*log.jsonl.*--resume"):
        train(model_cfg, train_cfg, TEXT, tmp_path, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before  # untouched
    other, _ = configs(max_iters=4, warmup_iters=2, n_layer=1)
    train(other, train_cfg, TEXT, tmp_path, progress=False, overwrite=True)
    assert load_checkpoint(tmp_path).model_config.n_layer == 1
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").open()]
    assert [r["step"] for r in rows] == [0, 4]  # no row of the old run


def test_an_overwrite_that_fails_to_start_puts_the_old_run_back(tmp_path):
    model_cfg, train_cfg = configs(max_iters=4, warmup_iters=2)
    train(model_cfg, train_cfg, TEXT, tmp_path, progress=False)
    before = sorted(p.name for p in tmp_path.iterdir())
    _, bad_prompt = configs(max_iters=4, warmup_iters=2, sample_tokens=5, sample_prompt="Zebra")
    with pytest.raises(ValueError, match="--sample_prompt='Zebra'"):
        train(model_cfg, bad_prompt, TEXT, tmp_path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert load_checkpoint(tmp_path).step == 4


def test_a_run_on_a_directory_in_use_names_the_holder(tmp_path):
    model_cfg, train_cfg = configs(max_iters=4, warmup_iters=2)
    with claim_dir(tmp_path, tr.RUN_FILES, "latest"):
        with pytest.raises(RunDirError, match=f"in use by another run \\(pid {os.getpid()} on "):
            train(model_cfg, train_cfg, TEXT, tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_a_failed_start_leaves_no_directory(tmp_path):
    model_cfg, train_cfg = configs(block_size=64)
    with pytest.raises(ValueError, match="block_size=64 needs 65"):
        train(model_cfg, train_cfg, "a short text.\n" * 4, tmp_path / "runs" / "a", progress=False)
    assert not (tmp_path / "runs").exists()


# ---- the sample at the end ----------------------------------------------------------------------
def test_a_sample_prompt_outside_the_vocabulary_is_refused_before_training(tmp_path, capsys):
    model_cfg, train_cfg = configs(sample_tokens=5, sample_prompt="the Zebra")
    with pytest.raises(ValueError, match=r"--sample_prompt='the Zebra' cannot be written.*'Z'"):
        train(model_cfg, train_cfg, TEXT, tmp_path / "run")
    assert not (tmp_path / "run").exists() and "step 4" not in capsys.readouterr().err


def test_a_text_without_a_newline_samples_from_its_first_character(tmp_path, capsys):
    text = TEXT.replace("\n", " ")
    model_cfg, train_cfg = configs(max_iters=4, warmup_iters=2, sample_tokens=5)
    result = train(model_cfg, train_cfg, text, tmp_path / "run")  # the default prompt "\n"
    assert result["step"] == 4
    sample = capsys.readouterr().out.split("---- a sample ----\n")[1].splitlines()[0]
    assert sample.startswith(text[0]) and len(sample) == 1 + 5


# ---- the log ------------------------------------------------------------------------------------
def test_a_torn_last_log_line_is_dropped_on_resume(tmp_path):
    model_cfg, train_cfg = configs(max_iters=8, warmup_iters=2)
    train(model_cfg, train_cfg, TEXT, tmp_path, progress=False, until=4)
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"step": 8, "train_lo')  # a full disk cut the append short
    with pytest.warns(UserWarning, match=r"log.jsonl: dropped its last line"):
        assert train(model_cfg, train_cfg, TEXT, tmp_path, resume=True, progress=False)["step"] == 8
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").open()]
    assert [r["step"] for r in rows] == [0, 4, 8]


def test_a_damaged_log_line_is_an_error_naming_the_file_and_line(tmp_path):
    (tmp_path / "log.jsonl").write_text('{"step": 0}\n{"step": 4, oops}\n{"step": 8}\n')
    with pytest.raises(ValueError, match=r"log.jsonl, line 2: not a log row"):
        read_log(tmp_path)


def test_the_log_never_claims_a_step_whose_checkpoint_failed(tmp_path, monkeypatch):
    saves = []

    def full_disk_at_the_second_save(out_dir, **kwargs):
        saves.append(kwargs["step"])
        if len(saves) == 2:
            raise OSError(28, "No space left on device")
        return save_checkpoint(out_dir, **kwargs)

    monkeypatch.setattr(tr, "save_checkpoint", full_disk_at_the_second_save)
    model_cfg, train_cfg = configs()
    with pytest.raises(OSError, match="No space left"):
        train(model_cfg, train_cfg, TEXT, tmp_path, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").open()]
    assert [r["step"] for r in rows] == [0, 4] and load_checkpoint(tmp_path).step == 4


def test_a_full_disk_while_plotting_leaves_no_temporary_file(tmp_path, monkeypatch):
    def savefig(self, f, **kwargs):
        f.write(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", savefig)
    (tmp_path / "log.jsonl").write_text('{"step": 0, "train_loss": 4.0, "val_loss": 4.1}\n')
    with pytest.raises(OSError, match="No space left"):
        plot_losses(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]


# ---- what a resume cannot change ----------------------------------------------------------------
@pytest.mark.parametrize(
    "change, named", [({"tokenizer": "bpe"}, "tokenizer: 'char' -> 'bpe'"), ({"seed": 7}, "seed")]
)
def test_resume_refuses_settings_it_cannot_change(tmp_path, change, named):
    model_cfg, train_cfg = configs(max_iters=4, warmup_iters=2)
    train(model_cfg, train_cfg, TEXT, tmp_path, progress=False)
    _, changed_cfg = configs(max_iters=8, warmup_iters=2, **change)
    with pytest.raises(CheckpointError, match=f"a resume cannot change {named}"):
        train(model_cfg, changed_cfg, TEXT, tmp_path, resume=True, progress=False)
    _, longer = configs(max_iters=8, warmup_iters=2)  # max_iters is the run's to change
    assert train(model_cfg, longer, TEXT, tmp_path, resume=True, progress=False)["step"] == 8


def test_estimate_loss_scores_a_split_alone_as_it_does_beside_the_other():
    model_cfg, train_cfg = configs()
    tokenizer = tr.make_tokenizer(train_cfg, TEXT)
    data = TokenDataset(tokenizer.encode(TEXT))
    model = tr.Decoder(dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size))
    both = estimate_loss(model, data, train_cfg, model_cfg.block_size)
    assert estimate_loss(model, data, train_cfg, model_cfg.block_size, splits=("val",)) == {
        "val": both["val"]
    }
    assert model.training  # back in training mode
    with pytest.raises(ValueError, match=r"unknown splits \['test'\]"):
        estimate_loss(model, data, train_cfg, model_cfg.block_size, splits=("test",))


# ---- what a resume changes ----------------------------------------------------------------------
def test_a_resume_with_a_new_lr_and_max_iters_decays_over_the_new_length(tmp_path, capsys):
    model_cfg, train_cfg = configs(max_iters=4, warmup_iters=1, dropout=0.0)
    train(model_cfg, train_cfg, TEXT, tmp_path, progress=False)
    model_cfg, longer, _ = tr.resume_configs(tmp_path, None, {"lr": "1e-2", "max_iters": "8"})
    assert longer.lr_decay_iters == 8  # not the old max_iters, which left every step at min_lr
    capsys.readouterr()
    train(model_cfg, longer, TEXT, tmp_path, resume=True)
    out = capsys.readouterr().out
    assert "lr: 0.003 -> 0.01" in out
    assert f"learning rate: {tr.lr_at(4, longer):.3g} at step 5, cosine decay to min_lr" in out
    assert tr.lr_at(4, longer) > 10 * longer.min_lr


def test_a_resume_refuses_a_new_lr_that_no_remaining_step_would_use(tmp_path):
    model_cfg, train_cfg = configs(max_iters=6, lr_decay_iters=2, warmup_iters=1, dropout=0.0)
    train(model_cfg, train_cfg, TEXT, tmp_path, progress=False, until=3)
    model_cfg, changed, _ = tr.resume_configs(tmp_path, None, {"lr": "1e-2"})
    with pytest.raises(CheckpointError, match="lr: 0.003 -> 0.01 would change no step"):
        train(model_cfg, changed, TEXT, tmp_path, resume=True, progress=False)
