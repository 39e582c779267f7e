"""Reference answers to lesson 7 (the model and its loss): ``cross_entropy_grad`` and
``count_parameters``.

Reveal them in the notebook with ``%load solutions/lesson07.py``.
"""

from __future__ import annotations

import numpy as np

from decoder.model.config import ModelConfig


def cross_entropy_grad(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """d/d(logits) of the mean cross-entropy of ``logits`` (N, V) against ``targets`` (N,).

    Row n is (softmax(logits[n]) - onehot(targets[n])) / N.

    >>> cross_entropy_grad(np.zeros((1, 2)), np.array([1]))
    array([[ 0.5, -0.5]])
    """
    N = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)  # exp cannot overflow; p is unchanged
    p = np.exp(shifted)
    p /= p.sum(axis=1, keepdims=True)  # (N, V) softmax
    p[np.arange(N), targets] -= 1.0  # minus the one-hot: one column per row
    return p / N


def count_parameters(config: ModelConfig) -> int:
    """The number of parameters of ``Decoder(config)``, from the config alone.

    It covers the configs of lessons 5 to 7: multi-head (and grouped-query) attention
    (``attention="mha"``) and a dense feed-forward network (``ffn`` "gelu" or "swiglu").
    Multi-head latent attention and mixtures of experts (lesson 18) hold other matrices.

    >>> count_parameters(ModelConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4,
    ...                              n_embd=128))
    804096
    """
    if config.attention != "mha" or config.ffn not in ("gelu", "swiglu"):
        raise ValueError("counts attention='mha' with ffn 'gelu' or 'swiglu' only")
    C, V, H, b = config.n_embd, config.vocab_size, config.ffn_hidden, config.bias
    kv = config.n_kv_head * config.head_size  # the width of wk's and wv's outputs

    def linear(n_in: int, n_out: int, bias: bool = b) -> int:
        return n_in * n_out + (n_out if bias else 0)

    norm = C * (2 if config.norm == "layer" and b else 1)  # gain, plus a shift for LayerNorm
    qkv_bias = b or config.qkv_bias  # Qwen2: biases on wq, wk, wv, none on wo
    attn = linear(C, C, qkv_bias) + 2 * linear(C, kv, qkv_bias) + linear(C, C)  # wq wk wv wo
    if config.ffn == "gelu":
        ffn = linear(C, H) + linear(H, C)  # w1, w2
    else:
        ffn = 2 * linear(C, H) + linear(H, C)  # w1, w3, w2
    norms_per_block = 1 if config.parallel_block else 2
    block = attn + ffn + norms_per_block * norm

    total = V * C + config.n_layer * block  # token embedding and the blocks
    if config.pos == "learned":
        total += config.block_size * C
    if config.norm_position == "pre":
        total += norm  # norm_f
    if not config.tie_weights:
        total += V * C  # lm_head, which has no bias
    return total
