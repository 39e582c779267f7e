"""``python -m decoder.dpo``: direct preference optimisation of a fine-tuned model on
preference pairs (decoder.post.dpo says what it trains and logs).

    python -m decoder.dpo --checkpoint runs/sft --out runs/dpo
    python -m decoder.dpo --checkpoint runs/sft --out runs/dpo --dpo_beta=0.3 --lora-r 8
    python -m decoder.dpo --out runs/dpo --resume --max_iters=600
"""

from __future__ import annotations

import sys

from decoder.cli import arguments, parse, run_command
from decoder.post.dpo import dpo


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the process exit code."""
    p = arguments(
        "python -m decoder.dpo",
        "Direct preference optimisation on preference pairs. Settings of TrainConfig "
        "(decoder/training/config.py) can follow as --key=value, e.g. --dpo_beta=0.3 "
        "--max_iters=300.",
        "usually a decoder.sft run, e.g. runs/sft",
    )
    args, overrides, lora = parse(p, argv)
    return run_command(
        lambda: dpo(
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
