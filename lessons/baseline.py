"""The bar every Shakespeare loss in the course is drawn against: a bigram count model.

Count, in the training text, how often each character follows each other one; predict the
next character from the one before it by those counts (plus one, so nothing has probability
0). No gradient, no parameters to learn, one pass over the text: on tiny Shakespeare's
validation split it scores about 2.48 nats per character. A model that reads a whole context
must beat that number to have learned anything the counts do not already know, so every loss
plot of a character model on Shakespeare draws it as a line.

>>> ids = np.array([0, 1, 0, 1, 0, 1, 0, 1])
>>> bigram_loss(ids, ids, vocab_size=2, smoothing=0.0) < 1e-12  # 0 -> 1 -> 0 always
True
"""

from __future__ import annotations

import functools

import numpy as np


def bigram_loss(
    train_ids: np.ndarray, val_ids: np.ndarray, vocab_size: int, smoothing: float = 1.0
) -> float:
    """Mean cross-entropy (nats per token) on ``val_ids`` of bigram counts from ``train_ids``."""
    counts = np.full((vocab_size, vocab_size), smoothing, dtype=np.float64)
    np.add.at(counts, (train_ids[:-1], train_ids[1:]), 1.0)  # counts[a, b]: b after a
    probs = counts / counts.sum(axis=1, keepdims=True)
    return float(-np.log(probs[val_ids[:-1], val_ids[1:]]).mean())


@functools.cache
def shakespeare_bigram() -> float:
    """The bigram's validation loss on tiny Shakespeare, characters, the course's split."""
    from decoder.text.data import TokenDataset, load_shakespeare
    from decoder.text.tokenizer import CharTokenizer

    text = load_shakespeare()
    tokenizer = CharTokenizer.from_text(text)
    data = TokenDataset(np.asarray(tokenizer.encode(text)))
    return bigram_loss(data.train, data.val, tokenizer.vocab_size)


def draw_bigram(ax, loss: float | None = None) -> None:
    """A dashed line at the bigram's loss on ``ax`` (a matplotlib Axes), labelled."""
    loss = shakespeare_bigram() if loss is None else loss
    ax.axhline(loss, color="gray", linestyle="--", linewidth=1, label=f"bigram counts ({loss:.2f})")
