"""Every checkpoint our commands write loads in decoder.generate and decoder.finetune (a LoRA
SFT run included), and decoder.chat answers from an SFT or DPO run (issue 28)."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

import decoder.chat as chat_cli
import decoder.generate as generate_cli
from decoder.post.chat import respond
from decoder.post.dpo import dpo
from decoder.post.lora import finetune
from decoder.post.posttrain import load_post_model
from decoder.post.sft import sft
from decoder.training.checkpoint import load_model
from tests.decoder.test_sft import SHORT, TEXT, make_base

LORA = {"r": 2, "alpha": 4.0, "targets": ["wq", "wv"]}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))  # keep files out of ~


@pytest.fixture
def lora_sft(tmp_path):
    """A LoRA SFT run of two steps on an untrained base."""
    make_base(tmp_path / "base")
    overrides = {**SHORT, "max_iters": "2"}
    sft(tmp_path / "base", tmp_path / "sft", n_examples=120, overrides=overrides, lora=LORA,
        text=TEXT, progress=False)  # fmt: skip
    return tmp_path / "sft"


def test_a_lora_sft_run_loads_for_sampling_and_fine_tuning(lora_sft, tmp_path, capsys):
    model, tokenizer, _ = load_model(lora_sft)
    merged = load_post_model(lora_sft)[0].eval()  # what decoder.dpo starts from
    ids = np.arange(12)[None] % tokenizer.vocab_size
    np.testing.assert_allclose(model(ids)[0].data, merged(ids)[0].data, atol=1e-6)
    assert "wq.A" not in " ".join(model.state_dict())  # a plain Decoder, adapters merged
    argv = ["--checkpoint", str(lora_sft), "--max-new-tokens", "3", "--seed", "1"]
    assert generate_cli.main(argv) == 0, capsys.readouterr().err
    out = finetune(lora_sft, TEXT[:2000], tmp_path / "ft", r=2, max_iters=1, progress=False)
    assert out["wrapped"]
    assert respond(model, tokenizer, "Who speaks the line", 4) is not None


# ---- decoder.chat ----------------------------------------------------------------------------
class Recorder:
    """A stdout that keeps each write apart, to see the answer come piece by piece."""

    def __init__(self):
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass


def test_chat_streams_the_greedy_answer_of_an_sft_and_a_dpo_run(lora_sft, tmp_path, monkeypatch):
    dpo(lora_sft, tmp_path / "dpo", n_examples=120, overrides={**SHORT, "max_iters": "2"},
        text=TEXT, progress=False)  # fmt: skip
    question = "Who speaks the line: but soft what light now"
    for run in (lora_sft, tmp_path / "dpo"):
        model, tokenizer, _ = load_model(run)
        answer = respond(model, tokenizer, question, 6)
        assert len(answer) > 1  # not stopped at once: pieces to stream
        out = Recorder()
        monkeypatch.setattr(sys, "stdout", out)
        argv = ["--checkpoint", str(run), "--prompt", question, "--temperature", "0"]
        assert chat_cli.main([*argv, "--max-new-tokens", "6"]) == 0
        monkeypatch.undo()
        assert "".join(out.writes) == answer + "\n"
        assert len(out.writes) == len(answer) + 1  # one piece per character, then the newline


def test_chat_reads_one_instruction_a_line_and_refuses_a_model_without_the_template(
    lora_sft, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Who speaks the line: o speak\n\n  \nhello\n"))
    argv = ["--checkpoint", str(lora_sft), "--max-new-tokens", "3", "--seed", "1"]
    assert chat_cli.main(argv) == 0
    assert len(capsys.readouterr().out.splitlines()) >= 2  # two answers (blank lines skipped)
    assert chat_cli.main(["--checkpoint", str(tmp_path / "base"), "--prompt", "hi"]) == 2
    assert "no chat tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        chat_cli.main([*argv, "--beam-width", "2", "--top-k", "3"])
    assert "--beam-width ranks by the model's own probabilities" in capsys.readouterr().err
