"""Tests for bench/architectures.py, the architecture comparison: one tiny run end to end (on
a short text, never downloaded), the KV-cache bytes per architecture, the median and spread
over seeds, and its doctests. Leaves out timing (that is the bench)."""

from __future__ import annotations

import doctest
import importlib.util
import json
from pathlib import Path

import pytest

from decoder.training.config import build_configs
from tests.decoder.test_train import TEXT

BENCH = Path(__file__).parents[2] / "bench"
spec = importlib.util.spec_from_file_location("architectures", BENCH / "architectures.py")
arch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(arch)


def test_doctests():
    assert doctest.testmod(arch).failed == 0


@pytest.mark.parametrize(
    ("preset", "per_token", "full"),
    [
        ("gpt2", 4 * 2 * 128 * 4, 4 * 2 * 128 * 4 * 64),  # 4 layers, K and V of 128, float32
        ("gpt3", 4096, 4096 // 4 * (64 + 16 + 64 + 16)),  # two layers keep only their band
        ("llama3", 2048, 2048 * 64),  # 2 of 4 heads cached (GQA)
        ("mistral", 2048, 2048 * 16),  # every layer rolls at 16 tokens
        ("deepseek-v2", 4 * (64 + 16) * 4, 4 * (64 + 16) * 4 * 64),  # MLA: latent + rotary key
    ],
)
def test_cache_bytes(preset, per_token, full):
    assert arch.cache_bytes(build_configs(preset)[0]) == (per_token, full)


def test_summarise_takes_medians_and_the_spread_per_preset():
    runs = [
        {"preset": p, "seed": s, "val_loss": v, "params": 10, "losses": [v]}
        for p, s, v in [("a", 0, 2.0), ("b", 0, 1.0), ("a", 1, 3.0), ("a", 2, 2.5)]
    ]
    a, b = arch.summarise(runs)
    assert (a["preset"], a["seeds"], a["val_loss"], a["val_spread"]) == ("a", 3, 2.5, 1.0)
    assert (b["preset"], b["seeds"], b["val_loss"], b["val_spread"]) == ("b", 1, 1.0, 0.0)


def test_a_tiny_comparison_writes_its_table_json_and_plot(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("decoder.text.data.load_shakespeare", lambda: TEXT)
    out = tmp_path / "arch"
    arch.main(
        ["--presets", "llama3", "deepseek-v2", "--seeds", "1", "2", "--max_iters", "2"]
        + ["--eval_iters", "1", "--gen_tokens", "3", "--out", str(out)]
    )
    result = json.loads(out.with_suffix(".json").read_text())
    assert [r["preset"] for r in result["runs"]] == ["llama3"] * 2 + ["deepseek-v2"] * 2
    llama, deepseek = result["rows"]
    assert deepseek["active_params"] < deepseek["params"]  # 6 of 8 experts idle per token
    assert llama["active_params"] == llama["params"]
    assert "| deepseek-v2 |" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 0
