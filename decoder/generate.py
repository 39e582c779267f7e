"""Sampling from a trained checkpoint, streamed to the terminal as the tokens come.

    python -m decoder.generate --checkpoint runs/shakespeare-char --prompt "ROMEO:" \\
        --max-new-tokens 500 --temperature 0.8 --top-k 40 --top-p 0.95 --seed 1
    python -m decoder.generate --checkpoint runs/shakespeare-char --prompt "ROMEO:" \\
        --beam-width 4 --length-penalty 1.0 --stop "." --max-new-tokens 80
    python -m decoder.generate --from-pretrained gpt2 --prompt "Hello, I'm a language model,"

``--from-pretrained`` reads a Hugging Face model directory or hub name instead
(decoder/pretrained.py).

The model's ``generate`` yields one token id at a time; ``stream_decode`` turns those into
text pieces without ever printing half of a multi-byte character (a byte-level BPE token
can end in the middle of one: "é" is two bytes, and they may come in two tokens).
A prompt longer than the context is cropped to its last ``block_size`` tokens, with a
notice on stderr (the model could not attend further back anyway).

``--beam-width`` above 1 searches instead of sampling (decoder/decoding.py), ranking the
continuations that end at ``--stop`` (a text of one token) or at ``--max-new-tokens`` by
their log-probability over length ** ``--length-penalty``. Left out on purpose: batched
sampling of several prompts, stop sequences of several tokens.
Follows nanoGPT's ``sample.py``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

from minigrad.backend import DEVICES

REPLACEMENT = "\ufffd"  # what a UTF-8 decoder with errors="replace" puts for broken bytes


def default_prompt(tokenizer: Any, first_id: int = 0) -> str:
    """The prompt of a sample when none is given: a newline (a sample starts as a line does)
    where the vocabulary has one, else the token ``first_id``: decoder.train passes its
    text's first token; a checkpoint alone has no text, so decoder.generate takes token 0.

    >>> from decoder.tokenizer import CharTokenizer
    >>> default_prompt(CharTokenizer.from_text("to be or"))  # no newline: its token 0
    ' '
    >>> default_prompt(CharTokenizer.from_text(chr(10).join(["to be", "or"]))) == chr(10)
    True
    """
    try:
        if tokenizer.encode("\n"):
            return "\n"
    except ValueError:  # a character-level vocabulary from a text without a newline
        pass
    return tokenizer.decode([first_id])


def stream_decode(
    tokenizer: Any, ids: Iterable[int], max_pending: int = 8, context: Sequence[int] = ()
) -> Iterator[str]:
    """Decode token ids one by one into text pieces, never splitting a UTF-8 character.

    A token whose bytes end inside a character is held back until the character is
    complete; after ``max_pending`` tokens it is let through as it is (the model did
    produce an invalid byte sequence). Each piece is decoded after the token before it
    (``context``'s last token for the first: the prompt's), and only what that adds is
    yielded: a SentencePiece tokenizer drops the space in front of the text it decodes, so
    decoding "▁world" alone would lose the space between two words.

    >>> from types import SimpleNamespace
    >>> byte_tok = SimpleNamespace(decode=lambda ids: bytes(ids).decode("utf-8", "replace"))
    >>> list(stream_decode(byte_tok, [104, 0xC3, 0xA9, 33]))  # "h", then "é" as two bytes, "!"
    ['h', 'é', '!']
    """
    before = [int(t) for t in context][-1:]
    pending: list[int] = []
    for token in ids:
        pending.append(int(token))
        text = _decode_whole(tokenizer, before + pending)
        if text is None and len(pending) < max_pending:
            continue  # subtle: wait for the rest of the character
        head = tokenizer.decode(before)
        if text is not None and text.startswith(head):
            yield text[len(head) :]
        else:  # broken bytes (or a context that decodes differently alone): as they are
            yield tokenizer.decode(pending)
        before, pending = pending[-1:], []
    if pending:
        yield tokenizer.decode(pending)


def _decode_whole(tokenizer: Any, ids: list[int]) -> str | None:
    """The text of ``ids``, or None if it ends inside a multi-byte character."""
    try:
        text = tokenizer.decode(ids)
    except UnicodeDecodeError:  # a tokenizer that decodes strictly
        return None
    return None if text.endswith(REPLACEMENT) else text


def print_sample(
    model: Any,
    tokenizer: Any,
    prompt: str,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    use_cache: bool = True,
    out: TextIO | None = None,
    beam_width: int = 1,
    length_penalty: float = 1.0,
    stop: str | None = None,
) -> str:
    """Write ``prompt`` and then its continuation to ``out`` (stdout), flushing each piece;
    the settings are ``Decoder.generate``'s, and ``stop`` is the text of its stop token.

    Returns the whole text written. Raises the tokenizer's error for a prompt it cannot
    encode, and ValueError for an empty prompt or a stop text that is not one token.
    """
    out = out or sys.stdout
    ids = tokenizer.encode(prompt)
    if len(ids) == 0:
        raise ValueError("the prompt is empty: give at least one character, e.g. --prompt '\\n'")
    block_size = model.config.block_size
    if len(ids) > block_size:
        print(
            f"note: the prompt has {len(ids)} tokens, more than the context of {block_size}; "
            f"the model sees only the last {block_size}",
            file=sys.stderr,
        )
        ids = ids[-block_size:]
    stop_ids = None if stop is None else tokenizer.encode(stop)
    if stop_ids is not None and len(stop_ids) != 1:
        raise ValueError(
            f"--stop {stop!r} is {len(stop_ids)} tokens; it must be exactly one token "
            f"(a single character with the char tokenizer)"
        )
    pieces = [prompt]
    out.write(prompt)
    out.flush()
    tokens = model.generate(
        [ids],
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        use_cache=use_cache,
        beam_width=beam_width,
        length_penalty=length_penalty,
        stop_token=None if stop_ids is None else stop_ids[0],
    )
    for piece in stream_decode(tokenizer, tokens, context=ids):
        out.write(piece)
        out.flush()  # stream: show each piece as soon as it exists
        pieces.append(piece)
    out.write("\n")
    out.flush()
    return "".join(pieces)


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the process exit code."""
    from decoder.checkpoint import CheckpointError, load_model
    from decoder.pretrained import load_pretrained

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
    p.add_argument("--max-new-tokens", type=int, default=500)
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
        help="beam search ranks by log-probability / length ** this (> 0 favours longer)",
    )
    p.add_argument("--stop", default=None, help="end after this text (one token)")
    p.add_argument("--device", default="cpu", choices=DEVICES)
    args = p.parse_args(argv)
    if args.beam_width != 1 and (args.temperature, args.top_k, args.top_p) != (None,) * 3:
        p.error(
            "--beam-width ranks by the model's own probabilities: drop --temperature, "
            "--top-k and --top-p (they shape sampling)"
        )
    if args.temperature is None:
        args.temperature = 0.8 if args.beam_width == 1 else 1.0
    if args.block_size is not None and not args.from_pretrained:
        p.error("--block-size goes with --from-pretrained (a checkpoint keeps its own)")
    try:
        if args.from_pretrained:
            model, tokenizer = load_pretrained(
                args.from_pretrained, device=args.device, block_size=args.block_size
            )
        else:
            model, tokenizer, _ = load_model(args.checkpoint, device=args.device)
        print_sample(
            model,
            tokenizer,
            default_prompt(tokenizer) if args.prompt is None else args.prompt,
            args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            use_cache=not args.no_cache,
            beam_width=args.beam_width,
            length_penalty=args.length_penalty,
            stop=args.stop,
        )
    except (CheckpointError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
