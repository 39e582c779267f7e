"""Checks of lesson 9 (generation): ``min_p_probs``, ``greedy_generate`` and
``greedy_generate_cached``.

The decoding checks use a small untrained model: greedy decoding must match
``Decoder.generate`` token for token whatever the weights.
"""

from __future__ import annotations

import numpy as np

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.text.tokenizer import CharTokenizer
from minigrad import functional as F

# What each answer may call in the library: no_grad and the logits' own methods; the cached
# loop also the model's caches. The model itself is the check's CallLog, which is not library
# code; generate, its sampler and sample_token are off limits.
_LOOP = ("minigrad.autograd.no_grad", "minigrad.tensor.Tensor", "minigrad.backend.to_numpy")
ALLOWED = {
    "greedy_generate": _LOOP,
    "greedy_generate_cached": (
        *_LOOP,
        "decoder.model.model.Decoder.new_caches",
        "decoder.model.attention.KVCache",
    ),
}

PROMPTS = ("ROMEO:\n", "First Citizen:\nWe are", "KING:\nMy lord")


def small_model() -> tuple[Decoder, CharTokenizer]:
    """A seeded untrained model with a 16-token context, and a tokenizer for the prompts."""
    tok = CharTokenizer.from_text("".join(PROMPTS) + "abcdefghijklmnopqrstuvwxyz ,.;!?")
    mg.manual_seed(0)
    config = ModelConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=32)
    return Decoder(config), tok


class CallLog:
    """Wraps the model and records, per forward pass, its length T and whether it had caches."""

    def __init__(self, model: Decoder):
        self.model, self.calls = model, []

    def __call__(self, ids, targets=None, caches=None):
        self.calls.append((np.shape(ids)[-1], caches is not None))
        return self.model(ids, targets, caches=caches)

    def __getattr__(self, name):  # config, new_caches, ...
        return getattr(self.model, name)


def test_min_p_probs(fn):
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    got = fn(np.log(probs), 0.2)  # threshold 0.2 * 0.5 = 0.1: the last token goes
    want = [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]
    assert np.allclose(got, want), (
        f"got {got}, want {want} (the cut is min_p * the top probability)"
    )
    assert np.allclose(fn(np.log(probs) + 1000, 0.2), got), "large logits: subtract the max"
    g = np.random.default_rng(2)
    logits = 2 * g.standard_normal(65)
    softmax = F.softmax(mg.tensor(logits, dtype="float64"), axis=-1).numpy()
    assert np.allclose(fn(logits, 0.0), softmax), "min_p = 0 keeps the whole softmax"
    one_hot = np.eye(65)[np.argmax(logits)]
    assert np.allclose(fn(logits, 1.0), one_hot), "min_p = 1 keeps only the top token"
    q = fn(logits, 0.1)
    kept = q > 0
    assert np.isclose(q.sum(), 1.0)
    assert np.array_equal(kept, softmax >= 0.1 * softmax.max())
    assert np.allclose(q[kept], softmax[kept] / softmax[kept].sum())


def test_greedy_generate(fn):
    model, tok = small_model()
    block_size = model.config.block_size
    for prompt, n in [(PROMPTS[0], 5), (PROMPTS[1], 2 * block_size)]:
        ids = tok.encode(prompt)
        want = list(model.generate(ids, n, temperature=0, use_cache=False))
        logged = CallLog(model)
        got = [int(t) for t in fn(logged, ids, n)]
        assert got == want, f"after {prompt!r}: got {tok.decode(got)!r}, want {tok.decode(want)!r}"
        lengths = [min(len(ids) + i, block_size) for i in range(n)]
        assert logged.calls == [(T, False) for T in lengths], (
            "run the model once per new token, on the whole context cropped to block_size, "
            "without caches"
        )


def test_greedy_generate_cached(fn):
    model, tok = small_model()
    block_size = model.config.block_size
    for prompt, n in [(PROMPTS[0], 6), (PROMPTS[2], block_size - 13)]:
        ids = tok.encode(prompt)
        want = list(model.generate(ids, n, temperature=0, use_cache=True))
        logged = CallLog(model)
        got = [int(t) for t in fn(logged, ids, n)]
        assert got == want, f"after {prompt!r}: got {tok.decode(got)!r}, want {tok.decode(want)!r}"
        assert logged.calls[0] == (len(ids), True), "start with a prefill of the prompt"
        assert logged.calls[1:] == [(1, True)] * (n - 1), "then one cached token per pass"
