"""Direct preference optimisation: the sequence log-likelihoods, the frozen reference, the
held-out numbers, exact resume of decoder.dpo, and its command-line errors. The loss itself
(its gradient, PyTorch's numbers) is tested in tests/decoder/test_dpo_loss.py."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
from decoder.dpo import main
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.post.chat import chat_tokenizer, encode_pair, pad_batch
from decoder.post.dpo import DPOObjective, dpo, sequence_logps
from decoder.text.tokenizer import CharTokenizer
from decoder.training.log import read_log
from tests.decoder.test_sft import SHORT, TEXT, make_base


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))


@pytest.fixture
def base(tmp_path):
    make_base(tmp_path / "base")
    return tmp_path / "base"


def small_model(seed: int) -> Decoder:
    mg.manual_seed(seed)
    return Decoder(ModelConfig(vocab_size=10, block_size=16, n_layer=1, n_head=2, n_embd=8))


def test_sequence_logps_sum_the_response_tokens_only():
    model = small_model(0)
    tok = chat_tokenizer(CharTokenizer.from_text("abcdefg"))
    x, y = pad_batch(
        [encode_pair(tok, "ab", "cde"), encode_pair(tok, "abcd", "e")], tok.vocab_size - 1
    )
    got = sequence_logps(model, x, y).numpy()
    logits = model(x)[0].numpy().astype(np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    for b in range(2):
        kept = y[b] >= 0
        assert kept.sum() == (4, 2)[b]  # the response and <|end|>
        expected = logp[b, np.flatnonzero(kept), y[b, kept]].sum()
        np.testing.assert_allclose(got[b], expected, rtol=1e-5)


def test_the_loss_starts_at_log_2_and_trains_only_the_policy():
    policy, reference = small_model(0), small_model(0)
    objective = DPOObjective(reference, beta=0.5)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, (3, 2, 6))
    y = np.where(np.arange(6) < 2, -100, rng.integers(0, 10, (3, 2, 6)))
    loss = objective(policy, x, y)
    np.testing.assert_allclose(loss.item(), np.log(2), rtol=1e-6)  # policy == reference: z = 0
    loss.backward()
    assert policy.tok_emb.weight.grad is not None
    assert all(p.grad is None and not p.requires_grad for p in reference.parameters())


def test_resume_repeats_the_uninterrupted_run(base, tmp_path, monkeypatch):
    monkeypatch.setattr("decoder.training.loop.plot_losses", lambda *a, **k: None)  # seconds each
    kw = dict(n_examples=60, overrides={**SHORT, "batch_size": "4"}, text=TEXT, progress=False)
    whole = dpo(base, tmp_path / "whole", **kw)
    dpo(base, tmp_path / "split", until=4, **kw)
    rest = dpo(None, tmp_path / "split", resume=True, **kw)
    assert whole["step"] == rest["step"] == 6
    keys = ("train_loss", "val_loss", "reward_margin", "preference_accuracy", "likelihood_accuracy")
    log_whole, log_split = read_log(tmp_path / "whole"), read_log(tmp_path / "split")
    assert [r["step"] for r in log_whole] == [0, 3, 6]
    for a, b in zip(log_whole, log_split, strict=True):
        assert [a[k] for k in keys] == [b[k] for k in keys]
    first = log_whole[0]
    assert first["reward_margin"] == 0.0 and first["preference_accuracy"] == 0.0  # policy = ref
    np.testing.assert_allclose(first["val_loss"], np.log(2), rtol=1e-6)


def test_dpo_after_sft_plots_its_numbers(base, tmp_path):
    from decoder.post.sft import sft

    kw = dict(n_examples=60, overrides={**SHORT, "max_iters": "2", "eval_interval": "2"},
              text=TEXT, progress=False)  # fmt: skip
    sft(base, tmp_path / "sft", **kw)
    out = dpo(tmp_path / "sft", tmp_path / "dpo", **kw)
    assert out["step"] == 2 and 0 <= out["likelihood_accuracy_after"] <= 1
    assert (tmp_path / "dpo" / "loss.png").stat().st_size > 0


def test_cli_errors(base, tmp_path, capsys):
    assert main(["--checkpoint", str(base), "--out", str(tmp_path / "a"), "--dpo_beta=0"]) == 2
    assert "dpo_beta must be a finite float in (0, inf)" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "chosen": "b"}\n')
    assert main(["--checkpoint", str(base), "--out", str(tmp_path / "b"), "--data", str(bad)]) == 2
    assert "line 1: no ['rejected']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--checkpoint", str(base), "--out", str(tmp_path / "c"), "--examples", "1"])
    assert "--examples=1" in capsys.readouterr().err
