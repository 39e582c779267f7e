"""``python -m decoder.chat``: answer instructions with an SFT or DPO run, streamed to the
terminal as the tokens come.

    python -m decoder.chat --checkpoint runs/sft
    python -m decoder.chat --checkpoint runs/dpo --prompt "Who speaks the line ..." \\
        --temperature 0 --max-new-tokens 80

Each instruction is put in the chat template (decoder.post.chat: ``<|user|> instruction
<|assistant|>``) and the answer runs until the model writes ``<|end|>`` or reaches
``--max-new-tokens`` (or the context). Without ``--prompt`` it reads one instruction per line
until the input ends (Ctrl-D). The sampling options are decoder.generate's; the checkpoint is
loaded as decoder.generate loads it (a LoRA run's adapters merged). Left out on purpose:
multi-turn dialogues and system prompts (SFT here trains one turn).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

from decoder.cli import add_device, run_command
from decoder.generate import add_sampling, sampling
from decoder.post.chat import CHAT_TOKENS, answer_tokens, has_chat_tokens
from decoder.text.stream import stream_decode
from decoder.training.checkpoint import load_model


def parser() -> argparse.ArgumentParser:
    """The command line's options."""
    p = argparse.ArgumentParser(
        prog="python -m decoder.chat", description="Answer instructions with an SFT or DPO run."
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a run of decoder.sft or decoder.dpo (its --out) or one of its ckpt-* directories",
    )
    p.add_argument(
        "--prompt",
        default=None,
        help="one instruction to answer (default: read one per line until the input ends)",
    )
    add_sampling(p, max_new_tokens=200)
    add_device(p, "the checkpoint's device")
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the process exit code (decoder.cli.run_command's)."""
    p = parser()
    args = p.parse_args(argv)
    settings = sampling(p, args)
    return run_command(
        lambda: chat(args.checkpoint, args.prompt, args.max_new_tokens, args.device, settings)
    )


def chat(
    checkpoint: str,
    prompt: str | None,
    max_new_tokens: int,
    device: str | None,
    settings: dict[str, Any],
) -> None:
    """Answer ``prompt``, or each line of the input, streaming each answer to stdout."""
    model, tokenizer, _ = load_model(checkpoint, device=device)
    if not has_chat_tokens(tokenizer):
        raise ValueError(
            f"{checkpoint}: its tokenizer has no chat tokens ({', '.join(CHAT_TOKENS)}): it is "
            f"not a run of decoder.sft or decoder.dpo; chat with one, or sample it with "
            f"python -m decoder.generate"
        )
    for instruction in [prompt] if prompt is not None else _instructions():
        ids, tokens = answer_tokens(model, tokenizer, instruction, max_new_tokens, **settings)
        for piece in stream_decode(tokenizer, tokens, context=ids):
            sys.stdout.write(piece)
            sys.stdout.flush()  # stream: show each piece as soon as it exists
        sys.stdout.write("\n")
        sys.stdout.flush()


def _instructions() -> Iterator[str]:
    """The non-blank lines of the input, with a "> " prompt where a person types them."""
    interactive = sys.stdin.isatty()
    if interactive:
        print("one instruction per line; Ctrl-D to end", file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            return
        if line.strip():
            yield line


if __name__ == "__main__":
    sys.exit(main())
