"""Tests for bench/train_vs_torch.py's recipe check: the lines it prints where our preset
departs from nanoGPT's recipe. Leaves out the training runs themselves (that is the bench).

Holds: shakespeare-char and baby-gpt follow nanoGPT's recipe, its exact GELU included, so the
bench prints no difference for them; a preset that drifts, in a config field or in the GELU
its built model computes, is listed by name.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from decoder import config as config_module
from decoder.config import build_configs
from decoder.model import Decoder

BENCH = Path(__file__).parents[2] / "bench"


def _load_bench():
    spec = importlib.util.spec_from_file_location("train_vs_torch", BENCH / "train_vs_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load_bench()
SMALL = dict(n_layer=2, n_embd=16, n_head=2, block_size=8)  # the GELU, without the cost


def _gelu(preset: str, **overrides) -> str | None:
    return bench.our_gelu(Decoder(build_configs(preset, **SMALL, **overrides)[0]))


@pytest.mark.parametrize("preset", sorted(bench.NANOGPT))
def test_the_nanogpt_presets_print_no_difference(preset):
    assert _gelu(preset) == bench.NANOGPT_GELU == "none"
    assert bench.recipe_differences(preset, _gelu(preset)) == []


def test_our_gelu_is_read_off_the_built_model():
    assert _gelu("shakespeare-char", gelu_approximate="tanh") == "tanh"
    assert _gelu("shakespeare-char-modern") is None  # SwiGLU: no GELU to compare


def test_a_preset_that_drifts_back_to_the_tanh_gelu_is_listed(monkeypatch):
    drifted = dataclasses.replace(config_module.PRESETS["shakespeare-char"])
    drifted.model = {**drifted.model, "gelu_approximate": "tanh"}
    monkeypatch.setitem(config_module.PRESETS, "shakespeare-char", drifted)
    gelu = _gelu("shakespeare-char")
    assert gelu == "tanh"
    assert bench.recipe_differences("shakespeare-char", gelu) == [
        "GELU: ours approximate='tanh', nanoGPT nn.GELU() (exact, erf)"
    ]


def test_a_drifted_config_field_is_listed(monkeypatch):
    drifted = dataclasses.replace(config_module.PRESETS["baby-gpt"])
    drifted.train = {**drifted.train, "lr": 3e-4}
    monkeypatch.setitem(config_module.PRESETS, "baby-gpt", drifted)
    assert bench.recipe_differences("baby-gpt", "none") == ["lr: ours 0.0003, nanoGPT 0.001"]
