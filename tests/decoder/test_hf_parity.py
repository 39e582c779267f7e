"""Hugging Face parity (issue 28): Llama 3.x's RoPE scaling (and linear, YaRN, dynamic NTK), a
Llama config that
names a sliding window it does not use, and a tied config whose file carries its own
head, each against transformers on a tiny random model built offline."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from decoder.hf.pretrained import from_pretrained, save_pretrained
from decoder.model.model import Decoder
from decoder.model.positional import rope_frequencies
from tests.decoder import test_pretrained
from tests.decoder.test_pretrained import V, hf_logits, hf_model

tf = test_pretrained.tf  # the fixture: transformers, offline

LLAMA3 = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}  # fmt: skip
# trained on 32 positions, run on 128: with theta 500000 and head size 32, transformers' ramp
# (over the pair index) keeps pairs the paper's (over the turns) would interpolate
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
OURS = {"llama3": "llama3", "linear": "linear", "yarn": "yarn-code"}


def wide_llama(tf, rope_scaling):
    """Head size 32 and Llama 3's theta, so some pairs are slow enough for the ramp to act."""
    import torch

    torch.manual_seed(0)
    config = tf.LlamaConfig(
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=64,
        intermediate_size=48, vocab_size=V, max_position_embeddings=128, rope_theta=500000.0,
        rope_scaling=rope_scaling, initializer_range=0.2,  # logits that tell the scalings apart
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    return tf.LlamaForCausalLM(config).eval()


@pytest.mark.oracle
@pytest.mark.parametrize(
    "rope_scaling", [LLAMA3, {"rope_type": "linear", "factor": 2.0}, YARN], ids=OURS
)
def test_rope_scaling_matches_transformers_and_saves_back(tf, tmp_path, rope_scaling):
    theirs = wide_llama(tf, rope_scaling)
    theirs.save_pretrained(tmp_path / "theirs")
    ours = from_pretrained(tmp_path / "theirs")
    assert ours.config.rope_scaling == OURS[rope_scaling["rope_type"]]
    c = ours.config
    freqs, _ = rope_frequencies(
        32, c.rope_theta, c.rope_scaling, c.rope_factor, c.rope_original_context
    )
    inv_freq = theirs.model.rotary_emb.inv_freq.double().numpy()  # float32 there
    np.testing.assert_allclose(freqs, inv_freq, rtol=1e-6)
    ids = np.random.default_rng(0).integers(0, V, size=(1, 120))
    expected = hf_logits(theirs, ids)
    tol = 1e-5 * np.abs(expected).max()  # float32 sums over logits of a few units
    np.testing.assert_allclose(ours(ids)[0].data, expected, atol=tol)
    plain = dataclasses.replace(
        ours.config, rope_scaling=None, rope_factor=1.0, rope_original_context=None
    )
    unscaled = Decoder(plain)
    unscaled.load_state_dict(ours.state_dict())
    assert np.abs(unscaled(ids)[0].data - expected).max() > 1e-3  # the scaling matters here
    save_pretrained(ours, tmp_path / "ours")
    back = type(theirs).from_pretrained(tmp_path / "ours").eval()
    np.testing.assert_allclose(hf_logits(back, ids), expected, atol=tol)


def test_transformers_yarn_ramps_over_the_pair_index_where_the_paper_ramps_over_the_turns():
    code, m_code = rope_frequencies(32, 500000.0, "yarn-code", 4.0, original_context=32)
    paper, m_paper = rope_frequencies(32, 500000.0, "yarn", 4.0, original_context=32)
    assert m_code == m_paper  # the same temperature, 0.1 ln(4) + 1
    assert code[0] == 1.0 and paper[0] < 0.5  # pair 0 turns 5 times over 32: kept, or not
    np.testing.assert_allclose(code[3:], paper[3:])  # both interpolate the slow pairs alike


@pytest.mark.oracle
def test_dynamic_ntk_is_plain_rope_within_the_context_as_in_transformers(tf, tmp_path):
    theirs = wide_llama(tf, {"rope_type": "dynamic", "factor": 4.0})
    theirs.save_pretrained(tmp_path / "theirs")
    ours = from_pretrained(tmp_path / "theirs")
    assert ours.config.rope_scaling is None and ours.config.block_size == 128
    ids = np.random.default_rng(0).integers(0, V, size=(1, 128))  # the whole context
    expected = hf_logits(theirs, ids)
    np.testing.assert_allclose(ours(ids)[0].data, expected, atol=1e-5 * np.abs(expected).max())


@pytest.mark.oracle
def test_a_llama_config_naming_a_sliding_window_does_not_window(tf, tmp_path):
    theirs = hf_model(tf, "llama", sliding_window=4)
    theirs.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    assert ours.config.window is None
    ids = np.arange(24)[None] % V  # longer than the window it names
    np.testing.assert_allclose(ours(ids)[0].data, hf_logits(theirs, ids), atol=3e-5)


@pytest.mark.oracle
@pytest.mark.parametrize("kind", ["llama-tied", "gpt2"])
def test_a_tied_config_whose_file_has_its_own_head_keeps_it_as_transformers(tf, tmp_path, kind):
    import torch
    from safetensors.torch import load_file, save_file

    hf_model(tf, kind).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    embedding = next(
        w for n, w in weights.items() if n.endswith(("wte.weight", "embed_tokens.weight"))
    )
    weights["lm_head.weight"] = torch.randn_like(embedding)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    theirs = hf_model(tf, kind).from_pretrained(tmp_path).eval()
    ours = from_pretrained(tmp_path)
    assert not ours.config.tie_weights
    ids = np.arange(12)[None]
    np.testing.assert_allclose(ours(ids)[0].data, hf_logits(theirs, ids), atol=3e-5)
