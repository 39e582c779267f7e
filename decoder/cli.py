"""What the commands (decoder.train, generate, finetune, sft, dpo, chat) share on the command
line: ``--key=value`` settings, the preset list, ``--device`` (its rule is
decoder.training.config.device_or_cpu's), the options of the post-training commands, and one
mapping from errors to exit codes.

Every trainer's command line ends the same way (``run_command``): 0 done, 1 the loss
diverged, 2 an error the user can fix, printed as one line, 130 interrupted after saving.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from decoder.model.config import ModelConfig
from decoder.text.data import NO_VERIFY
from decoder.training.config import DEFAULT_PRESET, PRESETS, TrainConfig
from decoder.training.step import TrainingDiverged
from minigrad.backend import DEVICES

MEMORY_FIX = "lower --batch_size, --block_size or --n_embd (the model's size)"
LORA_DEFAULTS = {"alpha": 16.0, "targets": ["wq", "wv"]}  # sft and dpo with --lora-r


# ---- every command -----------------------------------------------------------------------------
def parse_overrides(items: list[str]) -> dict[str, str]:
    """``["--n_layer=6", "--max-iters", "100"]`` -> ``{"n_layer": "6", "max_iters": "100"}``.

    >>> parse_overrides(["--n_layer=6", "--max-iters", "100"])
    {'n_layer': '6', 'max_iters': '100'}
    """
    overrides, i = {}, 0
    while i < len(items):
        item = items[i]
        if not item.startswith("--") or item == "--":
            raise ValueError(f"unexpected argument {item!r}: settings are written --key=value")
        key, eq, value = item[2:].partition("=")
        if not eq:  # "--key value"
            if i + 1 >= len(items) or items[i + 1].startswith("--"):
                raise ValueError(f"--{key} needs a value: write --{key}=VALUE")
            value, i = items[i + 1], i + 1
        overrides[key.replace("-", "_")] = value
        i += 1
    return overrides


def list_presets() -> str:
    lines = []
    for name, preset in PRESETS.items():
        default = " (default)" if name == DEFAULT_PRESET else ""
        lines.append(f"{name}{default}\n    {preset.description}")
    return "\n".join(lines)


def settings_help() -> str:
    """Every ``--key=value`` setting: each field of ModelConfig and TrainConfig with its default
    and the comment beside it in the source, read from the dataclasses (so it cannot drift)."""
    lines = ["settings, as --key=value (a preset sets some of them first: see --list-presets):"]
    for cls in (ModelConfig, TrainConfig):
        # the one-line reason after each field: `name: type = default  # reason`
        notes = dict(re.findall(r"^ +(\w+): [^=\n]+=[^#\n]*# *(.*)$", inspect.getsource(cls), re.M))
        lines.append(f"  {cls.__name__} ({cls.__module__}):")
        for f in dataclasses.fields(cls):
            default = f.default
            if isinstance(default, str) and not default.isprintable():
                default = repr(default)  # a newline shows as '\n'
            lines.append(f"    --{f.name}={default}  {notes.get(f.name, '')}".rstrip())
    return "\n".join(lines)


def run_command(body: Callable[[], object]) -> int:
    """Run a command's body and return its exit code, the same for every trainer's command line.

    0 done; 1 the loss diverged (TrainingDiverged); 2 an error the user can fix, printed as one
    line (ValueError, OSError, RuntimeError, KeyError: CheckpointError, RunDirError, and
    load_shakespeare offline are among them; MemoryError past decoder.model.memory's check);
    130 interrupted, after the loop saved.
    """
    try:
        body()
    except KeyboardInterrupt:
        return 130
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, OSError, RuntimeError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # NumPy's and CuPy's say how much they wanted
        print(f"error: out of memory ({e}): {MEMORY_FIX}", file=sys.stderr)
        return 2
    return 0


def add_device(p: argparse.ArgumentParser, default: str) -> None:
    """Every command's ``--device``; left out, it is ``default`` (the device the run or
    checkpoint was trained on) or the CPU, as decoder.training.config.device_or_cpu rules.
    With it comes ``--no-verify`` (every command loads or resumes a checkpoint)."""
    p.add_argument(
        "--device",
        default=None,
        choices=DEVICES,
        help=f"where to run (default: {default}, or the CPU with a note where CUDA cannot run)",
    )
    add_no_verify(p)


def add_no_verify(p: argparse.ArgumentParser) -> None:
    """``--no-verify``: the loads of this process skip their SHA-256 checks."""
    p.add_argument(
        "--no-verify",
        nargs=0,
        action=_NoVerify,
        help=f"skip the SHA-256 checks of the checkpoints, adapters, merged models and "
        f"tokenizers it loads, for files too large to hash at every load (as {NO_VERIFY}=1)",
    )


class _NoVerify(argparse.Action):
    """``--no-verify``: sets MINIGRAD_NO_VERIFY=1 for this process, which every load reads
    (decoder.text.data.sha256_differs), so no command passes a flag down to its loads."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        os.environ[NO_VERIFY] = "1"


# ---- the command line shared by decoder.sft and decoder.dpo -------------------------------------
def arguments(prog: str, description: str, start_from: str) -> argparse.ArgumentParser:
    """The options both commands take; settings come after them as --key=value."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--checkpoint", help=f"the run to start from ({start_from})")
    p.add_argument("--out", required=True, help="the run directory")
    p.add_argument("--data", help="a JSONL file of examples (default: made from Shakespeare)")
    p.add_argument("--examples", type=int, default=4000, help="how many to make (no --data)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue the run in --out")
    again.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    p.add_argument("--lora-r", type=int, help="train LoRA adapters of this rank (0: none)")
    p.add_argument("--lora-alpha", type=float, help="LoRA's scale is alpha / r (default 16)")
    p.add_argument("--targets", help="comma-separated Linear names for LoRA (default wq,wv)")
    add_device(p, "the device of the model it starts from (or of the resumed run)")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None) -> tuple[Any, dict, dict | None]:
    """The parsed options, the --key=value settings, and the LoRA settings (None: full)."""
    args, rest = p.parse_known_args(argv)
    if not (args.resume or args.checkpoint):
        p.error("give the model to start from with --checkpoint (or --resume a run)")
    if args.examples < 2:
        p.error(f"--examples={args.examples}: at least 2 (some train, some are held out)")
    if args.lora_r is not None and args.lora_r < 0:
        p.error(f"--lora-r={args.lora_r}: a rank is at least 1 (0: train every weight)")
    targets = args.targets and [t.strip() for t in args.targets.split(",") if t.strip()]
    given = {"r": args.lora_r, "alpha": args.lora_alpha, "targets": targets}
    given = {k: v for k, v in given.items() if v is not None}
    if given and "r" not in given and not args.resume:
        p.error("--lora-alpha and --targets shape LoRA's adapters: give --lora-r too")
    # a resume compares what was given with the run's adapters (decoder.post.posttrain)
    lora = given if args.resume else {**LORA_DEFAULTS, **given}
    try:
        overrides = parse_overrides(rest)
    except ValueError as e:
        p.error(str(e))
    if args.device is not None:
        overrides["device"] = args.device
    return args, overrides, lora if (args.resume and lora) or lora.get("r") else None
