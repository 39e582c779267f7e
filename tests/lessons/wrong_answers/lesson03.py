"""Known-wrong answers to lesson 3's exercises: each a mistake a learner makes."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from decoder.text.bpe import BPETokenizer, merge_pair, split_text


def build_vocab_off_by_one(merges):
    vocab = [bytes([b]) for b in range(256)]
    for a, b in merges:
        vocab.append(vocab[a - 1] + vocab[b])  # off by one in the first id
    return vocab


def train_bpe_first_seen_tie(text, num_merges):
    words = [list(chunk.encode()) for chunk in split_text(text)]
    merges = []
    for new_id in range(256, 256 + num_merges):
        counts = {}
        for ids in words:
            for pair in pairwise(ids):
                counts[pair] = counts.get(pair, 0) + 1
        pair = max(counts, key=counts.get)  # ties go to the first pair seen
        words = [merge_pair(ids, pair, new_id) for ids in words]
        merges.append(pair)
    return merges


def train_bpe_first_id_tie(text, num_merges):
    """Counts chunks once with their weights, but a tie is broken on the first id only: among
    (97, 99) and (97, 98) it keeps the one seen first. Diverges from the library at merge 49
    on Shakespeare, and on "acab" at once."""
    chunk_counts = Counter(split_text(text))
    words = [list(chunk.encode()) for chunk in chunk_counts]
    merges = []
    for new_id in range(256, 256 + num_merges):
        stats = Counter()
        for ids, n in zip(words, chunk_counts.values(), strict=True):
            for pair in pairwise(ids):
                stats[pair] += n
        pair = max(stats, key=lambda p: (stats[p], -p[0]))  # the second id never compared
        words = [merge_pair(ids, pair, new_id) for ids in words]
        merges.append(pair)
    return merges


def train_bpe_library(text, num_merges):
    return BPETokenizer.train(text, vocab_size=256 + num_merges).merges


WRONG = [
    ("build_vocab", build_vocab_off_by_one),
    ("train_bpe", train_bpe_first_seen_tie),
    ("train_bpe", train_bpe_first_id_tie),
    ("train_bpe", train_bpe_library),
]
