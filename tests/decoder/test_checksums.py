"""SHA-256 records beyond a checkpoint's own (issue 28): an adapter folder records its adapters
and the base's tokenizer, a merged Hugging Face model its files; every load checks them, and
``--no-verify`` (or MINIGRAD_NO_VERIFY=1) skips the checks for files too large to hash."""

from __future__ import annotations

import json

import pytest

from decoder.hf.config import PretrainedError, config_from_hf
from decoder.hf.pretrained import CHECKSUMS, load_pretrained, save_pretrained
from decoder.model.model import Decoder
from decoder.post.lora import ADAPTERS, SETTINGS, finetune, load_adapted, merge
from decoder.text.data import NO_VERIFY
from decoder.training.checkpoint import CheckpointError, load_checkpoint, load_model
from tests.decoder.test_cli import run_cli
from tests.decoder.test_one_line_errors import assert_one_line, run_dir  # noqa: F401 (fixture)
from tests.decoder.test_pretrained import LLAMA_CONFIG

CHANGED = "its SHA-256 is not the one recorded in"
VOCAB = {"a": 0, "b": 1, "ab": 2, "c": 3, "d": 4}
TOKENIZER = {
    "model": {"type": "BPE", "vocab": VOCAB, "merges": ["a b"]},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
    "decoder": {"type": "ByteLevel"},
}


@pytest.fixture(autouse=True)
def _token_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(NO_VERIFY, raising=False)


def flip_last_byte(path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x01  # one bit of the last tensor's last value: still a valid file
    path.write_bytes(bytes(raw))


def edit_tokenizer(path) -> None:
    """The same tokens under other ids: c and d swapped."""
    spec = json.loads(path.read_text())
    spec["model"]["vocab"] |= {"c": 4, "d": 3}
    path.write_text(json.dumps(spec))


@pytest.fixture
def adapted(tmp_path):
    """A tiny Llama-family base with its own tokenizer.json, fine-tuned for two steps."""
    base = tmp_path / "base"
    config, _ = config_from_hf(LLAMA_CONFIG)
    save_pretrained(Decoder(config), base)
    (base / "tokenizer.json").write_text(json.dumps(TOKENIZER))
    out = tmp_path / "lora"
    text = "abcddcabcabd" * 200
    finetune(base, text, out, max_iters=2, progress=False, pretrained=True, block_size=16)
    return base, out


# ---- our checkpoints ------------------------------------------------------------------------
def test_no_verify_loads_a_checkpoint_whose_weights_changed(run_dir, tmp_path, monkeypatch):  # noqa: F811
    copy = tmp_path / "ckpt"
    copy.mkdir()
    for file in load_checkpoint(run_dir).path.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    flip_last_byte(copy / "model.safetensors")
    args = ["--checkpoint", str(copy), "--max-new-tokens", "2"]
    assert_one_line(run_cli("decoder.generate", *args), CHANGED, "--no-verify")
    assert run_cli("decoder.generate", *args, "--no-verify").returncode == 0
    monkeypatch.setenv(NO_VERIFY, "1")  # the variable the flag sets
    assert run_cli("decoder.generate", *args).returncode == 0


# ---- an adapter folder ----------------------------------------------------------------------
def test_adapters_record_their_file_and_the_bases_tokenizer(adapted):
    base, out = adapted
    settings = json.loads((out / SETTINGS).read_text())
    assert set(settings["sha256"]) == {ADAPTERS} and len(settings["tokenizer_sha256"]) == 64
    load_adapted(out)  # as saved: checks pass


def test_a_flipped_byte_in_the_adapters_is_refused(adapted, monkeypatch):
    _, out = adapted
    flip_last_byte(out / ADAPTERS)
    with pytest.raises(CheckpointError, match=rf"{ADAPTERS}: {CHANGED} .*{SETTINGS}"):
        load_adapted(out)
    monkeypatch.setenv(NO_VERIFY, "1")
    load_adapted(out)


def test_a_base_tokenizer_edited_since_the_fine_tune_is_refused(adapted, monkeypatch):
    base, out = adapted
    edit_tokenizer(base / "tokenizer.json")
    with pytest.raises(CheckpointError, match=rf"tokenizer\.json: {CHANGED} .*{SETTINGS}"):
        load_adapted(out)
    monkeypatch.setenv(NO_VERIFY, "1")
    load_adapted(out)


# ---- a merged model ---------------------------------------------------------------------------
@pytest.mark.parametrize("change", ["tokenizer", "weights"])
def test_a_merged_model_is_tied_to_its_tokenizer_and_weights(adapted, tmp_path, change):
    _, out = adapted
    merged = merge(out, tmp_path / "merged")
    record = json.loads((merged / CHECKSUMS).read_text())
    assert set(record) == {"config.json", "model.safetensors", "tokenizer.json"}
    load_pretrained(merged)
    if change == "tokenizer":
        edit_tokenizer(merged / "tokenizer.json")
    else:
        flip_last_byte(merged / "model.safetensors")
    with pytest.raises(PretrainedError, match=rf"{CHANGED} .*{CHECKSUMS}"):
        load_pretrained(merged)
    result = run_cli("decoder.generate", "--from-pretrained", str(merged), "--prompt", "ab")
    assert_one_line(result, CHANGED, "--no-verify")
    args = ["--from-pretrained", str(merged), "--prompt", "ab", "--max-new-tokens", "2"]
    assert run_cli("decoder.generate", *args, "--no-verify").returncode == 0


def test_a_merged_checkpoint_is_tied_to_its_tokenizer(run_dir, tmp_path):  # noqa: F811
    out = tmp_path / "lora"
    finetune(run_dir, "the cat sat on a mat.\n" * 80, out, max_iters=2, progress=False)
    merged = merge(out, tmp_path / "merged")
    tokenizer = merged / "tokenizer.json"
    spec = json.loads(tokenizer.read_text())
    tokenizer.write_text(json.dumps({**spec, "chars": spec["chars"][::-1]}))  # other ids
    with pytest.raises(CheckpointError, match=rf"tokenizer\.json: {CHANGED} state\.json"):
        load_model(merged)
