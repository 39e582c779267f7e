"""``python -m decoder.sft``: supervised fine-tuning of a pre-trained model on instruction
pairs (decoder.post.sft says what it trains and logs).

    python -m decoder.sft --checkpoint runs/shakespeare-char --out runs/sft
    python -m decoder.sft --checkpoint runs/shakespeare-char --out runs/sft-lora --lora-r 8
    python -m decoder.sft --out runs/sft --resume --max_iters=600
    python -m decoder.sft --checkpoint runs/X --data my.jsonl --out runs/my-sft --lr=1e-4
"""

from __future__ import annotations

import sys

from decoder.cli import arguments, parse, run_command
from decoder.post.sft import sft


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the process exit code."""
    p = arguments(
        "python -m decoder.sft",
        "Supervised fine-tuning on instruction pairs. Settings of TrainConfig "
        "(decoder/training/config.py) can follow as --key=value, e.g. --max_iters=500 --lr=1e-4.",
        "a pre-training run, e.g. runs/shakespeare-char",
    )
    args, overrides, lora = parse(p, argv)
    return run_command(
        lambda: sft(
            args.checkpoint,
            args.out,
            args.data,
            args.examples,
            overrides,
            lora,
            resume=args.resume,
            overwrite=args.overwrite,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
