"""`make gpu-check`: everything that needs an NVIDIA GPU, in one command and one report.

On a machine with a GPU and `pip install -e '.[gpu]'` (and torch, for the two benchmarks),
runs in order, each in its own process, and goes on after a failure:

1. every GPU-only test (`pytest -m gpu`);
2. compute-sanitizer's memcheck, racecheck and synccheck on the flash-attention kernels, on a
   small case and an odd-sized one (this script again, with --kernel-case, checks the
   kernels' output against the NumPy twin so a crashed run never reads as clean);
3. the GPU half of bench/attention.py (--device cuda --skip-kv);
4. a short bench/train_vs_torch.py --device cuda (baby-gpt, 300 steps).

Then writes bench/results/gpu-<gpu name>.md: the GPU, driver and library versions, a summary
table (one line per step: passed or failed, the numbers that matter, the time) and the tail
of each step's output. Exits 1 if any step failed.

The parsing and the report writing are plain functions on text, tested on recorded outputs in
tests/kernels/test_gpu_check.py, so this works the first time it meets a GPU.
Usage: python bench/gpu_check.py [--out bench/results] [--iters 300] [--skip-bench]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import re
import shutil
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
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
KERNEL_TOL = 2e-4  # float32 kernels against the float64 twin, as in the GPU tests
TAIL_LINES = 40  # lines of each step's output kept in the report
TIMEOUT_S = 3600  # per step: the benchmarks on a slow GPU take minutes, not an hour


@dataclass
class Step:
    """One command of the check, with what it is called in the report."""

    title: str
    command: list[str]
    kind: str  # which parser reads its output: tests, sanitizer, attention, train


@dataclass
class Result:
    """What a step did: passed (None: not run), and a one-line summary of its numbers."""

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
    line: a process that died before its kernels ran also reports 0 errors.
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
    kernel_ok = re.search(r"^kernel case .* ok$", output, re.M) is not None
    if not counts:
        return False, f"no {tool} summary in the output"
    summary = f"{sum(counts)} {noun}"
    if not kernel_ok:
        return False, summary + "; the kernels did not finish their check"
    return sum(counts) == 0, summary


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


PARSERS = {
    "tests": parse_pytest,
    "memcheck": lambda out: parse_sanitizer(out, "memcheck"),
    "racecheck": lambda out: parse_sanitizer(out, "racecheck"),
    "synccheck": lambda out: parse_sanitizer(out, "synccheck"),
    "attention": parse_attention,
    "train": parse_train,
}


# ---------------------------------------------------------------------------------------------
# The report


def render_report(environment: dict[str, str], results: list[Result], when: str) -> str:
    """The markdown report: environment, one summary row per step, then each step's tail."""
    lines = [f"# GPU check: {environment.get('GPU', 'unknown GPU')}", ""]
    lines += [f"Written by `make gpu-check` (bench/gpu_check.py) on {when}.", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in environment.items()]
    counts = {
        word: sum(r.passed is value for r in results)
        for word, value in (("passed", True), ("FAILED", False), ("not run", None))
    }
    tally = ", ".join(f"{n} {word}" for word, n in counts.items() if n)
    lines += ["", f"## Summary: {len(results)} steps, {tally}", ""]
    lines += ["| step | result | details | time |", "|---|---|---|---|"]
    for r in results:
        verdict = {True: "passed", False: "**FAILED**", None: "not run"}[r.passed]
        details = r.summary.replace("|", "\\|")
        lines.append(f"| {r.step.title} | {verdict} | {details} | {r.seconds:.0f} s |")
    lines += ["", "## Output of each step", ""]
    for r in results:
        if r.passed is None:
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


def plan(python: str, iters: int, sanitizer: str | None, skip_bench: bool) -> list[Step]:
    """The commands of the check, in order. Without compute-sanitizer its steps are absent
    (`main` reports them as not run)."""
    # No -q: pyproject's addopts already has one, and a second drops pytest's summary line.
    steps = [
        Step(
            "GPU tests (pytest -m gpu)",
            [python, "-m", "pytest", "-m", "gpu", "-p", "no:xdist", "-rfEs", "tests"],
            "tests",
        )
    ]
    if sanitizer is not None:
        for tool in SANITIZER_TOOLS:
            for case in KERNEL_CASES:
                command = [sanitizer, "--tool", tool, "--error-exitcode", "1", python]
                command += [str(ROOT / "bench" / "gpu_check.py"), "--kernel-case", case]
                steps.append(Step(f"{tool}, {case} case {KERNEL_CASES[case]}", command, tool))
    if not skip_bench:
        attention = [python, str(ROOT / "bench" / "attention.py"), "--device", "cuda", "--skip-kv"]
        steps.append(Step("bench/attention.py --device cuda", attention, "attention"))
        train = [python, str(ROOT / "bench" / "train_vs_torch.py"), "--device", "cuda"]
        train += ["--iters", str(iters), "--quiet"]
        steps.append(Step(f"bench/train_vs_torch.py baby-gpt, {iters} steps", train, "train"))
    return steps


def run(step: Step, timeout: float = TIMEOUT_S) -> Result:
    """Run one step, capturing stdout and stderr together, and parse its output."""
    print(f"== {step.title}: {' '.join(step.command)}", flush=True)
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            step.command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
        output, returncode = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as e:
        output, returncode = (e.stdout or b"") + b"\n(timed out)", None
    output = output.decode(errors="replace")
    seconds = time.perf_counter() - start
    passed, summary = PARSERS[step.kind](output)
    if returncode != 0:
        passed = False
        summary += "; timed out" if returncode is None else f"; exit code {returncode}"
    print(f"   {'passed' if passed else 'FAILED'}: {summary} ({seconds:.0f} s)", flush=True)
    return Result(step, passed, summary, seconds, output)


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


def kernel_case(name: str) -> int:
    """Run the flash kernels forward and backward on one case, check them against the twin,
    print 'kernel case ... ok' (what parse_sanitizer looks for). The sanitized process."""
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
    o, lse = flash_attention_forward_cuda(*(cupy.asarray(x) for x in (q, k, v)))
    grads = flash_attention_backward_cuda(
        *(cupy.asarray(x) for x in (q, k, v)), o, lse, cupy.asarray(grad_o)
    )
    q64, k64, v64, g64 = (x.astype(np.float64) for x in (q, k, v, grad_o))
    o_ref, lse_ref = flash_attention_forward(q64, k64, v64)
    want = (o_ref, lse_ref, *flash_attention_backward(q64, k64, v64, o_ref, lse_ref, g64))
    worst = max(
        float(np.max(np.abs(cupy.asnumpy(x) - w) / (1 + np.abs(w))))
        for x, w in zip((o, lse, *grads), want, strict=True)
    )
    verdict = "ok" if worst <= KERNEL_TOL else f"WRONG (tolerance {KERNEL_TOL})"
    print(f"kernel case {name} {KERNEL_CASES[name]}: worst relative error {worst:.2e} {verdict}")
    return 0 if verdict == "ok" else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--iters", type=int, default=300, help="train_vs_torch steps")
    parser.add_argument("--skip-bench", action="store_true", help="tests and sanitizers only")
    parser.add_argument("--kernel-case", choices=sorted(KERNEL_CASES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kernel_case:
        return kernel_case(args.kernel_case)
    if shutil.which("nvidia-smi") is None:
        raise SystemExit("make gpu-check needs an NVIDIA GPU and its driver (nvidia-smi)")
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # ImportError, or CUDARuntimeError without a usable device
        raise SystemExit(f"cupy cannot use the GPU ({e}): pip install -e '.[gpu]'") from None
    sanitizer = shutil.which("compute-sanitizer")
    env = environment(sanitizer)
    results = [run(step) for step in plan(sys.executable, args.iters, sanitizer, args.skip_bench)]
    if sanitizer is None:
        missing = "compute-sanitizer is not on PATH: install the CUDA toolkit to run it"
        results.insert(
            1, Result(Step("compute-sanitizer (all tools)", [], "none"), None, missing, 0, "")
        )
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    path = report_path(args.out, env["GPU"])
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, text=True) as f:
        f.write(render_report(env, results, when))
    print(f"\nreport: {path}")
    return 1 if any(r.passed is False for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
