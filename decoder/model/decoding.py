"""Decoding: how a next token is chosen from the logits (``sampling_probs``, ``sample_token``:
temperature, top-k, top-p; greedy at temperature 0), and two strategies beyond sampling one
token at a time, beam search and speculative decoding. Both take a ``Decoder`` and a prompt
(a list of token ids) and return token ids. ``Decoder.generate`` (decoder/model/model.py)
samples with the first and searches with the second.

- Beam search keeps the ``beam_width`` likeliest continuations (by their summed
  log-probabilities) as one batch; each step scores every beam's every next token and keeps
  the best ``beam_width`` of them, reordering the KV caches by the beam each came from. A
  continuation that emits ``stop_token`` is finished; at the end, finished and unfinished
  ones are ranked by score / length ** length_penalty (Hugging Face's normalisation; a
  penalty above 0 favours longer ones, 0 ranks by the plain sum).
- Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a small draft model
  proposes k tokens, the target scores all of them in one forward, and each draft token d is
  kept with probability min(1, p(d) / q(d)); the first one refused is replaced by a draw from
  the residual max(0, p - q), renormalised, and if all k are kept the target's own next
  distribution adds one more. The output follows the target's distribution exactly (the
  same temperature / top-k / top-p distribution ``sample_token`` draws from); greedy
  (temperature 0) gives the target's greedy tokens.

Both keep KV caches while the sequence fits in block_size, and past it recompute over the
last block_size tokens, as ``Decoder.generate`` does. Then the window moves with every token,
and one forward can score only its last position as generate would: so past block_size the
target generates alone, without drafts. Left out on purpose: models with sliding-window
layers (a rolling cache cannot be reordered or rolled back), batches of prompts, early
stopping of beam search, diverse beams, tree-shaped drafts (Medusa), a draft that adapts k.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from decoder.model.attention import KVCache
from minigrad.autograd import no_grad
from minigrad.backend import to_numpy
from minigrad.nn import Module

# |length_penalty| at most this: 10 already ranks by length alone, and length ** 1e300 overflows
MAX_LENGTH_PENALTY = 10.0

if TYPE_CHECKING:  # annotations only: decoder.model.model imports this module
    from decoder.model.model import Decoder


@contextmanager
def inference(model: Module) -> Iterator[None]:
    """No graph and eval mode inside; every module's own mode restored afterwards."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise a ValueError naming the first invalid sampling setting.

    >>> check_sampling(0.8, 40, 0.95)
    >>> check_sampling(1.0, 0, None)
    Traceback (most recent call last):
    ...
    ValueError: top_k must be a positive integer (or None for no cut), got 0
    """
    if not temperature >= 0:  # `not >=` also catches NaN
        raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and (int(top_k) != top_k or top_k < 1):
        raise ValueError(f"top_k must be a positive integer (or None for no cut), got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (or None for no cut), got {top_p}")


def sampling_probs(
    logits: np.ndarray,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> np.ndarray:
    """The distribution (V,), float64, that ``sample_token`` draws the next token from.

    temperature 0 puts all the mass on the most likely token (greedy). Otherwise: divide by
    the temperature; keep the ``top_k`` largest logits (k above V keeps all; ties with the
    k-th are kept too); turn them into probabilities; keep the nucleus, the smallest set of
    most likely tokens whose mass reaches ``top_p`` (the top token always stays); renormalise.

    >>> sampling_probs(np.array([1.0, 3.0, 2.0]), top_k=2).round(3).tolist()
    [0.0, 0.731, 0.269]
    """
    check_sampling(temperature, top_k, top_p)
    logits = np.asarray(logits, dtype=np.float64)
    V = logits.shape[-1]
    if temperature == 0:
        return np.eye(V)[np.argmax(logits)]
    logits = logits / temperature
    if top_k is not None and top_k < V:
        kth = np.partition(logits, V - top_k)[V - top_k]  # the k-th largest logit
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max())  # subtle: subtract the max so exp cannot overflow
    probs /= probs.sum()
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-probs, kind="stable")  # most likely first
        mass_before = np.cumsum(probs[order]) - probs[order]  # mass of the tokens ahead of each
        keep = np.zeros(V, dtype=bool)
        keep[order[mass_before < top_p]] = True  # the first token has 0 ahead: always kept
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
    return probs


def sample_token(
    logits: np.ndarray,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    rng: np.random.Generator | None = None,
) -> int:
    """One token id drawn from the logits (V,) of the next position, from the distribution
    ``sampling_probs`` gives; greedy (temperature 0) draws nothing from ``rng``.

    >>> logits = np.array([1.0, 3.0, 2.0])
    >>> sample_token(logits, temperature=0.0), sample_token(logits, top_k=1)
    (1, 1)
    >>> sorted({sample_token(logits, top_p=0.9, rng=np.random.default_rng(s)) for s in range(50)})
    [1, 2]
    """
    probs = sampling_probs(logits, temperature, top_k, top_p)
    if temperature == 0:
        return int(np.argmax(probs))
    rng = rng if rng is not None else np.random.default_rng()
    return int(rng.choice(probs.shape[-1], p=probs))


def _new_caches(model: Decoder, batch_size: int) -> list[KVCache]:
    """New caches, refused where a layer's cache is rolling (shorter than block_size)."""
    caches = model.new_caches(batch_size)
    if not all(c.block_size >= model.config.block_size for c in caches):
        raise ValueError(
            "beam search and speculative decoding reorder and roll back KV caches, which a "
            "sliding-window layer's rolling cache cannot do: sample with generate() instead"
        )
    return caches


class _Stream:
    """One model's forwards over a growing batch of equal-length sequences, feeding the cache
    only the tokens it has not seen; ``rollback`` forgets cached tokens."""

    def __init__(self, model: Decoder, batch_size: int = 1):
        self.model = model
        self.limit = model.config.block_size
        self.caches: list[KVCache] | None = _new_caches(model, batch_size)
        self.fed = 0  # tokens of each sequence held in the caches

    def logits(self, seqs: list[list[int]], n: int) -> np.ndarray:
        """The logits (B, n, V), float64 on the host, after each of the last n tokens of each
        sequence: the distributions of the tokens that follow them."""
        with inference(self.model):
            if self.caches is not None and len(seqs[0]) <= self.limit:
                out, _ = self.model([s[self.fed :] for s in seqs], caches=self.caches)
                self.fed = len(seqs[0])
            else:  # past block_size the window shifts every step: no cache from now on
                self.caches = None
                out, _ = self.model([s[-self.limit :] for s in seqs])
        return to_numpy(out.data[:, -n:]).astype(np.float64)

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens (later ones were rejected)."""
        if self.caches is not None and self.fed > length:
            for cache in self.caches:
                cache.length = length
            self.fed = length

    def reorder(self, rows: np.ndarray) -> None:
        """Make sequence i's cache the cache of sequence rows[i] (a beam's parent)."""
        for cache in self.caches or []:
            cache.k, cache.v = cache.k[rows], cache.v[rows]  # (B, ...) -> (len(rows), ...)


def _check_prompt(model: Decoder, prompt: list[int], max_new_tokens: int) -> None:
    """Raise a ValueError for an empty prompt, ids outside the vocabulary, or a negative
    number of tokens (generate's checks)."""
    if len(prompt) == 0:
        raise ValueError("decoding needs a prompt of at least one token, got none")
    model._as_ids([list(prompt)], "prompt")  # integer ids inside the vocabulary
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-probabilities.

    >>> np.exp(_log_softmax(np.array([[0.0, np.log(3.0)]]))).round(3).tolist()
    [[0.25, 0.75]]
    """
    shifted = logits - logits.max(-1, keepdims=True)  # subtle: no overflow in exp
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def beam_search(
    model: Decoder,
    prompt: list[int],
    max_new_tokens: int,
    beam_width: int,
    length_penalty: float = 1.0,
    stop_token: int | None = None,
) -> list[int]:
    """The best continuation of ``prompt`` found with ``beam_width`` beams (the new tokens,
    ending with ``stop_token`` if it finished by emitting it). Width 1 is greedy decoding.
    """
    if int(beam_width) != beam_width or beam_width < 1:
        raise ValueError(f"beam_width must be a positive integer, got {beam_width}")
    if not abs(length_penalty) <= MAX_LENGTH_PENALTY:  # NaN fails this too
        raise ValueError(
            f"length_penalty={length_penalty}: choose between -{MAX_LENGTH_PENALTY:g} and "
            f"{MAX_LENGTH_PENALTY:g} (1.0 is the usual; above 0 favours longer continuations)"
        )
    _check_prompt(model, prompt, max_new_tokens)
    stream = _Stream(model, batch_size=1)
    beams, scores = [list(prompt)], np.zeros(1)  # summed log-probabilities of the new tokens
    finished: list[tuple[float, list[int]]] = []  # (normalised score, whole sequence)
    for step in range(1, max_new_tokens + 1):
        logp = _log_softmax(stream.logits(beams, 1)[:, 0])  # (W, V)
        V = logp.shape[1]
        totals = (scores[:, None] + logp).ravel()  # (W, V) -> (W V,): every extension
        best = np.argsort(-totals, kind="stable")[:beam_width]  # ties: lower beam, token
        parents, tokens, best_totals = *np.divmod(best, V), totals[best]
        done = np.isin(tokens, [] if stop_token is None else [stop_token])
        for i in np.flatnonzero(done):
            sequence = beams[parents[i]] + [int(tokens[i])]
            finished.append((best_totals[i] / step**length_penalty, sequence))
        parents, tokens, scores = parents[~done], tokens[~done], best_totals[~done]
        if not len(parents):
            break
        beams = [beams[p] + [int(t)] for p, t in zip(parents, tokens, strict=True)]
        stream.reorder(parents)  # each kept beam continues its parent's cache
    else:  # ran to max_new_tokens: the unfinished beams compete too
        length = max(max_new_tokens, 1)
        finished += [(s / length**length_penalty, b) for s, b in zip(scores, beams, strict=True)]
    best_sequence = max(finished, key=lambda f: f[0])[1]  # max keeps the first of equals
    return best_sequence[len(prompt) :]


@dataclass
class SpeculativeResult:
    """What ``speculative_decode`` made: the tokens, and how many drafts it proposed and the
    target accepted."""

    tokens: list[int]
    proposed: int
    accepted: int

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")


def accept_drafts(
    p: np.ndarray, q: np.ndarray, drafts: list[int], rng: np.random.Generator
) -> list[int]:
    """Speculative sampling's rule: the target's distributions ``p`` (k + 1, V) after each
    draft token, the draft's ``q`` (k, V) that proposed ``drafts`` (k,); the tokens kept,
    then one drawn by the target (k + 1 tokens at most).

    >>> p = np.array([[0.0, 1.0], [1.0, 0.0]])  # the target is sure of token 1, then 0
    >>> accept_drafts(p, np.array([[0.5, 0.5]]), [1], np.random.default_rng(0))
    [1, 0]
    """
    V = p.shape[1]
    for i, d in enumerate(drafts):
        # keep d with probability min(1, p/q) (q[i, d] > 0: d was drawn from q)
        if rng.random() * q[i, d] < p[i, d]:
            continue
        residual = np.maximum(p[i] - q[i], 0.0)  # the mass the draft under-proposes
        total = residual.sum()
        # subtle: total is 0 only where p == q up to rounding, and then p is the answer
        probs = residual / total if total > 0 else p[i]
        return drafts[:i] + [int(rng.choice(V, p=probs))]
    return drafts + [int(rng.choice(V, p=p[-1]))]


def speculative_decode(
    target: Decoder,
    draft: Decoder,
    prompt: list[int],
    max_new_tokens: int,
    k: int = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
) -> SpeculativeResult:
    """``max_new_tokens`` tokens after ``prompt`` from ``target``'s distribution (shaped by
    temperature, top_k and top_p as in ``sample_token``), with ``draft`` proposing ``k``
    tokens per target forward."""
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(
            f"the draft's vocab_size={draft.config.vocab_size} is not the target's "
            f"{target.config.vocab_size}: the two models must share one tokenizer"
        )
    if int(k) != k or not 1 <= k < target.config.block_size:
        raise ValueError(
            f"k={k} draft tokens per step must be an integer in [1, block_size - 1] = "
            f"[1, {target.config.block_size - 1}]: the target scores k + 1 positions at once"
        )
    _check_prompt(target, prompt, max_new_tokens)
    settings = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    sampling_probs(np.zeros(1), **settings)  # check the settings now
    rng = np.random.default_rng(seed)
    target_stream, draft_stream = _Stream(target), _Stream(draft)
    context, new, proposed, accepted = list(prompt), [], 0, 0
    while len(new) < max_new_tokens:
        # never past max_new_tokens, nor past block_size (see the module's docstring)
        limit = target.config.block_size
        n_drafts = max(min(k, max_new_tokens - len(new) - 1, limit - len(context)), 0)
        drafts, q = [], []
        for _ in range(n_drafts):
            probs = sampling_probs(draft_stream.logits([context + drafts], 1)[0, 0], **settings)
            q.append(probs)
            drafts.append(int(rng.choice(len(probs), p=probs)))
        logits = target_stream.logits([context + drafts], n_drafts + 1)[0]  # one forward
        p = np.stack([sampling_probs(row, **settings) for row in logits])  # (k + 1, V)
        kept = accept_drafts(p, np.array(q).reshape(n_drafts, p.shape[1]), drafts, rng)
        proposed, accepted = proposed + n_drafts, accepted + len(kept) - 1
        context += kept
        new += kept
        for stream in (target_stream, draft_stream):  # the last token is not cached yet
            stream.rollback(len(context) - 1)
    return SpeculativeResult(new, proposed, accepted)
