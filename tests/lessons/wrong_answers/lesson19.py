"""Known-wrong answers to lesson 19's exercises: each a mistake a learner makes."""

from __future__ import annotations

import numpy as np

import minigrad as mg
from decoder.post.chat import pad_batch
from decoder.post.losses import dpo_loss
from minigrad import functional as F


def masked_targets_off_by_one(ids, n_prompt):
    ids = np.asarray(ids)
    y = ids[1:].copy()
    y[:n_prompt] = -100  # one too many: the first response token is never trained
    return ids[:-1], y


def masked_targets_unshifted(ids, n_prompt):
    ids = np.asarray(ids)
    y = ids[:-1].copy()  # each position "predicts" its own token
    y[: n_prompt - 1] = -100
    return ids[:-1], y


def masked_targets_library(ids, n_prompt):
    x, y = pad_batch([(ids, n_prompt)], pad_id=0)
    return x[0], y[0]


def _log_softmax(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def response_logp_mean(logits, y):
    keep = y != -100
    picked = np.take_along_axis(_log_softmax(logits), np.where(keep, y, 0)[..., None], -1)[..., 0]
    return np.where(keep, picked, 0.0).sum(-1) / np.maximum(keep.sum(-1), 1)  # per token


def response_logp_unmasked(logits, y):
    picked = np.take_along_axis(_log_softmax(logits), np.where(y < 0, 0, y)[..., None], -1)
    return picked[..., 0].sum(-1)  # the ignored positions add log p(token 0)


def response_logp_unstable(logits, y):
    with np.errstate(over="ignore", invalid="ignore"):  # e^1000 is inf: inf - inf at 1000s
        logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    keep = y != -100
    picked = np.take_along_axis(logp, np.where(keep, y, 0)[..., None], -1)[..., 0]
    return np.where(keep, picked, 0.0).sum(-1)


def response_logp_library(logits, y):
    return -F.cross_entropy(mg.tensor(logits), y, reduction="none").numpy().sum(-1)


def dpo_loss_naive(pc, pr, rc, rr, beta):
    z = beta * ((pc - rc) - (pr - rr))
    with np.errstate(over="ignore"):
        return float(np.log(1 + np.exp(-z)).mean())  # e^(1e4) overflows to inf


def dpo_loss_without_reference(pc, pr, rc, rr, beta):
    return float(np.logaddexp(0.0, -beta * (pc - pr)).mean())


def dpo_loss_library(pc, pr, rc, rr, beta):
    return dpo_loss(*(mg.tensor(a, dtype="float64") for a in (pc, pr, rc, rr)), beta=beta).item()


WRONG = [
    ("masked_targets", masked_targets_off_by_one),
    ("masked_targets", masked_targets_unshifted),
    ("masked_targets", masked_targets_library),
    ("response_logp", response_logp_mean),
    ("response_logp", response_logp_unmasked),
    ("response_logp", response_logp_unstable),
    ("response_logp", response_logp_library),
    ("dpo_loss", dpo_loss_naive),
    ("dpo_loss", dpo_loss_without_reference),
    ("dpo_loss", dpo_loss_library),
]
