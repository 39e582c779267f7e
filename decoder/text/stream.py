"""Text out of a model as it comes: the tokens a model's ``generate`` yields, one at a time,
decoded and written as soon as they make whole characters.

``stream_decode`` turns token ids into text pieces without ever printing half of a
multi-byte character (a byte-level BPE token can end in the middle of one: "é" is two bytes,
and they may come in two tokens). ``print_sample`` writes a prompt and its continuation; a
prompt longer than the context is cropped to its last ``block_size`` tokens, with a notice
on stderr (the model could not attend further back anyway). ``default_prompt`` is the prompt
of a sample when none is given. decoder.generate and the sample at the end of a training run
(decoder.training.loop) both print through ``print_sample``.
Follows nanoGPT's ``sample.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

REPLACEMENT = "\ufffd"  # what a UTF-8 decoder with errors="replace" puts for broken bytes


def default_prompt(tokenizer: Any, first_id: int = 0) -> str:
    """The prompt of a sample when none is given: a newline (a sample starts as a line does)
    where the vocabulary has one, else the token ``first_id``: a training run passes its
    text's first token; a checkpoint alone has no text, so decoder.generate takes token 0.

    >>> from decoder.text.tokenizer import CharTokenizer
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


def _encode(tokenizer: Any, text: str, option: str) -> list[int]:
    """``tokenizer.encode(text)``, its error naming the option the text came from; a special
    token written in the text (a chat marker) gets the command that places it."""
    try:
        return tokenizer.encode(text)
    except ValueError as e:
        markers = [m for m in getattr(tokenizer, "special_tokens", {}) if m in text]
        hint = ""
        if markers:  # subtle: text never turns into a special token (decoder.post.chat)
            hint = (
                f"; {', '.join(markers)} are special tokens, which text never turns into: "
                f"for the chat template, talk to the run with python -m decoder.chat"
            )
        raise ValueError(f"{option}: {e}{hint}") from None


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
    ids = _encode(tokenizer, prompt, "--prompt")
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
    stop_ids = None if stop is None else _encode(tokenizer, stop, f"--stop {stop!r}")
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
