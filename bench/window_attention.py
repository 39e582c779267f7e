"""Sliding-window attention: the NumPy flash path windowed against full causal attention.

Causal attention, float32, B=1, nh=4, hs=32, W=256, T from 1024 to 8192 (``--T`` to change):
process CPU time (best of ``--reps`` after one cold run; a busy machine disturbs it less than
wall time, as in fused_ops.py) and extra peak memory of one forward plus
backward through ``F.scaled_dot_product_attention(..., impl="flash")``, with ``window=W``
and without. Memory is tracemalloc's peak during the cold run over what was allocated before
it (the inputs); NumPy reports its array allocations to tracemalloc.

The windowed path skips every key tile wholly outside the band, so its work is O(T * W):
doubling T should double its time, while full causal attention's quadruples. The table prints
each time per query (microseconds / T), flat for a linear cost, and the ratio full / windowed.
Both paths keep only O(T) extra memory (the tiles are the same size), so memory grows linearly
in both; the window saves time, not memory, in the flash path (the naive path would save
neither: it builds the full T x T matrix and masks it).

Run it on one BLAS thread (below): a multithreaded BLAS spins while waiting, and on a busy
machine that spinning lands in the CPU time at random.
Usage: OPENBLAS_NUM_THREADS=1 python bench/window_attention.py [--T 1024 2048 4096 8192]
       [--window 256] [--reps 2]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

B, NH, HS = 1, 4, 32


def measure(T: int, window: int | None, reps: int) -> tuple[float, int]:
    """Best CPU time in seconds and cold peak extra bytes of one forward + backward."""
    import minigrad as mg
    from minigrad.functional.attention import scaled_dot_product_attention

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((B, NH, T, HS)).astype(np.float32) for _ in range(4)]
    q, k, v = (mg.tensor(a, requires_grad=True) for a in arrays[:3])
    grad = mg.tensor(arrays[3])

    def step() -> None:
        q.grad = k.grad = v.grad = None
        out = scaled_dot_product_attention(q, k, v, impl="flash", window=window)
        out.backward(grad)

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    step()
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    times = []
    for _ in range(reps):
        start = time.process_time()
        step()
        times.append(time.process_time() - start)
    return min(times), peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args()
    print(f"flash path (NumPy), causal, float32, B={B}, nh={NH}, hs={HS}, W={args.window}")
    print(
        f"{'T':>6} | {'full s':>8} {'us/query':>8} {'MiB':>7} | "
        f"{'window s':>8} {'us/query':>8} {'MiB':>7} | {'full/window':>11}"
    )
    for T in args.T:
        full_s, full_mem = measure(T, None, args.reps)
        win_s, win_mem = measure(T, args.window, args.reps)
        print(
            f"{T:>6} | {full_s:>8.3f} {1e6 * full_s / T:>8.1f} {full_mem / 2**20:>7.1f} | "
            f"{win_s:>8.3f} {1e6 * win_s / T:>8.1f} {win_mem / 2**20:>7.1f} | "
            f"{full_s / win_s:>10.1f}x"
        )


if __name__ == "__main__":
    main()
