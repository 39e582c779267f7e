"""Generation speed: what `python -m decoder.generate` runs (the KV cache) beside nanoGPT's
sampling, which has no cache and re-runs the cropped context for every token.

    python bench/generate_vs_torch.py                     # shakespeare-char, 500 tokens
    python bench/generate_vs_torch.py --block-size 512    # a context the cache never fills
    python bench/generate_vs_torch.py --preset shakespeare-char-modern --tokens 1000

Three rows: minigrad with the cache (decoder.generate's default), minigrad without it
(``--no-cache``), and nanoGPT's ``GPT.generate`` (bench/torch_reference.py: the lm_head on
the last position only, top-k, ``torch.multinomial``). All start from the same weights (our
initialisation, untrained: speed does not depend on them) and the prompt "\\n", and sample
with nanoGPT's sample.py settings (temperature 0.8, top_k 200). Ours is timed through
decoder.text.stream.print_sample, the command line's own path without the checkpoint load,
writing into a buffer instead of the terminal. Each row is the best of ``--reps`` runs after
a 10-token warm-up, in its own process.

Subtle: our cache holds at most block_size tokens. With the classic preset's 64, it fills
after 64 tokens, and from then on our generate recomputes the last 64 tokens at every step
as nanoGPT always does (a rolling cache would keep keys computed at positions the cropped
window has since shifted). So over 500 tokens the cache speeds up only the first 64;
``--block-size`` raises the context (the model is untrained anyway) to show its full effect.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere

from decoder.model.config import ModelConfig  # noqa: E402
from decoder.training.config import build_configs  # noqa: E402

TEMPERATURE, TOP_K = 0.8, 200  # nanoGPT's sample.py defaults
PROMPT = "\n"
WARMUP_TOKENS = 10
SIDES = {
    "cache": "minigrad, KV cache (default)",
    "no-cache": "minigrad, no cache",
    "torch": "pytorch, nanoGPT (no cache)",
}


def setup(args: argparse.Namespace) -> tuple[ModelConfig, object, dict]:
    """The model config, the tokenizer and our initial weights (as decoder.train makes them)."""
    import minigrad as mg
    from decoder.model.model import Decoder
    from decoder.text.data import load_shakespeare, load_text
    from decoder.text.tokenizer import CharTokenizer

    text = load_text(args.data) if args.data else load_shakespeare()
    tokenizer = CharTokenizer.from_text(text)
    extra = {"vocab_size": tokenizer.vocab_size}
    if args.block_size:
        extra["block_size"] = args.block_size
    model_cfg, train_cfg = build_configs(args.preset, **extra)
    mg.manual_seed(train_cfg.seed)
    return model_cfg, tokenizer, Decoder(model_cfg).state_dict()


def time_ours(args: argparse.Namespace, use_cache: bool) -> float:
    """Best tokens/s of ``args.reps`` runs of decoder.generate's sampling, in this process."""
    from decoder.model.model import Decoder
    from decoder.text.stream import print_sample

    model_cfg, tokenizer, state = setup(args)
    model = Decoder(model_cfg)
    model.load_state_dict(state)

    def run(n: int) -> float:
        start = time.perf_counter()
        print_sample(
            model,
            tokenizer,
            PROMPT,
            n,
            temperature=TEMPERATURE,
            top_k=TOP_K,
            seed=0,
            use_cache=use_cache,
            out=io.StringIO(),
        )
        return n / (time.perf_counter() - start)

    run(WARMUP_TOKENS)
    return max(run(args.tokens) for _ in range(args.reps))


def time_torch(args: argparse.Namespace) -> float:
    """Best tokens/s of ``args.reps`` runs of nanoGPT's generate, in this process."""
    import torch
    from torch_reference import GPT  # beside this file

    model_cfg, tokenizer, state = setup(args)
    model = GPT(model_cfg)
    model.load_ours(state)
    model.eval()
    torch.manual_seed(0)
    idx = torch.tensor([tokenizer.encode(PROMPT)], dtype=torch.long)  # (1, T)

    def run(n: int) -> float:
        start = time.perf_counter()
        model.generate(idx, n, temperature=TEMPERATURE, top_k=TOP_K)
        return n / (time.perf_counter() - start)

    run(WARMUP_TOKENS)
    return max(run(args.tokens) for _ in range(args.reps))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="shakespeare-char")
    p.add_argument("--tokens", type=int, default=500, help="new tokens per run")
    p.add_argument("--block-size", type=int, default=None, help="default: the preset's")
    p.add_argument("--reps", type=int, default=3, help="runs per row; the best is kept")
    p.add_argument("--data", default=None, help="a text file (default: tiny Shakespeare)")
    p.add_argument("--side", choices=tuple(SIDES), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tokens < 1 or args.reps < 1:
        p.error(f"--tokens and --reps must be >= 1, got {args.tokens} and {args.reps}")
    if args.side:  # a child process: time one row, answer one JSON line
        speed = time_torch(args) if args.side == "torch" else time_ours(args, args.side == "cache")
        print(json.dumps({"tokens_per_s": speed}))
        return 0

    block_size = args.block_size or build_configs(args.preset)[0].block_size
    print(
        f"{args.preset}: {args.tokens} tokens from {PROMPT!r}, block_size {block_size}, "
        f"temperature {TEMPERATURE}, top_k {TOP_K}; best of {args.reps}"
    )
    print(f"{'':32}{'tokens/s':>10}{'ms/token':>10}")
    forwarded = [f"--preset={args.preset}", f"--tokens={args.tokens}", f"--reps={args.reps}"]
    forwarded += [f"--block-size={args.block_size}"] if args.block_size else []
    forwarded += [f"--data={args.data}"] if args.data else []
    speed = {}
    for side, label in SIDES.items():
        cmd = [sys.executable, __file__, *forwarded, f"--side={side}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            if side == "torch" and "No module named 'torch'" in done.stderr:
                print("PyTorch is not installed: its row is left out")
                break
            sys.exit(f"the {label!r} row failed:\n{done.stderr}")
        speed[side] = json.loads(done.stdout.strip().splitlines()[-1])["tokens_per_s"]
        print(f"{label:32}{speed[side]:10.1f}{1e3 / speed[side]:10.2f}", flush=True)
    if "torch" in speed:
        print(f"ratio minigrad (KV cache) / pytorch: {speed['cache'] / speed['torch']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
