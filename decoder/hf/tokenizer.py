"""The BPE tokenizers that Llama-family models ship as ``tokenizer.json`` (Hugging Face's
``tokenizers`` format), read without that library.

Two kinds of BPE live in these files, both with a ``vocab`` (token -> id) and ranked
``merges`` (the lower the rank, the earlier the pair merges):

- byte-level (GPT-2's scheme; Qwen2, Llama 3): text is split by a regular expression, each
  chunk's UTF-8 bytes are written as printable characters (``BYTE_CHARS``, GPT-2's
  ``bytes_to_unicode``) and merged. When the ids of the merged tokens follow the merges'
  order, a token's id is its rank and tiktoken's encoder gives the same ids at Rust speed
  (as it does for GPT-2 itself); otherwise ``bpe_merge`` below does it.
- SentencePiece's (Llama 2, Mistral): spaces become "▁", one is put in front, and the text's
  characters are merged whole, without a split; a character outside the vocabulary is spelled
  as its bytes, ``<0xNN>`` tokens ("byte fallback").

Left out on purpose: WordPiece and Unigram models, Unicode normalisers (NFC, NFKC), dropout
and other training-time options; a file using one is refused by name.
Follows the ``tokenizers`` library's BPE model and GPT-2's ``encoder.py``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import tiktoken

from decoder.text.bpe import GPT2_SPLIT_PATTERN, split_text
from minigrad.fileio import parse_json


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character: bytes that print stand for
    themselves, the others (controls, space) are moved to code points 256 and up.

    >>> m = _bytes_to_unicode(); m[ord("a")], m[ord(" ")], m[ord("\\n")]
    ('a', 'Ġ', 'Ċ')
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


BYTE_CHARS = _bytes_to_unicode()
CHAR_BYTES = {c: b for b, c in BYTE_CHARS.items()}
SPACE = "▁"  # SentencePiece's visible space (U+2581)
BYTE_TOKEN = re.compile(r"<0x([0-9A-F]{2})>")


def bpe_merge(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Merge the adjacent pair of lowest rank (the leftmost of equals) until none is ranked.

    >>> bpe_merge(list("aaab"), {("a", "a"): 0, ("a", "b"): 1})  # the first "aa" goes first
    ['aa', 'ab']
    """
    symbols = list(symbols)
    while len(symbols) > 1:
        pairs = [ranks.get(pair, len(ranks)) for pair in pairwise(symbols)]
        i = min(range(len(pairs)), key=pairs.__getitem__)  # min keeps the leftmost of ties
        if pairs[i] == len(ranks):
            break
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    return symbols


class HFTokenizer:
    """A ``tokenizer.json`` BPE tokenizer with our interface (encode, decode, vocab_size).

    It has no ``to_dict``: its state is the file beside the model's weights.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        spec, model, self.special = _read_spec(self.path)
        self.vocab: dict[str, int] = model["vocab"]
        merges = _merges(model.get("merges"), self.path)
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.id_to_token = {i: t for t, i in self.vocab.items()} | {
            i: t for t, i in self.special.items()
        }
        self.byte_fallback = bool(model.get("byte_fallback"))
        self.unk = self.vocab.get(model.get("unk_token") or "")
        try:  # the steps' fields are read as the tokenizers library writes them
            steps = _steps(spec)
            self.byte_level = "ByteLevel" in steps
            if self.byte_level:
                self.pattern = _split_pattern(spec, self.path)
                self.encoding = self._as_tiktoken(merges)
            elif "Replace" in steps or "Metaspace" in steps:
                self.prepend = _prepend_scheme(spec)
                self.encoding = None
        except (AttributeError, TypeError, KeyError) as e:
            raise ValueError(
                f"{self.path}: its normalizer, pre_tokenizer or decoder is not in the format of "
                f"Hugging Face's tokenizers ({type(e).__name__}: {e}); download the file again"
            ) from None
        if not (self.byte_level or "Replace" in steps or "Metaspace" in steps):
            raise ValueError(
                f"{self.path}: neither byte-level nor SentencePiece-style BPE (its steps are "
                f"{sorted(steps)}); this reader knows those two"
            )

    def _as_tiktoken(self, merges: list[tuple[str, ...]]) -> tiktoken.Encoding | None:
        """tiktoken's encoder for this vocabulary, if a token's id can serve as its rank:
        every byte is a token and the merged tokens' ids rise with their merges' ranks."""
        merged_ids = [self.vocab.get(a + b) for a, b in merges]
        if not all(BYTE_CHARS[b] in self.vocab for b in range(256)) or None in merged_ids:
            return None
        if any(x >= y for x, y in pairwise(merged_ids)):
            return None
        return tiktoken.Encoding(
            name=os.path.basename(os.path.dirname(self.path)) or "tokenizer.json",
            pat_str=self.pattern,
            mergeable_ranks={
                bytes(CHAR_BYTES[c] for c in t): i  # a special token in the vocab stays special
                for t, i in self.vocab.items()
                if t not in self.special
            },
            special_tokens=self.special,
        )

    @property
    def vocab_size(self) -> int:
        return max(self.id_to_token) + 1

    def encode(self, text: str, allowed_special: str = "none_raise") -> list[int]:
        """Text to ids; ``allowed_special`` as in BPETokenizer ("all", "none", "none_raise")."""
        if allowed_special not in ("all", "none", "none_raise"):
            raise ValueError(
                f"allowed_special={allowed_special!r}: use 'all', 'none' or 'none_raise'"
            )
        specials = sorted(self.special, key=len, reverse=True) if allowed_special == "all" else []
        if allowed_special == "none_raise":
            found = [s for s in self.special if s in text]
            if found:
                raise ValueError(
                    f"the text holds the special token {found[0]!r}; pass allowed_special='all' "
                    f"to encode it as one id, or 'none' to encode it as text"
                )
        parts = (
            re.split("(" + "|".join(map(re.escape, specials)) + ")", text) if specials else [text]
        )
        ids: list[int] = []
        for i, part in enumerate(parts):
            if i % 2:  # re.split with a group puts the separators at odd positions
                ids.append(self.special[part])
            elif part:
                ids.extend(self._encode_ordinary(part, first=i == 0))
        return ids

    def _encode_ordinary(self, text: str, first: bool) -> list[int]:
        if self.encoding is not None:
            return self.encoding.encode_ordinary(text)
        if self.byte_level:
            ids = []
            for chunk in split_text(text, self.pattern):
                symbols = [BYTE_CHARS[b] for b in chunk.encode("utf-8")]
                ids.extend(self.vocab[s] for s in bpe_merge(symbols, self.ranks))
            return ids
        text = text.replace(" ", SPACE)
        if self.prepend == "always" or (self.prepend == "first" and first):
            text = SPACE + text
        ids = []
        for piece in bpe_merge(list(text), self.ranks):
            if piece in self.vocab:
                ids.append(self.vocab[piece])
            elif self.byte_fallback:
                ids.extend(self.vocab[f"<0x{b:02X}>"] for b in piece.encode("utf-8"))
            elif self.unk is not None:
                ids.append(self.unk)
            else:
                raise ValueError(f"{piece!r} is not in the vocabulary of {self.path}")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Ids to text; bytes that are not valid UTF-8 become U+FFFD."""
        pieces = []
        for i in ids:
            if i not in self.id_to_token:
                raise ValueError(f"id {i} is out of range for {self.path}")
            token = self.id_to_token[i]
            if token in self.special:
                pieces.append(token.encode("utf-8"))
            elif self.byte_level:
                pieces.append(bytes(CHAR_BYTES[c] for c in token))
            elif BYTE_TOKEN.fullmatch(token):
                pieces.append(bytes([int(token[3:5], 16)]))
            else:
                pieces.append(token.replace(SPACE, " ").encode("utf-8"))
        text = b"".join(pieces).decode("utf-8", errors="replace")
        if not self.byte_level and self.prepend != "never" and text.startswith(" "):
            text = text[1:]  # the space put in front when encoding
        return text


def _read_spec(path: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
    """The file's whole spec, its ``model`` (checked to be a BPE model whose vocabulary maps
    tokens to ids) and its added tokens as token -> id."""
    fix = "download the model's tokenizer.json again"
    try:
        with open(path, "rb") as f:
            spec = parse_json(f.read())
    except FileNotFoundError:
        raise ValueError(
            f"{path}: missing; a Llama-family model needs the tokenizer.json of its "
            f"hub repository beside its weights"
        ) from None
    except ValueError as e:  # not JSON, or nested too deep
        raise ValueError(f"{path}: {e}; {fix}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
        found = type(spec.get("model") if isinstance(spec, dict) else spec).__name__
        raise ValueError(f"{path}: its model is a JSON {found}, not a tokenizer object; {fix}")
    model = spec["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{path}: a {model.get('type')!r} model; only BPE is read here")
    for where, table in (("model.vocab", model.get("vocab")), ("added_tokens", _added(spec))):
        bad = _not_ids(table)
        if bad is not None:
            raise ValueError(f"{path}: {where} {bad}: each token needs an integer id >= 0; {fix}")
    return spec, model, _added(spec)


def _added(spec: dict[str, Any]) -> Any:
    """``added_tokens`` as token -> id, or the malformed value itself."""
    added = spec.get("added_tokens", [])
    if isinstance(added, list) and all(isinstance(t, dict) and "content" in t for t in added):
        return {t["content"]: t.get("id") for t in added if isinstance(t["content"], str)}
    return added


def _not_ids(table: Any) -> str | None:
    """What is wrong with a token -> id table, or None when nothing is.

    >>> _not_ids({"a": 0, "b": "1"}), _not_ids(["a"]), _not_ids({"a": 0})
    ("maps 'b' to '1'", 'is a list, not an object of token -> id', None)
    """
    if not isinstance(table, dict):
        return f"is a {type(table).__name__}, not an object of token -> id"
    for token, i in table.items():
        if type(i) is not int or i < 0:
            return f"maps {token!r} to {i!r}"
    return None


def _merges(merges: Any, path: str) -> list[tuple[str, str]]:
    """The ranked merges: "a b" strings in older files, [a, b] lists in newer ones."""
    if not isinstance(merges, list):
        merges = [merges]  # reported below as the first merge
    pairs = []
    for rank, m in enumerate(merges):
        pair = tuple(m.split(" ", 1)) if isinstance(m, str) else m
        if not (isinstance(pair, list | tuple) and len(pair) == 2):
            pair = None
        if pair is None or not all(isinstance(s, str) for s in pair):
            raise ValueError(
                f'{path}: model.merges[{rank}] is {m!r}; a merge is "a b" or ["a", "b"] '
                f"(a list of them); download the model's tokenizer.json again"
            )
        pairs.append(tuple(pair))
    return pairs


def _steps(spec: dict[str, Any]) -> set[str]:
    """The type names of the normaliser, pre-tokenizer and decoder steps, nested included."""
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if "type" in node:
                found.add(node["type"])
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    for key in ("normalizer", "pre_tokenizer", "decoder"):
        visit(spec.get(key))
    unknown = found & {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "BertPreTokenizer"}
    if unknown:
        raise ValueError(f"tokenizer.json uses {sorted(unknown)}, which this reader lacks")
    return found


def _prepend_scheme(spec: dict[str, Any]) -> str:
    """Where a SentencePiece-style tokenizer puts "▁" in front of the text: "always" (before
    every stretch between special tokens: a Prepend normaliser, as Llama 2's files), "first"
    (before the text's start only) or "never", as a Metaspace pre-tokenizer asks."""
    normalizer, pre = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}
    if any(n.get("type") == "Prepend" for n in [normalizer, *normalizer.get("normalizers", [])]):
        return "always"
    for step in [pre, *pre.get("pretokenizers", [])]:
        if step.get("type") == "Metaspace":
            legacy = "always" if step.get("add_prefix_space") else "never"  # before 0.19
            return step.get("prepend_scheme", legacy)
    return "never"


def _split_pattern(spec: dict[str, Any], path: str) -> str:
    """The regular expression a byte-level tokenizer splits text with."""
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    for step in steps:
        if step.get("type") == "ByteLevel" and step.get("add_prefix_space"):
            raise ValueError(f"{path}: ByteLevel add_prefix_space is not implemented here")
    splits = [s for s in steps if s.get("type") == "Split"]
    if len(splits) == 1 and "Regex" in splits[0].get("pattern", {}):
        if splits[0].get("behavior") != "Isolated" or splits[0].get("invert"):
            raise ValueError(f"{path}: a Split other than 'Isolated' is not implemented here")
        return splits[0]["pattern"]["Regex"]
    if not splits and any(s.get("type") == "ByteLevel" and s.get("use_regex", True) for s in steps):
        return GPT2_SPLIT_PATTERN
    raise ValueError(f"{path}: its pre-tokenizer {pre!r} is not one this reader knows")
