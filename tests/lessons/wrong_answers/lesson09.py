"""Known-wrong answers to lesson 9's exercises: each a mistake a learner makes."""

from __future__ import annotations

import numpy as np

import minigrad as mg
from decoder.model.decoding import sample_token
from decoder.model.model import Decoder

GREEDY = dict(temperature=0, top_k=None, top_p=None)


def min_p_absolute(logits, min_p):
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    probs = np.where(probs >= min_p, probs, 0.0)  # the cut must scale with the top probability
    return probs / probs.sum()


def greedy_with_generate(model, ids, n):
    return list(model.generate(ids, n, temperature=0, use_cache=False))


def greedy_uncropped(model, ids, n):
    context, new = list(ids), []
    with mg.no_grad():
        for _ in range(n):
            logits, _ = model([context[-model.config.block_size - 1 :]])  # one token too many
            new.append(int(np.argmax(logits.numpy()[0, -1])))
            context.append(new[-1])
    return new


def greedy_with_sample_token(model, ids, n):
    # the loop is written, the choice of the token is the library's sampler
    context, new = list(ids), []
    with mg.no_grad():
        for _ in range(n):
            logits, _ = model([context[-model.config.block_size :]])
            new.append(sample_token(logits.numpy()[0, -1], temperature=0))
            context.append(new[-1])
    return new


def greedy_with_decoder_sample(model, ids, n):
    # Decoder's own sampling loop, run with the given model as self: every forward pass
    # still goes through model(...)
    return list(Decoder._sample(model, list(ids), n, GREEDY, None, False, None))


def greedy_cached_without_cache(model, ids, n):
    context, new = list(ids), []
    with mg.no_grad():
        for _ in range(n):
            logits, _ = model([context])  # the whole context every time
            new.append(int(np.argmax(logits.numpy()[0, -1])))
            context.append(new[-1])
    return new


def greedy_cached_with_decoder_sample(model, ids, n):
    return list(Decoder._sample(model, list(ids), n, GREEDY, None, True, None))


WRONG = [
    ("min_p_probs", min_p_absolute),
    ("greedy_generate", greedy_with_generate),
    ("greedy_generate", greedy_uncropped),
    ("greedy_generate", greedy_with_sample_token),
    ("greedy_generate", greedy_with_decoder_sample),
    ("greedy_generate_cached", greedy_cached_without_cache),
    ("greedy_generate_cached", greedy_cached_with_decoder_sample),
]
