"""Sampling from a trained checkpoint, streamed to the terminal as the tokens come.

    python -m decoder.generate --checkpoint runs/shakespeare-char --prompt "ROMEO:" \\
        --max-new-tokens 500 --temperature 0.8 --top-k 40 --top-p 0.95 --seed 1
    python -m decoder.generate --checkpoint runs/shakespeare-char --prompt "ROMEO:" \\
        --beam-width 4 --length-penalty 1.0 --stop "." --max-new-tokens 80
    python -m decoder.generate --from-pretrained gpt2 --prompt "Hello, I'm a language model,"

``--from-pretrained`` reads a Hugging Face model directory or hub name instead
(decoder/hf/pretrained.py).

Sampling, its settings and the stream of text are the library's (decoder.model.decoding,
decoder.text.stream); this module parses the command line and loads the model.

``--beam-width`` above 1 searches instead of sampling (decoder/model/decoding.py), ranking the
continuations that end at ``--stop`` (a text of one token) or at ``--max-new-tokens`` by
their log-probability over length ** ``--length-penalty``. Left out on purpose: batched
sampling of several prompts, stop sequences of several tokens.
Follows nanoGPT's ``sample.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from decoder.cli import add_device, run_command
from decoder.hf.pretrained import CONFIG, load_pretrained
from decoder.post.lora import MERGED, SETTINGS
from decoder.text.stream import default_prompt, print_sample
from decoder.training.checkpoint import LATEST, STATE, CheckpointError, load_model


def parser() -> argparse.ArgumentParser:
    """The command line's options."""
    p = argparse.ArgumentParser(
        prog="python -m decoder.generate", description="Sample text from a trained checkpoint."
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--checkpoint",
        help="a run directory (--out of training) or one of its ckpt-* directories",
    )
    source.add_argument(
        "--from-pretrained",
        metavar="PATH",
        help="a Hugging Face model directory (GPT-2, Llama, Mistral, Qwen2) or a hub name "
        "such as gpt2 (downloaded with pip install -e '.[hub]')",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="with --from-pretrained: crop the context to this many tokens (default: the "
        "model's own; Llama-family models of 32k tokens need gigabytes for it)",
    )
    p.add_argument(
        "--prompt",
        default=None,
        help="the text to continue (default: a newline, or token 0 where the vocabulary has none)",
    )
    add_sampling(p)
    p.add_argument("--stop", default=None, help="end after this text (one token)")
    add_device(p, "the checkpoint's device; the CPU for --from-pretrained")
    return p


def add_sampling(p: argparse.ArgumentParser, max_new_tokens: int = 500) -> None:
    """The sampling options (decoder.chat takes them too); ``sampling`` reads them."""
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument(
        "--temperature", type=float, default=None, help="< 1 sharper, > 1 flatter (default 0.8)"
    )
    p.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold")
    p.add_argument("--seed", type=int, default=None, help="for a reproducible sample")
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="recompute the whole context each "
        "token instead of using the KV cache (slower; for comparison)",
    )
    p.add_argument("--beam-width", type=int, default=1, help="> 1: beam search instead of sampling")
    p.add_argument(
        "--length-penalty",
        type=float,
        default=1.0,
        help="beam search ranks by log-probability / length ** this (> 0 favours longer; "
        "-10 to 10)",
    )


def sampling(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """``add_sampling``'s options as Decoder.generate's keywords (a mix that cannot go
    together is a usage error)."""
    if args.beam_width != 1 and (args.temperature, args.top_k, args.top_p) != (None,) * 3:
        p.error(
            "--beam-width ranks by the model's own probabilities: drop --temperature, "
            "--top-k and --top-p (they shape sampling)"
        )
    default_temperature = 0.8 if args.beam_width == 1 else 1.0
    return dict(
        temperature=default_temperature if args.temperature is None else args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        use_cache=not args.no_cache,
        beam_width=args.beam_width,
        length_penalty=args.length_penalty,
    )


def check_checkpoint_dir(path: Path) -> None:
    """Refuse, with what to run instead, a --checkpoint that is a fine-tune's adapters or a
    Hugging Face model directory rather than a run (or one of its checkpoints)."""
    if (path / LATEST).exists() or (path / STATE).exists():
        return
    if (path / SETTINGS).is_file():
        merged = path / MERGED
        instead = (
            f"sample the merged model with --checkpoint {merged}"
            if (merged / LATEST).exists()
            else f"merge them first (python -m decoder.finetune merge --adapters {path} "
            f"--out DIR) and sample --checkpoint DIR"
        )
        if (merged / CONFIG).is_file():
            instead = f"sample the merged model with --from-pretrained {merged}"
        raise CheckpointError(f"{path} holds LoRA adapters, not a checkpoint: {instead}")
    if (path / CONFIG).is_file():
        raise CheckpointError(
            f"{path} is a Hugging Face model directory ({CONFIG}), not one of our "
            f"checkpoints: sample it with --from-pretrained {path}"
        )


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the process exit code."""
    p = parser()
    args = p.parse_args(argv)
    settings = sampling(p, args)
    if args.block_size is not None and not args.from_pretrained:
        p.error("--block-size goes with --from-pretrained (a checkpoint keeps its own)")

    def body() -> None:
        if args.from_pretrained:
            model, tokenizer = load_pretrained(
                args.from_pretrained, device=args.device or "cpu", block_size=args.block_size
            )
        else:
            check_checkpoint_dir(Path(args.checkpoint))
            model, tokenizer, _ = load_model(args.checkpoint, device=args.device)
        prompt = default_prompt(tokenizer) if args.prompt is None else args.prompt
        print_sample(model, tokenizer, prompt, args.max_new_tokens, **settings, stop=args.stop)

    return run_command(body)  # one line on an error the user can fix, as every command


if __name__ == "__main__":
    sys.exit(main())
