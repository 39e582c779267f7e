"""Train our Decoder and its PyTorch twin (bench/torch_reference.py) on the same data with the
same recipe, each in its own process, and compare their validation losses and throughput.

    python bench/train_vs_torch.py                                   # shakespeare-char, 2000 steps
    python bench/train_vs_torch.py --iters 500                       # shorter
    python bench/train_vs_torch.py --preset shakespeare-char-modern  # RoPE, RMSNorm, SwiGLU, GQA
    python bench/train_vs_torch.py --device cuda                     # baby-gpt on the GPU

Both sides start from the same weights (our model's initialisation, copied into the twin),
sample the very same batches (decoder.data with the same seeds), follow the same learning
rate schedule and score the same evaluation batches. So their losses should agree closely
at first and differ only by float rounding growing through training; tokens/s counts the
training steps alone (evaluation excluded) on both sides.

Separate processes keep each side's thread pools and memory to itself, and let the torch
side import torch while ours never does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from decoder.config import build_configs  # noqa: E402
from decoder.data import TokenDataset, load_shakespeare, load_text  # noqa: E402
from decoder.tokenizer import CharTokenizer  # noqa: E402


def configs(args: argparse.Namespace):
    warmup = build_configs(args.preset)[1].warmup_iters
    extra = {
        "max_iters": args.iters,
        "device": args.device,
        "sample_tokens": 0,
        "warmup_iters": min(warmup, args.iters // 2),
    }
    if args.eval_interval:
        extra["eval_interval"] = args.eval_interval
    return build_configs(args.preset, **extra)


def run_side(args: argparse.Namespace) -> dict:
    """One side's training, in this process: the result as a dict."""
    import dataclasses

    text = load_text(args.data) if args.data else load_shakespeare()
    model_cfg, train_cfg = configs(args)
    tokenizer = CharTokenizer.from_text(text)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    if args.side == "ours":
        from decoder.train import train

        with tempfile.TemporaryDirectory() as out:
            result = train(model_cfg, train_cfg, text, out, progress=not args.quiet)
        return {k: result[k] for k in ("train_loss", "val_loss", "tokens_per_s", "losses")}

    from torch_reference import get_lr, train_reference  # beside this file

    import minigrad as mg
    from decoder.model import Decoder
    from minigrad.optim import cosine_lr

    # the same schedule, step for step
    for it in range(train_cfg.max_iters + 1):
        ours = cosine_lr(
            it, train_cfg.lr, train_cfg.min_lr, train_cfg.warmup_iters, train_cfg.lr_decay_iters
        )
        assert abs(ours - get_lr(it, train_cfg)) < 1e-12, f"schedules differ at step {it}"
    mg.manual_seed(train_cfg.seed)  # our initial weights, as decoder.train makes them
    init_state = Decoder(model_cfg).state_dict()
    data = TokenDataset(tokenizer.encode(text))
    result = train_reference(model_cfg, train_cfg, data, init_state, progress=not args.quiet)
    return {k: result[k] for k in ("train_loss", "val_loss", "tokens_per_s", "losses")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--preset", default=None, help="default: shakespeare-char (cpu), baby-gpt (cuda)"
    )
    p.add_argument("--iters", type=int, default=None, help="steps (default: the preset's)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--data", default=None, help="a text file (default: tiny Shakespeare)")
    p.add_argument("--eval-interval", type=int, default=None)
    p.add_argument("--quiet", action="store_true", help="no per-evaluation lines")
    p.add_argument("--side", choices=("ours", "torch"), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.preset = args.preset or ("baby-gpt" if args.device == "cuda" else "shakespeare-char")
    if args.iters is None:
        args.iters = build_configs(args.preset)[1].max_iters
    if args.side:  # a child process: train one side, write its result
        Path(args.result).write_text(json.dumps(run_side(args)))
        return 0

    results = {}
    forwarded = [a for a in sys.argv[1:]]
    for side in ("ours", "torch"):
        print(f"== {side}: {args.preset}, {args.iters} steps on {args.device}", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        cmd = [sys.executable, __file__, *forwarded, "--side", side, "--result", path]
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        results[side] = json.loads(Path(path).read_text())
        os.unlink(path)

    ours, ref = results["ours"], results["torch"]
    n = min(5, len(ours["losses"]))
    first = max(abs(a - b) for a, b in zip(ours["losses"][:n], ref["losses"][:n], strict=True))
    print(f"\n{args.preset}, {args.iters} steps, {args.device}")
    print(f"{'':10}{'train loss':>12}{'val loss':>12}{'tokens/s':>12}")
    for name, r in (("minigrad", ours), ("pytorch", ref)):
        print(f"{name:10}{r['train_loss']:12.4f}{r['val_loss']:12.4f}{r['tokens_per_s']:12,.0f}")
    print(f"throughput ratio minigrad / pytorch: {ours['tokens_per_s'] / ref['tokens_per_s']:.2f}")
    print(f"largest loss difference over the first {n} steps: {first:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
