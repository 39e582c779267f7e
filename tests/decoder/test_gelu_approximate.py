"""ModelConfig.gelu_approximate: which GELU the MLP of ffn="gelu" computes (issue 15).

Holds: each GELU preset has its source's form (nanoGPT's exact nn.GELU() for shakespeare-char
and baby-gpt, GPT-2's tanh for the GPT-2-style ones), the field is checked and set from the
command line, and a run saved before the field existed loads and resumes with the tanh GELU it
was trained with, never silently switching. Hugging Face's names for the two forms are tested
in test_pretrained.py.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from decoder import cli
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.text.tokenizer import CharTokenizer
from decoder.training import run as tr
from decoder.training.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_model,
    save_checkpoint,
)
from decoder.training.config import build_configs


def _form(model: Decoder) -> str:
    """The ``approximate`` of every block's GELU, which must agree."""
    (form,) = {block.ffn.act.approximate for block in model.blocks}
    return form


@pytest.mark.parametrize(
    "preset, form",
    [
        ("shakespeare-char", "none"),  # nanoGPT's CPU run: its MLP's nn.GELU() is exact
        ("baby-gpt", "none"),  # nanoGPT's GPU run: the same model.py
        ("gpt2", "tanh"),  # GPT-2's checkpoints use gelu_new, the tanh form
        ("gpt2-pre", "tanh"),
        ("gpt3", "tanh"),  # GPT-3 kept GPT-2's model and its GELU
        ("tiny", "tanh"),  # the default: what every run before the field had
    ],
)
def test_each_gelu_preset_has_its_sources_form_in_config_and_model(preset, form):
    model_cfg, _ = build_configs(preset, n_layer=2, n_embd=16, n_head=2, block_size=8)
    assert model_cfg.gelu_approximate == form
    assert _form(Decoder(model_cfg)) == form  # make_ffn passes it on to the MLP


@pytest.mark.parametrize(
    "settings, match",
    [
        (dict(gelu_approximate="erf"), r"gelu_approximate='erf' is not one of \('tanh', 'none'\)"),
        (dict(gelu_approximate=None), r"ModelConfig.gelu_approximate must be of type str"),
        (
            dict(ffn="swiglu", gelu_approximate="none"),
            r"gelu_approximate='none' is for the GELU of ffn='gelu', but ffn='swiglu' has none: "
            r"set --ffn=gelu or drop it",
        ),
    ],
)
def test_the_field_is_checked(settings, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**settings)


def test_the_command_line_sets_it():
    overrides = cli.parse_overrides(["--gelu-approximate", "tanh"])
    assert overrides == {"gelu_approximate": "tanh"}
    model_cfg, _ = build_configs("shakespeare-char", overrides)
    assert model_cfg.gelu_approximate == "tanh"
    assert build_configs("gpt2", {"gelu_approximate": "none"})[0].gelu_approximate == "none"
    with pytest.raises(ValueError, match="gelu_approximate='exact' is not one of"):
        build_configs("tiny", {"gelu_approximate": "exact"})


def test_another_ffn_drops_the_presets_gelu_but_not_one_given_with_it():
    # shakespeare-char is the default preset: `--ffn=moe` alone must still work on it
    for ffn in ("swiglu", "moe"):
        assert build_configs("shakespeare-char", {"ffn": ffn})[0].gelu_approximate == "tanh"
    with pytest.raises(ValueError, match="is for the GELU of ffn='gelu', but ffn='swiglu'"):
        build_configs("shakespeare-char", {"ffn": "swiglu", "gelu_approximate": "none"})


# ---- runs saved before the field existed ------------------------------------------------------
TEXT = "to be or not to be, that is the question\n"


def _old_run(run, preset: str) -> None:
    """A checkpoint of ``preset``'s model whose state.json lacks gelu_approximate, as every
    run saved before the field existed (trained with the then hard-coded tanh GELU)."""
    tok = CharTokenizer.from_text(TEXT)
    model_cfg, train_cfg = build_configs(preset, vocab_size=tok.vocab_size)
    # what the MLP then computed, whatever the preset
    model_cfg = dataclasses.replace(model_cfg, gelu_approximate="tanh")
    ckpt_dir = save_checkpoint(
        run,
        step=1,
        model_state=Decoder(model_cfg).state_dict(),
        model_config=model_cfg,
        train_config=train_cfg,
        tokenizer=tok.to_dict(),
    )
    state = json.loads((ckpt_dir / "state.json").read_text())
    del state["model_config"]["gelu_approximate"]
    (ckpt_dir / "state.json").write_text(json.dumps(state))


def test_a_saved_config_without_the_field_loads_as_tanh(tmp_path):
    _old_run(tmp_path, "shakespeare-char")
    assert load_checkpoint(tmp_path).model_config.gelu_approximate == "tanh"
    model, _, _ = load_model(tmp_path)
    assert _form(model) == "tanh"
    x = np.arange(8)[None]
    assert np.isfinite(model(x)[0].numpy()).all()


def test_resuming_an_old_run_keeps_its_tanh_gelu(tmp_path):
    _old_run(tmp_path, "shakespeare-char")
    model_cfg, _, _ = tr.resume_configs(tmp_path, None, {})
    assert model_cfg.gelu_approximate == "tanh"  # the run's own, not the preset's "none"
    # naming the preset whose GELU has since changed is refused, naming the difference
    with pytest.raises(CheckpointError, match=r"gelu_approximate: 'tanh' -> 'none'"):
        tr.resume_configs(tmp_path, "shakespeare-char", {})
    # nor can the new form be forced on the saved weights with an override
    model_cfg, train_cfg, saved = tr.resume_configs(tmp_path, None, {"gelu_approximate": "none"})
    with pytest.raises(CheckpointError, match=r"model differs .*gelu_approximate: 'tanh' -> "):
        tr._check_resume(saved, model_cfg, train_cfg, fingerprint="")
