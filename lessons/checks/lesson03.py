"""Checks of lesson 3 (tokenization): ``build_vocab`` and ``train_bpe``.

The text is this package's BPE source: varied English and code, and no download.
"""

from __future__ import annotations

import inspect

from exercises import forbidden

import decoder.text.bpe
from decoder.text.bpe import BPETokenizer


def test_build_vocab(fn):
    assert fn([]) == [bytes([b]) for b in range(256)]
    assert fn([(104, 105), (256, 33)])[256:] == [b"hi", b"hi!"]
    text = inspect.getsource(decoder.text.bpe)[:20_000]
    bpe = BPETokenizer.train(text, vocab_size=256 + 60)
    assert fn(bpe.merges) == bpe.vocab, "differs from the library's table"
    ids = bpe.encode(text[:2000])
    assert b"".join(fn(bpe.merges)[i] for i in ids).decode() == text[:2000]


def test_train_bpe(fn):
    with forbidden(fn, BPETokenizer, "train", "this exercise writes it"):
        assert fn("aaabdaaabac", 3) == [(97, 97), (97, 98), (256, 257)]
        assert fn("dcba", 1) == [(98, 97)], "a tie goes to the smallest pair, not the first seen"
        assert fn("a, a, a, b", 1) == [(32, 97)], '", " spans two chunks: it must not be merged'
        piece = inspect.getsource(decoder.text.bpe)[:20_000]
        got = fn(piece, 40)
    assert got == BPETokenizer.train(piece, vocab_size=256 + 40).merges
