"""Tokenizers: text to integer ids and back.

Holds three tokenizers that share one small protocol (``encode``, ``decode``, ``vocab_size``,
``to_dict``; ``tokenizer_from_dict`` rebuilds any of them from a checkpoint):

- ``CharTokenizer``: one id per distinct character of a corpus, as in char-rnn and nanoGPT's
  Shakespeare example. The smallest thing that works; every id is one character.
- ``BPETokenizer`` (decoder/text/bpe.py): byte-level byte-pair encoding trained here, in plain
  Python, whose ranks tiktoken's fast Rust encoder serves with the same ids.
- ``TiktokenTokenizer``: a thin wrapper over a pretrained tiktoken encoding such as ``gpt2``.

Left out on purpose: pretrained files of our own: tiktoken loads those.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import tiktoken

from decoder.text.bpe import BPETokenizer

TOKENIZERS = ("char", "bpe", "gpt2")  # by name: built from the text (two), or pretrained


class Tokenizer(Protocol):
    """What the rest of the project needs from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


# ---- characters ---------------------------------------------------------------------------------
class CharTokenizer:
    """One id per character, ids in sorted order of the characters.

    Special tokens (decoder/post/chat.py's template) take the ids after the characters, as in
    BPETokenizer; ``encode`` never makes them from text (its callers place their ids).

    >>> tok = CharTokenizer.from_text("hello")
    >>> tok.vocab_size, tok.encode("hell"), tok.decode([1, 0, 2, 2, 3])
    (4, [1, 0, 2, 2], 'hello')
    >>> tok = tok.with_special_tokens(["<|end|>"])
    >>> tok.vocab_size, tok.special_tokens, tok.decode([1, 4])
    (5, {'<|end|>': 4}, 'h<|end|>')
    """

    def __init__(self, chars: Iterable[str], special_tokens: Sequence[str] = ()):
        self.chars = list(chars)
        if not self.chars:
            raise ValueError("a CharTokenizer needs at least one character")
        if any(len(c) != 1 for c in self.chars) or len(set(self.chars)) != len(self.chars):
            raise ValueError("a CharTokenizer's vocabulary must be distinct single characters")
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        if len(set(special_tokens)) != len(special_tokens):
            raise ValueError(f"repeated special tokens: {list(special_tokens)}")
        self.special_tokens = {s: len(self.chars) + i for i, s in enumerate(special_tokens)}
        self.special_ids = {i: s for s, i in self.special_tokens.items()}

    def with_special_tokens(self, tokens: Sequence[str]) -> CharTokenizer:
        """This tokenizer with ``tokens`` added after its special tokens (old ids unchanged)."""
        return CharTokenizer(self.chars, [*self.special_tokens, *tokens])

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The tokenizer whose vocabulary is the sorted distinct characters of ``text``."""
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + len(self.special_tokens)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            unknown = sorted(set(text) - self.stoi.keys())
            shown = ", ".join(repr(c) for c in unknown[:20]) + (" ..." if len(unknown) > 20 else "")
            raise ValueError(
                f"{len(unknown)} character(s) not in this tokenizer's vocabulary: {shown} "
                "(it holds the characters of the corpus it was built from)"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        n = len(self.chars)
        # subtle: a negative id would index from the end
        bad = [i for i in ids if not 0 <= i < n and i not in self.special_ids]
        if bad:
            raise ValueError(f"ids out of range for a vocabulary of {self.vocab_size}: {bad[:10]}")
        return "".join(self.chars[i] if i < n else self.special_ids[i] for i in ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "char",
            "chars": "".join(self.chars),
            "special_tokens": list(self.special_tokens),  # ids follow the characters
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CharTokenizer:
        return cls(d["chars"], d.get("special_tokens", ()))  # older checkpoints have none


# ---- pretrained tiktoken encodings --------------------------------------------------------------
# The files of the pretrained encoding the command line offers (tiktoken_ext/openai_public.py),
# so that the error for a machine without network can say what to download.
TIKTOKEN_FILES = {
    "gpt2": (
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
    ),
}


def _tiktoken_cache_dir() -> str:
    """Where tiktoken keeps downloaded files (the rule in ``tiktoken.load.read_file_cached``)."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return os.environ[var]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _offline_message(name: str, error: OSError) -> str:
    """What to download, and where to put it, when tiktoken cannot fetch ``name``'s files."""
    folder = _tiktoken_cache_dir()
    where = (
        f"tiktoken reads them from {folder} (set TIKTOKEN_CACHE_DIR to choose another folder), "
        "each file named by the SHA-1 of its URL"
    )
    if name in TIKTOKEN_FILES:
        files = "".join(
            f"\n  {url}\n    -> {os.path.join(folder, hashlib.sha1(url.encode()).hexdigest())}"
            for url in TIKTOKEN_FILES[name]
        )
        get = f"On a machine with network access, download{files}\nand copy them there"
    else:
        get = "Their URLs are in tiktoken_ext/openai_public.py; download them and copy them there"
    return (
        f"could not download the files of tiktoken's {name!r} encoding ({error}). {where}. "
        f"{get}, or run once with network access to fill that folder."
    )


class TiktokenTokenizer:
    """A pretrained tiktoken encoding (``gpt2``, ``cl100k_base``, ...) behind our interface."""

    def __init__(self, name: str = "gpt2"):
        self.name = name
        try:
            self.encoding = tiktoken.get_encoding(name)
        except OSError as e:  # what requests and urllib raise when offline
            raise RuntimeError(_offline_message(name, e)) from e

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def encode(self, text: str, allowed_special: str | Iterable[str] = "none_raise") -> list[int]:
        """As ``BPETokenizer.encode``, by tiktoken."""
        if allowed_special == "none":
            return self.encoding.encode_ordinary(text)
        if allowed_special == "none_raise":
            return self.encoding.encode(text)
        if allowed_special == "all":
            return self.encoding.encode(text, allowed_special="all")
        return self.encoding.encode(text, allowed_special=set(allowed_special))

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode(list(ids))

    def to_dict(self) -> dict[str, Any]:
        return {"type": "tiktoken", "name": self.name}


# ---- choosing and rebuilding --------------------------------------------------------------------
def get_tokenizer(
    name: str, text: str | None = None, vocab_size: int = 512
) -> CharTokenizer | BPETokenizer | TiktokenTokenizer:
    """A tokenizer by name: ``"char"`` and ``"bpe"`` are built from ``text``; ``"gpt2"`` (or
    any tiktoken encoding name) is pretrained. ``vocab_size`` is for ``"bpe"`` only.

    >>> get_tokenizer("char", text="abca").vocab_size
    3
    """
    if name in ("char", "bpe"):
        if text is None:
            raise ValueError(f"the {name!r} tokenizer is built from a text: pass text=...")
        if name == "char":
            return CharTokenizer.from_text(text)
        return BPETokenizer.train(text, vocab_size)
    if name in tiktoken.list_encoding_names():
        return TiktokenTokenizer(name)
    raise ValueError(
        f"unknown tokenizer {name!r}: use one of {TOKENIZERS} (or another tiktoken encoding)"
    )


def tokenizer_from_dict(d: dict[str, Any]) -> CharTokenizer | BPETokenizer | TiktokenTokenizer:
    """Rebuild any tokenizer from its ``to_dict()``.

    >>> tokenizer_from_dict(CharTokenizer.from_text("ab").to_dict()).encode("ba")
    [1, 0]
    """
    kind = d.get("type")
    if kind == "char":
        return CharTokenizer.from_dict(d)
    if kind == "bpe":
        return BPETokenizer.from_dict(d)
    if kind == "tiktoken":
        return TiktokenTokenizer(d["name"])
    raise ValueError(f"unknown tokenizer type {kind!r}: expected 'char', 'bpe' or 'tiktoken'")
