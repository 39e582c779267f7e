"""Data-parallel training over MPI (decoder.training.dist) with 1 and 2 ranks on this machine.

For each rank count N it launches ``mpirun -n N`` on this script (``--worker``), and each rank
takes ``--steps`` timed training steps of a preset's model (decoder.training.step.train_step with a
DataParallel, after a few untimed ones) on its own ``batch_size`` rows, one BLAS thread per
rank. Rank 0 reports the median step time, the tokens/s of all ranks together (N * B * T rows
per step), the seconds per step spent in the gradient's Allreduce (and in ZeRO-1's Allgather
with ``--zero``), and the AdamW state each rank holds.

Then, with 2 ranks, the flat gradient buffer's Allreduce is timed alone, as one buffer, as 4
buckets and as one message per parameter: bucketing pays off when buckets are sent while the
backward pass still runs; here the backward pass ends before any communication, so it can
only add per-message latency.

Usage: python bench/ddp.py [--preset shakespeare-char] [--steps 30] [--zero]  (about a minute)
The other engineers' work shares this machine's two cores: run it on a quiet machine for
numbers to compare, and read the 2-rank speed-up as a lower bound.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WARMUP_STEPS = 3


def worker(preset: str, steps: int, zero: bool) -> None:
    import minigrad as mg
    from decoder.model.model import Decoder
    from decoder.training.config import build_configs
    from decoder.training.dist import DataParallel
    from decoder.training.step import train_step
    from minigrad.cpu_tuning import reuse_freed_memory
    from minigrad.optim import AdamW, param_groups_for_decay

    reuse_freed_memory()
    dist = DataParallel.from_mpi(zero=zero)
    model_cfg, train_cfg = build_configs(preset, {"device": "cpu"})
    mg.manual_seed(train_cfg.seed)
    model = Decoder(model_cfg)
    optimizer = AdamW(param_groups_for_decay(model, train_cfg.weight_decay), lr=train_cfg.lr)
    B, T = train_cfg.batch_size, model_cfg.block_size
    rng = np.random.default_rng([train_cfg.seed, dist.rank])
    times, comm = [], []
    for i in range(WARMUP_STEPS + steps):
        x = rng.integers(0, model_cfg.vocab_size, size=(B, T))  # (B, T)
        y = rng.integers(0, model_cfg.vocab_size, size=(B, T))
        dist.comm.Barrier()  # every rank starts the step together
        comm_before, start = dist.comm_time, time.perf_counter()
        train_step(model, optimizer, x, y, train_cfg, i + 1, dist)
        if i >= WARMUP_STEPS:
            times.append(time.perf_counter() - start)
            comm.append(dist.comm_time - comm_before)
    state = sum(
        v.nbytes for s in optimizer.state.values() for v in s.values() if hasattr(v, "nbytes")
    )
    buckets = time_buckets(dist, [p for p in model.parameters()])
    if dist.is_main:
        step_s = statistics.median(times)
        print(
            json.dumps(
                {
                    "ranks": dist.size,
                    "step_ms": 1e3 * step_s,
                    "tokens_per_s": dist.size * B * T / step_s,
                    "comm_ms": 1e3 * statistics.median(comm),
                    "state_mb": state / 2**20,
                    "buckets": buckets,
                    "parameters": sum(p.data.size for p in model.parameters()),
                }
            )
        )


def time_buckets(dist, params, repeats: int = 30) -> dict[str, float]:
    """Median ms of an Allreduce of the whole flat gradient sent as 1 buffer, 4 buckets, or
    one message per parameter."""
    from mpi4py import MPI

    flat = np.ones(sum(p.data.size for p in params), dtype=params[0].dtype)
    sizes = np.cumsum([p.data.size for p in params])[:-1]
    splits = {
        "1 buffer": [flat],
        "4 buckets": np.array_split(flat, 4),
        f"{len(params)} messages": np.split(flat, sizes),
    }
    result = {}
    for name, pieces in splits.items():
        samples = []
        for _ in range(repeats):
            dist.comm.Barrier()
            start = time.perf_counter()
            for piece in pieces:
                dist.comm.Allreduce(MPI.IN_PLACE, piece)
            samples.append(time.perf_counter() - start)
        result[name] = 1e3 * statistics.median(samples)
    return result


def launch(ranks: int, args: argparse.Namespace) -> dict:
    mpirun = Path(sys.executable).parent / "mpirun"
    command = [str(mpirun), "-n", str(ranks), sys.executable, __file__, "--worker"]
    command += ["--preset", args.preset, "--steps", str(args.steps)] + ["--zero"] * args.zero
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"mpirun -n {ranks} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="shakespeare-char")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--zero", action="store_true", help="shard AdamW's state (ZeRO-1)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.preset, args.steps, args.zero)
        return
    rows = [launch(n, args) for n in (1, 2)]
    print(f"{args.preset}: {rows[0]['parameters']:,} parameters, {args.steps} steps per run")
    print(f"{'ranks':>5} {'ms/step':>8} {'tokens/s':>9} {'comm ms/step':>13} {'AdamW MB/rank':>14}")
    for r in rows:
        print(
            f"{r['ranks']:>5} {r['step_ms']:>8.1f} {r['tokens_per_s']:>9,.0f} "
            f"{r['comm_ms']:>13.2f} {r['state_mb']:>14.2f}"
        )
    print(f"speed-up with 2 ranks: {rows[1]['tokens_per_s'] / rows[0]['tokens_per_s']:.2f}x")
    print("the gradient's Allreduce with 2 ranks, ms:")
    for name, ms in rows[1]["buckets"].items():
        print(f"  {name:>14}: {ms:.2f}")


if __name__ == "__main__":
    main()
