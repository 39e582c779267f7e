"""Speculative decoding: the acceptance rate and the speed-up of a small draft model beside
its target, against the target generating alone.

    python bench/speculative.py --target runs/shakespeare-char --draft runs/tiny
    python bench/speculative.py --train-steps 300 --data tinyshakespeare.txt  # trains both

The draft and the target must share a tokenizer (two char-level runs on the same text do).
With ``--train-steps`` both are trained here first, for that many steps, into a temporary
directory: the ``tiny`` preset as the draft and ``shakespeare-char`` as the target.

Each row generates from ``--prompts`` prompts (the first characters of lines of the
validation text) as many tokens as fit in the target's block_size: past it the context window
moves with every token and speculative decoding lets the target generate alone (see
decoder/model/decoding.py), so the speed-up is measured where it applies. Rows: greedy and sampled
(temperature 0.8), for several k. The acceptance rate is the share of drafted tokens kept; at
temperature 0 the tokens are also checked equal to the target's own greedy tokens. Timings
are wall-clock in this process, after a warm-up, on the CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere

from decoder.model.decoding import speculative_decode  # noqa: E402
from decoder.text.data import load_shakespeare, load_text  # noqa: E402
from decoder.training.checkpoint import load_model  # noqa: E402
from decoder.training.config import build_configs  # noqa: E402
from decoder.training.loop import train  # noqa: E402

PROMPT_CHARS = 4
KS = (2, 4, 6)
TEMPERATURES = (0.0, 0.8)


def train_pair(text: str, steps: int, out: Path) -> tuple[Path, Path]:
    """Train the ``tiny`` draft and the ``shakespeare-char`` target for ``steps`` steps."""
    runs = []
    for preset in ("tiny", "shakespeare-char"):
        model_cfg, train_cfg = build_configs(
            preset,
            max_iters=steps,
            warmup_iters=min(100, steps),
            eval_interval=steps,
            sample_tokens=0,
        )
        print(f"training {preset} for {steps} steps ...", file=sys.stderr)
        train(model_cfg, train_cfg, text, out / preset, progress=False)
        runs.append(out / preset)
    return runs[0], runs[1]


def prompts(text: str, tokenizer, n: int) -> list[list[int]]:
    """The first PROMPT_CHARS characters of n lines from the last tenth of the text."""
    lines = [line for line in text[int(len(text) * 0.9) :].splitlines() if len(line) > 8]
    step = max(len(lines) // n, 1)
    return [tokenizer.encode(line[:PROMPT_CHARS]) for line in lines[::step][:n]]


def timed(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` and the seconds it took."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def target_alone(target, starts, n_new: int, temperature: float) -> list[list[int]]:
    return [
        list(target.generate(s, n_new, temperature=temperature, seed=i))
        for i, s in enumerate(starts)
    ]


def speculative(target, draft, starts, n_new: int, k: int, temperature: float) -> list:
    return [
        speculative_decode(target, draft, s, n_new, k=k, temperature=temperature, seed=i)
        for i, s in enumerate(starts)
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="the target's run directory (shakespeare-char)")
    p.add_argument("--draft", help="the draft's run directory (tiny)")
    p.add_argument("--train-steps", type=int, help="train both here first, this many steps")
    p.add_argument("--data", default=None, help="a text file (default: tiny Shakespeare)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per row")
    args = p.parse_args()
    if (args.train_steps is None) == (args.target is None or args.draft is None):
        p.error("give --target and --draft, or --train-steps")
    text = load_text(args.data) if args.data else load_shakespeare()
    with tempfile.TemporaryDirectory() as tmp:
        if args.train_steps is not None:
            args.draft, args.target = train_pair(text, args.train_steps, Path(tmp))
        target, tokenizer, _ = load_model(args.target)
        draft, draft_tokenizer, _ = load_model(args.draft)
    if draft_tokenizer.to_dict() != tokenizer.to_dict():
        p.error("the draft and the target were trained with different tokenizers")
    starts = prompts(text, tokenizer, args.prompts)
    n_new = target.config.block_size - PROMPT_CHARS  # the tokens that fit in the context
    print(
        f"target {target.num_parameters():,} parameters (block_size "
        f"{target.config.block_size}), draft {draft.num_parameters():,}; {len(starts)} "
        f"prompts x {n_new} new tokens per row"
    )
    print(f"{'temperature':>11} {'k':>3} {'accepted':>9} {'target tok/s':>13} "
          f"{'speculative tok/s':>18} {'speed-up':>9}")  # fmt: skip
    list(target.generate(starts[0], 8))  # warm-up
    for temperature in TEMPERATURES:
        alone, t_alone = timed(target_alone, target, starts, n_new, temperature)
        for k in KS:
            results, t_spec = timed(speculative, target, draft, starts, n_new, k, temperature)
            if temperature == 0 and [r.tokens for r in results] != alone:
                raise AssertionError("greedy speculative tokens differ from the target's")
            rate = sum(r.accepted for r in results) / sum(r.proposed for r in results)
            total = len(starts) * n_new
            print(
                f"{temperature:>11} {k:>3} {rate:>9.1%} {total / t_alone:>13,.0f} "
                f"{total / t_spec:>18,.0f} {t_alone / t_spec:>8.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
