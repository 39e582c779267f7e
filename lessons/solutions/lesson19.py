"""Reference answers to lesson 19 (from a base model to an assistant): ``masked_targets``,
``response_logp`` and ``dpo_loss``.

Reveal them in the notebook with ``%load solutions/lesson19.py``.
"""

from __future__ import annotations

import numpy as np

from decoder.model.model import IGNORE_INDEX  # -100: a target that adds no loss and no gradient


def masked_targets(ids: list[int], n_prompt: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets of one chat turn: the targets of the prompt are IGNORE_INDEX.

    >>> x, y = masked_targets([2, 7, 3, 8, 9, 4], n_prompt=3)
    >>> x.tolist(), y.tolist()
    ([2, 7, 3, 8, 9], [-100, -100, 8, 9, 4])
    """
    ids = np.asarray(ids, dtype=np.int64)
    x, y = ids[:-1], ids[1:].copy()  # target t is token t + 1
    y[: n_prompt - 1] = IGNORE_INDEX  # they predict prompt tokens; <|assistant|> predicts the 1st
    return x, y


def response_logp(logits: np.ndarray, y: np.ndarray) -> np.ndarray:
    """log p(response | prompt) of each row: the log-softmax of ``logits`` (N, T, V) at the
    targets ``y`` (N, T), summed over the targets that are not IGNORE_INDEX -> (N,).

    >>> response_logp(np.zeros((1, 3, 4)), np.array([[IGNORE_INDEX, 1, 2]])).round(4)
    array([-2.7726])
    """
    z = logits - logits.max(axis=-1, keepdims=True)  # shifted: exp never overflows
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))  # (N, T, V) log-softmax
    keep = y != IGNORE_INDEX
    picked = np.take_along_axis(logp, np.where(keep, y, 0)[..., None], axis=-1)[..., 0]  # (N, T)
    return np.where(keep, picked, 0.0).sum(axis=-1)  # (N, T) -> (N,)


def dpo_loss(pc: np.ndarray, pr: np.ndarray, rc: np.ndarray, rr: np.ndarray, beta: float) -> float:
    """The mean of -log sigmoid(beta ((pc - rc) - (pr - rr))) over the pairs.

    >>> round(dpo_loss(np.array([-1.0]), np.array([-3.0]), np.array([-2.0]),
    ...                np.array([-2.0]), beta=0.5), 4)
    0.3133
    """
    z = beta * ((pc - rc) - (pr - rr))  # the reward margin
    return float(np.logaddexp(0.0, -z).mean())  # log(1 + e^-z), without overflow for z << 0
