"""Fused ops against the same math built from primitive Tensor ops, and against PyTorch eager.

For softmax, cross-entropy, LayerNorm and RMSNorm on float32 (B*T, C) arrays of the decoder's
default sizes, (768, 128) activations and (768, 65) logits, we time one forward plus backward
three ways: minigrad's fused Function, the composite of primitive ops (max, exp, sum, div...),
and torch.nn.functional on the CPU. A last row times ``linear`` on (12, 64, 128) @ W^T with W
(512, 128), fused against matmul + transpose + add, the measurement behind linear.py's choice.
The table prints medians over repetitions and two ratios: fused / composite (what fusing buys)
and fused / torch (the target is <= 2).

PyTorch runs in a child process (this script again, with --torch-worker, answering in JSON):
importing torch in the same process slows Python's garbage collector for minigrad's graphs.
Torch gets one thread by default, as NumPy's elementwise ops use one: the ratios then compare
the two per core. The default clock is the process's CPU time, which a busy shared machine
disturbs far less than wall time; ``--clock wall`` measures wall time instead.

Both processes first call minigrad.cpu_tuning.reuse_freed_memory(), as decoder.train does, so
that freed arrays' pages are reused rather than returned to the OS and faulted in again.
Without it (``--malloc default``) glibc's choice depends on what the process freed before,
and some rows, LayerNorm's for one, spend more time in page faults than in arithmetic; the
table's last column counts them.
Usage: python bench/fused_ops.py [--reps 15] [--inner 20] [--clock cpu|wall] [--torch-threads 1]
       [--malloc reuse|default]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

SHAPES = ((768, 128), (768, 65))  # (B*T, n_embd) activations and (B*T, vocab_size) logits
LINEAR_SHAPE = (12, 64, 128, 512)  # B, T, in_features, out_features
OPS = ("softmax", "cross_entropy", "layer_norm", "rms_norm")
LN_EPS, RMS_EPS = 1e-5, 1e-6
TARGET_RATIO = 2.0  # fused / torch must stay under this
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def make_inputs(shape: tuple[int, int], seed: int = 0) -> dict[str, np.ndarray]:
    """The same float32 arrays for both processes: x, an upstream gradient, targets, w, b."""
    rng = np.random.default_rng(seed)
    n, c = shape
    return {
        "x": rng.standard_normal(shape).astype(np.float32),
        "grad": rng.standard_normal(shape).astype(np.float32),
        "targets": rng.integers(0, c, n),
        "weight": (1 + 0.1 * rng.standard_normal(c)).astype(np.float32),
        "bias": (0.1 * rng.standard_normal(c)).astype(np.float32),
    }


def page_faults() -> int:
    """Minor page faults of this process so far (fresh pages the kernel had to hand out)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_it(step: Callable[[], None], reps: int, inner: int, clock: str) -> tuple[float, float]:
    """Median seconds per call of ``step`` over ``reps`` repetitions of ``inner`` calls, and
    the page faults per call."""
    now = CLOCKS[clock]
    for _ in range(3):  # warm caches and allocators
        step()
    times = []
    faults = page_faults()
    for _ in range(reps):
        start = now()
        for _ in range(inner):
            step()
        times.append((now() - start) / inner)
    return float(np.median(times)), (page_faults() - faults) / (reps * inner)


# ---- minigrad: fused and composite -------------------------------------------------------------
def minigrad_steps(shape: tuple[int, int]) -> dict[tuple[str, str], Callable[[], None]]:
    import minigrad as mg
    from minigrad import functional as F

    a = make_inputs(shape)
    x = mg.Tensor(a["x"], requires_grad=True)
    w = mg.Tensor(a["weight"], requires_grad=True)
    b = mg.Tensor(a["bias"], requires_grad=True)
    grad, targets = a["grad"], a["targets"]

    def softmax_c(t):
        e = (t - t.max(axis=-1, keepdims=True).detach()).exp()
        return e / e.sum(axis=-1, keepdims=True)

    def cross_entropy_c(t, tg):
        z = t - t.max(axis=-1, keepdims=True).detach()
        log_p = z - z.exp().sum(axis=-1, keepdims=True).log()
        return -mg.take_along_axis(log_p, tg[:, None], axis=1).mean()

    def layer_norm_c(t, w, b):
        centred = t - t.mean(axis=-1, keepdims=True)
        var = (centred * centred).mean(axis=-1, keepdims=True)
        return centred / (var + LN_EPS).sqrt() * w + b

    def rms_norm_c(t, w):
        return t / ((t * t).mean(axis=-1, keepdims=True) + RMS_EPS).sqrt() * w

    def run(fn, upstream=None):
        def step():
            x.grad = w.grad = b.grad = None
            fn().backward(upstream)

        return step

    return {
        ("softmax", "fused"): run(lambda: F.softmax(x), grad),
        ("softmax", "composite"): run(lambda: softmax_c(x), grad),
        ("cross_entropy", "fused"): run(lambda: F.cross_entropy(x, targets)),
        ("cross_entropy", "composite"): run(lambda: cross_entropy_c(x, targets)),
        ("layer_norm", "fused"): run(lambda: F.layer_norm(x, w, b, LN_EPS), grad),
        ("layer_norm", "composite"): run(lambda: layer_norm_c(x, w, b), grad),
        ("rms_norm", "fused"): run(lambda: F.rms_norm(x, w, RMS_EPS), grad),
        ("rms_norm", "composite"): run(lambda: rms_norm_c(x, w), grad),
    }


def minigrad_linear_steps() -> dict[tuple[str, str], Callable[[], None]]:
    import minigrad as mg
    from minigrad import functional as F

    B, T, n_in, n_out = LINEAR_SHAPE
    rng = np.random.default_rng(0)
    x = mg.Tensor(rng.standard_normal((B, T, n_in)).astype(np.float32), requires_grad=True)
    w = mg.Tensor(0.02 * rng.standard_normal((n_out, n_in)).astype(np.float32), requires_grad=True)
    b = mg.Tensor(np.zeros(n_out, np.float32), requires_grad=True)
    grad = rng.standard_normal((B, T, n_out)).astype(np.float32)

    def run(fn):
        def step():
            x.grad = w.grad = b.grad = None
            fn().backward(grad)

        return step

    return {
        ("linear", "fused"): run(lambda: F.linear(x, w, b)),
        ("linear", "composite"): run(lambda: x @ w.T + b),
    }


# ---- torch, in its own process -----------------------------------------------------------------
def torch_steps(shape: tuple[int, int]) -> dict[str, Callable[[], None]]:
    import torch
    import torch.nn.functional as TF

    a = make_inputs(shape)
    x = torch.tensor(a["x"], requires_grad=True)
    w = torch.tensor(a["weight"], requires_grad=True)
    b = torch.tensor(a["bias"], requires_grad=True)
    grad, targets = torch.tensor(a["grad"]), torch.tensor(a["targets"])
    c = shape[1]

    def run(fn, upstream=None):
        def step():
            x.grad = w.grad = b.grad = None
            fn().backward(upstream)

        return step

    return {
        "softmax": run(lambda: TF.softmax(x, -1), grad),
        "cross_entropy": run(lambda: TF.cross_entropy(x, targets)),
        "layer_norm": run(lambda: TF.layer_norm(x, (c,), w, b, LN_EPS), grad),
        "rms_norm": run(lambda: TF.rms_norm(x, (c,), w, RMS_EPS), grad),
    }


def torch_worker(reps: int, inner: int, clock: str, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    results = {"threads": torch.get_num_threads()}
    for shape in SHAPES:
        for op, step in torch_steps(shape).items():
            results[f"{op}|{shape}"] = time_it(step, reps, inner, clock)[0]
    print(json.dumps(results))


def run_torch(args: argparse.Namespace) -> dict | None:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--torch-worker"]
    cmd += ["--reps", str(args.reps), "--inner", str(args.inner), "--clock", args.clock]
    cmd += ["--torch-threads", str(args.torch_threads), "--malloc", args.malloc]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"(torch peer skipped: {proc.stderr.strip().splitlines()[-1:]})")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15, help="repetitions; the median is kept")
    parser.add_argument("--inner", type=int, default=20, help="calls timed together per rep")
    parser.add_argument("--clock", choices=CLOCKS, default="cpu", help="process CPU or wall time")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument(
        "--malloc",
        choices=("reuse", "default"),
        default="reuse",
        help="reuse: minigrad.cpu_tuning.reuse_freed_memory() in both processes; default: glibc's",
    )
    parser.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere
    if args.malloc == "reuse":
        from minigrad.cpu_tuning import reuse_freed_memory

        reuse_freed_memory()
    if args.torch_worker:
        torch_worker(args.reps, args.inner, args.clock, args.torch_threads)
        return

    rows = []
    for shape in SHAPES:
        steps = minigrad_steps(shape)
        for op in OPS:
            fused, faults = time_it(steps[(op, "fused")], args.reps, args.inner, args.clock)
            composite, _ = time_it(steps[(op, "composite")], args.reps, args.inner, args.clock)
            rows.append((op, shape, fused, composite, faults))
    linear = minigrad_linear_steps()
    linear_times = [
        time_it(linear[("linear", k)], args.reps, 5, args.clock) for k in ("fused", "composite")
    ]
    peer = run_torch(args)

    threads = f", torch threads: {peer['threads']}" if peer else ""
    print(
        f"forward + backward, float32, {args.clock} time, "
        f"median of {args.reps} x {args.inner} calls{threads}, malloc: {args.malloc}"
    )
    header = f"{'op':<15}{'shape':<12}{'fused us':>10}{'compos. us':>12}{'torch us':>10}"
    print(header + f"{'fused/comp':>12}{'fused/torch':>13}{'faults':>8}")
    misses = []
    for op, shape, fused, composite, faults in rows:
        torch_s = peer[f"{op}|{shape}"] if peer else float("nan")
        vs_torch = fused / torch_s
        if vs_torch > TARGET_RATIO:
            misses.append(f"{op} {shape}")
        print(
            f"{op:<15}{str(shape):<12}{fused * 1e6:>10.1f}{composite * 1e6:>12.1f}"
            f"{torch_s * 1e6:>10.1f}{fused / composite:>12.2f}{vs_torch:>13.2f}{faults:>8.0f}"
        )
    B, T, n_in, n_out = LINEAR_SHAPE
    (fused, faults), (composite, _) = linear_times
    print(
        f"{'linear':<15}{f'{B}x{T}x{n_in}':<12}{fused * 1e6:>10.1f}{composite * 1e6:>12.1f}"
        f"{'':>10}{fused / composite:>12.2f}{'':>13}{faults:>8.0f}"
    )
    print("faults: page faults per fused call (fresh pages from the OS)")
    if peer:
        verdict = f"missed by: {', '.join(misses)}" if misses else "met by every op"
        print(f"target fused/torch <= {TARGET_RATIO}: {verdict}")


if __name__ == "__main__":
    main()
