"""Tests for `make gpu-check` (bench/gpu_check.py) on recorded outputs, without a GPU.

Holds: the helpers' doctests; each parser on a passing and a failing recording (pytest,
compute-sanitizer's three tools, the kernel split, the GPU half of bench/attention.py,
bench/kernel_counts.py, bench/train_vs_torch.py), each with the rows of every tensor_cores
choice (off, tf32, 3xtf32), including the traps: a run where every GPU test skipped, a
sanitized process that died before its kernels ran yet reports 0 errors, one whose kernels
answered wrong, and a GPU without TF32, whose skipped choices are named but fail nothing; the
report written from parsed results (the counts whole, skipped steps named); the planned
commands and their order (tests, benchmarks, sanitizers), with and without pytest-xdist; a step
run for real (a Python child printing a recording), with its exit code and timeout; and the
budget: a step that does not fit is skipped and named, a running one is stopped when it runs
out, and the report is still written.

The recordings in gpu_check_outputs/ were written by hand in the tools' formats.
Leaves out `environment()`, which needs nvidia-smi and a GPU; the kernel check and the kernel
split run on the CuPy stand-in, their kernels in the CPU emulator, and so do `main()`, with
its environment and steps made up, and the kernels each column of bench/attention.py launches.
"""

from __future__ import annotations

import doctest
import importlib.util
import os
import re
import shutil
import sys
import time
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


def test_doctests():
    # the helpers' worked examples: nvidia-smi, file names, the split's rows, the choices
    assert doctest.testmod(gpu_check).failed == 0


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
        ("memcheck_clean.txt", "memcheck", True, "0 errors (kernels off, tf32, 3xtf32)"),
        ("memcheck_crashed.txt", "memcheck", False, "did not finish their check"),
        ("racecheck_clean.txt", "racecheck", True, "0 hazard errors and warnings (kernels off,"),
        ("racecheck_hazard.txt", "racecheck", False, "1 hazard errors and warnings"),
        ("pytest_passed.txt", "synccheck", False, "no synccheck summary"),
    ],
)
def test_sanitizer_summary(name, tool, passed, summary):
    got_passed, got_summary = gpu_check.parse_sanitizer(recorded(name), tool)
    assert got_passed is passed and summary in got_summary, got_summary


def test_sanitizer_summary_names_the_kernels_checked_and_the_wrong_ones():
    clean = recorded("memcheck_clean.txt")
    # a GPU without TF32: the launcher refuses tf32 and 3xtf32, off alone is checked
    old_gpu = clean.replace("off, tf32, 3xtf32 ok", "off ok")
    assert gpu_check.parse_sanitizer(old_gpu, "memcheck") == (True, "0 errors (kernels off)")
    # 0 sanitizer errors, but one choice's answers were out of tolerance
    wrong = clean.replace("off, tf32, 3xtf32 ok", "WRONG: tf32")
    assert gpu_check.parse_sanitizer(wrong, "memcheck") == (
        False,
        "0 errors; wrong answers from the kernels tf32",
    )


def test_attention_table():
    passed, summary = gpu_check.parse_attention(recorded("attention_cuda.txt"))
    assert passed
    assert summary == (
        "T=8192: naive 198.30 ms, kernel 136.80 ms, tf32 31.90 ms, 3xtf32 50.12 ms, "
        "torch 34.10 ms; longest T that fits: naive 8192, kernel 16384, tf32 16384, "
        "3xtf32 16384, torch 16384"
    )
    broken = recorded("attention_cuda.txt").replace(
        "longest T", "  (3xtf32 at T=1024 failed: x)\nlongest T"
    )
    assert gpu_check.parse_attention(broken) == (False, summary + "; 1 points failed")
    # a tensor-core column that failed at T=8192: the last complete row is T=4096's
    errored = recorded("attention_cuda.txt").replace(
        "       31.90        64.0", "       error            "
    )
    passed, summary = gpu_check.parse_attention(errored)
    assert summary.startswith("T=4096: naive 49.77 ms, kernel 35.12 ms, tf32 8.61 ms, ")
    assert gpu_check.parse_attention("Traceback ...") == (False, "no GPU table in the output")


def test_kernel_split_table():
    passed, summary = gpu_check.parse_split(recorded("split_cuda.txt"))
    assert passed
    assert summary == (
        "forward / backward ms: "
        "T=1024: off 1.21 / 3.18, tf32 0.42 / 1.05, 3xtf32 0.61 / 1.52; "
        "T=4096: off 12.40 / 34.50, tf32 2.31 / 6.12, 3xtf32 3.57 / 9.40; "
        "T=16384: off 180.20 / 511.16, tf32 33.10 / 90.44, 3xtf32 52.87 / 141.02"
    )
    failed = recorded("split_cuda.txt").replace(
        "  16384    3xtf32     52.87    141.02    193.89",
        "  (kernel 3xtf32 at T=16384 failed: OutOfMemoryError: x)",
    )
    passed, summary = gpu_check.parse_split(failed)
    assert passed is False
    assert summary.endswith("tf32 33.10 / 90.44; failed: 3xtf32 at T=16384"), summary
    # a GPU without TF32: the tensor-core rows skipped, named, and no failure
    lines = recorded("split_cuda.txt").splitlines()
    old_gpu = [line for line in lines if "tf32 " not in line]
    old_gpu[1:1] = [f"  (kernel {c} skipped: needs TF32 tensor cores)" for c in ("tf32", "3xtf32")]
    passed, summary = gpu_check.parse_split("\n".join(old_gpu))
    assert passed and summary == (
        "forward / backward ms: T=1024: off 1.21 / 3.18; T=4096: off 12.40 / 34.50; "
        "T=16384: off 180.20 / 511.16; skipped (not on this GPU): tf32, 3xtf32"
    )
    assert gpu_check.parse_split("Traceback ...") == (False, "no kernel split table in the output")
    # the tile sweep: a faster tile than the plan's is named; one that failed fails the step
    sweep = (
        "  tile    tf32 flash_mma_bwd_dkdv    64  backward     6.12  (plan)\n"
        "  tile    tf32 flash_mma_bwd_dkdv    32  backward     5.50\n"
        "  tile    tf32 flash_mma_fwd         64   forward     2.31  (plan)\n"
        "  tile    tf32 flash_mma_fwd         32   forward     2.30\n"
    )
    passed, summary = gpu_check.parse_split(recorded("split_cuda.txt") + sweep)
    assert passed and summary.endswith(
        "; tiles: tf32 flash_mma_bwd_dkdv 32 beats the plan 64, 5.50 vs 6.12 ms"
    )  # fwd's 32 is within the 3% of noise: not named
    passed, summary = gpu_check.parse_split(
        recorded("split_cuda.txt") + sweep.replace("5.50", "6.00")
    )
    assert passed and summary.endswith("; tiles: the plans are the fastest")
    broken = "  (tile 3xtf32 flash_mma_bwd_dq 64 failed: CUDADriverError: x)\n"
    passed, summary = gpu_check.parse_split(recorded("split_cuda.txt") + sweep + broken)
    assert passed is False and summary.endswith("; tile sweep failed: 3xtf32 flash_mma_bwd_dq 64")
    passed, summary = gpu_check.parse_split(
        recorded("split_cuda.txt") + "  (tile off flash_attn_fwd 64: does not fit: ...)\n"
    )
    assert passed  # a tile this GPU's shared memory cannot hold is not a failure


def test_counts_summary_points_to_their_section():
    assert gpu_check.parse_counts(recorded("kernel_counts.txt")) == (
        True,
        "5 lines, in full under Kernel counts",
    )
    assert gpu_check.parse_counts("\n") == (False, "no output")


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


STEP_TIMES = """\
one step on cuda, ms per phase (median, synchronised): 6 layers, 6 heads, matmul_precision high
widths                              forward  backward  optimiser     step
n_embd 48, block 32, batch 4           6.25      3.97       1.17    11.25
n_embd 384, block 256, batch 64       10.50     21.00       6.00    37.50
host floor / step: 0.30 (near 1, waiting on the host; near 0, on the device)
"""


def test_step_times_summary():
    passed, summary = gpu_check.parse_step_times(STEP_TIMES)
    assert passed
    assert summary == "step 37.5 ms at n_embd 384; host floor 11.2 ms (n_embd 48), 0.30 of the step"
    one_row = "\n".join(STEP_TIMES.splitlines()[:3])
    assert gpu_check.parse_step_times(one_row) == (False, "no timing table in the output")


def test_report_has_environment_summary_and_tails():
    results = [
        _result("tests", "pytest_failed.txt"),
        _result("racecheck", "racecheck_clean.txt"),
        _result("train", "train_cuda.txt"),
        gpu_check.Result(
            gpu_check.Step("compute-sanitizer (all tools)", [], "none"), None, "x", 0, ""
        ),
        _result("counts", "kernel_counts.txt"),
    ]
    env = {"GPU": "NVIDIA H100 80GB HBM3", "cupy-cuda12x": "13.3.0", "numpy": "2.1.3"}
    text = gpu_check.render_report(env, results, "2026-11-24 03:00 UTC")
    assert text.startswith("# GPU check: NVIDIA H100 80GB HBM3\n")
    assert "| cupy-cuda12x | 13.3.0 |" in text
    assert "## Summary: 5 steps, 3 passed, 1 FAILED, 1 skipped" in text
    assert "| tests step | **FAILED** | 1 failed, 98 passed" in text
    assert "| compute-sanitizer (all tools) | skipped | x | 0 s |" in text
    # the counts whole, under their own heading, before the other steps' tails and not among them
    counts = "## Kernel counts\n\n`python -c ...`\n\n```\n" + recorded("kernel_counts.txt")
    assert counts.rstrip() + "\n```" in text
    assert text.index("## Kernel counts") < text.index("## Output of each step")
    assert "### counts step" not in text
    assert "### train step\n\n`python -c ...`\n\n```\n" in text
    assert "largest loss difference over the first 5 steps: 3.81e-06\n```" in text
    # Only the last TAIL_LINES lines of a long output, and table cells never broken by '|'.
    long = _result("tests", "pytest_passed.txt")
    long.output = "\n".join(f"line {i}" for i in range(500))
    long.summary = "a | b"
    text = gpu_check.render_report(env, [long], "now")
    assert "line 499" in text and f"line {499 - gpu_check.TAIL_LINES}\n" not in text
    assert "a \\| b" in text


def test_plan_runs_tests_then_benchmarks_then_every_tool_on_both_cases():
    sanitizer = "/usr/local/cuda/bin/compute-sanitizer"
    steps = gpu_check.plan("py", 300, sanitizer, skip_bench=False, workers=8)
    kinds = [s.kind for s in steps]
    # the benchmarks before the sanitizers: a short lease measures first; the static counts,
    # which a machine without a GPU gives too, after them
    assert (
        kinds
        == ["tests", "split", "attention", "train", "peer", "train", "step"]
        + ["memcheck"] * 2
        + ["racecheck"] * 2
        + ["synccheck"] * 2
        + ["counts", "train", "train"]  # strict float32, and the plain kernels: last
    )
    assert steps[0].command[:5] == ["py", "-m", "pytest", "-m", "gpu"]
    assert steps[0].command[-3:] == ["-n", "8", "tests"] and "8 xdist workers" in steps[0].title
    assert steps[1].command[-1] == "--kernel-split"
    assert steps[2].command[-5:] == ["--T", "1024", "4096", "8192", "16384"]
    assert steps[3].command[-3:] == ["--iters", "300", "--quiet"] and "cuda" in steps[3].command
    assert steps[4].command[-2:] == ["--iters", "300"] and "nanogpt_peer.py" in steps[4].command[1]
    assert steps[5].command[-1] == "--attn-impl=flash" and "100" in steps[5].title
    assert (
        steps[6].command[-2:] == ["--time", "cuda"] and "gpu_step_counts.py" in steps[6].command[1]
    )
    assert steps[7].command[:5] == [sanitizer, "--tool", "memcheck", "--error-exitcode", "1"]
    assert {s.command[-1] for s in steps[7:-3]} == {"small", "odd"}
    assert steps[-3].command[-1] == "--no-emulate" and steps[-3].absent == ""
    assert steps[-2].command[-1] == "--matmul-precision=highest" and "100" in steps[-2].title
    assert steps[-1].command[:2] == ["env", "MINIGRAD_FAST_PATHS=0"]
    assert all(s.seconds > 0 for s in steps)  # every step has a time the budget can weigh
    # the issue-25/26 decisions (split, attention, both training rows, nanoGPT) fit the
    # default budget by their expected times, with the tests before them
    decisive = sum(s.seconds for s in steps[:6])
    assert decisive <= gpu_check.BUDGET_S, decisive
    # without xdist, compute-sanitizer and bench/kernel_counts.py: serial, and named as absent
    steps = gpu_check.plan("py", 300, None, skip_bench=False, workers=0, counts=False)
    assert steps[0].command[-3:] == ["-p", "no:xdist", "tests"] and "serial" in steps[0].title
    assert "not in this checkout" in steps[-3].absent
    assert [s.kind for s in steps[-4:]] == ["none", "counts", "train", "train"]
    assert "not on PATH" in steps[-4].absent
    without = gpu_check.plan("py", 300, None, skip_bench=True)
    assert [s.kind for s in without] == ["tests", "none"]


def test_xdist_workers_only_where_xdist_is_installed(monkeypatch):
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: None)
    assert gpu_check.xdist_workers(None) == 0 and gpu_check.xdist_workers(4) == 0
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(gpu_check.os, "cpu_count", lambda: 16)
    assert gpu_check.xdist_workers(None) == gpu_check.WORKERS and gpu_check.xdist_workers(3) == 3
    monkeypatch.setattr(gpu_check.os, "cpu_count", lambda: 2)
    assert gpu_check.xdist_workers(None) == 2


def _echo_step(name: str, kind: str, exit_code: int = 0) -> object:
    code = f"import sys; print(open({str(OUTPUTS / name)!r}).read()); sys.exit({exit_code})"
    return gpu_check.Step("echo", [sys.executable, "-c", code], kind)


def test_run_parses_a_real_child_and_its_exit_code():
    result = gpu_check.run(_echo_step("memcheck_clean.txt", "memcheck"))
    assert result.passed and result.summary == "0 errors (kernels off, tf32, 3xtf32)"
    assert "kernel case small" in result.output
    failed = gpu_check.run(_echo_step("memcheck_clean.txt", "memcheck", exit_code=3))
    assert failed.passed is False
    assert failed.summary == "0 errors (kernels off, tf32, 3xtf32); exit code 3"


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
    passed, summary = gpu_check.parse_sanitizer(
        printed + "========= ERROR SUMMARY: 0 errors\n", "memcheck"
    )
    assert passed and summary == "0 errors (kernels off, tf32, 3xtf32)"
    # each choice reached its kernels: TF32's 10-bit inputs show, 3xTF32's and fmaf's do not
    worst = dict(re.findall(r"^  (\w+) +([\d.e+-]+) \(tolerance", printed, re.M))
    assert float(worst["tf32"]) > 1e-4 > 1e-5 > max(float(worst["off"]), float(worst["3xtf32"]))


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
def test_kernel_case_skips_what_the_gpu_lacks_and_fails_a_wrong_answer(
    fake_cupy, monkeypatch, capsys
):
    from minigrad.kernels import emulator

    with emulator.use_device("sm_75"):  # no TF32: the fmaf kernels alone, the others named
        assert gpu_check.kernel_case("small") == 0
    printed = capsys.readouterr().out
    assert re.search(r"^  tf32 +skipped: .*compute capability 8\.0", printed, re.M)
    assert printed.rstrip().endswith(": off ok")
    # a tolerance TF32 cannot meet: the check fails, naming the choice
    monkeypatch.setitem(gpu_check.KERNEL_TOL, "tf32", 1e-6)
    assert gpu_check.kernel_case("small") == 1
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith(": WRONG: tf32")
    assert not gpu_check.parse_sanitizer(
        printed + "========= ERROR SUMMARY: 0 errors\n", "memcheck"
    )[0]


def test_the_budget_skips_what_does_not_fit_and_stops_what_runs_over(tmp_path):
    # A step that fits runs; one whose expected time does not is skipped and named (a later,
    # shorter one still runs); a step that runs past the budget is stopped at the deadline.
    quick = _echo_step("memcheck_clean.txt", "memcheck")
    quick.seconds = 1
    heavy = gpu_check.Step("heavy", [sys.executable, "-c", "raise SystemExit(9)"], "train", 600)
    sleeper = gpu_check.Step(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], "train", 1
    )
    absent = gpu_check.Step("counts", [], "counts", 0, "bench/kernel_counts.py is not here")
    start = time.monotonic()
    results = gpu_check.run_within([quick, heavy, absent, sleeper], start + 2)
    assert time.monotonic() - start < 30
    assert [r.passed for r in results] == [True, None, None, False]
    assert results[1].summary.startswith("skipped for the budget: needs about 600 s, ")
    assert results[2].summary == "bench/kernel_counts.py is not here"
    assert results[3].summary.endswith("; timed out") and results[3].seconds < 10
    # nothing left: every step is skipped; the report is still written, naming them
    late = gpu_check.run_within([quick], time.monotonic() - 1)
    assert late[0].passed is None and "0 s left" in late[0].summary
    text = gpu_check.render_report({"GPU": "x"}, results + late, "now")
    assert "## Summary: 5 steps, 1 passed, 1 FAILED, 3 skipped" in text
    assert "| heavy | skipped | skipped for the budget: needs about 600 s" in text


def test_main_writes_the_report_when_the_budget_runs_out(tmp_path, monkeypatch, fake_cupy):
    # main() on the CuPy stand-in, with the GPU's environment and the planned steps made up: a
    # step too long for the budget is skipped and named, and the report is written all the same.
    quick = _echo_step("memcheck_clean.txt", "memcheck")
    quick.seconds = 1
    heavy = gpu_check.Step("heavy", [sys.executable, "-c", "pass"], "train", 600)
    monkeypatch.setattr(gpu_check.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(gpu_check, "environment", lambda sanitizer: {"GPU": "NVIDIA H100"})
    monkeypatch.setattr(gpu_check, "plan", lambda *args: [heavy, quick])
    argv = ["gpu_check.py", "--budget", "60", "--workers", "2", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    assert gpu_check.main() == 0
    text = (tmp_path / "gpu-nvidia-h100.md").read_text()
    assert "## Summary: 2 steps, 1 passed, 1 skipped" in text
    assert "| heavy | skipped | skipped for the budget: needs about 600 s, " in text
    assert "| budget | 60 s |" in text and "| pytest workers |" in text


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
def test_kernel_split_times_the_kernels_on_the_cupy_standin(fake_cupy, monkeypatch, capsys):
    # The process of the "kernel split" step, at a size the emulator runs in seconds: its
    # table is what parse_split reads (the times themselves mean nothing here).
    monkeypatch.setattr(gpu_check, "SPLIT_SHAPE", (1, 2, 16))
    monkeypatch.setattr(gpu_check, "SPLIT_T", (8, 40))
    monkeypatch.setattr(gpu_check, "SPLIT_REPS", 1)
    monkeypatch.setattr(gpu_check, "SWEEP_T", 40)
    from minigrad.kernels import emulator
    from minigrad.kernels import flash_attention_cuda as launcher

    tables = {name: dict(table) for name, table in (("fmaf", launcher._TILES),
                                                      ("mma", launcher._MMA_TILES))}  # fmt: skip
    with emulator.count_launches() as launches:  # which kernels each row's choice ran
        assert gpu_check.kernel_split() == 0
    assert {launch.options[-1] for launch in launches if launch.name == "flash_mma_fwd"} == {
        "-DPASSES=1",
        "-DPASSES=3",
    }
    # the sweep ran each mma kernel at KT 64 and 32 (the module's -DKT), then put the tables back
    dkdv_tiles = {
        next(o for o in launch.options if o.startswith("-DKT="))
        for launch in launches
        if launch.name == "flash_mma_bwd_dkdv"
    }
    assert dkdv_tiles == {"-DKT=64", "-DKT=32"}
    assert tables == {"fmaf": launcher._TILES, "mma": launcher._MMA_TILES}
    out = capsys.readouterr().out
    passed, summary = gpu_check.parse_split(out)
    assert passed and summary.startswith("forward / backward ms: T=8: off ")
    for T in (8, 40):
        assert re.search(rf"T={T}: off [\d.]+ / [\d.]+, tf32 [\d.]+ / [\d.]+, 3xtf32 ", summary)
    sweep = re.findall(r"^  tile +(\w+) +(\w+) +(\d+) +(\w+) +[\d.]+( +\(plan\))?$", out, re.M)
    points = {(choice, name, int(tile)) for choice, name, tile, _, _ in sweep}
    for choice in ("tf32", "3xtf32"):
        for kernel in ("fwd", "bwd_dkdv", "bwd_dq"):
            assert {(choice, f"flash_mma_{kernel}", t) for t in (64, 32)} <= points
    assert ("off", "flash_attn_fwd", 32) in points
    assert all(passes == ("forward" if "fwd" in name else "backward")
               for _, name, _, passes, _ in sweep)  # fmt: skip
    plans = [(choice, name) for choice, name, _, _, plan in sweep if plan]
    assert len(plans) == len(set(plans)) == len({(c, n) for c, n, _, _, _ in sweep})


def _load_attention():
    spec = importlib.util.spec_from_file_location("attention", ROOT / "bench" / "attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
def test_attention_columns_launch_the_kernels_they_are_named_for(fake_cupy, monkeypatch):
    # The attention step's kernel columns on the stand-in: each forward + backward launches the
    # fmaf kernels (kernel) or the mma ones with one or three passes (tf32, 3xtf32).
    import minigrad as mg
    from minigrad.kernels import emulator

    attention = _load_attention()
    arrays = attention.make_inputs(1, 1, 16, 16)
    monkeypatch.setattr(mg.backend, "_matmul_precision", mg.get_float32_matmul_precision())
    launched = {}
    for impl in ("kernel", "tf32", "3xtf32"):
        step = attention.cuda_step(arrays, impl)  # tf32 sets the precision: undone after the test
        with emulator.count_launches() as launches:
            step()
        launched[impl] = {(launch.name, launch.options[-1]) for launch in launches}
    assert {name for name, _ in launched["kernel"]} == {
        "flash_attn_fwd",
        "flash_attn_bwd_preprocess",
        "flash_attn_bwd_dkdv",
        "flash_attn_bwd_dq",
    }
    for impl, passes in (("tf32", "-DPASSES=1"), ("3xtf32", "-DPASSES=3")):
        assert launched[impl] - {("flash_attn_bwd_preprocess", "-DHS=16")} == {
            (name, passes) for name in ("flash_mma_fwd", "flash_mma_bwd_dkdv", "flash_mma_bwd_dq")
        }


def test_the_peer_step_is_absent_without_a_prepared_nanogpt_checkout(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check, "PEER_DIR", tmp_path / "bench" / "peers" / "nanoGPT")
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    (peer,) = [s for s in gpu_check.plan("py", 300, None, skip_bench=False) if s.kind == "peer"]
    assert "no prepared nanoGPT checkout in bench/peers/nanoGPT" in peer.absent
    data = tmp_path / "bench" / "peers" / "nanoGPT" / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    (data / "train.bin").write_bytes(b"")
    (peer,) = [s for s in gpu_check.plan("py", 300, None, skip_bench=False) if s.kind == "peer"]
    assert peer.absent == ""


def test_parse_peer_reads_nanogpt_s_median():
    out = "nanoGPT train.py float32, 300 iterations, median of 289: 14.02 ms/iter, "
    out += "1,168,616 tokens/s\n"
    assert gpu_check.parse_peer(out) == (True, "nanoGPT float32: 14.02 ms/iter, 1,168,616 tokens/s")
    assert gpu_check.parse_peer("Traceback ...") == (False, "no timing line in the output")
