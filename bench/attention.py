"""Attention: naive, dense and FlashAttention against PyTorch, and generation with a KV cache.

Three sections, each printing a table with ratios:

- CPU (default): causal attention, float32, B=1, nh=4, hs=32, T in 256..4096. Forward plus
  backward time (best of ``--reps`` after a warm-up) and extra peak memory of minigrad's naive
  path, its dense path (impl="auto" below FLASH_MIN_T) and its NumPy flash path (the twin of
  the CUDA kernel), with PyTorch's
  ``scaled_dot_product_attention`` on the CPU as the peer. Memory: tracemalloc's peak during
  one forward + backward, relative to what was allocated before it (the inputs); NumPy
  reports its array allocations to tracemalloc. torch's allocations are invisible to
  tracemalloc, so for all three we also print the growth of the process's peak resident set
  (ru_maxrss) over the resident set before the run: coarser (it sees every allocation, and
  a peak below the import's is hidden), but the same yardstick for all four.
  Targets: flash's extra memory grows linearly in T (at T=2048, at most half of one
  T x T x nh float32 matrix) and its time is at most 1.5x the naive path's.
- GPU (``--device cuda``): the CUDA kernels against the naive path on CuPy and PyTorch's SDPA
  on CUDA, float32, B=4, nh=8, hs=64, T from 512 to 16384: forward + backward time with CUDA
  events after a warm-up, extra peak memory (the bytes CuPy's pool had to hold; torch's
  max_memory_allocated), and the longest T each fits in memory. Three kernel columns, the
  launcher's ``tensor_cores`` choices: ``kernel`` (fmaf, what minigrad's attention runs by
  default) and ``tf32`` (the tensor cores, what it runs under
  ``set_float32_matmul_precision("high")``), both through minigrad's
  ``scaled_dot_product_attention``; ``3xtf32``, which no switch of it reaches, by the
  launcher's two calls (no autograd around them: some microseconds less).
- KV cache (skipped with ``--skip-kv``): tokens per second generating 500 tokens greedily
  with and without the cache, with the ``shakespeare-char`` model (untrained: speed does not
  depend on the weights) and its block_size raised to 512, so the cache never fills.

Each (implementation, T) point runs in its own process (this script again with --worker,
answering one JSON line): one point's peak memory or out-of-memory error cannot leak into the
next, and torch is never imported beside minigrad.
Usage: python bench/attention.py [--device cpu|cuda] [--T 256 1024 ...] [--reps 3] [--skip-kv]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {  # B, nh, hs for each device
    "cpu": (1, 4, 32),
    "cuda": (4, 8, 64),
}
TS = {"cpu": (256, 1024, 2048, 4096), "cuda": (512, 1024, 2048, 4096, 8192, 16384)}
IMPLS = {
    "cpu": ("naive", "dense", "flash", "torch"),
    "cuda": ("naive", "kernel", "tf32", "3xtf32", "torch"),
}
TIME_TARGET = 1.5  # flash time / naive time on the CPU must stay under this
MEMORY_TARGET = 0.5  # flash extra memory at T=2048, in T x T x nh float32 matrices
KV_TOKENS, KV_PRESET, KV_BLOCK_SIZE = 500, "shakespeare-char", 512


def make_inputs(B: int, nh: int, T: int, hs: int, seed: int = 0) -> list[np.ndarray]:
    """q, k, v (B, nh, T, hs) and an upstream gradient, float32, the same in every process."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, nh, T, hs)).astype(np.float32) for _ in range(4)]


def resident_bytes() -> int:
    """This process's resident set now (Linux: /proc/self/statm counts pages)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


def peak_resident_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


# ---- workers: one point each, answering in JSON ------------------------------------------------
def minigrad_step(arrays: list[np.ndarray], impl: str, device: str):
    """One forward + backward of minigrad's attention, as a function of no arguments."""
    import minigrad as mg
    from minigrad.functional.attention import scaled_dot_product_attention

    q, k, v = (mg.tensor(a, requires_grad=True, device=device) for a in arrays[:3])
    grad = mg.tensor(arrays[3], device=device)
    sdpa_impl = "flash" if impl in ("flash", "kernel", "tf32") else impl  # naive or dense

    def step() -> None:
        q.grad = k.grad = v.grad = None
        out = scaled_dot_product_attention(q, k, v, causal=True, impl=sdpa_impl)
        out.backward(grad)

    return step


def kernel_step(arrays: list[np.ndarray], tensor_cores: str):
    """One forward + backward of the CUDA kernels called through their launcher, with its
    `tensor_cores` choice: for the one minigrad's attention has no switch for (3xtf32)."""
    import cupy

    from minigrad.kernels.flash_attention_cuda import (
        flash_attention_backward_cuda,
        flash_attention_forward_cuda,
    )

    q, k, v, grad = (cupy.asarray(a) for a in arrays)

    def step() -> None:
        o, lse = flash_attention_forward_cuda(q, k, v, True, tensor_cores=tensor_cores)
        flash_attention_backward_cuda(q, k, v, o, lse, grad, True, tensor_cores=tensor_cores)

    return step


def torch_step(arrays: list[np.ndarray], device: str):
    import torch

    q, k, v = (torch.tensor(a, device=device, requires_grad=True) for a in arrays[:3])
    grad = torch.tensor(arrays[3], device=device)

    def step() -> None:
        q.grad = k.grad = v.grad = None
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)

    return step


def cpu_worker(impl: str, T: int, reps: int) -> dict:
    B, nh, hs = SHAPES["cpu"]
    arrays = make_inputs(B, nh, T, hs)
    step = torch_step(arrays, "cpu") if impl == "torch" else minigrad_step(arrays, impl, "cpu")
    result = {}
    # memory first, on a cold run: later runs could reuse memory the allocator kept
    rss_before = resident_bytes()
    if impl != "torch":
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        step()
        result["peak_bytes"] = tracemalloc.get_traced_memory()[1] - before
        tracemalloc.stop()
    else:
        step()
    result["rss_bytes"] = max(0, peak_resident_bytes() - rss_before)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    result["time_s"] = min(times)
    if impl == "torch":
        import torch

        result["threads"] = torch.get_num_threads()
    return result


def cuda_worker(impl: str, T: int, reps: int) -> dict:
    B, nh, hs = SHAPES["cuda"]
    arrays = make_inputs(B, nh, T, hs)
    if impl == "torch":
        return torch_cuda_worker(arrays, reps)
    import cupy

    step = cuda_step(arrays, impl)
    pool = cupy.get_default_memory_pool()
    try:
        step()  # warm-up: compiles the kernel, sizes the pool
        cupy.cuda.Device().synchronize()
        pool.free_all_blocks()  # now the pool holds only what is alive: the inputs
        held = pool.total_bytes()
        step()
        cupy.cuda.Device().synchronize()
        peak = pool.total_bytes() - held  # the pool grew to the run's peak and kept it
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(reps):
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    except cupy.cuda.memory.OutOfMemoryError:
        return {"oom": True}
    return {"time_s": min(times), "peak_bytes": peak}


def cuda_step(arrays: list[np.ndarray], impl: str):
    """One forward + backward of one of IMPLS["cuda"] but torch on the GPU, as a function of
    no arguments. "tf32" sets this process's float32 matmul precision to "high"."""
    import cupy

    import minigrad as mg
    from minigrad.functional.attention import kernel_supports
    from minigrad.kernels.flash_attention_cuda import resolve_tensor_cores

    if impl in ("tf32", "3xtf32"):  # without TF32 on this GPU: the launcher's refusal, not fmaf
        resolve_tensor_cores(impl, cupy.cuda.Device().attributes)
    if impl in ("kernel", "tf32") and not kernel_supports(arrays[0], arrays[1]):
        raise RuntimeError(f"the CUDA kernel does not take q, k of shape {arrays[0].shape}")
    if impl == "3xtf32":
        return kernel_step(arrays, impl)
    if impl == "tf32":
        mg.set_float32_matmul_precision("high")  # "auto" then picks the TF32 kernels
    return minigrad_step(arrays, impl, "cuda")


def torch_cuda_worker(arrays: list[np.ndarray], reps: int) -> dict:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("this torch has no CUDA: the peer needs a CUDA build of torch")
    try:
        step = torch_step(arrays, "cuda")
        step()  # warm-up
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - held
        times = []
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    except torch.cuda.OutOfMemoryError:
        return {"oom": True}
    return {"time_s": min(times), "peak_bytes": peak}


def run_point(device: str, impl: str, T: int, reps: int) -> dict:
    """Measure one point in a fresh process; {"error": ...} if it failed."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", impl, "--device", device]
    cmd += ["--T", str(T), "--reps", str(reps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit code {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- tables ------------------------------------------------------------------------------------
def mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def cpu_table(T_values: list[int], reps: int) -> None:
    B, nh, hs = SHAPES["cpu"]
    print(f"CPU, causal, float32, B={B}, nh={nh}, hs={hs}: forward + backward, best of {reps}")
    results = {
        (impl, T): run_point("cpu", impl, T, reps) for T in T_values for impl in IMPLS["cpu"]
    }
    for (impl, T), r in results.items():
        if "error" in r:
            print(f"  ({impl} at T={T} failed: {r['error']})")
    threads = next((r["threads"] for r in results.values() if "threads" in r), "?")
    print(f"(torch threads: {threads}; MB = 2^20 bytes; 'TxT' = one T x T x nh float32 matrix)")
    head = f"{'T':>6}{'naive s':>9}{'dense s':>9}{'flash s':>9}{'torch s':>9}"
    head += f"{'dn/nv':>7}{'fl/nv':>7}{'fl/torch':>9}"
    head += f"{'naive MB':>10}{'dense MB':>10}{'flash MB':>10}{'fl/TxT':>8}"
    head += f"{'rss MB nv/dn/fl/torch':>24}"
    print(head)
    misses = []
    for T in T_values:
        nv, dn, fl, th = row = [results[(impl, T)] for impl in IMPLS["cpu"]]
        if any("error" in r for r in row):
            continue
        matrix = T * T * nh * 4  # bytes of one float32 score matrix
        rss = "/".join(f"{r['rss_bytes'] / 2**20:.0f}" for r in row)
        ratio = fl["time_s"] / nv["time_s"]
        times = "".join(f"{r['time_s']:>9.3f}" for r in row)
        print(
            f"{T:>6}{times}{dn['time_s'] / nv['time_s']:>7.2f}{ratio:>7.2f}"
            f"{fl['time_s'] / th['time_s']:>9.1f}{mb(nv['peak_bytes']):>10}"
            f"{mb(dn['peak_bytes']):>10}{mb(fl['peak_bytes']):>10}"
            f"{fl['peak_bytes'] / matrix:>8.3f}{rss:>24}"
        )
        if ratio > TIME_TARGET:
            misses.append(f"T={T}: flash takes {ratio:.2f}x the naive time (target {TIME_TARGET})")
        if T == 2048 and fl["peak_bytes"] > MEMORY_TARGET * matrix:
            misses.append(f"T=2048: flash extra memory is {fl['peak_bytes'] / matrix:.2f} TxT")
    steps = []
    for a, b in zip(T_values[:-1], T_values[1:], strict=True):
        small, large = results[("flash", a)], results[("flash", b)]
        if "peak_bytes" in small and "peak_bytes" in large:
            steps.append(f"x{large['peak_bytes'] / small['peak_bytes']:.2f} for T x{b / a:.0f}")
    steps = ", ".join(steps)
    print(f"flash extra memory growth between rows: {steps} (linear: the same factor as T)")
    print("targets met" if not misses else "targets missed:\n  " + "\n  ".join(misses))


def cuda_table(T_values: list[int], reps: int) -> None:
    B, nh, hs = SHAPES["cuda"]
    print(f"GPU, causal, float32, B={B}, nh={nh}, hs={hs}: forward + backward, best of {reps}")
    print(f"{'T':>7}" + "".join(f"{impl + ' ms':>12}{impl + ' MB':>12}" for impl in IMPLS["cuda"]))
    longest: dict[str, int] = {}
    for T in T_values:
        row = f"{T:>7}"
        for impl in IMPLS["cuda"]:
            r = run_point("cuda", impl, T, reps)
            if "error" in r:
                row += f"{'error':>12}{'':>12}"
                print(f"  ({impl} at T={T} failed: {r['error']})")
            elif r.get("oom"):
                row += f"{'OOM':>12}{'':>12}"
            else:
                row += f"{r['time_s'] * 1e3:>12.2f}{mb(r['peak_bytes']):>12}"
                longest[impl] = T
        print(row, flush=True)
    print("longest T that fits: " + ", ".join(f"{i} {longest.get(i, '-')}" for i in IMPLS["cuda"]))


def kv_cache_table() -> None:
    """Tokens per second of greedy generation, with and without the KV cache."""
    try:
        from decoder.model.model import Decoder
        from decoder.training.config import build_configs
    except ImportError as e:
        print(f"KV cache benchmark skipped: the model is not available ({e})")
        return
    import minigrad as mg

    mg.manual_seed(0)
    config, _ = build_configs(KV_PRESET, block_size=KV_BLOCK_SIZE)
    model = Decoder(config).eval()
    print(
        f"KV cache: {KV_TOKENS} tokens, greedy, preset {KV_PRESET!r} (untrained) with "
        f"block_size={KV_BLOCK_SIZE}, attn_impl={config.attn_impl!r}"
    )
    tokens, speed = {}, {}
    for use_cache in (True, False):
        start = time.perf_counter()
        tokens[use_cache] = list(model.generate([0], KV_TOKENS, temperature=0, use_cache=use_cache))
        speed[use_cache] = KV_TOKENS / (time.perf_counter() - start)
    print(f"{'with cache tok/s':>18}{'without tok/s':>15}{'speed-up':>10}{'same tokens':>13}")
    same = "yes" if tokens[True] == tokens[False] else "no"
    print(f"{speed[True]:>18.1f}{speed[False]:>15.1f}{speed[True] / speed[False]:>10.1f}{same:>13}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--T", type=int, nargs="+", help="sequence lengths (default per device)")
    parser.add_argument("--reps", type=int, default=3, help="timed runs per point; best kept")
    parser.add_argument("--skip-kv", action="store_true", help="skip the KV cache section")
    parser.add_argument(
        "--worker", choices=sorted({*IMPLS["cpu"], *IMPLS["cuda"]}), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))  # run from anywhere

    if args.worker:
        if len(args.T) != 1:
            raise SystemExit("--worker measures one point: pass one --T")
        worker = cpu_worker if args.device == "cpu" else cuda_worker
        print(json.dumps(worker(args.worker, args.T[0], args.reps)))
        return
    if args.device == "cuda":
        import minigrad as mg

        if not mg.cuda_available():
            raise SystemExit(
                "--device cuda needs CuPy and an NVIDIA GPU, and neither is usable here: "
                "pip install -e '.[gpu]' on a machine with CUDA 12, or run the CPU half"
            )
    T_values = args.T or list(TS[args.device])
    start = time.perf_counter()
    (cpu_table if args.device == "cpu" else cuda_table)(T_values, args.reps)
    if not args.skip_kv:
        print()
        kv_cache_table()
    print(f"\n(total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
