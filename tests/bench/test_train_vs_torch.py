"""Tests for bench/train_vs_torch.py's recipe check (the lines it prints where our preset
departs from nanoGPT's recipe) and its report over repeated runs, fed made-up results. Leaves
out the training runs themselves (that is the bench).

Holds: shakespeare-char and baby-gpt follow nanoGPT's recipe, its exact GELU included, so the
bench prints no difference for them; a preset that drifts, in a config field or in the GELU
its built model computes, is listed by name. With --repeat each side's speed is the median of
its runs, each round's ratio is its own pair's, and losses that differ between repeats of one
side are flagged; one run prints the rows bench/gpu_check.py parses, without the repeats' lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from decoder.model.model import Decoder
from decoder.training import config as config_module
from decoder.training.config import build_configs

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


def _run(tokens_per_s: float, side: str = "ours", losses=(4.0, 3.5, 3.0)) -> dict:
    """A made-up result of one side's run, as the child process writes it: 3 steps of 64
    tokens at ``tokens_per_s``."""
    result = {
        "train_loss": 2.5,
        "val_loss": 2.6,
        "tokens_per_s": tokens_per_s,
        "time_s": 3 * 64 / tokens_per_s,
        "losses": list(losses),
        "peak_rss_mb": 150.0,
    }
    if side == "ours":
        return {**result, "shards_setting": 2, "shards": 2, "cpus": 2}
    return {**result, "threads": 2, "our_gelu": "none", "peak_rss_mb": 400.0}


def _report(capsys, runs, iters=3) -> str:
    args = argparse.Namespace(preset="shakespeare-char", iters=iters, device="cpu")
    bench.report(args, runs)
    return capsys.readouterr().out


def test_summarize_takes_medians_ranges_and_the_loss_spread():
    s = bench.summarize([_run(100.0), _run(300.0), _run(200.0, losses=(4.0, 3.5, 3.25))])
    assert s["tokens_per_s"] == 200.0 and s["tokens_per_s_range"] == (100.0, 300.0)
    assert s["ms_per_step"] == pytest.approx(1e3 * 64 / 200)  # 3 steps of 64 tokens
    assert s["ms_per_step_range"] == pytest.approx((1e3 * 64 / 300, 1e3 * 64 / 100))
    assert s["loss_spread"] == 0.25
    assert s["losses"] == [4.0, 3.5, 3.0]  # the first run's


def test_round_ratios_pair_the_runs_of_each_round():
    runs = {"ours": [_run(90.0), _run(60.0)], "torch": [_run(100.0, "torch"), _run(50.0, "torch")]}
    assert bench.round_ratios(runs) == pytest.approx([0.9, 1.2])


def test_one_run_prints_the_rows_gpu_check_reads_and_no_repeat_lines(capsys):
    out = _report(capsys, {1337: {"ours": [_run(95.0)], "torch": [_run(100.0, "torch")]}})
    rows = re.findall(r"^ *\d+ +(minigrad|pytorch) +[\d.]+ +([\d.]+) +([\d,]+) *$", out, re.M)
    assert [r[0] for r in rows] == ["minigrad", "pytorch"]  # bench/gpu_check.py's pattern
    assert "throughput ratio minigrad / pytorch: 0.95" in out
    assert "ours: shards=2 (row shards in 2 processes), one BLAS thread each" in out
    assert "the reference ran on 2 torch thread(s)" in out
    assert "per-round" not in out and "repeats" not in out and "min-max" not in out
    assert "targets: throughput ratio >= 0.9: met" in out


def test_repeats_report_medians_per_round_ratios_and_identical_losses(capsys):
    ours = [_run(t) for t in (80.0, 100.0, 120.0)]
    torch = [_run(t, "torch") for t in (100.0, 200.0, 100.0)]
    out = _report(capsys, {1337: {"ours": ours, "torch": torch}})
    assert re.search(r"1337  minigrad +2\.5000 +2\.6000 +100$", out, re.M)  # the medians
    assert re.search(r"1337  pytorch +2\.5000 +2\.6000 +100$", out, re.M)
    assert "throughput ratio minigrad / pytorch: 1.00" in out
    assert "per-round ratio minigrad / pytorch, seed 1337: 0.80 0.50 1.20 (median 0.80)" in out
    assert re.search(r"1337  minigrad .* 80-120 +533\.3-800\.0$", out, re.M)  # the ranges
    assert "losses identical across the repeats of each side" in out
    assert "targets: throughput ratio of the medians >= 0.9: met" in out


def test_repeats_whose_losses_differ_are_flagged(capsys):
    ours = [_run(100.0), _run(100.0)]
    torch = [_run(100.0, "torch"), _run(100.0, "torch", losses=(4.0, 3.5, 3.001))]
    steady = [_run(100.0, "torch"), _run(100.0, "torch")]
    out = _report(capsys, {1: {"ours": ours, "torch": torch}, 2: {"ours": ours, "torch": steady}})
    assert "losses differ across the repeats of one side by up to 1.00e-03 (pytorch, seed 1)" in out
    assert "median per-round ratio over all seeds: 1.00" in out


def test_shards_line_says_when_our_side_did_not_shard():
    assert bench.shards_line({"shards_setting": 2, "shards": 1, "cpus": 2}) == (
        "ours: shards=2, not sharded in this run (shard_count 1), default BLAS threads"
    )
    assert bench.shards_line({"shards_setting": 4, "shards": 4, "cpus": 2}) == (
        "ours: shards=4 (row shards), one after another on 2 core(s)"
    )


def test_our_shards_reads_the_runs_train_config():
    model_cfg, train_cfg = build_configs("shakespeare-char", **SMALL, shards=3)
    got = bench.our_shards(model_cfg, train_cfg)
    assert got["shards_setting"] == 3 and got["shards"] in (1, 3)
    model_cfg, train_cfg = build_configs("shakespeare-char", **SMALL, shards=2, dropout=0.1)
    assert bench.our_shards(model_cfg, train_cfg)["shards"] == 1  # dropout: no shards


@pytest.mark.parametrize("precision, shown", [(None, "TF32"), ("highest", "float32")])
def test_both_sides_take_the_run_s_matmul_precision_and_the_report_names_it(
    precision, shown, capsys
):
    args = argparse.Namespace(
        preset="baby-gpt", iters=3, device="cuda", seed=1, eval_interval=None,
        matmul_precision=precision,
    )  # fmt: skip
    _, train_cfg = bench.configs(args)
    assert train_cfg.matmul_precision == (precision or "high")  # baby-gpt's TF32, as nanoGPT's
    bench.report(args, {1: {"ours": [_run(95.0)], "torch": [_run(100.0, "torch")]}})
    assert f"baby-gpt, 3 steps, cuda, {shown} products" in capsys.readouterr().out
    assert "TF32" not in bench.GPU_DEPARTURES  # the reference allows it exactly when we do
