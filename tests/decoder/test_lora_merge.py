"""What a LoRA merge writes (issue 28): the merged model computes what the adapted one did (an
adapter on a tied output head is refused), a Hugging Face base keeps its whole context however
short the fine-tune's, and a merge never writes over its own inputs. Tiny models are built
offline with transformers, as in test_pretrained.py."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import decoder.hf.pretrained as hf_pretrained
from decoder import finetune as finetune_cli
from decoder.hf.pretrained import from_pretrained
from decoder.hf.tokenizer import HFTokenizer
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.post.lora import finetune, load_adapted, merge
from decoder.post.sft import sft
from minigrad.nn.lora import apply_lora
from tests.decoder import test_pretrained
from tests.decoder.test_pretrained import byte_level_tokenizer, hf_logits, hf_model
from tests.decoder.test_sft import SHORT, make_base
from tests.decoder.test_sft import TEXT as PLAY

tf = test_pretrained.tf  # the fixture: transformers, offline

TEXT = "hello world, the cat's hat. " * 300


def hf_dir(tf, tmp_path, kind: str, name: str):
    """A tiny ``kind`` saved in tmp_path/name with a byte-level tokenizer.json of its size."""
    (tmp_path / "tok").mkdir(exist_ok=True)
    byte_level_tokenizer(tmp_path / "tok")
    n_vocab = HFTokenizer(tmp_path / "tok" / "tokenizer.json").vocab_size
    model = hf_model(tf, kind, vocab_size=n_vocab)
    model.resize_token_embeddings(n_vocab)
    model.save_pretrained(tmp_path / name)
    shutil.copy(tmp_path / "tok" / "tokenizer.json", tmp_path / name)
    return tmp_path / name, model


def adapt(base, out, targets=("wq", "wv"), block_size=None):
    finetune(base, TEXT, out, r=2, targets=targets, max_iters=3, lr=0.05, progress=False,
             pretrained=True, block_size=block_size)  # fmt: skip
    return out


# ---- a tied output head ----------------------------------------------------------------------
def test_an_adapter_on_a_tied_head_is_refused_before_anything_changes():
    model = Decoder(ModelConfig(vocab_size=11, n_layer=1, n_head=2, n_embd=8, block_size=8))
    with pytest.raises(
        ValueError, match="lm_head.weight is tied to tok_emb.weight.*drop 'lm_head'"
    ):
        apply_lora(model, ("wq", "lm_head"), r=2)
    assert model.lm_head.weight is model.tok_emb.weight
    assert all(p.requires_grad for p in model.parameters())  # nothing was wrapped or frozen


@pytest.mark.oracle
def test_a_tied_llama_refuses_an_adapter_on_its_head_from_the_command_line(tf, tmp_path, capsys):
    base, _ = hf_dir(tf, tmp_path, "llama-tied", "tied")
    (tmp_path / "data.txt").write_text(TEXT)
    argv = ["--from-pretrained", str(base), "--data", str(tmp_path / "data.txt")]
    argv += ["--out", str(tmp_path / "lora"), "--targets", "wq,lm_head", "--max-iters", "1"]
    assert finetune_cli.main(argv) == 2
    assert "lm_head.weight is tied to tok_emb.weight" in capsys.readouterr().err


@pytest.mark.oracle
def test_a_merged_untied_head_computes_what_the_adapted_model_did(tf, tmp_path):
    base, _ = hf_dir(tf, tmp_path, "llama", "llama")
    out = adapt(base, tmp_path / "lora", targets=("wq", "lm_head"))
    adapted, _, _ = load_adapted(out)
    assert np.abs(adapted.lm_head.B.data).max() > 0  # the head's adapter did train
    merged = from_pretrained(merge(out, tmp_path / "merged"))
    ids = np.arange(20)[None]
    np.testing.assert_allclose(merged(ids)[0].data, adapted(ids)[0].data, atol=1e-5)


# ---- --block-size on a merge -----------------------------------------------------------------
@pytest.mark.oracle
def test_a_merge_keeps_the_whole_context_of_a_base_fine_tuned_on_a_shorter_one(
    tf, tmp_path, monkeypatch
):
    base, theirs = hf_dir(tf, tmp_path, "gpt2", "gpt2")  # 64 learned positions
    # GPT-2's tokenizer is tiktoken's (a download): this one reads the tokenizer.json beside it
    monkeypatch.setattr(
        hf_pretrained, "TiktokenTokenizer", lambda _: HFTokenizer(base / "tokenizer.json")
    )
    out = adapt(base, tmp_path / "lora", block_size=16)
    merged_dir = merge(out, tmp_path / "merged")
    assert json.loads((merged_dir / "config.json").read_text())["n_positions"] == 64
    merged = from_pretrained(merged_dir)
    np.testing.assert_array_equal(
        merged.pos_emb.weight.data, theirs.transformer.wpe.weight.detach().numpy()
    )
    adapted, _, _ = load_adapted(out, full_context=True)
    ids = np.arange(60)[None]  # past the 16 positions the fine-tune saw
    np.testing.assert_allclose(merged(ids)[0].data, adapted(ids)[0].data, atol=1e-5)
    assert np.abs(merged(ids)[0].data - hf_logits(theirs, ids)).max() > 1e-4  # it did change


# ---- a merge's output and its inputs ---------------------------------------------------------
@pytest.mark.oracle
def test_a_merge_refuses_an_output_that_is_holds_or_lies_in_an_input(tf, tmp_path, capsys):
    base, _ = hf_dir(tf, tmp_path, "llama", "llama")
    out = adapt(base, tmp_path / "lora")
    files = sorted(p.name for p in base.iterdir())
    cases = {
        base: f"is the base {base}",
        tmp_path: f"holds the base {base}",
        base / "sub": f"lies inside the base {base}",
        out: f"is the adapters {out}",
    }
    for where, message in cases.items():
        argv = ["merge", "--adapters", str(out), "--out", str(where), "--overwrite"]
        assert finetune_cli.main(argv) == 2
        assert message in capsys.readouterr().err
    assert sorted(p.name for p in base.iterdir()) == files  # nothing moved aside
    assert finetune_cli.main(["merge", "--adapters", str(out), "--out", str(out / "m")]) == 0


def test_sft_refuses_an_adapter_on_a_tied_head(tmp_path, monkeypatch):
    """decoder.sft's LoRA (whose merge decoder.dpo starts from) meets the same refusal."""
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))
    make_base(tmp_path / "base")
    lora = {"r": 2, "alpha": 4.0, "targets": ["wq", "lm_head"]}
    with pytest.raises(ValueError, match="lm_head.weight is tied to tok_emb.weight"):
        sft(tmp_path / "base", tmp_path / "sft", n_examples=120, overrides=SHORT, lora=lora,
            text=PLAY, progress=False)  # fmt: skip
