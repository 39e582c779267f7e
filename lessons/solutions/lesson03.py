"""Reference answers to lesson 3 (tokenization): ``build_vocab`` and ``train_bpe``.

Reveal them in the notebook with ``%load solutions/lesson03.py``.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from decoder.text.bpe import merge_pair, split_text


def build_vocab(merges: list[tuple[int, int]]) -> list[bytes]:
    """The bytes of every id: ids 0..255 are the single bytes, id 256 + r is merge r's two
    tokens' bytes joined.

    >>> build_vocab([(104, 105), (256, 33)])[256:]
    [b'hi', b'hi!']
    """
    vocab = [bytes([b]) for b in range(256)]
    for a, b in merges:
        vocab.append(vocab[a] + vocab[b])  # both ids are older than the new one
    return vocab


def train_bpe(text: str, num_merges: int) -> list[tuple[int, int]]:
    """Learn ``num_merges`` merges from ``text``, as ``BPETokenizer.train`` does.

    Split the text with ``split_text`` (GPT-4's pattern), merge within chunks only, pick the
    most frequent pair each step (ties: the smallest pair), and give it id 256, 257, ...
    """
    # each distinct chunk once, as a list of byte ids, with how often it occurs
    chunk_counts = Counter(split_text(text))
    words = [list(chunk.encode("utf-8")) for chunk in chunk_counts]
    weights = list(chunk_counts.values())
    merges = []
    for new_id in range(256, 256 + num_merges):
        stats: Counter[tuple[int, int]] = Counter()
        for ids, n in zip(words, weights, strict=True):
            for pair in pairwise(ids):
                stats[pair] += n
        pair = max(stats, key=lambda p: (stats[p], -p[0], -p[1]))  # ties: the smallest pair
        words = [merge_pair(ids, pair, new_id) for ids in words]
        merges.append(pair)
    return merges
