"""``python -m decoder.finetune``: LoRA fine-tuning of a trained checkpoint on new text, and
merging the adapters back.

    python -m decoder.finetune --checkpoint runs/shakespeare-char --data my.txt \\
        --lora-r 8 --lora-alpha 16 --targets wq,wv --max_iters=200 --out runs/my-lora
    python -m decoder.finetune merge --adapters runs/my-lora --out runs/my-merged
    python -m decoder.generate --checkpoint runs/my-merged
    python -m decoder.finetune --from-pretrained gpt2 --data my.txt --out runs/gpt2-lora --merge
    python -m decoder.generate --from-pretrained runs/gpt2-lora/merged

What fine-tuning does, what it saves and how merging works is decoder.post.lora's; this module
parses the command line and calls it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from decoder.cli import add_device, add_no_verify, run_command
from decoder.post.lora import MERGED, finetune, merge
from decoder.text.data import load_text

OVERWRITE_HELP = "replace what a previous run left in --out (without it, that is refused)"


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the process exit code (decoder.cli.run_command's)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_command(lambda: _command(argv))


def _command(argv: list[str]) -> None:
    """Fine-tune, or merge, as the command line asks."""
    if argv[:1] == ["merge"]:
        p = argparse.ArgumentParser(
            prog="python -m decoder.finetune merge",
            description="Merge LoRA adapters into a full checkpoint.",
        )
        p.add_argument("--adapters", required=True, help="the --out of a fine-tune")
        p.add_argument("--out", required=True, help="where to write the merged checkpoint")
        p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
        add_no_verify(p)
        args = p.parse_args(argv[1:])
        path = merge(args.adapters, args.out, overwrite=args.overwrite)
        print(f"merged checkpoint written to {path}")
        return
    p = argparse.ArgumentParser(
        prog="python -m decoder.finetune",
        description="LoRA fine-tuning of a checkpoint on new text (see also: merge).",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="the base run (or checkpoint) dir")
    source.add_argument(
        "--from-pretrained",
        metavar="PATH",
        help="a Hugging Face model directory or hub name as the base (see decoder.generate)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="with --from-pretrained: the context to train with (default: the model's)",
    )
    p.add_argument("--data", required=True, help="a UTF-8 text file to fine-tune on")
    p.add_argument("--out", required=True, help="where to save the adapters")
    p.add_argument("--lora-r", type=int, default=8, help="the adapters' rank")
    p.add_argument("--lora-alpha", type=float, default=16.0, help="scale: alpha / r")
    p.add_argument("--lora-dropout", type=float, default=0.0)
    p.add_argument("--targets", default="wq,wv", help="comma-separated Linear names")
    p.add_argument("--per-head", action="store_true", help="one adapter per head")
    # --max_iters=200, as train, sft and dpo spell their settings; --max-iters 200 works too
    p.add_argument("--max_iters", "--max-iters", type=int, default=200, help="optimiser steps")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1337)
    add_device(p, "the base checkpoint's device; the CPU for --from-pretrained")
    p.add_argument(
        "--merge", action="store_true", help=f"also write a merged checkpoint into OUT/{MERGED}"
    )
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    args = p.parse_args(argv)
    if args.block_size is not None and not args.from_pretrained:
        p.error("--block-size goes with --from-pretrained (a checkpoint keeps its own)")
    finetune(
        args.from_pretrained or args.checkpoint,
        load_text(args.data),
        args.out,
        r=args.lora_r,
        alpha=args.lora_alpha,
        targets=tuple(t.strip() for t in args.targets.split(",") if t.strip()),
        per_head=args.per_head,
        dropout=args.lora_dropout,
        max_iters=args.max_iters,
        lr=args.lr,
        seed=args.seed,
        device=args.device,
        data_path=str(Path(args.data).resolve()),
        overwrite=args.overwrite,
        pretrained=args.from_pretrained is not None,
        block_size=args.block_size,
    )
    if args.merge:  # subtle: the fine-tune removed an old OUT/merged if it overwrote
        path = merge(args.out, Path(args.out) / MERGED)
        print(f"merged checkpoint written to {path}")


if __name__ == "__main__":
    sys.exit(main())
