"""Known-wrong answers to lesson 8's exercises: each a mistake a learner makes."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

import minigrad as mg
from decoder.training import loop, step
from minigrad.optim import AdamW, clip_grad_norm_, cosine_lr
from minigrad.optim import clip_grad_norm_ as minigrad_clip


def warmup_cosine_off_by_one(step, max_lr, min_lr, warmup_steps, decay_steps):
    if step < warmup_steps:
        return max_lr * step / warmup_steps  # starts at 0, where the library starts above it
    if step >= decay_steps:
        return min_lr
    ratio = (step - warmup_steps) / (decay_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * ratio))


def warmup_cosine_library(step, max_lr, min_lr, warmup_steps, decay_steps):
    return cosine_lr(step, max_lr, min_lr, warmup_steps, decay_steps)


def warmup_cosine_lr_at(s, max_lr, min_lr, warmup_steps, decay_steps):
    # lesson 8 imports lr_at from decoder.training.loop itself; it reads four fields
    cfg = SimpleNamespace(
        lr=max_lr, min_lr=min_lr, warmup_iters=warmup_steps, lr_decay_iters=decay_steps
    )
    return loop.lr_at(s, cfg)


def warmup_cosine_through_numpy(step, max_lr, min_lr, warmup_steps, decay_steps):
    """The library's schedule, called by NumPy on the answer's behalf (np.vectorize's frame,
    not the answer's, makes the call): the guard follows the stack past neutral code."""
    return float(np.vectorize(cosine_lr)(step, max_lr, min_lr, warmup_steps, decay_steps))


def clip_each_separately(grads, max_norm):
    norm = float(np.sqrt(sum(np.sum(g * g) for g in grads)))
    return [g * min(1.0, max_norm / (np.linalg.norm(g) + 1e-6)) for g in grads], norm


def _clip_through(clip, grads, max_norm):
    tensors = [mg.Tensor(np.zeros(g.shape), requires_grad=True) for g in grads]
    for t, g in zip(tensors, grads, strict=True):
        t.grad = g.copy()
    norm = clip(tensors, max_norm)
    return [t.grad for t in tensors], norm


def clip_with_library(grads, max_norm):
    return _clip_through(clip_grad_norm_, grads, max_norm)


def clip_with_training_step(grads, max_norm):
    # the training step's own pieces, imported there from minigrad.optim
    tensors = [mg.Tensor(g.copy(), requires_grad=True) for g in grads]
    for t, g in zip(tensors, grads, strict=True):
        t.grad = g.copy()
    norm = step.grad_norm(tensors)
    return [g * step.clip_scale(norm, max_norm) for g in grads], norm


def clip_with_alias(grads, max_norm, clip=minigrad_clip):  # reached by a default argument
    return _clip_through(clip, grads, max_norm)


def adam_decoupled(p, g, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    b1, b2 = betas
    p = p * (1 - lr * weight_decay)  # AdamW's decay, not L2's
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return p - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps), m, v


def adam_through_adamw(p, g, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    # the library's AdamW with decay 0, fed the L2 gradient, replayed from the moments
    param = mg.Tensor(p.copy(), requires_grad=True)
    opt = AdamW([param], lr=lr, betas=betas, eps=eps, weight_decay=0.0)
    opt.state[0] = dict(step=t - 1, exp_avg=m + 0 * p, exp_avg_sq=v + 0 * p)  # copies
    param.grad = g + weight_decay * p
    opt.step()
    return param.data, opt.state[0]["exp_avg"], opt.state[0]["exp_avg_sq"]


WRONG = [
    ("warmup_cosine", warmup_cosine_off_by_one),
    ("warmup_cosine", warmup_cosine_library),
    ("warmup_cosine", warmup_cosine_lr_at),
    ("warmup_cosine", warmup_cosine_through_numpy),
    ("clip_by_global_norm", clip_each_separately),
    ("clip_by_global_norm", clip_with_library),
    ("clip_by_global_norm", clip_with_training_step),
    ("clip_by_global_norm", clip_with_alias),
    ("adam_l2_step", adam_decoupled),
    ("adam_l2_step", adam_through_adamw),
]
