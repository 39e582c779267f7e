"""Reference answers to lesson 11 (the capstone): ``block_forward``, ``decoder_forward``,
``train_step`` and ``train_loop``.

Reveal them in the notebook with ``%load solutions/lesson11.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from minigrad import functional as F
from minigrad.optim import clip_grad_norm_, set_lr


def block_forward(block: Any, x: Any) -> Any:
    """A pre-norm block from its parts: x + attn(norm1(x)), then + ffn(norm2(x)). (B, T, C)."""
    x = x + block.attn(block.norm1(x))  # tokens exchange information
    return x + block.ffn(block.norm2(x))  # each token transformed on its own


def decoder_forward(model: Any, ids: np.ndarray) -> Any:
    """Logits (B, T, V) for ids (B, T), through ``block_forward`` for every block."""
    B, T = ids.shape
    x = model.tok_emb(ids)  # (B, T) -> (B, T, C)
    x = x + model.pos_emb(T)  # (T, C) learned positions, broadcast over the batch
    for block in model.blocks:
        x = block_forward(block, x)
    return model.lm_head(model.norm_f(x))  # (B, T, C) -> (B, T, V)


def train_step(model: Any, optimizer: Any, x: np.ndarray, y: np.ndarray, grad_clip: float) -> float:
    """One AdamW step on the batch (x, y) through ``decoder_forward``; the loss before it."""
    logits = decoder_forward(model, x)
    B, T, V = logits.shape
    loss = F.cross_entropy(logits.reshape(B * T, V), y.reshape(B * T))
    optimizer.zero_grad()  # the previous step's gradients would add to these
    loss.backward()
    clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()


def train_loop(
    model: Any,
    optimizer: Any,
    get_batch: Callable[[], tuple[np.ndarray, np.ndarray]],
    steps: int,
    lr_at: Callable[[int], float],
    grad_clip: float = 1.0,
) -> list[float]:
    """``steps`` steps of ``train_step``, step s at learning rate ``lr_at(s)``; the losses."""
    losses = []
    for s in range(steps):
        set_lr(optimizer, lr_at(s))  # before the step that uses it
        x, y = get_batch()
        losses.append(train_step(model, optimizer, x, y, grad_clip))
    return losses
