"""nanoGPT's own train.py, on this machine: the program our GPU training is measured against.

Issue 26's target is a baby-gpt step within 2x the time of nanoGPT's own `train.py` on the same
GPU (its `config/train_shakespeare_char.py`: the model of our `baby-gpt` preset). Our PyTorch
reference in bench/torch_reference.py writes nanoGPT's model and step; this runs nanoGPT itself,
so that no reference slower than the real peer can flatter us.

    python bench/nanogpt_peer.py --prepare [--nanogpt bench/peers/nanoGPT]
    python3 bench/nanogpt_peer.py [--nanogpt DIR] [--iters 300] [--dtype float32]

``--prepare`` (here, before a GPU session) writes the character data nanoGPT's own
``data/shakespeare_char/prepare.py`` would write from its download (input.txt, train.bin,
val.bin, meta.pkl: characters numbered in sorted order, the first 90% for training, uint16 ids)
from our verified copy of tiny Shakespeare, since the GPU machine cannot reach the internet. The
checkout itself comes from `fetch karpathy/nanoGPT` (the tool library), exported into
bench/peers/nanoGPT, which git ignores: a GPU run carries it (``carry=["bench/peers"]``).

Without ``--prepare`` it runs ``train.py config/train_shakespeare_char.py`` there without
torch.compile (ours has no compiler either), for ``--iters`` iterations with evaluations only at
the first and the last, and prints the median of nanoGPT's own per-iteration times after the
first 10, leaving out the iterations that evaluated (on 20 batches each, not the config's 200:
they are not timed, and a GPU lease is short). float32 lets its matrix products use TF32
(nanoGPT sets ``allow_tf32``), as our baby-gpt preset does; bfloat16 is its default on a GPU.
"""

from __future__ import annotations

import argparse
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / "bench" / "peers" / "nanoGPT"
ITER = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", re.M)
WARMUP = 10  # iterations left out at the start: CUDA's lazy set-up, the allocator warming up
TOKENS_PER_ITER = 64 * 256  # the config's batch_size x block_size


def prepare(nanogpt: Path) -> Path:
    """Write nanoGPT's shakespeare_char data from our cached text; returns its folder."""
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from decoder.text.data import load_shakespeare

    text = load_shakespeare()
    folder = nanogpt / "data" / "shakespeare_char"
    if not (nanogpt / "train.py").exists():
        raise SystemExit(f"{nanogpt} holds no train.py: export karpathy/nanoGPT there first")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "input.txt").write_text(text, encoding="utf-8")
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    n = int(len(text) * 0.9)
    for name, part in (("train", text[:n]), ("val", text[n:])):
        np.array([stoi[c] for c in part], dtype=np.uint16).tofile(folder / f"{name}.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}
    (folder / "meta.pkl").write_bytes(pickle.dumps(meta))
    return folder


def median_ms(output: str, iters: int) -> float | None:
    """The median of nanoGPT's per-iteration times after the warm-up, without the iterations
    that ran an evaluation (the first and the last here); None when it printed none.

    >>> median_ms("iter 0: loss 4.2, time 900.00ms, mfu -100.00%\\n" + "".join(
    ...     f"iter {i}: loss 2.0, time {10 + i % 2}.00ms, mfu 20%\\n" for i in range(1, 20)), 20)
    10.5
    """
    times = [float(ms) for i, ms in ITER.findall(output) if WARMUP <= int(i) < iters]
    return statistics.median(times) if times else None


def run(nanogpt: Path, iters: int, dtype: str, device: str = "cuda", eval_iters: int = 20) -> int:
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "train.py", "config/train_shakespeare_char.py"]
        command += ["--compile=False", f"--max_iters={iters}", f"--eval_interval={iters}"]
        command += ["--log_interval=1", f"--dtype={dtype}", f"--device={device}"]
        command += [f"--eval_iters={eval_iters}", f"--out_dir={out}"]
        done = subprocess.run(command, cwd=nanogpt, capture_output=True, text=True, check=False)
    ms = median_ms(done.stdout, iters)
    if done.returncode or ms is None:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        print(f"nanoGPT train.py failed (exit {done.returncode}): {' '.join(command)}")
        return 1
    print(f"nanoGPT train.py {dtype}, {iters} iterations, median of {iters - WARMUP - 1}: "
          f"{ms:.2f} ms/iter, {TOKENS_PER_ITER / ms * 1000:,.0f} tokens/s")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nanogpt", type=Path, default=DEFAULT_DIR, help="nanoGPT's checkout")
    p.add_argument("--prepare", action="store_true", help="write its data and exit")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--device", default="cuda", help="cpu only to try this script out")
    p.add_argument("--eval-iters", type=int, default=20, help="batches per evaluation (untimed)")
    args = p.parse_args(argv)
    if args.prepare:
        print(f"wrote {prepare(args.nanogpt)}")
        return 0
    return run(args.nanogpt, args.iters, args.dtype, args.device, args.eval_iters)


if __name__ == "__main__":
    sys.exit(main())
