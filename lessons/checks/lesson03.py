"""Checks of lesson 3 (tokenization): ``build_vocab`` and ``train_bpe``.

The text is this package's BPE source: varied English and code, and no download.
"""

from __future__ import annotations

import inspect

import numpy as np
from exercises import fresh_seed

import decoder.text.bpe
from decoder.text.bpe import BPETokenizer

ALLOWED = {
    # the two helpers the stub names: the split pattern and one merge in one chunk
    "train_bpe": ("decoder.text.bpe.split_text", "decoder.text.bpe.merge_pair"),
}


def test_build_vocab(fn):
    assert fn([]) == [bytes([b]) for b in range(256)]
    assert fn([(104, 105), (256, 33)])[256:] == [b"hi", b"hi!"]
    text = inspect.getsource(decoder.text.bpe)[:20_000]
    bpe = BPETokenizer.train(text, vocab_size=256 + 60)
    assert fn(bpe.merges) == bpe.vocab, "differs from the library's table"
    ids = bpe.encode(text[:2000])
    assert b"".join(fn(bpe.merges)[i] for i in ids).decode() == text[:2000]


def test_train_bpe(fn):
    assert fn("aaabdaaabac", 3) == [(97, 97), (97, 98), (256, 257)]
    assert fn("dcba", 1) == [(98, 97)], "a tie goes to the smallest pair, not the first seen"
    # ac, ca and ab tie; ac and ab share their first id: the second id decides, (97, 98)
    assert fn("acab", 1) == [(97, 98)], (
        "acab: (97, 99), (99, 97) and (97, 98) each occur once; the smallest pair compares "
        "(a, b) tuples, the second id too where the first ids are equal"
    )
    assert fn("a, a, a, b", 1) == [(32, 97)], '", " spans two chunks: it must not be merged'
    # short random texts over a few letters, full of ties, against the library
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    for _ in range(6):
        words = ["".join(rng.choice(list("abcd"), size=rng.integers(1, 7))) for _ in range(8)]
        text = " ".join(rng.choice(words, size=20))
        n = int(rng.integers(3, 12))
        try:
            want = BPETokenizer.train(text, vocab_size=256 + n).merges
        except ValueError:  # the text runs out of pairs before n merges: draw another
            continue
        assert fn(text, n) == want, f"differs from BPETokenizer.train on {text!r}, {n} merges"
    piece = inspect.getsource(decoder.text.bpe)[:20_000]
    got = fn(piece, 40)
    assert got == BPETokenizer.train(piece, vocab_size=256 + 40).merges
