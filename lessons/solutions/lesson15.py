"""Reference answers to lesson 15 (LoRA): ``merged_weight``, ``block_diagonal`` and
``lora_trainable_count``.

Reveal them in the notebook with ``%load solutions/lesson15.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from decoder.model.config import ModelConfig
from minigrad.nn.lora import LoRALinear


def merged_weight(layer: LoRALinear) -> np.ndarray:
    """W + s (A B)^T, shape (out, in), from the parts of an unmerged ``LoRALinear``."""
    W = layer.base.weight.numpy()  # (out, in)
    A, B = layer.A.numpy(), layer.B.numpy()  # (in, r), (r, out)
    return W + layer.scale * (A @ B).T  # (in, out) -> (out, in), W's layout


def block_diagonal(B: np.ndarray) -> np.ndarray:
    """The block-diagonal matrix (h*r, h*d) with the blocks ``B[0], ..., B[h-1]`` of (h, r, d).

    >>> block_diagonal(np.ones((2, 1, 2))).tolist()
    [[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]]
    """
    h, r, d = B.shape
    out = np.zeros((h * r, h * d), dtype=B.dtype)
    for i in range(h):
        out[i * r : (i + 1) * r, i * d : (i + 1) * d] = B[i]  # head i's rows and columns
    return out


def lora_trainable_count(
    config: ModelConfig, targets: Sequence[str], r: int, per_head: bool = False
) -> int:
    """The trainable parameters ``apply_lora`` adds to ``Decoder(config)``.

    >>> lora_trainable_count(ModelConfig(n_layer=4, n_embd=128), ("wq", "wv"), r=8)
    16384
    """
    C, H = config.n_embd, config.ffn_hidden
    kv = config.n_kv_head * config.head_size  # wk's and wv's output width
    shapes = {"wq": (C, C), "wk": (C, kv), "wv": (C, kv), "wo": (C, C), "w1": (C, H), "w2": (H, C)}
    if config.ffn == "swiglu":
        shapes["w3"] = (C, H)
    heads = {"wq": config.n_head, "wk": config.n_kv_head, "wv": config.n_kv_head}
    heads["wo"] = config.n_head
    per_block = 0
    for name in targets:
        n_in, n_out = shapes[name]
        if per_head:  # h adapters: A_i (in, r) and B_i (r, out / h)
            h = heads[name]
            per_block += h * r * (n_in + n_out // h)
        else:  # A (in, r) and B (r, out)
            per_block += r * (n_in + n_out)
    return config.n_layer * per_block
