"""float32 against float16 (mixed precision with loss scaling), one preset, one command.

Trains the preset twice with ``python -m decoder.train`` (same seed, same steps), once per
``--dtype``, in fresh temporary run directories, and prints each run's final validation loss and
tokens per second as the training command reports them. The README's mixed-precision numbers
come from here.

    python bench/dtypes.py [--preset tiny] [--iters 500] [--device cpu]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FINAL = re.compile(r"step (\d+): val loss ([\d.]+), ([\d,]+) tokens/s")


def run(preset: str, iters: int, dtype: str, device: str) -> tuple[float, float]:
    """(validation loss, tokens/s) of one run, from its last line."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "decoder.train", f"--preset={preset}"]
        command += [f"--max_iters={iters}", f"--dtype={dtype}", f"--device={device}"]
        command += ["--out", str(Path(out) / "run")]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    found = FINAL.findall(done.stdout)
    if done.returncode or not found:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    _, loss, speed = found[-1]
    return float(loss), float(speed.replace(",", ""))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--iters", type=int, default=500)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = p.parse_args(argv)
    print(f"preset {args.preset}, {args.iters} steps, {args.device}")
    print(f"{'dtype':10s}{'val loss':>10s}{'tokens/s':>12s}")
    for dtype in ("float32", "float16"):
        loss, speed = run(args.preset, args.iters, dtype, args.device)
        print(f"{dtype:10s}{loss:10.4f}{speed:12,.0f}")


if __name__ == "__main__":
    main()
