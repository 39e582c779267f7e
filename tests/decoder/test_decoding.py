"""Beam search and speculative decoding (decoder/model/decoding.py).

Beam search against an exhaustive search over every continuation of a tiny vocabulary, with
and without its KV caches (reordered by beam); speculative decoding's greedy output against
the target's greedy tokens, and its sampled output against the target's distribution with a
chi-square test (a deterministic seed; a wrong acceptance rule fails the same test).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import minigrad as mg
from decoder.model import decoding
from decoder.model.config import ModelConfig
from decoder.model.decoding import accept_drafts, beam_search, sampling_probs, speculative_decode
from decoder.model.model import Decoder

V = 3


def tiny(seed: int, vocab_size: int = V, block_size: int = 8, scale: float = 30.0) -> Decoder:
    """A random model whose next-token distributions are far from uniform."""
    mg.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab_size, block_size=block_size, n_layer=1, n_head=2, n_embd=8)
    model = Decoder(cfg)
    for p in model.parameters():
        p.data = p.data * scale
    return model.eval()


def log_probs(model: Decoder, seq: list[int]) -> np.ndarray:
    logits, _ = model([seq])
    x = logits.numpy()[0, -1].astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def exhaustive(model, prompt, max_new_tokens, length_penalty, stop_token):
    """Every continuation (ended by stop_token or by length), scored as beam search ranks."""
    best, best_score = None, -np.inf
    for n in range(1, max_new_tokens + 1):
        for tokens in itertools.product(range(V), repeat=n):
            stops = [i for i, t in enumerate(tokens) if t == stop_token]
            if (stops and stops[0] != n - 1) or (not stops and n < max_new_tokens):
                continue  # it stopped earlier, or it would have gone on
            total = sum(
                log_probs(model, prompt + list(tokens[:i]))[t] for i, t in enumerate(tokens)
            )
            if total / n**length_penalty > best_score:
                best, best_score = list(tokens), total / n**length_penalty
    return best


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 3.0])
def test_a_wide_beam_is_an_exhaustive_search(length_penalty):
    model, prompt = tiny(0, scale=2.0), [1, 2]  # moderate probabilities: the penalty matters
    expected = exhaustive(model, prompt, 3, length_penalty, stop_token=0)
    assert beam_search(model, prompt, 3, V**3, length_penalty, stop_token=0) == expected


def test_the_length_penalty_changes_the_winner():
    """The case above is not vacuous: the penalty picks continuations of other lengths."""
    model, prompt = tiny(0, scale=2.0), [1, 2]
    found = {len(exhaustive(model, prompt, 3, a, stop_token=0)) for a in (0.0, 3.0)}
    assert len(found) == 2


def test_width_one_is_greedy():
    model = tiny(1)
    greedy = list(model.generate([1], 12, temperature=0))  # past block_size: recomputed
    assert beam_search(model, [1], 12, beam_width=1) == greedy


def _uncached(self, model: Decoder, batch_size: int = 1) -> None:
    self.model, self.limit, self.caches, self.fed = model, model.config.block_size, None, 0


def test_beams_with_reordered_caches_equal_beams_recomputed(monkeypatch):
    model = tiny(2, vocab_size=5, block_size=16)
    cached = beam_search(model, [1, 2, 3], 18, beam_width=4)
    monkeypatch.setattr(decoding._Stream, "__init__", _uncached)
    assert beam_search(model, [1, 2, 3], 18, beam_width=4) == cached
    # and a cache left in the beams' old order would change the answer
    monkeypatch.undo()
    monkeypatch.setattr(decoding._Stream, "reorder", lambda self, rows: None)
    with pytest.raises(ValueError):  # the batch no longer matches the number of beams
        beam_search(model, [1, 2, 3], 18, beam_width=4)


def test_generate_runs_beam_search_and_refuses_sampling_settings():
    model = tiny(3)
    assert list(model.generate([1], 5, beam_width=3)) == beam_search(model, [1], 5, 3)
    with pytest.raises(ValueError, match="beam search ranks continuations"):
        model.generate([1], 5, beam_width=3, temperature=0.8)
    with pytest.raises(ValueError, match="beam_width must be a positive integer"):
        model.generate([1], 5, beam_width=0)


def test_generate_stops_after_the_stop_token():
    model = tiny(4)
    tokens = list(model.generate([1], 30, temperature=0))
    stop = tokens[5]
    assert (
        list(model.generate([1], 30, temperature=0, stop_token=stop))
        == tokens[: tokens.index(stop) + 1]
    )


@pytest.mark.parametrize("k", [1, 3, 7])
def test_greedy_speculative_decoding_is_the_targets_greedy_output(k):
    target, draft = tiny(5, block_size=16), tiny(6, block_size=8)
    expected = list(target.generate([1, 2], 25, temperature=0))  # past both block sizes
    result = speculative_decode(target, draft, [1, 2], 25, k=k, temperature=0)
    assert result.tokens == expected
    assert 0 < result.proposed and 0 <= result.accepted <= result.proposed


def test_a_draft_equal_to_the_target_is_always_accepted():
    target = tiny(7, block_size=16)
    result = speculative_decode(target, target, [1], 12, k=3, temperature=0)
    assert result.acceptance_rate == 1.0


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    seen = expected > 0
    assert counts[~seen].sum() == 0, "a token of probability 0 was drawn"
    return float(((counts[seen] - expected[seen]) ** 2 / expected[seen]).sum())


# chi-square's 0.999 quantiles: a correct rule fails one seed in a thousand
CRITICAL_999 = {3: 16.27, 8: 26.12}


def _always_accept(p, q, drafts, rng):
    """A wrong rule: the drafts are never checked."""
    return drafts + [int(rng.choice(p.shape[1], p=p[-1]))]


def _resample_from_p(p, q, drafts, rng):
    """A wrong rule: a refused draft is replaced by a draw from p, not from max(0, p - q)."""
    for i, d in enumerate(drafts):
        if rng.random() * q[i, d] >= p[i, d]:
            return drafts[:i] + [int(rng.choice(p.shape[1], p=p[i]))]
    return drafts + [int(rng.choice(p.shape[1], p=p[-1]))]


@pytest.mark.parametrize(
    ("rule", "correct"),
    [(accept_drafts, True), (_always_accept, False), (_resample_from_p, False)],
)
def test_the_acceptance_rule_keeps_the_targets_distribution(rule, correct):
    p = np.array([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])  # target, after the draft
    q = np.array([[0.7, 0.1, 0.1, 0.1]])  # a draft that over-proposes token 0
    rng = np.random.default_rng(0)
    counts = np.zeros(4)
    for _ in range(4000):
        draft = [int(rng.choice(4, p=q[0]))]
        counts[rule(p, q, draft, rng)[0]] += 1
    assert (chi_square(counts, p[0]) < CRITICAL_999[3]) == correct


@pytest.mark.parametrize(("rule", "correct"), [(accept_drafts, True), (_resample_from_p, False)])
def test_sampled_speculative_decoding_follows_the_target(monkeypatch, rule, correct):
    """The first two tokens' joint distribution against the target's exact one."""
    monkeypatch.setattr(decoding, "accept_drafts", rule)
    target, draft = tiny(8, scale=8.0), tiny(9, scale=8.0)  # q is far from p
    prompt = [1]
    first = sampling_probs(log_probs(target, prompt), temperature=1.0)
    exact = np.concatenate([first[a] * np.exp(log_probs(target, prompt + [a])) for a in range(V)])
    counts = np.zeros(V * V)
    for seed in range(300):
        a, b = speculative_decode(target, draft, prompt, 2, k=2, seed=seed).tokens
        counts[a * V + b] += 1
    assert (chi_square(counts, exact) < CRITICAL_999[8]) == correct


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(k=0), r"k=0 draft tokens per step must be an integer in \[1, block_size - 1\]"),
        (dict(k=8), r"k=8 draft tokens"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    ],
)
def test_speculative_decoding_refuses_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        speculative_decode(tiny(0), tiny(1), [1], 4, **kwargs)


@pytest.mark.parametrize(
    ("prompt", "n", "message"),
    [
        ([], 4, "needs a prompt of at least one token"),
        ([1, 3], 4, "token id 3 is outside the vocabulary"),
        ([1], -1, "max_new_tokens must be >= 0"),
    ],
)
def test_both_refuse_a_bad_prompt(prompt, n, message):
    with pytest.raises(ValueError, match=message):
        speculative_decode(tiny(0), tiny(1), prompt, n)
    with pytest.raises(ValueError, match=message):
        beam_search(tiny(0), prompt, n, beam_width=2)


def test_no_new_tokens_is_an_empty_answer():
    assert beam_search(tiny(0), [1], 0, beam_width=2) == []
    assert speculative_decode(tiny(0), tiny(1), [1], 0).tokens == []


def test_speculative_decoding_needs_one_vocabulary():
    with pytest.raises(ValueError, match="must share one tokenizer"):
        speculative_decode(tiny(0), tiny(1, vocab_size=5), [1], 4)


# ---- the command line ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from decoder.training.config import build_configs
    from decoder.training.loop import train
    from tests.decoder.test_train import TEXT

    run = tmp_path_factory.mktemp("run")
    model_cfg, train_cfg = build_configs(
        "tiny", max_iters=2, warmup_iters=1, eval_iters=1, batch_size=2, block_size=16,
        sample_tokens=0,
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIGRAD_DATA_DIR", str(run / "cache"))
        train(model_cfg, train_cfg, TEXT, run, progress=False)
    return run


def test_the_cli_runs_beam_search_to_the_stop_text(run_dir, capsys):
    from decoder.generate import main
    from decoder.training.checkpoint import load_model

    args = ["--checkpoint", str(run_dir), "--prompt", "the", "--max-new-tokens", "20"]
    assert main([*args, "--beam-width", "3", "--length-penalty", "0.5", "--stop", "t"]) == 0
    model, tok, _ = load_model(run_dir)
    expected = beam_search(model, tok.encode("the"), 20, 3, 0.5, stop_token=tok.encode("t")[0])
    assert capsys.readouterr().out == "the" + tok.decode(expected) + "\n"


def test_the_cli_refuses_sampling_settings_with_beams(run_dir, capsys):
    from decoder.generate import main

    with pytest.raises(SystemExit):
        main(["--checkpoint", str(run_dir), "--beam-width", "2", "--temperature", "0.8"])
    assert "drop --temperature, --top-k and --top-p" in capsys.readouterr().err


def test_the_cli_refuses_a_stop_text_of_several_tokens(run_dir, capsys):
    from decoder.generate import main

    assert main(["--checkpoint", str(run_dir), "--stop", "the"]) == 2
    assert "--stop 'the' is 3 tokens; it must be exactly one token" in capsys.readouterr().err
