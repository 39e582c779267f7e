"""Export (issue 28): the default character model saves as a GPT-2 with a tokenizer.json that
transformers loads and gives our ids and logits; a Llama saved from Python gets its
tokenizer.json; the presets no Hugging Face class can hold are refused by the field. Tests run
offline and on tiny models."""

from __future__ import annotations

import numpy as np
import pytest

from decoder.hf.config import PretrainedError
from decoder.hf.pretrained import load_pretrained, save_pretrained
from decoder.model.model import Decoder
from decoder.post.chat import chat_tokenizer
from decoder.text.tokenizer import CharTokenizer
from decoder.training.config import build_configs

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
SMALL = dict(n_layer=2, n_head=2, n_embd=16, block_size=16)


@pytest.fixture(scope="module")
def tf():
    """transformers (with torch), told never to reach the hub, or a skip saying why."""
    pytest.importorskip("torch", reason="torch (the oracle extra) is not installed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield pytest.importorskip(
            "transformers", reason="transformers (the oracle extra) is not installed"
        )


def small_model(preset: str, tokenizer) -> Decoder:
    config, _ = build_configs(preset, vocab_size=tokenizer.vocab_size, **SMALL)
    return Decoder(config).eval()


def their_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.as_tensor([ids])).logits.float().numpy()


@pytest.mark.parametrize(
    "preset, architecture",
    [("shakespeare-char", "GPT2LMHeadModel"), ("shakespeare-char-modern", "LlamaForCausalLM")],
)
@pytest.mark.oracle
def test_a_character_model_loads_in_transformers_with_its_tokenizer(
    tf, tmp_path, preset, architecture
):
    tokenizer = chat_tokenizer(CharTokenizer.from_text(TEXT))  # special tokens too
    ours = small_model(preset, tokenizer)
    assert ours.config.bias is False  # GPT-2 has biases: written as zeros
    save_pretrained(ours, tmp_path, tokenizer)
    theirs = tf.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == architecture
    theirs_tok = tf.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    text = "hear me,\nCitizen"  # 16 characters, the context
    ids = tokenizer.encode(text)
    assert theirs_tok.encode(text) == ids and theirs_tok.decode(ids) == text
    assert theirs_tok.convert_tokens_to_ids("<|end|>") == tokenizer.special_tokens["<|end|>"]
    np.testing.assert_allclose(their_logits(theirs, ids), ours(np.array([ids]))[0].data, atol=2e-5)
    back, back_tok = load_pretrained(tmp_path)  # and back into ours, characters and all
    assert back_tok.to_dict() == tokenizer.to_dict()
    np.testing.assert_allclose(back(np.array([ids]))[0].data, ours(np.array([ids]))[0].data)


@pytest.mark.parametrize(
    "preset, field",
    [
        ("gpt2", "norm_position='post'"),
        ("gpt3", "'window': 16"),
        ("deepseek-v2", "attention='mla'"),
    ],
)
def test_presets_no_hugging_face_class_holds_are_refused_by_the_field(tmp_path, preset, field):
    tokenizer = CharTokenizer.from_text(TEXT)
    with pytest.raises(PretrainedError, match=field):
        save_pretrained(small_model(preset, tokenizer), tmp_path / preset, tokenizer)
    assert not (tmp_path / preset).exists()  # nothing written


def test_a_tokenizer_without_a_writer_is_refused_before_anything_is_written(tmp_path):
    from decoder.text.bpe import BPETokenizer

    tokenizer = BPETokenizer.train(TEXT * 4, 260)
    with pytest.raises(PretrainedError, match="'bpe' tokenizer has no tokenizer.json writer"):
        save_pretrained(small_model("shakespeare-char-modern", tokenizer), tmp_path, tokenizer)
    assert not tmp_path.joinpath("config.json").exists()
