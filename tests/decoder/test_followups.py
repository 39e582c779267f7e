"""Loose ends of issue 11: decoder.finetune checks its numbers by TrainConfig's rules and
never applies adapters to a base that changed or vanished since; decoder.generate's default
prompt works for a model whose text had no newline."""

import json
from pathlib import Path

import numpy as np
import pytest

import decoder
import decoder.generate as gen
from decoder.post.lora import finetune, load_adapted, merge
from decoder.training.checkpoint import CheckpointError, load_checkpoint
from decoder.training.config import build_configs
from decoder.training.loop import train
from minigrad.optim import cosine_lr

WORDS = ["the", "cat", "sat", "on", "a", "mat"]


def make_text(seed: int = 0, newline: str = "\n") -> str:
    rng = np.random.default_rng(seed)
    return newline.join(" ".join(rng.choice(WORDS, size=5)) + "." for _ in range(200))


@pytest.fixture(autouse=True)
def _token_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))


def train_base(run, text=None, seed=1337, max_iters=4, **kwargs):
    model_cfg, train_cfg = build_configs(
        "tiny",
        max_iters=max_iters,
        warmup_iters=1,
        eval_interval=max_iters,
        eval_iters=1,
        batch_size=4,
        block_size=16,
        sample_tokens=0,
        seed=seed,
    )
    train(model_cfg, train_cfg, text or make_text(), run, progress=False, **kwargs)
    return run


@pytest.fixture(scope="module")
def shared_base(tmp_path_factory):
    """One tiny trained base for the tests that only read it."""
    run = tmp_path_factory.mktemp("shared")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIGRAD_DATA_DIR", str(run / "cache"))
        return train_base(run / "base")


# ---- finetune's numbers -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(lr=float("nan")), r"TrainConfig\.lr must be a finite float in \[0, inf\), got nan"),
        (dict(lr=-1e-3), r"TrainConfig\.lr must be a finite float"),
        (dict(max_iters=0), r"TrainConfig\.max_iters must be a finite int in \[1, inf\), got 0"),
        (dict(max_iters=2.5), r"TrainConfig\.max_iters must be of type int, got 2\.5"),
        (dict(seed=-1), r"TrainConfig\.seed must be a finite int in \[0, "),
        (dict(alpha=float("inf")), r"LoRA alpha must be a finite number"),
    ],
)
def test_finetune_checks_its_numbers_as_train_config(shared_base, tmp_path, kwargs, message):
    out = tmp_path / "lora"
    with pytest.raises(ValueError, match=message):
        finetune(shared_base, make_text(1), out, r=2, progress=False, **kwargs)
    assert not out.exists()  # a failed start leaves no --out behind


def test_finetune_trains_with_the_schedule_it_records(shared_base, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr("decoder.training.loop.set_lr", lambda opt, lr: seen.append(lr))
    out = tmp_path / "lora"
    finetune(shared_base, make_text(1), out, r=2, max_iters=20, lr=0.1, progress=False)
    # warmup over a tenth of the steps to lr, then a cosine decay towards lr / 10
    assert seen == [cosine_lr(step, 0.1, 0.01, 2, 20) for step in range(20)]
    settings = json.loads((out / "lora.json").read_text())
    assert settings["lr"] == 0.1 and settings["max_iters"] == 20


# ---- adapters and their base --------------------------------------------------------------------
def test_adapters_whose_base_checkpoint_was_replaced_by_training_say_so(tmp_path):
    base = train_base(tmp_path / "base")
    finetune(base, make_text(1), tmp_path / "lora", r=2, max_iters=2, progress=False)
    train_base(base, max_iters=6, resume=True)  # the base trains on: ckpt-000004 is removed
    assert load_checkpoint(base).path.name == "ckpt-000006"
    pattern = (
        r"lora\.json: these adapters were trained on .*ckpt-000004 \(step 4\), which is gone: "
        r".* now holds ckpt-000006 .* copy its checkpoint directory elsewhere"
    )
    with pytest.raises(CheckpointError, match=pattern):
        load_adapted(tmp_path / "lora")
    with pytest.raises(CheckpointError, match=pattern):
        merge(tmp_path / "lora", tmp_path / "merged")


def test_adapters_are_never_applied_to_a_base_with_other_weights(tmp_path):
    base = train_base(tmp_path / "base")
    finetune(base, make_text(1), tmp_path / "lora", r=2, max_iters=2, progress=False)
    load_adapted(tmp_path / "lora")  # the same base: loads
    train_base(base, seed=7, overwrite=True)  # another run, to the same step and folder name
    assert load_checkpoint(base).path.name == "ckpt-000004"
    with pytest.raises(CheckpointError, match=r"holds other weights than the ones these adapters"):
        load_adapted(tmp_path / "lora")


# ---- decoder.generate's default prompt ----------------------------------------------------------
def test_generate_default_prompt_for_a_model_whose_text_had_no_newline(tmp_path, capsys):
    run = train_base(tmp_path / "base", text=make_text(newline=" "))
    assert gen.main(["--checkpoint", str(run), "--max-new-tokens", "8", "--seed", "0"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(" ") and len(printed) == 1 + 8 + 1  # token 0 (a space), 8, "\n"
    argv = ["--checkpoint", str(run), "--max-new-tokens", "8", "--prompt", "\n"]
    assert gen.main(argv) == 2  # a prompt given outright is still checked
    assert "'\\n'" in capsys.readouterr().err


# ---- the package's map --------------------------------------------------------------------------
def test_the_package_docstring_names_every_module():
    names = {p.stem for p in Path(decoder.__file__).parent.glob("*.py")} - {"__init__"}
    missing = sorted(n for n in names if f"``{n}``" not in decoder.__doc__)
    assert not missing, f"decoder/__init__.py's docstring should name {missing}"
