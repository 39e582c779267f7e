"""One device rule for every command (decoder.training.config.device_or_cpu): ``--device`` where
given, else the device the run or checkpoint was trained on. Device "cuda" on a machine without
CuPy: a clear error for a device the user asked for, the CPU with a note for one that only a
preset, a run or a checkpoint chose. CuPy is hidden (the stand-in where a test asks for CUDA), so
these run the same with a GPU."""

import json
import sys

import pytest

import decoder.dpo as dpo_cli
import decoder.finetune as ft
import decoder.generate as gen
import decoder.sft as sft_cli
import decoder.train as tr
import minigrad as mg
from decoder.training.checkpoint import load_checkpoint, load_model
from minigrad import backend
from minigrad.backend import DeviceUnavailableError
from tests.decoder.test_sft import TEXT, make_base

# baby-gpt (device "cuda") shrunk to train in a second on the CPU
BABY = ["--preset", "baby-gpt", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=8"]
BABY += ["--batch_size=2", "--max_iters=2", "--warmup_iters=0", "--eval_iters=1"]
BABY += ["--sample_tokens=2", "--dropout=0"]
INSTALL = r"needs CuPy, which is not installed.*pip install -e '\.\[gpu\]'"


@pytest.fixture(autouse=True)
def no_cupy(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    monkeypatch.setattr(backend, "_cupy", None)
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("the cat sat on the mat.\n" * 40, encoding="utf-8")
    return path


def test_the_library_raises_one_error_type_that_says_how_to_install():
    with pytest.raises(DeviceUnavailableError, match=INSTALL) as info:
        mg.zeros(2, device="cuda")
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    assert not mg.cuda_available()


def test_a_preset_that_defaults_to_cuda_trains_on_the_cpu_with_a_note(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert tr.main([*BABY, "--data", str(text_file), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "note: device 'cuda' needs CuPy" in err and "Running on the CPU" in err
    assert "Traceback" not in err
    # the checkpoint records the device the run had; generate on it asks for no GPU
    assert gen.main(["--checkpoint", str(out), "--max-new-tokens=2"]) == 0


@pytest.mark.parametrize("flag", [["--device", "cuda"], ["--device=cuda"]])
def test_asking_for_cuda_without_cupy_is_an_error_before_anything_is_written(
    flag, text_file, tmp_path, capsys
):
    out = tmp_path / "run"
    assert tr.main([*BABY, *flag, "--data", str(text_file), "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("error: device 'cuda' needs CuPy")
    assert not out.exists()


def test_generate_on_cuda_without_cupy_is_an_error(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert tr.main([*BABY, "--device=cpu", "--data", str(text_file), "--out", str(out)]) == 0
    capsys.readouterr()
    assert gen.main(["--checkpoint", str(out), "--device", "cuda", "--max-new-tokens=2"]) == 2
    assert capsys.readouterr().err.startswith("error: device 'cuda' needs CuPy")


# ---- the same rule in every command --------------------------------------------------------------
NOTE = "note: device 'cuda' needs CuPy"
POST = ["--examples=40", "--max_iters=1", "--warmup_iters=0", "--eval_iters=1", "--batch_size=2"]


@pytest.fixture
def cuda_base(tmp_path, monkeypatch):
    """A small checkpoint trained (as its state.json says) on "cuda"."""
    monkeypatch.setattr("decoder.post.sft.load_shakespeare", lambda: TEXT)
    monkeypatch.setattr("decoder.post.dpo.load_shakespeare", lambda: TEXT)
    make_base(tmp_path / "base", dropout=0.0)
    state_path = load_checkpoint(tmp_path / "base", with_optimizer=False).path / "state.json"
    state = json.loads(state_path.read_text())
    state["train_config"]["device"] = "cuda"
    state_path.write_text(json.dumps(state))
    return tmp_path / "base"


@pytest.mark.parametrize(
    "command, args",
    [
        (gen, ["--max-new-tokens=2", "--prompt=a"]),
        (ft, ["--max-iters=1"]),
        (sft_cli, POST),
        (dpo_cli, POST),
    ],
    ids=["generate", "finetune", "sft", "dpo"],
)
def test_a_command_on_a_cuda_checkpoint_runs_on_the_cpu_with_a_note(
    command, args, cuda_base, tmp_path, capsys
):
    out = ["--out", str(tmp_path / "out")] if command is not gen else []
    data = ["--data", str(_text(tmp_path))] if command is ft else []
    assert command.main(["--checkpoint", str(cuda_base), *out, *data, *args]) == 0
    err = capsys.readouterr().err
    assert NOTE in err and "Running on the CPU" in err and "Traceback" not in err
    if command in (sft_cli, dpo_cli):  # the run records the device it had
        assert load_checkpoint(tmp_path / "out").train_config.device == "cpu"


@pytest.mark.parametrize("command", [ft, sft_cli, dpo_cli], ids=["finetune", "sft", "dpo"])
def test_every_command_refuses_an_explicit_cuda_without_cupy(command, cuda_base, tmp_path, capsys):
    data = ["--data", str(_text(tmp_path))] if command is ft else []
    argv = ["--checkpoint", str(cuda_base), "--out", str(tmp_path / "out"), *data]
    assert command.main([*argv, "--device", "cuda"]) == 2
    assert capsys.readouterr().err.startswith("error: device 'cuda' needs CuPy")


def test_a_checkpoint_loads_on_the_device_it_was_trained_on_where_cuda_runs(cuda_base, fake_cupy):
    assert load_model(cuda_base, device=None)[0].device == "cuda"  # the commands' default
    assert load_model(cuda_base)[0].device == "cpu"  # the library's default stays the CPU
    assert load_model(cuda_base, device="cpu")[0].device == "cpu"


def _text(tmp_path):
    path = tmp_path / "new.txt"
    path.write_text(TEXT[:2000], encoding="utf-8")
    return path
