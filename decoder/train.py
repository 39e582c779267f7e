"""``python -m decoder.train``: train a model from a preset and ``--key=value`` settings.

    python -m decoder.train                                  # nanoGPT's CPU Shakespeare run
    python -m decoder.train --preset tiny --max_iters=200    # any config field as --key=value
    python -m decoder.train --out runs/shakespeare-char --resume
    mpirun -n 2 python -m decoder.train --ddp --zero --preset tiny

The loop, its log, checkpoints and resume are decoder.training's (decoder/training/loop.py);
this module parses the command line and calls ``decoder.training.loop.train``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from decoder.cli import add_device, list_presets, parse_overrides, run_command, settings_help
from decoder.text.data import load_shakespeare, load_text
from decoder.training.config import DEFAULT_PRESET, build_configs, device_or_cpu
from decoder.training.loop import train
from decoder.training.run import resume_configs

if TYPE_CHECKING:  # decoder.training.dist imports mpi4py only when a run asks for it
    from decoder.training.dist import DataParallel


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the process exit code."""
    p = argparse.ArgumentParser(
        prog="python -m decoder.train",
        description="Train a decoder-only transformer. Any field of ModelConfig or TrainConfig "
        "(decoder/model/config.py, decoder/training/config.py) can be set as --key=value, "
        "e.g. --n_layer=6 --lr=3e-4.",
        epilog=settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", default=None, help=f"a named config (default {DEFAULT_PRESET})")
    p.add_argument("--list-presets", action="store_true", help="print the presets and exit")
    p.add_argument("--data", default=None, help="a UTF-8 text file (default: tiny Shakespeare)")
    p.add_argument("--out", default=None, help="the run directory (default: runs/<preset>)")
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out with its saved settings; settings given alongside "
        "replace those (e.g. --max_iters=4000 to go on longer)",
    )
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run in --out (without it, a new run refuses a directory that holds one)",
    )
    add_device(p, "the preset's (or the resumed run's) device")
    p.add_argument(
        "--ddp",
        action="store_true",
        help="one rank of a data-parallel run: launch with mpirun -n N (needs the dist extra)",
    )
    p.add_argument("--zero", action="store_true", help="with --ddp: shard AdamW's state (ZeRO-1)")
    args, rest = p.parse_known_args(argv)
    if args.list_presets:
        print(list_presets())
        return 0
    if args.zero and not args.ddp:
        p.error("--zero shards the optimiser over the ranks of a --ddp run: add --ddp")
    if not args.ddp:
        return _run(args, rest)
    from decoder.training.dist import DataParallel

    try:
        dist = DataParallel.from_mpi(zero=args.zero)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with dist.abort_on_failure():
        code = _run(args, rest, dist)
    # subtle: a Ctrl-C stops every rank after the same step (DataParallel.any), so all of them
    # end with 130 by themselves; an abort then would kill rank 0 while it writes the checkpoint
    if code not in (0, 130):  # the other ranks would wait for this one for ever
        dist.abort(code)
    return code


def _run(args: argparse.Namespace, rest: list[str], dist: DataParallel | None = None) -> int:
    """Train as the parsed command line asks; returns the exit code."""

    def body() -> None:
        overrides = parse_overrides(rest)
        if args.device is not None:
            overrides["device"] = args.device
        out_dir = Path(args.out or Path("runs") / (args.preset or DEFAULT_PRESET))
        data_path = str(Path(args.data).resolve()) if args.data else None
        if args.resume:
            model_cfg, train_cfg, saved = resume_configs(out_dir, args.preset, overrides)
            data_path = data_path or saved.extra.get("data_path")
        else:
            model_cfg, train_cfg = build_configs(args.preset or DEFAULT_PRESET, overrides)
        device = device_or_cpu(train_cfg.device, requested="device" in overrides)
        train_cfg = dataclasses.replace(train_cfg, device=device)
        text = load_text(data_path) if data_path else load_shakespeare()
        train(
            model_cfg,
            train_cfg,
            text,
            out_dir,
            resume=args.resume,
            data_path=data_path,
            overwrite=args.overwrite,
            dist=dist,
        )

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
