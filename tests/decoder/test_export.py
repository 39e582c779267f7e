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
    # saved again by transformers (which adds a post-processor and tokenizer_config.json):
    # still our characters
    theirs.save_pretrained(tmp_path / "again")
    theirs_tok.save_pretrained(tmp_path / "again")
    _, again_tok = load_pretrained(tmp_path / "again")
    assert again_tok.to_dict() == tokenizer.to_dict()


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
    class WordTokenizer:  # a user's own: ours has no way to write it
        vocab_size = 64

        def to_dict(self):
            return {"type": "words"}

    config, _ = build_configs("shakespeare-char-modern", vocab_size=64, **SMALL)
    with pytest.raises(PretrainedError, match="'words' tokenizer has no tokenizer.json writer"):
        save_pretrained(Decoder(config), tmp_path, WordTokenizer())
    assert not tmp_path.joinpath("config.json").exists()


# digits in threes, contractions, newlines, accents, a character never seen in training
BPE_TEXTS = [
    "Before we proceed any further, hear me speak.",
    "We'll go, they're 12345 strong!\n\n  Speak.\r\nCitizen",
    "caf\u00e9 na\u00efve \u2014 \u00bfqu\u00e9? \U0001f600 <|end|> tail",
]


def bpe_tokenizer():
    from decoder.post.chat import chat_tokenizer
    from decoder.text.bpe import BPETokenizer

    text = (TEXT + "We'll proceed, 12345 citizens! caf\u00e9 na\u00efve \u2014 ") * 8
    return chat_tokenizer(BPETokenizer.train(text, 256 + 60))


def tiktoken_tokenizer():
    """A TiktokenTokenizer around an encoding made here (tiktoken's own need the network)."""
    from decoder.text.tokenizer import TiktokenTokenizer

    tokenizer = object.__new__(TiktokenTokenizer)
    tokenizer.name, tokenizer.encoding = "ours", bpe_tokenizer().to_tiktoken()
    return tokenizer


@pytest.mark.parametrize("make", [bpe_tokenizer, tiktoken_tokenizer], ids=["bpe", "tiktoken"])
@pytest.mark.oracle
def test_a_byte_level_bpe_is_written_as_a_tokenizer_json_transformers_reads(tf, tmp_path, make):
    tokenizer = make()
    ours = small_model("shakespeare-char-modern", tokenizer)
    save_pretrained(ours, tmp_path, tokenizer)
    theirs_tok = tf.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    _, back_tok = load_pretrained(tmp_path)  # our own reader of tokenizer.json
    for text in BPE_TEXTS:
        ids = tokenizer.encode(text, allowed_special="all")
        assert theirs_tok.encode(text) == ids, text
        assert back_tok.encode(text, allowed_special="all") == ids, text
        assert theirs_tok.decode(ids) == text and back_tok.decode(ids) == text
    assert (
        theirs_tok.convert_tokens_to_ids("<|end|>")
        == tokenizer.encode("<|end|>", allowed_special="all")[0]
    )


def test_merges_are_recovered_from_ranks_and_a_token_no_merge_makes_is_refused():
    from decoder.hf.export import byte_bpe_tokenizer_json

    byte_ranks = {bytes([b]): b for b in range(256)}
    spec = byte_bpe_tokenizer_json(byte_ranks | {b"ab": 256, b"abc": 257}, r"\p{L}+", {})
    assert spec["model"]["merges"] == ["a b", "ab c"]
    with pytest.raises(PretrainedError, match="not made by merging two lower-ranked tokens"):
        byte_bpe_tokenizer_json(byte_ranks | {b"abc": 256}, r"\p{L}+", {})  # no "ab" or "bc"
    with pytest.raises(PretrainedError, match="byte 0 has no token"):
        byte_bpe_tokenizer_json({bytes([b]): b for b in range(1, 256)}, r"\p{L}+", {})
