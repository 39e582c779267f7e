"""Per-node overhead of minigrad's autograd against PyTorch eager (CPU) and raw NumPy.

Two workloads, each a forward and a backward pass:

(a) chain: 1,000 small steps on an 8-element tensor, alternating ``y.tanh()`` with
    ``y * 1.001 + 0.001`` (1,500 ops, plus the final sum: 1,501 graph nodes). The arrays are
    tiny, so the time is almost all per-node bookkeeping: the cost this benchmark is about.
(b) single ops on (64, 128) arrays: ``x @ w`` with w (128, 128), ``x + y`` and ``x.tanh()``,
    each with an explicit upstream gradient (one node). Here the arithmetic starts to count.

The NumPy rows are the floor: the same arithmetic with a hand-written backward (a reverse
loop over the saved tanh outputs for (a); the textbook formulas for (b): ``g @ w.T`` and
``x.T @ g``, ``g`` twice, ``g * (1 - z^2)``), with no graph at all.

Each library runs in its own process (this script re-invoked with ``--worker LIB``, JSON back
on stdout): importing torch into minigrad's process adds many Python objects, which makes
every run of Python's cyclic garbage collector, and so minigrad's graphs, much slower. The
garbage collector stays on, as in real use. Every library runs on one thread (this measures
bookkeeping, not parallel speed-up), and the workers run in interleaved rounds so that a
burst of load from elsewhere hits all three alike; each number is the median of all samples.
Target: minigrad's cost per node at most 2x PyTorch eager's.

Usage: python bench/overhead.py        (about 20-40 s; without torch it prints the other rows)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBS = ("minigrad", "numpy", "torch")
CHAIN_STEPS = 1000
CHAIN_NODES = CHAIN_STEPS // 2 * 2 + CHAIN_STEPS // 2 + 1  # mul + add, tanh, and the sum
SHAPE = (64, 128)
TARGET = 2.0  # minigrad / torch per node, at most
ROUNDS = 3  # worker processes per library, interleaved, so a burst of load hits all alike
REPEATS = 5  # timed samples per workload in each worker
# One thread everywhere: this measures per-node overhead, not how well a library parallelizes.
ONE_THREAD = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def sample_times(fn: Callable[[], object], number: int, repeats: int) -> list[float]:
    """``repeats`` samples of the mean seconds per call over ``number`` back-to-back calls."""
    fn()  # warm up: first-call costs (imports, allocator, caches) are not overhead
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return times


# ---- workloads, one set per library ----------------------------------------------------------
def minigrad_workloads() -> dict[str, Callable[[], object]]:
    sys.path.insert(0, str(ROOT))
    import numpy as np

    import minigrad as mg

    rng = np.random.default_rng(0)
    x8 = mg.tensor(rng.standard_normal(8), dtype=np.float32, requires_grad=True)
    x = mg.tensor(rng.standard_normal(SHAPE), dtype=np.float32, requires_grad=True)
    y = mg.tensor(rng.standard_normal(SHAPE), dtype=np.float32, requires_grad=True)
    w = mg.tensor(rng.standard_normal((128, 128)), dtype=np.float32, requires_grad=True)
    g = rng.standard_normal(SHAPE).astype(np.float32)

    def chain():
        out = x8
        for i in range(CHAIN_STEPS):
            out = out * 1.001 + 0.001 if i % 2 else out.tanh()
        out.sum().backward()

    return {
        "chain": chain,
        "matmul": lambda: (x @ w).backward(g),
        "add": lambda: (x + y).backward(g),
        "tanh": lambda: x.tanh().backward(g),
    }


def numpy_workloads() -> dict[str, Callable[[], object]]:
    import numpy as np

    rng = np.random.default_rng(0)
    x8 = rng.standard_normal(8).astype(np.float32)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    y = rng.standard_normal(SHAPE).astype(np.float32)
    w = rng.standard_normal((128, 128)).astype(np.float32)
    g = rng.standard_normal(SHAPE).astype(np.float32)

    def chain():
        out, saved = x8, []
        for i in range(CHAIN_STEPS):
            if i % 2:
                out = out * 1.001 + 0.001
            else:
                out = np.tanh(out)
                saved.append(out)
        out.sum()
        grad = np.ones_like(out)  # d(sum)/d(out)
        for i in reversed(range(CHAIN_STEPS)):
            if i % 2:
                grad = grad * 1.001
            else:
                z = saved.pop()
                grad = grad * (1 - z * z)
        return grad

    def matmul():
        x @ w
        return g @ w.T, x.T @ g

    def add():
        x + y
        return g.copy(), g.copy()  # each input gets its own gradient array, as autograd does

    def tanh():
        z = np.tanh(x)
        return g * (1 - z * z)

    return {"chain": chain, "matmul": matmul, "add": add, "tanh": tanh}


def torch_workloads() -> dict[str, Callable[[], object]]:
    import torch

    torch.set_num_threads(1)  # like for like: NumPy's BLAS is held to one thread too
    gen = torch.Generator().manual_seed(0)
    x8 = torch.randn(8, generator=gen, requires_grad=True)
    x = torch.randn(SHAPE, generator=gen, requires_grad=True)
    y = torch.randn(SHAPE, generator=gen, requires_grad=True)
    w = torch.randn((128, 128), generator=gen, requires_grad=True)
    g = torch.randn(SHAPE, generator=gen)

    def chain():
        out = x8
        for i in range(CHAIN_STEPS):
            out = out * 1.001 + 0.001 if i % 2 else out.tanh()
        out.sum().backward()

    return {
        "chain": chain,
        "matmul": lambda: (x @ w).backward(g),
        "add": lambda: (x + y).backward(g),
        "tanh": lambda: x.tanh().backward(g),
    }


WORKLOADS = {"minigrad": minigrad_workloads, "numpy": numpy_workloads, "torch": torch_workloads}


def worker(lib: str) -> dict:
    """Samples of every workload of one library, in microseconds per graph node."""
    try:
        work = WORKLOADS[lib]()
    except ImportError as e:
        return {"missing": str(e)}
    result = {"chain": [t / CHAIN_NODES * 1e6 for t in sample_times(work["chain"], 3, REPEATS)]}
    for op in ("matmul", "add", "tanh"):
        result[op] = [t * 1e6 for t in sample_times(work[op], 100, REPEATS)]
    return result


# ---- the parent: one process per library, then the table -------------------------------------
ROWS = [
    ("chain", f"(a) chain of {CHAIN_STEPS} ops on (8,), per node"),
    ("matmul", "(b) (64,128) @ (128,128), fwd+bwd"),
    ("add", "(b) (64,128) + (64,128), fwd+bwd"),
    ("tanh", "(b) tanh (64,128), fwd+bwd"),
]


def run_worker(lib: str) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", lib],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **ONE_THREAD},
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    samples: dict[str, dict[str, list[float]]] = {lib: {} for lib in LIBS}
    missing: dict[str, str] = {}
    for _ in range(ROUNDS):
        for lib in LIBS:
            if lib in missing:
                continue
            result = run_worker(lib)
            if "missing" in result:
                missing[lib] = result["missing"]
                continue
            for key, times in result.items():
                samples[lib].setdefault(key, []).extend(times)
    libs = [lib for lib in LIBS if lib not in missing]
    results = {lib: {k: statistics.median(v) for k, v in samples[lib].items()} for lib in libs}
    have_torch = "torch" in results

    print(f"microseconds per graph node, median of {ROUNDS * REPEATS}; float32, CPU, one thread")
    header = f"{'workload':<40}" + "".join(f"{lib:>10}" for lib in libs)
    header += f"{'minigrad/torch':>16}" if have_torch else ""
    print(header)
    print("-" * len(header))
    for key, label in ROWS:
        line = f"{label:<40}" + "".join(f"{results[lib][key]:>10.1f}" for lib in libs)
        if have_torch:
            line += f"{results['minigrad'][key] / results['torch'][key]:>16.2f}"
        print(line)

    if not have_torch:
        print(f"\ntorch is missing ({missing['torch']}): pip install -e '.[oracle]' to compare")
        return
    ratio = results["minigrad"]["chain"] / results["torch"]["chain"]
    verdict = "meets" if ratio <= TARGET else "MISSES"
    print(
        f"\nper-node overhead (a): minigrad / torch = {ratio:.2f}, {verdict} the target <= {TARGET}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=LIBS, help="internal: time one library, print JSON")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker)))
    else:
        main()
