"""Reference answers to lesson 18 (architectures side by side): ``kv_bytes_per_token``,
``load_balancing_loss`` and ``greedy_accept``.

Reveal them in the notebook with ``%load solutions/lesson18.py``.
"""

from __future__ import annotations

import numpy as np


def kv_bytes_per_token(config, dtype_bytes: int = 4) -> int:
    """Bytes one token adds to the KV caches of the whole model: per layer, K and V of each
    of the n_kv_head heads (MHA, GQA), or MLA's latent c_KV and its shared rotary key.

    >>> from decoder.model.config import ModelConfig
    >>> kv_bytes_per_token(ModelConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, pos="rope"))
    256
    """
    if config.attention == "mla":
        per_layer = config.kv_lora_rank + config.rope_head_dim  # one latent, every head reads it
    else:
        per_layer = 2 * config.n_kv_head * config.head_size  # K and V of each KV head
    return config.n_layer * per_layer * dtype_bytes


def load_balancing_loss(probs: np.ndarray, k: int) -> float:
    """Switch Transformer's load-balancing loss E * sum_e f_e P_e for router probabilities
    ``probs`` (N, E): f_e is expert e's share of the N k (token, expert) pairs of top-k
    routing (ties to the lower index), P_e its mean probability.

    >>> load_balancing_loss(np.array([[0.5, 0.5], [0.5, 0.5]]), 1)  # all to expert 0
    1.0
    """
    N, E = probs.shape
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # (N, E) -> (N, k)
    share = np.bincount(chosen.ravel(), minlength=E) / (N * k)  # (E,) f, sums to one
    return float(E * (share * probs.mean(0)).sum())


def greedy_accept(drafts: list[int], target_choices: list[int]) -> list[int]:
    """Greedy speculative decoding's verification: ``target_choices`` (k + 1) are the
    target's greedy tokens after the prompt and each of the k ``drafts``. The drafts are kept
    up to the first one the target would not have chosen; then the target's own token follows
    (it replaces the refused draft, or comes after all k).

    >>> greedy_accept([5, 7, 9], [5, 7, 2, 4])
    [5, 7, 2]
    """
    kept = []
    for draft, choice in zip(drafts, target_choices, strict=False):
        if draft != choice:
            break
        kept.append(draft)
    return kept + [target_choices[len(kept)]]
