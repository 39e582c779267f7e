"""Known-wrong answers to lesson 7's exercises: each a mistake a learner makes."""

from __future__ import annotations

import numpy as np

import minigrad as mg
from minigrad import functional as F


def cross_entropy_grad_summed(logits, targets):
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(targets)), targets] -= 1.0
    return p  # the gradient of the sum, not of the mean


def cross_entropy_grad_by_autograd(logits, targets):
    z = mg.tensor(logits, requires_grad=True)  # minigrad's autograd answers for you
    F.cross_entropy(z, targets).backward()
    return z.grad


def _count(config, final_norm=True, qkv_bias=True):
    """The hand count, with two rules that a learner may leave out."""
    C, V, H, b = config.n_embd, config.vocab_size, config.ffn_hidden, config.bias
    kv = config.n_kv_head * (C // config.n_head)
    in_bias = b or (qkv_bias and config.qkv_bias)
    norm = C * (2 if config.norm == "layer" and b else 1)
    attn = 2 * C * C + 2 * C * kv + (C + 2 * kv if in_bias else 0) + (C if b else 0)
    n_ffn = 2 if config.ffn == "gelu" else 3
    ffn = n_ffn * C * H + ((n_ffn - 1) * H + C if b else 0)
    block = attn + ffn + (1 if config.parallel_block else 2) * norm
    total = V * C + config.n_layer * block
    total += config.block_size * C if config.pos == "learned" else 0
    total += norm if config.norm_position == "pre" and final_norm else 0
    return total + (0 if config.tie_weights else V * C)


def count_parameters_no_final_norm(config):
    return _count(config, final_norm=False)


def count_parameters_no_qkv_bias(config):
    return _count(config, qkv_bias=False)  # Qwen2's biases on wq, wk, wv left out


def count_parameters_by_building(config):
    from decoder.model.model import Decoder

    return Decoder(config).num_parameters()


# the counts of the configs the check used to try, and GPT-2's: right on those, and only there
LOOKUP = {
    (65, 64, 4, 4, 4, 128, "gelu", "layer", "pre", False, "learned", False, True): 804_096,
    (65, 64, 4, 4, 2, 128, "swiglu", "rms", "pre", False, "rope", False, True): 734_464,
    (50, 16, 2, 4, 4, 32, "gelu", "layer", "pre", False, "sinusoidal", True, False): 28_672,
    (50, 16, 2, 4, 4, 32, "swiglu", "rms", "post", False, "learned", True, True): 28_000,
    (50, 16, 2, 4, 1, 32, "gelu", "layer", "pre", True, "alibi", True, True): 13_376,
    (50257, 1024, 12, 12, 12, 768, "gelu", "layer", "pre", False, "learned", True, True): (
        124_439_808
    ),
}


def count_parameters_lookup(config):
    key = tuple(
        getattr(config, f)
        for f in (
            "vocab_size",
            "block_size",
            "n_layer",
            "n_head",
            "n_kv_head",
            "n_embd",
            "ffn",
            "norm",
            "norm_position",
            "parallel_block",
            "pos",
            "bias",
            "tie_weights",
        )
    )
    return LOOKUP.get(key, 0)


WRONG = [
    ("cross_entropy_grad", cross_entropy_grad_summed),
    ("cross_entropy_grad", cross_entropy_grad_by_autograd),
    ("count_parameters", count_parameters_no_final_norm),
    ("count_parameters", count_parameters_no_qkv_bias),
    ("count_parameters", count_parameters_by_building),
    ("count_parameters", count_parameters_lookup),
]
