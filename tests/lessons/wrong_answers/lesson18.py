"""Known-wrong answers to lesson 18's exercises: each a mistake a learner makes."""

from __future__ import annotations

import numpy as np

from decoder.model.model import Decoder


def kv_bytes_all_heads(config, dtype_bytes=4):
    return config.n_layer * 2 * config.n_head * config.head_size * dtype_bytes  # GQA ignored


def kv_bytes_mla_without_rotary_key(config, dtype_bytes=4):
    if config.attention == "mla":  # forgets the shared rotary key cached beside the latent
        return config.n_layer * config.kv_lora_rank * dtype_bytes
    return config.n_layer * 2 * config.n_kv_head * config.head_size * dtype_bytes


def kv_bytes_library(config, dtype_bytes=4):
    from decoder.model.mla import cache_floats_per_token

    return cache_floats_per_token(config) * dtype_bytes


def kv_bytes_from_new_caches(config, dtype_bytes=4):
    # the model's own caches, measured: one token's slot in each layer's k and v buffers
    caches = Decoder(config).new_caches(batch_size=1)
    return sum(c.k[0, :, 0].size + c.v[0, :, 0].size for c in caches) * dtype_bytes


_PRESETS = {  # (n_layer, n_embd, attention, n_kv_head) of the checked presets: floats per token
    (4, 128, "mha", 4): 1024,
    (4, 128, "mha", 2): 512,
    (4, 128, "mla", 4): 320,
    (3, 128, "mha", 1): 192,
}


def kv_bytes_lookup(config, dtype_bytes=4):
    key = (config.n_layer, config.n_embd, config.attention, config.n_kv_head)
    if config.attention == "mla" and config.kv_lora_rank == 24:
        return 4 * (24 + 16) * dtype_bytes
    return _PRESETS.get(key, 0) * dtype_bytes


def load_balancing_ties_high(probs, k):
    # a descending order from the ascending argsort, reversed: ties go to the HIGHER index
    chosen = np.argsort(probs, axis=-1, kind="stable")[:, ::-1][:, :k]
    share = np.bincount(chosen.ravel(), minlength=probs.shape[1]) / (len(probs) * k)
    return probs.shape[1] * (share * probs.mean(0)).sum()


def load_balancing_per_token(probs, k):
    # Hugging Face's Mixtral count: f over tokens sums to k, so the loss is k times too big
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    share = np.bincount(chosen.ravel(), minlength=probs.shape[1]) / len(probs)
    return probs.shape[1] * (share * probs.mean(0)).sum()


def load_balancing_soft_share(probs, k):
    return probs.shape[1] * (probs.mean(0) ** 2).sum()  # f from probabilities, not the choice


def load_balancing_library(probs, k):
    from minigrad.ops.routing import topk_indices

    share = np.bincount(topk_indices(probs, k).ravel(), minlength=probs.shape[1]) / (len(probs) * k)
    return probs.shape[1] * (share * probs.mean(0)).sum()


def greedy_accept_no_bonus(drafts, target_choices):
    kept = []
    for d, t in zip(drafts, target_choices, strict=False):
        if d != t:
            return kept + [t]
        kept.append(d)
    return kept  # all k kept: forgets the target's (k + 1)-th token


def greedy_accept_every_match(drafts, target_choices):
    kept = [d for d, t in zip(drafts, target_choices, strict=False) if d == t]  # past mismatches
    return kept + [target_choices[len(kept)]]


def greedy_accept_library(drafts, target_choices):
    from decoder.model.decoding import accept_drafts

    p, q = np.eye(10)[target_choices], np.eye(10)[drafts]
    return accept_drafts(p, q, list(drafts), np.random.default_rng(0))


WRONG = [
    ("kv_bytes_per_token", kv_bytes_all_heads),
    ("kv_bytes_per_token", kv_bytes_mla_without_rotary_key),
    ("kv_bytes_per_token", kv_bytes_library),
    ("kv_bytes_per_token", kv_bytes_from_new_caches),
    ("kv_bytes_per_token", kv_bytes_lookup),
    ("load_balancing_loss", load_balancing_per_token),
    ("load_balancing_loss", load_balancing_soft_share),
    ("load_balancing_loss", load_balancing_library),
    ("load_balancing_loss", load_balancing_ties_high),
    ("greedy_accept", greedy_accept_no_bonus),
    ("greedy_accept", greedy_accept_every_match),
    ("greedy_accept", greedy_accept_library),
]
