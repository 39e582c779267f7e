"""The architecture comparison's presets (decoder/training/config.py): each one, shrunk to tiny
sizes, trains, resumes to the same losses as an uninterrupted run, and generates from its
checkpoint; and each full-size preset has the choices of its column of the comparison table."""

from __future__ import annotations

import pytest

from decoder.model.model import Decoder
from decoder.training.checkpoint import load_model
from decoder.training.config import build_configs
from decoder.training.loop import train
from tests.decoder.test_train import TEXT

COMPARISON = ("gpt2", "gpt2-pre", "gpt3", "llama3", "mistral", "deepseek-v2", "granite")
TINY = dict(n_layer=2, n_embd=32, block_size=16, batch_size=2, max_iters=4, warmup_iters=1)
TINY_RUN = dict(eval_interval=2, eval_iters=1, sample_tokens=0)


@pytest.fixture(autouse=True)
def _token_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))  # keep ids out of ~/.cache


@pytest.mark.parametrize("preset", COMPARISON)
def test_each_preset_trains_resumes_and_generates(preset, tmp_path):
    window = {"window": 4} if preset in ("gpt3", "mistral") else {}  # narrower than the context
    model_cfg, train_cfg = build_configs(preset, **TINY, **TINY_RUN, **window)
    whole = train(model_cfg, train_cfg, TEXT, tmp_path / "whole", progress=False)
    train(model_cfg, train_cfg, TEXT, tmp_path / "split", progress=False, until=2)
    rest = train(model_cfg, train_cfg, TEXT, tmp_path / "split", resume=True, progress=False)
    assert rest["losses"] == whole["losses"][2:]  # bitwise
    model, tokenizer, _ = load_model(tmp_path / "split")
    tokens = list(model.generate([tokenizer.encode("the")], 20, temperature=0))  # past 16
    assert len(tokens) == 20


@pytest.mark.parametrize(
    ("preset", "choices"),
    [
        ("gpt2", dict(pos="learned", ffn="gelu", norm="layer", norm_position="post")),
        ("gpt2-pre", dict(pos="learned", ffn="gelu", norm="layer", norm_position="pre")),
        ("gpt3", dict(pos="learned", ffn="gelu", norm_position="pre", tie_weights=False)),
        ("llama3", dict(pos="rope", ffn="swiglu", norm="rms", n_kv_head=2, tie_weights=True)),
        ("mistral", dict(pos="rope", ffn="swiglu", norm="rms", n_kv_head=2, window=16)),
        ("mistral", dict(window_pattern="W", norm_position="pre", tie_weights=False)),
        ("deepseek-v2", dict(attention="mla", pos="rope", rope_scaling="yarn", norm="rms")),
        ("deepseek-v2", dict(ffn="moe", n_shared_experts=2, tie_weights=False)),
        ("granite", dict(pos="rope", ffn="swiglu", norm="rms", n_kv_head=2, tie_weights=True)),
    ],
)
def test_each_preset_has_its_columns_choices_at_shakespeare_scale(preset, choices):
    model_cfg, train_cfg = build_configs(preset)
    base_model, base_train = build_configs("shakespeare-char")
    assert {k: getattr(model_cfg, k) for k in choices} == choices
    assert (model_cfg.n_layer, model_cfg.n_embd, model_cfg.block_size) == (4, 128, 64)
    assert train_cfg == base_train  # the same steps, batch and schedule
    assert 0.7e6 < Decoder(model_cfg).num_parameters() < 0.9e6


def test_gpt3_alternates_dense_and_banded_layers():
    model_cfg, _ = build_configs("gpt3")
    assert [model_cfg.layer_window(i) for i in range(4)] == [None, 16, None, 16]


def test_deepseek_v2_routes_each_token_to_a_quarter_of_its_experts():
    model_cfg, _ = build_configs("deepseek-v2")
    model = Decoder(model_cfg)
    assert (model_cfg.n_experts, model_cfg.top_k) == (8, 2)
    # the idle 6 of 8 routed experts in each of 4 layers: 6 * 3 * 128 * 32 weights apiece
    assert model.num_parameters() - model.num_active_parameters() == 4 * 6 * 3 * 128 * 32
    # YaRN stretches a 16-position training context by 4 to the 64 of block_size
    assert model_cfg.rope_original_context * model_cfg.rope_factor == model_cfg.block_size


def test_mistral_has_no_context_limit_as_every_layer_is_windowed():
    model_cfg, _ = build_configs("mistral")
    assert model_cfg.context_limit is None  # every layer windowed, RoPE: no position limit
