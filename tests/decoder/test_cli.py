"""The command lines: decoder.train, decoder.generate and decoder.finetune, end to end."""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import decoder.finetune as ft
import decoder.post.lora as lora
import decoder.train as tr
from decoder.post.lora import finetune, load_adapted, merge
from decoder.text.stream import print_sample
from decoder.training.checkpoint import load_checkpoint, load_model
from decoder.training.config import PRESETS, build_configs
from decoder.training.loop import train
from decoder.training.rundir import RunDirError
from minigrad.serialization import load_safetensors

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "me"]
TINY = ["--preset", "tiny", "--eval_iters=2", "--batch_size=4", "--block_size=16"]


# what a fine-tune leaves: its adapters and manifest, and the loop's log and plot
FINETUNE_FILES = ["adapters.safetensors", "log.jsonl", "lora.json", "loss.png"]


def make_text(words, seed=0, n_lines=300) -> str:
    rng = np.random.default_rng(seed)
    return (
        "\n".join(
            " ".join(rng.choice(words, size=rng.integers(3, 8))) + "." for _ in range(n_lines)
        )
        + "\n"
    )


@pytest.fixture(autouse=True)
def _token_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(make_text(WORDS), encoding="utf-8")
    return path


def run_cli(module, *args, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        **kwargs,
    )


# ---- decoder.train ------------------------------------------------------------------------------
def test_list_presets(capsys):
    assert tr.main(["--list-presets"]) == 0
    out = capsys.readouterr().out
    for name, preset in PRESETS.items():
        assert name in out and preset.description in out


def test_overrides_are_type_checked(capsys, tmp_path):
    assert tr.main(["--preset", "tiny", "--n_layer=abc", "--out", str(tmp_path)]) == 2
    assert "--n_layer='abc': expected a value of type int" in capsys.readouterr().err
    assert tr.main(["--preset", "tiny", "--n_layers=3", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown setting 'n_layers'" in err and "n_layer" in err and "max_iters" in err
    assert tr.main(["--preset", "huge"]) == 2
    assert "unknown preset 'huge'" in capsys.readouterr().err


def test_train_then_generate_end_to_end(tmp_path, text_file):
    run = tmp_path / "run"
    args = [
        "--data",
        str(text_file),
        "--out",
        str(run),
        "--max_iters=20",
        "--eval_interval=10",
        "--sample_tokens=40",
        "--sample_prompt=the",
    ]
    result = run_cli("decoder.train", *TINY, *args)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (run / "log.jsonl").open()]
    assert [r["step"] for r in rows] == [0, 10, 20]
    assert (run / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert load_checkpoint(run).step == 20
    assert "---- a sample ----\nthe" in result.stdout and str(run) in result.stdout

    result = run_cli(
        "decoder.generate",
        "--checkpoint",
        str(run),
        "--prompt",
        "the cat",
        "--max-new-tokens",
        "30",
        "--seed",
        "1",
        "--top-k",
        "5",
        "--top-p",
        "0.9",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("the cat") and len(result.stdout) == len("the cat") + 30 + 1

    result = run_cli("decoder.generate", "--checkpoint", str(run), "--prompt", "XYZ")
    assert result.returncode == 2 and "not in this tokenizer's vocabulary: 'X'" in result.stderr


def test_ctrl_c_saves_and_resume_continues(tmp_path, text_file):
    run = tmp_path / "run"
    args = [
        *TINY,
        "--data",
        str(text_file),
        "--out",
        str(run),
        "--max_iters=100000",
        "--eval_interval=5",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "decoder.train", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (run / "latest").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted at step" in err and f"--out {run} --resume" in err
    step = load_checkpoint(run).step
    assert step >= 5

    result = run_cli("decoder.train", "--out", str(run), "--resume", f"--max_iters={step + 3}")
    assert result.returncode == 0, result.stderr
    assert f"resuming {run} from step {step}" in result.stdout
    assert load_checkpoint(run).step == step + 3


# ---- decoder.generate ---------------------------------------------------------------------------
class Recorder(io.StringIO):
    flushes = 0

    def flush(self):
        self.flushes += 1


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A tiny model trained briefly on WORDS text (shared by the tests below)."""
    run = tmp_path_factory.mktemp("base")
    model_cfg, train_cfg = build_configs(
        "tiny",
        max_iters=60,
        eval_interval=60,
        eval_iters=2,
        batch_size=8,
        block_size=16,
        sample_tokens=0,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIGRAD_DATA_DIR", str(run / "cache"))
        train(model_cfg, train_cfg, make_text(WORDS), run, progress=False)
    return run


def test_generate_streams_each_token(base_run, capsys):
    model, tok, _ = load_model(base_run)
    out = Recorder()
    text = print_sample(model, tok, "the", 25, temperature=0.8, seed=3, out=out)
    assert out.getvalue() == text + "\n" and len(text) == 3 + 25
    assert out.flushes >= 25  # one flush per token (plus the prompt and the newline)
    again = print_sample(model, tok, "the", 25, temperature=0.8, seed=3, out=Recorder())
    assert again == text  # seeded
    long_prompt = "the cat sat on a mat " * 3  # 63 characters > block_size 16
    print_sample(model, tok, long_prompt, 5, seed=0, out=Recorder())
    assert "more than the context of 16" in capsys.readouterr().err


# ---- decoder.finetune ---------------------------------------------------------------------------
@pytest.mark.summation_order
def test_finetune_saves_adapters_lowers_the_loss_and_merges(base_run, tmp_path):
    new_text = make_text(["dog", "ran", "to", "me", "cat"], seed=1)  # other words, known letters
    out = tmp_path / "lora"
    result = finetune(base_run, new_text, out, r=4, alpha=8, max_iters=60, lr=1e-2, progress=False)
    assert result["val_loss_after"] < result["val_loss_before"] - 0.05
    assert sorted(p.name for p in out.iterdir()) == [
        "adapters.safetensors",
        "log.jsonl",
        "lora.json",
        "loss.png",
    ]
    arrays, _ = load_safetensors(out / "adapters.safetensors")
    assert len(arrays) == 2 * 2 * 2  # (A, B) x (wq, wv) x 2 layers: nothing else
    assert all(name.endswith((".wq.A", ".wq.B", ".wv.A", ".wv.B")) for name in arrays)
    settings = json.loads((out / "lora.json").read_text())
    assert settings["r"] == 4 and Path(settings["base_checkpoint"]).parent == base_run.resolve()

    merged_dir = merge(out, tmp_path / "merged")
    adapted, tok, _ = load_adapted(out)
    merged, _, _ = load_model(merged_dir)
    ids = [tok.encode("the dog ran to")]
    np.testing.assert_allclose(merged(ids)[0].numpy(), adapted(ids)[0].numpy(), atol=1e-5)
    base, _, _ = load_model(base_run)
    assert not np.allclose(base(ids)[0].numpy(), merged(ids)[0].numpy(), atol=1e-3)


def test_finetune_cli_per_head_and_merge(base_run, tmp_path, capsys):
    data = tmp_path / "new.txt"
    data.write_text(make_text(["sat", "on", "a", "mat"], seed=2))
    out = tmp_path / "lora"
    argv = [
        "--checkpoint",
        str(base_run),
        "--data",
        str(data),
        "--out",
        str(out),
        "--lora-r",
        "2",
        "--targets",
        "wq,wk,wv",
        "--per-head",
        "--max-iters",
        "5",
        "--merge",
    ]
    assert ft.main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "val loss on the new text before" in printed and "after 5 steps" in printed
    assert load_checkpoint(out / "merged").model_config == load_checkpoint(base_run).model_config
    assert ft.main(["merge", "--adapters", str(out), "--out", str(tmp_path / "m2")]) == 0


def test_finetune_rejects_text_the_tokenizer_cannot_write(base_run, tmp_path, capsys):
    data = tmp_path / "new.txt"
    data.write_text("Zebras!\n" * 50)
    argv = ["--checkpoint", str(base_run), "--data", str(data), "--out", str(tmp_path / "o")]
    assert ft.main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot be written with the base checkpoint's tokenizer" in err and "'Z'" in err
    assert not (tmp_path / "o").exists()  # a failed start leaves no --out behind


# ---- the run directory and resume settings ------------------------------------------------------
def test_a_second_run_into_one_out_is_refused_unless_overwritten(tmp_path, text_file, capsys):
    run = tmp_path / "run"
    argv = [*TINY, "--data", str(text_file), "--out", str(run), "--max_iters=4"]
    argv += ["--warmup_iters=2", "--sample_tokens=0"]
    assert tr.main(argv) == 0
    step = load_checkpoint(run).step
    assert tr.main(argv) == 2
    assert "holds a previous run" in capsys.readouterr().err and load_checkpoint(run).step == step
    assert tr.main([*argv, "--overwrite"]) == 0

    assert tr.main(["--out", str(run), "--resume", "--tokenizer=bpe"]) == 2
    assert "a resume cannot change tokenizer: 'char' -> 'bpe'" in capsys.readouterr().err
    assert tr.main(["--out", str(run), "--resume", "--preset", "shakespeare-char"]) == 2
    err = capsys.readouterr().err
    assert "--preset shakespeare-char builds another model" in err and "n_layer: 2 -> 4" in err
    again = ["--out", str(run), "--resume", *TINY, "--max_iters=6"]  # the run's own preset
    assert tr.main(again) == 0 and load_checkpoint(run).step == 6


def test_no_network_for_the_default_text_is_an_error_not_a_traceback(tmp_path, monkeypatch, capsys):
    def offline():
        raise RuntimeError("could not download Tiny Shakespeare: no network; pass --data PATH")

    monkeypatch.setattr(tr, "load_shakespeare", offline)
    assert tr.main([*TINY, "--out", str(tmp_path / "run")]) == 2
    assert "error: could not download Tiny Shakespeare" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_finetune_refuses_a_previous_fine_tune_unless_overwritten(base_run, tmp_path):
    text = make_text(["dog", "ran", "to", "me"], seed=1)
    out = tmp_path / "lora"
    finetune(base_run, text, out, r=2, max_iters=2, progress=False)
    merge(out, out / "merged")
    with pytest.raises(RunDirError, match=r"holds a previous run \(adapters.safetensors, "):
        finetune(base_run, text, out, r=4, max_iters=2, progress=False)
    with pytest.raises(RunDirError, match=r"holds a previous run \(ckpt-"):
        merge(out, out / "merged")
    assert json.loads((out / "lora.json").read_text())["r"] == 2
    finetune(base_run, text, out, r=4, max_iters=2, progress=False, overwrite=True)
    assert json.loads((out / "lora.json").read_text())["r"] == 4
    assert sorted(p.name for p in out.iterdir()) == [
        "adapters.safetensors",
        "log.jsonl",
        "lora.json",
        "loss.png",
    ]


def test_finetune_diverges_as_training_does(base_run, tmp_path, monkeypatch, capsys):
    def poisoned_model(*args, **kwargs):
        model, tokenizer, ckpt = load_model(*args, **kwargs)
        forward = model.forward

        def nan_in_training(ids, targets=None, caches=None):
            logits, loss = forward(ids, targets, caches)
            return logits, loss * float("nan") if model.training else loss

        model.forward = nan_in_training
        return model, tokenizer, ckpt

    monkeypatch.setattr(lora, "load_model", poisoned_model)
    data = tmp_path / "new.txt"
    data.write_text(make_text(["sat", "on", "a", "mat"], seed=2))
    out = tmp_path / "o"
    assert ft.main(["--checkpoint", str(base_run), "--data", str(data), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "error: the loss is nan at step 1: training stopped before that step" in err
    assert not out.exists()  # nothing saved: the directory it created is removed
