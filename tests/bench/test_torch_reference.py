"""Tests for bench/torch_reference.py, the nanoGPT reference the benchmarks compare against.

Holds: our weights land in the reference's fused projections in the right order (the logits
agree in float64 with our model's, for the classic and the modern layout); its training loop
repeats decoder.train's losses over the first steps from the same weights and batches; its
cache-less generate crops the context to block_size. Leaves out timing (that is the bench).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import minigrad as mg
from decoder.model.model import Decoder
from decoder.text.data import TokenDataset
from decoder.text.tokenizer import CharTokenizer
from decoder.training.config import build_configs

pytest.importorskip("torch", reason="the oracle is not installed: pip install -e '.[oracle]'")
import torch  # noqa: E402

BENCH = Path(__file__).parents[2] / "bench"


def _load_reference():
    spec = importlib.util.spec_from_file_location("torch_reference", BENCH / "torch_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ref = _load_reference()


def _ours(preset: str, **overrides):
    model_cfg, train_cfg = build_configs(preset, **overrides)
    mg.manual_seed(0)
    return Decoder(model_cfg), model_cfg, train_cfg


@pytest.mark.summation_order
@pytest.mark.parametrize("preset", ["shakespeare-char", "shakespeare-char-modern"])
def test_logits_equal_ours_from_our_weights(preset):
    ours, model_cfg, _ = _ours(preset, n_layer=2)
    gelu = getattr(getattr(ours.blocks[0].ffn, "act", None), "approximate", "none")
    theirs = ref.GPT(model_cfg, gelu)
    ours.double()
    theirs.load_ours(ours.state_dict())
    theirs.double()
    ids = np.random.default_rng(0).integers(0, model_cfg.vocab_size, size=(2, 16))
    want, _ = ours(ids, ids)
    got, _ = theirs(torch.from_numpy(ids), torch.from_numpy(ids))
    np.testing.assert_allclose(got.detach().numpy(), want.data, rtol=0, atol=1e-10)


def test_fused_projection_stacks_q_k_v_in_order():
    ours, _, _ = _ours("shakespeare-char-modern", n_layer=1)
    state = ours.state_dict()
    fused = ref.nanogpt_names(state)["transformer.h.0.attn.c_attn.weight"]
    want = np.concatenate([state[f"blocks.0.attn.{n}.weight"] for n in ("wq", "wk", "wv")])
    np.testing.assert_array_equal(fused, want)


def test_load_ours_names_the_mismatch():
    ours, model_cfg, _ = _ours("shakespeare-char", n_layer=1)
    state = ours.state_dict()
    state.pop("norm_f.weight")
    with pytest.raises(KeyError, match="transformer.ln_f.weight"):
        ref.GPT(model_cfg).load_ours(state)


@pytest.mark.summation_order
def test_training_repeats_our_losses(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "data"))
    from decoder.training.loop import train

    rng = np.random.default_rng(0)
    text = "".join(rng.choice(list("abcdefghij ,.\n"), size=4000))
    tokenizer = CharTokenizer.from_text(text)
    model_cfg, train_cfg = build_configs(
        "tiny",
        vocab_size=tokenizer.vocab_size,
        max_iters=5,
        warmup_iters=2,
        eval_iters=2,
        sample_tokens=0,
    )
    ours = train(model_cfg, train_cfg, text, tmp_path / "run", progress=False)

    mg.manual_seed(train_cfg.seed)  # our initial weights, as decoder.train makes them
    model = Decoder(model_cfg)
    gelu = model.blocks[0].ffn.act.approximate
    data = TokenDataset(tokenizer.encode(text))
    theirs = ref.train_reference(
        model_cfg, train_cfg, data, model.state_dict(), gelu=gelu, progress=False
    )
    np.testing.assert_allclose(theirs["losses"], ours["losses"], rtol=0, atol=2e-6)
    assert theirs["val_loss"] == pytest.approx(ours["val_loss"], abs=2e-5)


def test_generate_crops_the_context_to_block_size():
    model_cfg = dataclasses.replace(build_configs("tiny")[0], block_size=8)
    model = ref.GPT(model_cfg).eval()
    torch.manual_seed(0)
    out = model.generate(torch.zeros((1, 3), dtype=torch.long), 12, temperature=0.8, top_k=5)
    assert out.shape == (1, 15)  # 12 new tokens, the last 8 of them made from a cropped context
    assert int(out.max()) < model_cfg.vocab_size
