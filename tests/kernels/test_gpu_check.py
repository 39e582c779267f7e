"""Tests for `make gpu-check` (bench/gpu_check.py) on recorded outputs, without a GPU.

Holds: each parser on a passing and a failing recording (pytest, compute-sanitizer's three
tools, the GPU half of bench/attention.py, bench/train_vs_torch.py), including the traps: a
run where every GPU test skipped, and a sanitized process that died before its kernels ran
yet reports 0 errors; the report written from parsed results; the planned commands; and a
step run for real (a Python child printing a recording), with its exit code and timeout.

The recordings in gpu_check_outputs/ were written by hand in the tools' formats.
Leaves out `environment()`, which needs nvidia-smi and a GPU; the kernel check runs on the
CuPy stand-in, its kernels in the CPU emulator.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
OUTPUTS = Path(__file__).with_name("gpu_check_outputs")


def _load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu_check = _load_gpu_check()


def recorded(name: str) -> str:
    return (OUTPUTS / name).read_text()


def test_nvidia_smi_and_report_name():
    gpu = gpu_check.parse_nvidia_smi(recorded("nvidia_smi.csv"))
    assert gpu == {"name": "NVIDIA H100 80GB HBM3", "driver": "550.54.15", "memory": "81559 MiB"}
    path = gpu_check.report_path(Path("bench/results"), gpu["name"])
    assert path == Path("bench/results/gpu-nvidia-h100-80gb-hbm3.md")


@pytest.mark.parametrize(
    "name, passed, summary",
    [
        ("pytest_passed.txt", True, "98 passed, 1 skipped, 2211 deselected, 2 warnings"),
        ("pytest_failed.txt", False, "1 failed, 98 passed, 2211 deselected; failed: tests/"),
        ("pytest_all_skipped.txt", False, "(no GPU test ran)"),
    ],
)
def test_pytest_summary(name, passed, summary):
    got_passed, got_summary = gpu_check.parse_pytest(recorded(name))
    assert got_passed is passed and summary in got_summary, got_summary


@pytest.mark.parametrize(
    "name, tool, passed, summary",
    [
        ("memcheck_clean.txt", "memcheck", True, "0 errors"),
        ("memcheck_crashed.txt", "memcheck", False, "did not finish their check"),
        ("racecheck_clean.txt", "racecheck", True, "0 hazard errors and warnings"),
        ("racecheck_hazard.txt", "racecheck", False, "1 hazard errors and warnings"),
        ("pytest_passed.txt", "synccheck", False, "no synccheck summary"),
    ],
)
def test_sanitizer_summary(name, tool, passed, summary):
    got_passed, got_summary = gpu_check.parse_sanitizer(recorded(name), tool)
    assert got_passed is passed and summary in got_summary, got_summary


def test_attention_table():
    passed, summary = gpu_check.parse_attention(recorded("attention_cuda.txt"))
    assert passed
    assert summary == (
        "T=8192: naive 198.30 ms, kernel 136.80 ms, torch 34.10 ms; "
        "longest T that fits: naive 8192, kernel 16384, torch 16384"
    )
    broken = recorded("attention_cuda.txt").replace(
        "longest T", "  (kernel at T=512 failed: x)\nlongest T"
    )
    assert gpu_check.parse_attention(broken)[0] is False
    assert gpu_check.parse_attention("Traceback ...") == (False, "no GPU table in the output")


def test_train_summary_and_loss_agreement():
    text = recorded("train_cuda.txt")
    passed, summary = gpu_check.parse_train(text)
    assert passed
    assert summary == (
        "val loss 2.1452 (minigrad) vs 2.1447 (pytorch); tokens/s 148,311 vs 402,956, ratio 0.37"
    )
    diverged = text.replace("2.1452", "2.4452")  # our side trained, but to a different loss
    assert gpu_check.parse_train(diverged)[0] is False


def _result(kind: str, name: str, passed_override=None):
    step = gpu_check.Step(f"{kind} step", ["python", "-c", "..."], kind)
    passed, summary = gpu_check.PARSERS[kind](recorded(name))
    return gpu_check.Result(step, passed, summary, 12.3, recorded(name))


def test_report_has_environment_summary_and_tails():
    results = [
        _result("tests", "pytest_failed.txt"),
        _result("racecheck", "racecheck_clean.txt"),
        _result("train", "train_cuda.txt"),
        gpu_check.Result(
            gpu_check.Step("compute-sanitizer (all tools)", [], "none"), None, "x", 0, ""
        ),
    ]
    env = {"GPU": "NVIDIA H100 80GB HBM3", "cupy-cuda12x": "13.3.0", "numpy": "2.1.3"}
    text = gpu_check.render_report(env, results, "2026-11-24 03:00 UTC")
    assert text.startswith("# GPU check: NVIDIA H100 80GB HBM3\n")
    assert "| cupy-cuda12x | 13.3.0 |" in text
    assert "## Summary: 4 steps, 2 passed, 1 FAILED, 1 not run" in text
    assert "| tests step | **FAILED** | 1 failed, 98 passed" in text
    assert "| compute-sanitizer (all tools) | not run | x | 0 s |" in text
    assert "### train step\n\n`python -c ...`\n\n```\n" in text
    assert "largest loss difference over the first 5 steps: 3.81e-06\n```" in text
    # Only the last TAIL_LINES lines of a long output, and table cells never broken by '|'.
    long = _result("tests", "pytest_passed.txt")
    long.output = "\n".join(f"line {i}" for i in range(500))
    long.summary = "a | b"
    text = gpu_check.render_report(env, [long], "now")
    assert "line 499" in text and f"line {499 - gpu_check.TAIL_LINES}\n" not in text
    assert "a \\| b" in text


def test_plan_runs_every_tool_on_both_cases():
    steps = gpu_check.plan("py", 300, "/usr/local/cuda/bin/compute-sanitizer", skip_bench=False)
    kinds = [s.kind for s in steps]
    assert kinds == ["tests"] + ["memcheck"] * 2 + ["racecheck"] * 2 + ["synccheck"] * 2 + [
        "attention",
        "train",
    ]
    assert steps[0].command[:5] == ["py", "-m", "pytest", "-m", "gpu"]
    assert steps[1].command[:5] == [
        "/usr/local/cuda/bin/compute-sanitizer",
        "--tool",
        "memcheck",
        "--error-exitcode",
        "1",
    ]
    assert {s.command[-1] for s in steps[1:7]} == {"small", "odd"}
    assert steps[-1].command[-3:] == ["--iters", "300", "--quiet"] and "cuda" in steps[-1].command
    without = gpu_check.plan("py", 300, None, skip_bench=True)
    assert [s.kind for s in without] == ["tests"]


def _echo_step(name: str, kind: str, exit_code: int = 0) -> object:
    code = f"import sys; print(open({str(OUTPUTS / name)!r}).read()); sys.exit({exit_code})"
    return gpu_check.Step("echo", [sys.executable, "-c", code], kind)


def test_run_parses_a_real_child_and_its_exit_code():
    result = gpu_check.run(_echo_step("memcheck_clean.txt", "memcheck"))
    assert result.passed and result.summary == "0 errors"
    assert "kernel case small" in result.output
    failed = gpu_check.run(_echo_step("memcheck_clean.txt", "memcheck", exit_code=3))
    assert failed.passed is False and failed.summary == "0 errors; exit code 3"


def test_run_reports_a_timeout():
    step = gpu_check.Step("sleeps", [sys.executable, "-c", "import time; time.sleep(30)"], "train")
    result = gpu_check.run(step, timeout=0.5)
    assert result.passed is False and result.summary.endswith("; timed out")


def test_the_planned_pytest_command_gives_a_summary_the_parser_reads(tmp_path):
    # The real pytest, with this project's addopts: a second -q there once hid the summary.
    (tmp_path / "test_tiny.py").write_text(
        "import pytest\n\n\n@pytest.mark.gpu\ndef test_runs():\n    pass\n\n\n"
        "@pytest.mark.gpu\n@pytest.mark.skip(reason='no GPU')\ndef test_skips():\n    pass\n"
    )
    planned = gpu_check.plan(sys.executable, 1, None, skip_bench=True)[0]
    config = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path)]
    command = [*planned.command[:-1], *config, "-p", "no:cacheprovider", str(tmp_path)]
    result = gpu_check.run(gpu_check.Step(planned.title, command, "tests"))
    assert result.passed and result.summary == "1 passed, 1 skipped", result.output


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
@pytest.mark.parametrize("case", sorted(gpu_check.KERNEL_CASES))
def test_kernel_case_checks_the_kernels_on_the_cupy_standin(case, fake_cupy, capsys):
    # The process compute-sanitizer watches, run here on the stand-in (kernels in the emulator).
    assert gpu_check.kernel_case(case) == 0
    printed = capsys.readouterr().out
    assert gpu_check.parse_sanitizer(printed + "========= ERROR SUMMARY: 0 errors\n", "memcheck")[0]
