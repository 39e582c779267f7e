"""`make gpu-check`: everything that needs an NVIDIA GPU, in one command and one report.

Made for a short GPU lease: it runs with nothing but what CUDA images carry (`python3` with
numpy, cupy, torch and pytest; no venv: `PYTHONPATH=. python3 bench/gpu_check.py`), in under 8
minutes on an H100, and a `--budget` stops it in time. In order, each step in its own process,
going on after a failure:

1. every GPU-only test (`pytest -m gpu`), on several workers where pytest-xdist is installed
   (serially where not; the report says which);
2. the benchmarks, before the sanitizers so that a short lease still measures: the kernels'
   forward and backward timed apart, for each `tensor_cores` choice of the launcher (the fmaf
   kernels, "off", and the tensor-core ones, "tf32" and "3xtf32"; this script again, with
   --kernel-split, which then runs each kernel at each tile of SWEEP_TILES at T=4096, the
   tile tables' decision in the same run), the GPU half of bench/attention.py (--device cuda
   --skip-kv at ATTENTION_T, the same kernels beside the naive CuPy path and torch SDPA), a
   short bench/train_vs_torch.py --device cuda (baby-gpt), nanoGPT's own train.py on the same
   GPU where a prepared checkout was carried along (bench/nanogpt_peer.py), ours again in a
   third of the steps with attention and its dropout in the flash kernel (--attn-impl=flash),
   and one step's phases timed apart at baby-gpt's widths and at tiny ones, the host's floor
   (bench/gpu_step_counts.py --time cuda);
3. compute-sanitizer's memcheck, racecheck and synccheck on the flash-attention kernels (every
   `tensor_cores` choice the GPU has), on a small case and an odd-sized one (this script
   again, with --kernel-case, checks the kernels' output against the NumPy twin so a crashed
   run never reads as clean);
4. as the budget allows: the counts of bench/kernel_counts.py (--no-emulate: nvcc's static
   mix and ptxas's registers, which a machine without a GPU gives too; a note in the report
   where the script is absent), and the training benchmark again in shorter runs: strict
   float32 on both sides (`--matmul-precision=highest`), and ours with the plain forms instead
   of the fused kernels (`MINIGRAD_FAST_PATHS=0`).

With `--budget SECONDS` (the default fits an 8-minute lease), a step starts only if its
expected time (`Step.seconds`: the H200 run's, rounded up, or a guess) fits in what is left, and it
is given what is left as its timeout (its whole process group is stopped then); a step that does
not fit is listed as skipped for the budget. The report is written either way.

Then writes bench/results/gpu-<gpu name>.md: the GPU, driver and library versions, a summary
table (one line per step: passed, failed or skipped, the numbers that matter, the time), the
kernel counts in full and the tail of each other step's output. Exits 1 if any step failed.

The parsing and the report writing are plain functions on text, tested on recorded outputs in
tests/kernels/test_gpu_check.py, so this works the first time it meets a GPU.
Usage: python3 bench/gpu_check.py [--out bench/results] [--iters 300] [--skip-bench]
       [--budget SECONDS] [--workers N]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere

from minigrad.fileio import atomic_write  # noqa: E402

# (B, nh, n_kv, T, S, hs): one full tile; and sizes that divide no tile, GQA 3, hs 80.
KERNEL_CASES = {"small": (1, 2, 1, 32, 32, 64), "odd": (2, 3, 1, 37, 53, 80)}
# Expected seconds of each tool on one case, now three kernel sets: the H200's fmaf-only run
# (memcheck and synccheck 1 s, racecheck 2 and 5 s) times three, rounded up.
SANITIZER_TOOLS = {"memcheck": 5, "racecheck": 15, "synccheck": 5}
# Worst |kernel - twin| / (1 + |twin|) against the float64 twin, per tensor_cores choice: float32
# sums (as in the GPU tests); TF32's 10-bit inputs, about 1e-3 a product (2e-3 the worst the
# emulator gives on KERNEL_CASES, three seeds); 3xTF32, about float32's.
KERNEL_TOL = {"off": 2e-4, "tf32": 1e-2, "3xtf32": 2e-4}
TAIL_LINES = 40  # lines of each step's output kept in the report
PEER_DIR = ROOT / "bench" / "peers" / "nanoGPT"  # nanoGPT's own checkout, where one is carried
TIMEOUT_S = 3600  # per step without a budget: the benchmarks on a slow GPU take minutes
BUDGET_S = 450  # the default --budget: an 8-minute lease less the start and the copy back
WORKERS = 8  # pytest-xdist workers for the GPU tests (on the H200's 16 cores: 100 s)
# The kernel split: causal float32 attention at the shape of the attention benchmark.
SPLIT_SHAPE = (4, 8, 64)  # B, nh, hs
SPLIT_T = (1024, 4096, 16384)
SPLIT_REPS = 5
# The tile sweep of the split: at one T, each kernel with each of these tiles (16 is there for
# small shared memories, never the fastest at hs 64).
SWEEP_T = 4096
SWEEP_TILES = (64, 32)
# bench/attention.py's T here: issue 25's table. Its default adds 512 and 2048, 10 processes
# more (five columns each) than a short lease can spare.
ATTENTION_T = (1024, 4096, 8192, 16384)
COUNTS_SCRIPT = ROOT / "bench" / "kernel_counts.py"


@dataclass
class Step:
    """One command of the check, with what it is called in the report."""

    title: str
    command: list[str]
    kind: str  # which parser reads its output: tests, a sanitizer, split, attention, ...
    seconds: float = 0  # expected time: the step starts only if this fits the budget left
    absent: str = ""  # why it cannot run on this machine (then skipped, with this reason)


@dataclass
class Result:
    """What a step did: passed (None: skipped, the summary says why), and a one-line summary
    of its numbers."""

    step: Step
    passed: bool | None
    summary: str
    seconds: float
    output: str


# ---------------------------------------------------------------------------------------------
# Parsing recorded outputs


def parse_nvidia_smi(csv: str) -> dict[str, str]:
    """The first GPU of `nvidia-smi --query-gpu=name,driver_version,memory.total
    --format=csv,noheader`.

    >>> parse_nvidia_smi("NVIDIA A100-SXM4-40GB, 535.104.05, 40960 MiB\\n")
    {'name': 'NVIDIA A100-SXM4-40GB', 'driver': '535.104.05', 'memory': '40960 MiB'}
    """
    fields = [f.strip() for f in csv.strip().splitlines()[0].split(",")]
    if len(fields) != 3:
        raise ValueError(f"unexpected nvidia-smi output: {csv!r}")
    return dict(zip(("name", "driver", "memory"), fields, strict=True))


def gpu_slug(name: str) -> str:
    """A file-name-safe GPU name.

    >>> gpu_slug("NVIDIA H100 80GB HBM3")
    'nvidia-h100-80gb-hbm3'
    """
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def parse_pytest(output: str) -> tuple[bool, str]:
    """(passed, summary) from pytest's last line, e.g. '12 passed, 3 skipped in 4.2s'.

    Fails when any test failed or errored, and when nothing ran at all: a GPU check in which
    every GPU test skipped has checked nothing.
    """
    match = re.search(r"^=* *((?:\d+ \w+(?:, )?)+) in [\d.]+s", output, re.M)
    if match is None:
        return False, "no pytest summary line (did pytest crash?)"
    counts = dict((word, int(n)) for n, word in re.findall(r"(\d+) (\w+)", match.group(1)))
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    summary = match.group(1)
    failures = re.findall(r"^FAILED (\S+)", output, re.M)
    if failures:
        summary += "; failed: " + ", ".join(failures)
    if counts.get("passed", 0) == 0 and not failed:
        return False, summary + " (no GPU test ran)"
    return failed == 0, summary


def parse_sanitizer(output: str, tool: str) -> tuple[bool, str]:
    """(passed, summary) of one compute-sanitizer run of `--kernel-case`.

    Clean means the tool's summary reports nothing AND the kernels' own check printed its ok
    line, 'kernel case <name> <shape>: <tensor_cores choices> ok', which comes after every
    choice was checked: a process that died before its kernels ran also reports 0 errors.
    The summary names the choices checked.
    """
    if tool == "racecheck":
        found = re.findall(
            r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+)", output
        )
        counts = [sum(int(n) for n in groups[1:]) for groups in found]
        noun = "hazard errors and warnings"
    else:
        counts = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) errors?", output)]
        noun = "errors"
    kernel_ok = re.search(r"^kernel case \w+ \([\d, ]+\): (.+) ok$", output, re.M)
    wrong = re.search(r"^kernel case \w+ \([\d, ]+\): WRONG: (.+)$", output, re.M)
    if not counts:
        return False, f"no {tool} summary in the output"
    summary = f"{sum(counts)} {noun}"
    if wrong is not None:
        return False, f"{summary}; wrong answers from the kernels {wrong.group(1)}"
    if kernel_ok is None:
        return False, summary + "; the kernels did not finish their check"
    return sum(counts) == 0, f"{summary} (kernels {kernel_ok.group(1)})"


def parse_attention(output: str) -> tuple[bool, str]:
    """(passed, summary) of `bench/attention.py --device cuda`: the kernel, naive and torch
    times at the longest T all three ran, and the longest T each fits.

    A row is '  4096   ms MB ms MB ms MB', with 'OOM' or 'error' in place of a number.
    """
    header = re.search(r"^ +T +(.*)$", output, re.M)
    longest = re.search(r"^longest T that fits: (.*)$", output, re.M)
    if header is None or longest is None:
        return False, "no GPU table in the output"
    impls = re.findall(r"(\w+) ms", header.group(1))
    rows = re.findall(r"^ *(\d+)((?: +(?:[\d.]+|-|OOM|error))+) *$", output, re.M)
    complete = [
        (int(T), [float(x) for x in cells.split()[::2]])
        for T, cells in rows
        if "OOM" not in cells and "error" not in cells
    ]
    errors = len(re.findall(r"^ +\(\w+ at T=\d+ failed", output, re.M))
    summary = f"longest T that fits: {longest.group(1)}"
    if complete:
        T, times = complete[-1]
        summary = (
            f"T={T}: "
            + ", ".join(f"{impl} {ms:.2f} ms" for impl, ms in zip(impls, times, strict=True))
            + f"; {summary}"
        )
    if errors:
        summary += f"; {errors} points failed"
    return errors == 0 and bool(complete), summary


def parse_train(output: str) -> tuple[bool, str]:
    """(passed, summary) of `bench/train_vs_torch.py`: both sides' validation loss and the
    throughput ratio. Passes when both sides trained and their losses agree within 0.05
    (the seed spread of one run; the engines differ far less)."""
    sides = dict(
        (name, (float(val), float(speed.replace(",", ""))))
        for name, val, speed in re.findall(
            r"^ *\d+ +(minigrad|pytorch) +[\d.]+ +([\d.]+) +([\d,]+) *$", output, re.M
        )
    )
    ratio = re.search(r"throughput ratio minigrad / pytorch: ([\d.]+)", output)
    if len(sides) != 2 or ratio is None:
        return False, "no results table in the output"
    (ours, ours_speed), (torch, torch_speed) = sides["minigrad"], sides["pytorch"]
    summary = (
        f"val loss {ours:.4f} (minigrad) vs {torch:.4f} (pytorch); tokens/s {ours_speed:,.0f} vs "
        f"{torch_speed:,.0f}, ratio {float(ratio.group(1)):.2f}"
    )
    return abs(ours - torch) <= 0.05, summary


def parse_peer(output: str) -> tuple[bool, str]:
    """(passed, summary) of bench/nanogpt_peer.py: nanoGPT's median ms per iteration."""
    found = re.search(r"^nanoGPT train.py (\w+), .*: ([\d.]+) ms/iter, ([\d,]+) tokens/s", output,
                      re.M)  # fmt: skip
    if found is None:
        return False, "no timing line in the output"
    dtype, ms, speed = found.groups()
    return True, f"nanoGPT {dtype}: {float(ms):.2f} ms/iter, {speed} tokens/s"


def parse_split(output: str) -> tuple[bool, str]:
    """(passed, summary) of `--kernel-split`: the kernels' forward and backward ms at each T,
    for each tensor_cores choice.

    A row is '   4096      tf32      2.20      5.70      7.90'; a point that failed prints a
    line '  (kernel tf32 at T=... failed: ...)' instead, and fails the step; a choice the GPU
    does not have, '  (kernel tf32 skipped: why)', which does not.

    >>> parse_split("   1024       off      1.21      3.18      4.39\\n"
    ...             "   1024      tf32      0.40      1.10      1.50\\n")
    (True, 'forward / backward ms: T=1024: off 1.21 / 3.18, tf32 0.40 / 1.10')
    """
    rows = re.findall(r"^ *(\d+) +(\w+) +([\d.]+) +([\d.]+) +[\d.]+ *$", output, re.M)
    errors = re.findall(r"^ +\(kernel (\w+) at T=(\d+) failed", output, re.M)
    skipped = re.findall(r"^ +\(kernel (\w+) skipped: ", output, re.M)
    if not rows and not errors:
        return False, "no kernel split table in the output"
    by_T: dict[str, list[str]] = {}
    for T, kernels, fwd, bwd in rows:
        by_T.setdefault(T, []).append(f"{kernels} {fwd} / {bwd}")
    summary = "forward / backward ms: " + "; ".join(
        f"T={T}: {', '.join(cells)}" for T, cells in by_T.items()
    )
    if errors:
        summary += "; failed: " + ", ".join(f"{kernels} at T={T}" for kernels, T in errors)
    if skipped:
        summary += "; skipped (not on this GPU): " + ", ".join(skipped)
    tiles_ok, tiles = parse_tile_sweep(output)
    return bool(rows) and not errors and tiles_ok, summary + tiles


def parse_tile_sweep(output: str) -> tuple[bool, str]:
    """(passed, what to add to the split's summary) of its tile sweep: for each kernel whose
    fastest tile is not the launcher's plan (by over 3%: timing noise), which and by how much.

    >>> parse_tile_sweep("  tile    tf32 flash_mma_bwd_dkdv    64  backward     6.12  (plan)\\n"
    ...                  "  tile    tf32 flash_mma_bwd_dkdv    32  backward     5.50\\n")
    (True, '; tiles: tf32 flash_mma_bwd_dkdv 32 beats the plan 64, 5.50 vs 6.12 ms')
    """
    points = re.findall(r"^  tile +(\w+) +(\w+) +(\d+) +\w+ +([\d.]+)( +\(plan\))?$", output, re.M)
    failed = re.findall(r"^  \(tile (\w+) (\w+) (\d+) failed", output, re.M)
    if not points and not failed:
        return True, ""  # an output from before the sweep
    kernels: dict[tuple[str, str], dict] = {}
    for choice, name, tile, ms, plan in points:
        entry = kernels.setdefault((choice, name), {"tiles": {}, "plan": None})
        entry["tiles"][int(tile)] = float(ms)
        if plan:
            entry["plan"] = int(tile)
    better = []
    for (choice, name), entry in kernels.items():
        best = min(entry["tiles"], key=entry["tiles"].get)
        plan = entry["plan"]
        if plan is not None and best != plan and entry["tiles"][best] < 0.97 * entry["tiles"][plan]:
            better.append(
                f"{choice} {name} {best} beats the plan {plan}, "
                f"{entry['tiles'][best]:.2f} vs {entry['tiles'][plan]:.2f} ms"
            )
    summary = "; tiles: " + ("; ".join(better) if better else "the plans are the fastest")
    if failed:
        summary += "; tile sweep failed: " + ", ".join(" ".join(f) for f in failed)
    return not failed, summary


def parse_counts(output: str) -> tuple[bool, str]:
    """(passed, summary) of `bench/kernel_counts.py`: its table goes into the report whole,
    under its own heading, so the summary only points there."""
    if not output.strip():
        return False, "no output"
    return True, f"{len(output.strip().splitlines())} lines, in full under Kernel counts"


def parse_step_times(output: str) -> tuple[bool, str]:
    """(passed, summary) of `bench/gpu_step_counts.py --time cuda`: the step's ms at the small
    widths (the host's floor) and at the preset's, and the floor's share of the step."""
    steps = re.findall(r"^n_embd (\d+), .* ([\d.]+)$", output, re.M)
    share = re.search(r"^host floor / step: ([\d.]+)", output, re.M)
    if len(steps) != 2 or share is None:
        return False, "no timing table in the output"
    (small, floor), (wide, real) = steps
    return True, (
        f"step {float(real):.1f} ms at n_embd {wide}; host floor {float(floor):.1f} ms "
        f"(n_embd {small}), {float(share.group(1)):.2f} of the step"
    )


PARSERS = {
    "tests": parse_pytest,
    "split": parse_split,
    "counts": parse_counts,
    "memcheck": lambda out: parse_sanitizer(out, "memcheck"),
    "racecheck": lambda out: parse_sanitizer(out, "racecheck"),
    "synccheck": lambda out: parse_sanitizer(out, "synccheck"),
    "attention": parse_attention,
    "train": parse_train,
    "peer": parse_peer,
    "step": parse_step_times,
}


# ---------------------------------------------------------------------------------------------
# The report


def render_report(environment: dict[str, str], results: list[Result], when: str) -> str:
    """The markdown report: environment, one summary row per step, the kernel counts in full,
    then the tail of each other step that ran."""
    lines = [f"# GPU check: {environment.get('GPU', 'unknown GPU')}", ""]
    lines += [f"Written by `make gpu-check` (bench/gpu_check.py) on {when}.", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in environment.items()]
    counts = {
        word: sum(r.passed is value for r in results)
        for word, value in (("passed", True), ("FAILED", False), ("skipped", None))
    }
    tally = ", ".join(f"{n} {word}" for word, n in counts.items() if n)
    lines += ["", f"## Summary: {len(results)} steps, {tally}", ""]
    lines += ["| step | result | details | time |", "|---|---|---|---|"]
    for r in results:
        verdict = {True: "passed", False: "**FAILED**", None: "skipped"}[r.passed]
        details = r.summary.replace("|", "\\|")
        lines.append(f"| {r.step.title} | {verdict} | {details} | {r.seconds:.0f} s |")
    for r in results:
        if r.step.kind == "counts":
            lines += ["", "## Kernel counts", "", f"`{' '.join(r.step.command)}`", ""]
            lines += ["```", r.output.rstrip(), "```"] if r.output.strip() else [r.summary]
    lines += ["", "## Output of each step", ""]
    for r in results:
        if r.passed is None or r.step.kind == "counts":
            continue
        tail = r.output.rstrip().splitlines()[-TAIL_LINES:]
        lines += [f"### {r.step.title}", "", f"`{' '.join(r.step.command)}`", "", "```"]
        lines += [*tail, "```", ""]
    return "\n".join(lines)


def report_path(out_dir: Path, gpu_name: str) -> Path:
    """bench/results/gpu-<gpu name>.md.

    >>> report_path(Path("bench/results"), "Tesla T4").as_posix()
    'bench/results/gpu-tesla-t4.md'
    """
    return out_dir / f"gpu-{gpu_slug(gpu_name)}.md"


# ---------------------------------------------------------------------------------------------
# Running


def plan(
    python: str,
    iters: int,
    sanitizer: str | None,
    skip_bench: bool,
    workers: int = 0,
    counts: bool = True,
) -> list[Step]:
    """The commands of the check, in order: tests, benchmarks, sanitizers. ``workers`` 0 runs
    the tests serially (no pytest-xdist); without compute-sanitizer or bench/kernel_counts.py
    (``counts`` False) their step is there, ``absent``."""
    script = str(ROOT / "bench" / "gpu_check.py")
    # No -q: pyproject's addopts already has one, and a second drops pytest's summary line.
    tests = [python, "-m", "pytest", "-m", "gpu", "-rfEs"]
    tests += ["-n", str(workers)] if workers else ["-p", "no:xdist"]
    tests.append("tests")
    how = f"{workers} xdist workers" if workers else "serial: pytest-xdist is not installed"
    # Expected seconds: the H200 run's, rounded up; the serial tests and the counts are guesses,
    # and so are the split and the attention step since they time the tensor-core kernels too.
    steps = [Step(f"GPU tests (pytest -m gpu, {how})", tests, "tests", 120 if workers else 300)]
    if not skip_bench:
        split = [python, script, "--kernel-split"]
        steps.append(Step("kernel split (forward, backward; tiles)", split, "split", 40))
        attention = [python, str(ROOT / "bench" / "attention.py"), "--device", "cuda", "--skip-kv"]
        attention += ["--T", *(str(T) for T in ATTENTION_T)]
        steps.append(Step("bench/attention.py --device cuda", attention, "attention", 90))
        train = [python, str(ROOT / "bench" / "train_vs_torch.py"), "--device", "cuda"]
        train += ["--iters", str(iters), "--quiet"]
        steps.append(Step(f"bench/train_vs_torch.py baby-gpt, {iters} steps", train, "train", 90))
        peer = [python, str(ROOT / "bench" / "nanogpt_peer.py"), "--iters", str(iters)]
        missing = "" if (PEER_DIR / "data" / "shakespeare_char" / "train.bin").exists() else (
            f"no prepared nanoGPT checkout in {PEER_DIR.relative_to(ROOT)}: see "
            f"bench/nanogpt_peer.py (fetch it, --prepare, carry bench/peers)"
        )  # fmt: skip
        steps.append(Step(f"nanoGPT's own train.py, float32, {iters} iterations", peer, "peer",
                          40, missing))  # fmt: skip
        # ours with attention (and its dropout) in the flash kernel, where auto takes the naive
        # path: what decides auto's choice under dropout (issue 26); a guess of 60 s
        flash = [*train[:-3], "--iters", str(max(iters // 3, 1)), "--quiet", "--attn-impl=flash"]
        steps.append(Step(f"the same, attention in the flash kernel, {max(iters // 3, 1)} steps",
                          flash, "train", 60))  # fmt: skip
        # where one step's time goes (forward, backward, optimiser) and how much of it is the
        # host's: what decides the next fusion (issue 26); a guess of 20 s
        phases = [python, str(ROOT / "bench" / "gpu_step_counts.py"), "--time", "cuda"]
        steps.append(Step("one step's phases and the host's floor", phases, "step", 20))
    if sanitizer is None:
        missing = "compute-sanitizer is not on PATH: install the CUDA toolkit to run it"
        steps.append(Step("compute-sanitizer (all tools)", [], "none", 0, missing))
    else:
        for tool, seconds in SANITIZER_TOOLS.items():
            for case in KERNEL_CASES:
                command = [sanitizer, "--tool", tool, "--error-exitcode", "1", python, script]
                command += ["--kernel-case", case]
                title = f"{tool}, {case} case {KERNEL_CASES[case]}"
                steps.append(Step(title, command, tool, seconds))
    if not skip_bench:
        # After the sanitizers: the static counts are nvcc's and ptxas's, which any machine with
        # nvcc gives (bench/results has them); on the GPU they only confirm the toolkit there.
        counted = [python, str(COUNTS_SCRIPT), "--no-emulate"]
        absent = "" if counts else "bench/kernel_counts.py is not in this checkout: no counts"
        steps.append(Step("bench/kernel_counts.py --no-emulate", counted, "counts", 30, absent))
        # last, as the budget allows: the training step against strict float32 (both sides)
        # and without our fused kernels (ours only), in shorter runs (guesses: 60 s each)
        short = max(iters // 3, 1)
        strict = [*train[:-3], "--iters", str(short), "--quiet", "--matmul-precision=highest"]
        steps.append(Step(f"the same, strict float32, {short} steps", strict, "train", 60))
        plain = ["env", "MINIGRAD_FAST_PATHS=0", *train[:-3], "--iters", str(short), "--quiet"]
        steps.append(Step(f"the same, TF32, plain kernels, {short} steps", plain, "train", 60))
    return steps


def run(step: Step, timeout: float = TIMEOUT_S) -> Result:
    """Run one step, capturing stdout and stderr together, and parse its output.

    The step runs in its own process group, so a timeout stops all of it (pytest's xdist
    workers too), not only the process started here.
    """
    print(f"== {step.title}: {' '.join(step.command)}", flush=True)
    start = time.perf_counter()
    proc = subprocess.Popen(
        step.command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        returncode = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
            os.killpg(proc.pid, signal.SIGKILL)
        output, returncode = proc.communicate()[0] + b"\n(timed out)", None
    output = output.decode(errors="replace")
    seconds = time.perf_counter() - start
    passed, summary = PARSERS[step.kind](output)
    if returncode != 0:
        passed = False
        summary += "; timed out" if returncode is None else f"; exit code {returncode}"
    print(f"   {'passed' if passed else 'FAILED'}: {summary} ({seconds:.0f} s)", flush=True)
    return Result(step, passed, summary, seconds, output)


def run_within(steps: list[Step], deadline: float | None) -> list[Result]:
    """Run the steps in order. With a ``deadline`` (time.monotonic()), a step starts only if
    its expected seconds fit in what is left, which is then its timeout; the others, and the
    steps ``absent`` here, are skipped with the reason."""
    results = []
    for step in steps:
        left = TIMEOUT_S if deadline is None else deadline - time.monotonic()
        why = step.absent
        if not why and (left <= 0 or step.seconds > left):
            why = "skipped for the budget: "
            why += f"needs about {step.seconds:.0f} s, {max(left, 0):.0f} s left"
        if why:
            print(f"== {step.title}: {why}", flush=True)
            results.append(Result(step, None, why, 0, ""))
        else:
            results.append(run(step, timeout=left))
    return results


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment(sanitizer: str | None) -> dict[str, str]:
    """The GPU, driver and versions this report is about (needs nvidia-smi and cupy)."""
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    gpu = parse_nvidia_smi(smi)
    import cupy

    runtime = cupy.cuda.runtime.runtimeGetVersion()  # e.g. 12040 for CUDA 12.4
    cupy_dist = next(
        (
            d.metadata["Name"]
            for d in importlib.metadata.distributions()
            if d.metadata["Name"].lower().startswith("cupy")
        ),
        "cupy",
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    tool = "not found (part of the CUDA toolkit): sanitizer steps not run"
    if sanitizer is not None:
        tool = subprocess.run([sanitizer, "--version"], capture_output=True, text=True).stdout
        tool = tool.strip().splitlines()[-1] if tool.strip() else sanitizer
    return {
        "GPU": gpu["name"],
        "memory": gpu["memory"],
        "driver": gpu["driver"],
        "CUDA runtime": f"{runtime // 1000}.{runtime % 1000 // 10}",
        cupy_dist: _version(cupy_dist),
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "python": sys.version.split()[0],
        "compute-sanitizer": tool,
        "commit": commit or "unknown",
    }


def tensor_core_choices(attributes: dict) -> dict[str, str]:
    """The launcher's tensor_cores choices, each with why this GPU (its device attributes)
    cannot run it, or "" where it can: the launcher's own rule, `resolve_tensor_cores`.

    >>> tensor_core_choices({"ComputeCapabilityMajor": 9})
    {'off': '', 'tf32': '', '3xtf32': ''}
    """
    from minigrad.kernels.flash_attention_cuda import TENSOR_CORES, resolve_tensor_cores

    why = {}
    for choice in TENSOR_CORES:
        try:
            resolve_tensor_cores(choice, attributes)
            why[choice] = ""
        except ValueError as e:
            why[choice] = str(e)
    return why


def kernel_case(name: str) -> int:
    """Run the flash kernels forward and backward on one case with each tensor_cores choice
    the GPU has, check each against the twin (KERNEL_TOL), then print 'kernel case ... ok'
    (what parse_sanitizer looks for) if all passed. The sanitized process."""
    import cupy
    import numpy as np

    from minigrad.kernels.flash_attention import flash_attention_backward, flash_attention_forward
    from minigrad.kernels.flash_attention_cuda import (
        flash_attention_backward_cuda,
        flash_attention_forward_cuda,
    )

    B, nh, n_kv, T, S, hs = KERNEL_CASES[name]
    rng = np.random.default_rng(0)
    q, grad_o = (rng.standard_normal((B, nh, T, hs)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((B, n_kv, S, hs)).astype(np.float32) for _ in range(2))
    q64, k64, v64, g64 = (x.astype(np.float64) for x in (q, k, v, grad_o))
    o_ref, lse_ref = flash_attention_forward(q64, k64, v64)
    want = (o_ref, lse_ref, *flash_attention_backward(q64, k64, v64, o_ref, lse_ref, g64))
    inputs = [cupy.asarray(x) for x in (q, k, v, grad_o)]
    print(f"kernel case {name} {KERNEL_CASES[name]}, worst relative error against the twin:")
    checked, wrong = [], []
    for choice, why in tensor_core_choices(cupy.cuda.Device().attributes).items():
        if why:
            print(f"  {choice:<8}skipped: {why}")
            continue
        o, lse = flash_attention_forward_cuda(*inputs[:3], tensor_cores=choice)
        grads = flash_attention_backward_cuda(*inputs[:3], o, lse, inputs[3], tensor_cores=choice)
        worst = max(
            float(np.max(np.abs(cupy.asnumpy(x) - w) / (1 + np.abs(w))))
            for x, w in zip((o, lse, *grads), want, strict=True)
        )
        tol = KERNEL_TOL[choice]
        print(f"  {choice:<8}{worst:.2e} (tolerance {tol:.0e})")
        (checked if worst <= tol else wrong).append(choice)
    verdict = f"WRONG: {', '.join(wrong)}" if wrong else f"{', '.join(checked)} ok"
    print(f"kernel case {name} {KERNEL_CASES[name]}: {verdict}")
    return 1 if wrong else 0


def kernel_split() -> int:
    """Time the kernels' forward and their backward apart, at SPLIT_SHAPE for each T in SPLIT_T
    and each tensor_cores choice the GPU has (causal float32; best of SPLIT_REPS after a
    warm-up, the device synchronised around each call); print one row per T and choice. The
    process of the "kernel split" step."""
    import functools

    import cupy
    import numpy as np

    from minigrad.kernels.flash_attention_cuda import (
        flash_attention_backward_cuda,
        flash_attention_forward_cuda,
    )

    B, nh, hs = SPLIT_SHAPE
    rng = np.random.default_rng(0)
    choices = tensor_core_choices(cupy.cuda.Device().attributes)
    print(f"kernel split: causal float32, B={B} nh={nh} hs={hs}, best of {SPLIT_REPS}, ms")
    for choice, why in choices.items():
        if why:
            print(f"  (kernel {choice} skipped: {why})")
    print(f"{'T':>7}{'kernels':>10}{'forward':>10}{'backward':>10}{'total':>10}")
    failed = 0
    for T in SPLIT_T:
        arrays = [rng.standard_normal((B, nh, T, hs), dtype=np.float32) for _ in range(4)]
        for choice in (choice for choice, why in choices.items() if not why):
            try:
                q, k, v, grad_o = (cupy.asarray(x) for x in arrays)
                forward = functools.partial(
                    flash_attention_forward_cuda, q, k, v, tensor_cores=choice
                )
                o, lse = forward()
                backward = functools.partial(
                    flash_attention_backward_cuda, q, k, v, o, lse, grad_o, tensor_cores=choice
                )
                fwd_ms, bwd_ms = best_ms(forward), best_ms(backward)
            except Exception as e:  # out of memory, or a launch the kernel refuses: go on
                print(f"  (kernel {choice} at T={T} failed: {type(e).__name__}: {e})")
                failed += 1
                continue
            print(f"{T:>7}{choice:>10}{fwd_ms:>10.2f}{bwd_ms:>10.2f}{fwd_ms + bwd_ms:>10.2f}")
    failed += tile_sweep([choice for choice, why in choices.items() if not why])
    return 1 if failed else 0


@contextlib.contextmanager
def forced_tile(kernel: str, tile: int):
    """Make the launcher's plan for ``kernel`` the one tile ``tile`` (bench only: the tile
    tables are the launcher's, `launch_plan` still checks that it fits)."""
    from minigrad.kernels import flash_attention_cuda as launcher

    table = launcher._MMA_TILES if kernel.startswith("flash_mma") else launcher._TILES
    saved = table[kernel]
    table[kernel] = (tile,)
    try:
        yield
    finally:
        table[kernel] = saved


def tile_sweep(choices: list[str]) -> int:
    """At SWEEP_T, each kernel of each tensor_cores choice run with each tile of SWEEP_TILES
    its table has, the others left to the plan, timing the pass that holds it (forward, or
    the whole backward); one line per point, '(plan)' on the launcher's own choice. What
    decides the tile tables (_TILES, _MMA_TILES) from one run. Returns the points that failed."""
    import functools

    import cupy
    import numpy as np

    from minigrad.kernels import flash_attention_cuda as launcher

    B, nh, hs = SPLIT_SHAPE
    attributes = cupy.cuda.Device().attributes
    rng = np.random.default_rng(0)
    q, k, v, grad_o = (
        cupy.asarray(rng.standard_normal((B, nh, SWEEP_T, hs), dtype=np.float32)) for _ in range(4)
    )
    print(f"tile sweep at T={SWEEP_T}: one kernel's tile forced, its pass timed (ms)")
    failed = 0
    for choice in choices:
        prefix = "flash_attn_" if choice == "off" else "flash_mma_"
        table = launcher._TILES if choice == "off" else launcher._MMA_TILES
        forward = functools.partial(
            launcher.flash_attention_forward_cuda, q, k, v, tensor_cores=choice
        )
        for kernel in ("fwd", "bwd_dkdv", "bwd_dq"):
            name = prefix + kernel
            tiles = [tile for tile in table[name] if tile in SWEEP_TILES]
            if len(tiles) < 2:
                continue
            plan = launcher.launch_plan(name, hs, attributes)[0]
            pass_name = "forward" if kernel == "fwd" else "backward"
            for tile in tiles:
                try:
                    with forced_tile(name, tile):
                        if kernel == "fwd":
                            ms = best_ms(forward)
                        else:
                            backward = functools.partial(
                                launcher.flash_attention_backward_cuda,
                                *(q, k, v, *forward(), grad_o),
                                tensor_cores=choice,
                            )
                            ms = best_ms(backward)
                except ValueError as e:  # the tile's shared memory does not fit this GPU
                    print(f"  (tile {choice} {name} {tile}: does not fit: {e})")
                    continue
                except Exception as e:  # a launch that fails: go on, and fail the step
                    print(f"  (tile {choice} {name} {tile} failed: {type(e).__name__}: {e})")
                    failed += 1
                    continue
                mark = "  (plan)" if tile == plan else ""
                print(f"  tile {choice:>7} {name:<19}{tile:>4} {pass_name:>9}{ms:>9.2f}{mark}")
    return failed


def best_ms(fn) -> float:
    """The best of SPLIT_REPS calls of ``fn`` in milliseconds, after one warm-up (it compiles
    the kernel), the device synchronised after each."""
    import cupy

    device = cupy.cuda.Device()
    fn()
    device.synchronize()
    times = []
    for _ in range(SPLIT_REPS):
        start = time.perf_counter()
        fn()
        device.synchronize()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def xdist_workers(requested: int | None) -> int:
    """pytest-xdist workers for the GPU tests: ``requested``, else WORKERS capped by the CPU
    count; 0 (serial) where pytest-xdist is not installed."""
    if importlib.util.find_spec("xdist") is None:
        return 0
    return requested if requested is not None else min(WORKERS, os.cpu_count() or 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--iters", type=int, default=300, help="train_vs_torch steps")
    parser.add_argument("--skip-bench", action="store_true", help="tests and sanitizers only")
    parser.add_argument(
        "--budget", type=float, default=BUDGET_S, help="seconds for all steps (0: no limit)"
    )
    parser.add_argument(
        "--workers", type=int, help=f"xdist workers (default {WORKERS}, at most the CPU count)"
    )
    parser.add_argument("--kernel-case", choices=sorted(KERNEL_CASES), help=argparse.SUPPRESS)
    parser.add_argument("--kernel-split", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kernel_case:
        return kernel_case(args.kernel_case)
    if args.kernel_split:
        return kernel_split()
    deadline = time.monotonic() + args.budget if args.budget > 0 else None
    if shutil.which("nvidia-smi") is None:
        raise SystemExit("make gpu-check needs an NVIDIA GPU and its driver (nvidia-smi)")
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # ImportError, or CUDARuntimeError without a usable device
        raise SystemExit(f"cupy cannot use the GPU ({e}): pip install -e '.[gpu]'") from None
    sanitizer = shutil.which("compute-sanitizer")
    env = environment(sanitizer)
    workers = xdist_workers(args.workers)
    env["pytest workers"] = f"{workers} (pytest-xdist)" if workers else "serial (no pytest-xdist)"
    env["budget"] = f"{args.budget:.0f} s" if deadline is not None else "none"
    steps = plan(
        sys.executable, args.iters, sanitizer, args.skip_bench, workers, COUNTS_SCRIPT.exists()
    )
    results = run_within(steps, deadline)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    path = report_path(args.out, env["GPU"])
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, text=True) as f:
        f.write(render_report(env, results, when))
    print(f"\nreport: {path}")
    return 1 if any(r.passed is False for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
