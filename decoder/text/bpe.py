"""Byte-level byte-pair encoding (BPE), trained here in plain Python, and the regular
expressions that split text into the chunks it merges within.

Text is split into chunks by a regular expression (GPT-4's by default), each chunk's UTF-8
bytes start as 256 single-byte tokens, and training repeatedly merges the most frequent
adjacent pair into a new token. ``BPETokenizer.to_tiktoken`` hands the learned ranks to
tiktoken's fast Rust encoder, which gives the same ids.

Splitting uses Python's ``re`` (not the ``regex`` package): decoder/text/rust_regex.py
rewrites tiktoken's patterns, written for Rust's regex engine, into ones ``re`` accepts, and
says where the two could differ. The tests check the split and the ids against tiktoken itself.

Left out on purpose: the speed tricks of production trainers (priority queues, parallel
counting), Unicode normalisation and SentencePiece-style byte fallback.

Follows Sennrich et al. 2016, "Neural Machine Translation of Rare Words with Subword Units"
(BPE), Radford et al. 2019 (GPT-2's byte-level BPE and split pattern), Karpathy's minbpe (the
shape of the code and tests; written afresh here) and tiktoken (the encoding rule and the
split patterns).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any

import tiktoken

from decoder.text.rust_regex import to_python_pattern
from minigrad.fileio import atomic_write, parse_json

# tiktoken's split patterns, in its Rust regex syntax (tiktoken_ext/openai_public.py).
# GPT-2: contractions, optional space + letters / numbers / other symbols, whitespace runs.
GPT2_SPLIT_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
# GPT-4 (cl100k_base): case-insensitive contractions, numbers in groups of at most 3 digits,
# a letter run may take one leading non-letter (" word", "_word"), newlines kept apart.
GPT4_SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
ENDOFTEXT = "<|endoftext|>"
N_BYTES = 256  # the first 256 ids are the single bytes, id b for byte b


# ---- splitting text into chunks -----------------------------------------------------------------
@functools.cache
def _compile_split(pattern: str) -> re.Pattern[str]:
    return re.compile(to_python_pattern(pattern))


def split_text(text: str, pattern: str = GPT4_SPLIT_PATTERN) -> list[str]:
    """Split ``text`` into the chunks that BPE merges within (never across).

    >>> split_text("Hello world's  123456 !!\\n")
    ['Hello', ' world', "'s", ' ', ' ', '123', '456', ' !!\\n']
    """
    return _compile_split(pattern).findall(text)


# ---- byte-pair encoding -------------------------------------------------------------------------
def merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every non-overlapping occurrence of ``pair``, left to right, by ``new_id``.

    >>> merge_pair([1, 1, 1, 2, 1, 1], (1, 1), 9)
    [9, 1, 2, 9]
    """
    out = []
    i = 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def bpe_encode_chunk(chunk: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Encode one chunk: merge the adjacent pair whose bytes rank lowest until none is a token.

    This is tiktoken's rule (ties go to the leftmost pair), so the ids match its encoder.

    >>> ranks = {bytes([b]): b for b in range(256)} | {b"aa": 256, b"ab": 257, b"aaab": 258}
    >>> bpe_encode_chunk(b"aaabdaaabac", ranks)
    [258, 100, 258, 97, 99]
    """
    parts = [chunk[i : i + 1] for i in range(len(chunk))]
    while len(parts) > 1:
        # min() returns the first of equal ranks, which makes ties go to the leftmost pair
        i = min(range(len(parts) - 1), key=lambda j: ranks.get(parts[j] + parts[j + 1], 1 << 62))
        merged = parts[i] + parts[i + 1]
        if merged not in ranks:
            break
        parts[i : i + 2] = [merged]
    return [ranks[p] for p in parts]


class BPETokenizer:
    """Byte-level BPE: ids 0..255 are bytes, then one id per merge, then the special tokens.

    ``merges[r]`` is the pair of ids that made id ``256 + r``; a token's rank is its id.

    >>> tok = BPETokenizer.train("aaabdaaabac", vocab_size=256 + 3)
    >>> tok.merges
    [(97, 97), (97, 98), (256, 257)]
    >>> tok.encode("aaabdaaabac")
    [258, 100, 258, 97, 99]
    """

    def __init__(
        self,
        merges: Sequence[tuple[int, int]],
        pattern: str = GPT4_SPLIT_PATTERN,
        special_tokens: Sequence[str] = (),
    ):
        self.merges = [(int(a), int(b)) for a, b in merges]
        self.pattern = pattern
        self.vocab = [bytes([b]) for b in range(N_BYTES)]  # id -> bytes
        for a, b in self.merges:
            if not (0 <= a < len(self.vocab) and 0 <= b < len(self.vocab)):
                raise ValueError(f"merge ({a}, {b}) uses an id not made yet")
            self.vocab.append(self.vocab[a] + self.vocab[b])
        self.ranks = {token: i for i, token in enumerate(self.vocab)}  # bytes -> id
        if len(self.ranks) != len(self.vocab):
            raise ValueError("two merges make the same bytes; tiktoken needs one id per token")
        if len(set(special_tokens)) != len(special_tokens):
            raise ValueError(f"repeated special tokens: {list(special_tokens)}")
        # Special tokens take the ids after the merges, in the order given.
        self.special_tokens = {s: len(self.vocab) + i for i, s in enumerate(special_tokens)}
        self.special_ids = {i: s for s, i in self.special_tokens.items()}

    @classmethod
    def train(
        cls,
        text: str,
        vocab_size: int,
        pattern: str = GPT4_SPLIT_PATTERN,
        special_tokens: Sequence[str] | None = None,
        verbose: bool = False,
    ) -> BPETokenizer:
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges from ``text``.

        ``vocab_size`` counts everything (bytes, merges, special tokens), so it is the size of
        the model's embedding table. Each step merges the most frequent pair; ties go to the
        smallest pair of ids, so training is deterministic. Pair counts are updated only in
        the chunks that hold the merged pair, and each distinct chunk is kept once with its
        count (a word seen 1000 times is merged once), which keeps 512 tokens on 1 MB of
        text to about a second.
        """
        special_tokens = list(special_tokens or [])
        num_merges = vocab_size - N_BYTES - len(special_tokens)
        if num_merges < 0:
            raise ValueError(
                f"vocab_size={vocab_size} is less than the 256 bytes plus "
                f"{len(special_tokens)} special token(s)"
            )
        chunk_counts = Counter(split_text(text, pattern))
        words = [list(chunk.encode("utf-8")) for chunk in chunk_counts]  # each as a list of ids
        weights = list(chunk_counts.values())

        # stats: pair -> occurrences in the text; where: pair -> words that may hold it
        stats: Counter[tuple[int, int]] = Counter()
        where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
        for w, (ids, n) in enumerate(zip(words, weights, strict=True)):
            for pair in pairwise(ids):
                stats[pair] += n
                where[pair].add(w)

        merges: list[tuple[int, int]] = []
        vocab = [bytes([b]) for b in range(N_BYTES)]
        for new_id in range(N_BYTES, N_BYTES + num_merges):
            if not stats:
                raise ValueError(
                    f"the text allows only {len(merges)} merges, so vocab_size can be at most "
                    f"{N_BYTES + len(merges) + len(special_tokens)} (asked for {vocab_size})"
                )
            pair = max(stats, key=lambda p: (stats[p], -p[0], -p[1]))
            count = stats[pair]
            touched = set()
            # Take the word's pairs out, merge, put its new pairs in: simple and exact.
            # subtle: a word in `where` may have lost the pair already; then this is a no-op.
            for w in where.pop(pair):
                ids, n = words[w], weights[w]
                for p in pairwise(ids):
                    stats[p] -= n
                    touched.add(p)
                ids = words[w] = merge_pair(ids, pair, new_id)
                for p in pairwise(ids):
                    stats[p] += n
                    where[p].add(w)
            for p in touched:
                if stats[p] == 0:
                    del stats[p]
            merges.append(pair)
            vocab.append(vocab[pair[0]] + vocab[pair[1]])
            if verbose:
                print(
                    f"merge {len(merges)}/{num_merges}: {pair} -> {new_id} {vocab[-1]!r} ({count})"
                )
        return cls(merges, pattern, special_tokens)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab) + len(self.special_tokens)

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode ``text``, reading special-token strings as plain text."""
        ids: list[int] = []
        memo: dict[str, list[int]] = {}  # a chunk recurs often ("the"), so encode it once
        for chunk in split_text(text, self.pattern):
            if chunk not in memo:
                memo[chunk] = bpe_encode_chunk(chunk.encode("utf-8"), self.ranks)
            ids.extend(memo[chunk])
        return ids

    def encode(self, text: str, allowed_special: str | Iterable[str] = "none_raise") -> list[int]:
        """Encode ``text``; ``allowed_special`` says which special-token strings become ids.

        ``"all"``: every special token; a set of strings: those; ``"none"``: none, they are
        plain text; ``"none_raise"`` (the default, like tiktoken's): none, and raise if the
        text holds one, since a special token read as text is usually a bug. With a set, a
        special token outside it also raises.
        """
        if allowed_special == "none":
            return self.encode_ordinary(text)
        if allowed_special == "all":
            allowed = set(self.special_tokens)
        elif allowed_special == "none_raise":
            allowed = set()
        elif isinstance(allowed_special, str):
            raise ValueError(
                f"allowed_special={allowed_special!r}: use 'all', 'none', "
                "'none_raise' or a set of special tokens"
            )
        else:
            allowed = set(allowed_special)
            unknown = allowed - self.special_tokens.keys()
            if unknown:
                raise ValueError(f"not special tokens of this tokenizer: {sorted(unknown)}")
        for s in self.special_tokens.keys() - allowed:
            if s in text:
                raise ValueError(
                    f"the text holds the special token {s!r}; pass allowed_special='all' (or "
                    "a set holding it) to encode it as one id, or 'none' to encode it as text"
                )
        if not allowed:
            return self.encode_ordinary(text)
        # Longest first, so one special token that starts another cannot cut it short.
        specials = sorted(allowed, key=len, reverse=True)
        parts = re.split("(" + "|".join(map(re.escape, specials)) + ")", text)
        ids = []
        for i, part in enumerate(parts):
            if i % 2:  # re.split with a group puts the separators at odd positions
                ids.append(self.special_tokens[part])
            elif part:
                ids.extend(self.encode_ordinary(part))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``; bytes that are not valid UTF-8 become U+FFFD, as in tiktoken."""
        pieces = []
        for i in ids:
            if 0 <= i < len(self.vocab):
                pieces.append(self.vocab[i])
            elif i in self.special_ids:
                pieces.append(self.special_ids[i].encode("utf-8"))
            else:
                raise ValueError(f"id {i} is out of range for a vocabulary of {self.vocab_size}")
        return b"".join(pieces).decode("utf-8", errors="replace")

    def with_special_tokens(self, tokens: Sequence[str]) -> BPETokenizer:
        """This tokenizer with ``tokens`` added after its special tokens (old ids unchanged).

        >>> BPETokenizer([]).with_special_tokens(["<|end|>"]).special_tokens
        {'<|end|>': 256}
        """
        return BPETokenizer(self.merges, self.pattern, [*self.special_tokens, *tokens])

    def to_tiktoken(self, name: str | None = None) -> tiktoken.Encoding:
        """The same tokenizer as a tiktoken ``Encoding``: same ids, Rust speed.

        tiktoken gets the pattern as written: its regex engine knows ``\\p{L}`` natively.
        """
        return tiktoken.Encoding(
            name=name or f"minigrad_bpe_{self.vocab_size}",
            pat_str=self.pattern,
            mergeable_ranks=dict(self.ranks),
            special_tokens=dict(self.special_tokens),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state: the merges as pairs of ids (the bytes follow from them)."""
        return {
            "type": "bpe",
            "pattern": self.pattern,
            "merges": [list(pair) for pair in self.merges],
            "special_tokens": list(self.special_tokens),  # ids follow the merges, in this order
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BPETokenizer:
        return cls([tuple(pair) for pair in d["merges"]], d["pattern"], d["special_tokens"])

    def save(self, path: str | os.PathLike) -> None:
        """Write ``to_dict()`` as JSON (atomically: a reader never sees half a file)."""
        with atomic_write(path, text=True) as f:
            json.dump(self.to_dict(), f)

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        with open(path, "rb") as f:
            return cls.from_dict(parse_json(f.read()))  # ValueError for bad or too deep JSON
