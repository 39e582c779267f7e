"""Device "cuda" on a machine without CuPy: a clear error for a device the user asked for, the CPU
with a note for one that only a preset chose. CuPy is hidden, so these run the same with a GPU."""

import sys

import pytest

import decoder.generate as gen
import decoder.train as tr
import minigrad as mg
from minigrad import backend
from minigrad.backend import DeviceUnavailableError

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
    assert "note: device 'cuda' needs CuPy" in err and "Training on the CPU" in err
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
