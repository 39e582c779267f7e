"""Reference answers to lesson 9 (generation): ``min_p_probs``, ``greedy_generate`` and
``greedy_generate_cached``.

Reveal them in the notebook with ``%load solutions/lesson09.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import minigrad as mg


def min_p_probs(logits: np.ndarray, min_p: float) -> np.ndarray:
    """The softmax of ``logits`` without the tokens below ``min_p`` times the top probability.

    >>> min_p_probs(np.log(np.array([0.5, 0.3, 0.15, 0.05])), 0.2).round(4).tolist()
    [0.5263, 0.3158, 0.1579, 0.0]
    """
    logits = np.asarray(logits, dtype=np.float64)
    probs = np.exp(logits - logits.max())  # subtract the max: exp cannot overflow
    probs /= probs.sum()
    probs = np.where(probs >= min_p * probs.max(), probs, 0.0)  # the top token always stays
    return probs / probs.sum()


def greedy_generate(model: Any, ids: list[int], n: int) -> list[int]:
    """The ``n`` tokens greedy decoding appends to ``ids``, recomputing the context each step."""
    block_size = model.config.block_size
    context, new = list(ids), []
    with mg.no_grad():
        for _ in range(n):
            logits, _ = model([context[-block_size:]])  # (1, T, V): crop to the context
            token = int(np.argmax(logits.numpy()[0, -1]))  # the last position scores the next
            context.append(token)
            new.append(token)
    return new


def greedy_generate_cached(model: Any, ids: list[int], n: int) -> list[int]:
    """Greedy decoding with a KV cache: one prefill of ``ids``, then one token per pass.

    Assumes ``len(ids) + n <= model.config.block_size`` (the cache never overflows).
    """
    caches = model.new_caches(1)
    new = []
    with mg.no_grad():
        logits, _ = model([list(ids)], caches=caches)  # prefill: (1, len(ids), V)
        for step in range(n):
            token = int(np.argmax(logits.numpy()[0, -1]))
            new.append(token)
            if step + 1 < n:  # the last token needs no forward pass
                logits, _ = model([[token]], caches=caches)  # (1, 1, V)
    return new
