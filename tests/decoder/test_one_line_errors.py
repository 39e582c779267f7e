"""Inputs that used to end in a traceback end in one line naming the problem and the fix
(issue 28): sizes too large for the machine's memory, a length penalty that overflows,
malformed tokenizer.json, config.json and shard index files, JSON nested thousands deep,
a damaged state.json, a shard worker whose trainer was killed, and NumPy's warnings before
a NaN stop."""

from __future__ import annotations

import json
import multiprocessing
import struct
import warnings

import numpy as np
import pytest

import decoder.train as tr
from decoder.cli import run_command
from decoder.hf.config import PretrainedError, config_from_hf
from decoder.hf.pretrained import from_pretrained
from decoder.hf.tokenizer import HFTokenizer
from decoder.training import shards as shards_module
from decoder.training.checkpoint import STATE, WEIGHTS, CheckpointError, load_checkpoint
from decoder.training.config import build_configs
from decoder.training.loop import train
from decoder.training.step import lm_loss
from tests.decoder.test_cli import make_text, run_cli
from tests.decoder.test_pretrained import GPT2_CONFIG, LLAMA_CONFIG

WORDS = ["the", "cat", "sat", "on", "a", "mat"]


@pytest.fixture(autouse=True)
def _token_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(make_text(WORDS), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    model_cfg, train_cfg = build_configs(
        "tiny", max_iters=2, warmup_iters=1, eval_iters=1, batch_size=2, block_size=16,
        sample_tokens=0,
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIGRAD_DATA_DIR", str(run / "cache"))
        train(model_cfg, train_cfg, make_text(WORDS), run, progress=False)
    return run


def assert_one_line(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1, result.stderr
    for fragment in fragments:
        assert fragment in error[0], error[0]


# ---- memory ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "setting, fix",
    [
        ("--batch_size=10000000000", "lower --batch_size or --block_size"),
        ("--block_size=10000000000", "lower --batch_size or --block_size"),
        ("--n_embd=10000000000", "lower --n_embd"),
    ],
)
def test_a_size_beyond_the_machines_memory_is_refused_before_allocating(
    tmp_path, text_file, setting, fix
):
    out = tmp_path / "run"
    args = ["--preset", "tiny", "--data", str(text_file), "--out", str(out), "--max_iters=1"]
    result = run_cli("decoder.train", *args, "--warmup_iters=0", setting)
    assert_one_line(result, "this needs at least", "GiB of memory", fix)


def test_a_memory_error_past_the_check_is_one_line(capsys):
    def body():
        raise MemoryError("Unable to allocate 74.5 GiB for an array with shape (10000000000,)")

    assert run_command(body) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: out of memory (Unable to allocate 74.5 GiB")
    assert "lower --batch_size, --block_size or --n_embd" in err


def test_a_config_claiming_two_billion_positions_asks_for_block_size(tmp_path):
    config = {**LLAMA_CONFIG, "max_position_embeddings": 2**31, "hidden_size": 4096,
              "num_attention_heads": 32}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = run_cli("decoder.generate", "--from-pretrained", str(tmp_path))
    assert_one_line(result, "the position tables", "with --block-size")


# ---- generate -------------------------------------------------------------------------------
@pytest.mark.parametrize("penalty", ["1e300", "-1e300", "nan"])
def test_a_length_penalty_that_would_overflow_is_refused(run_dir, penalty):
    args = ["--checkpoint", str(run_dir), "--beam-width", "2", "--max-new-tokens", "4"]
    result = run_cli("decoder.generate", *args, f"--length-penalty={penalty}")
    assert_one_line(result, "choose between -10 and 10")


# ---- Hugging Face files ---------------------------------------------------------------------
BYTE_LEVEL = {
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
    "decoder": {"type": "ByteLevel"},
    "added_tokens": [{"content": "<s>", "id": 3}],
}


STEPS = "its normalizer, pre_tokenizer or decoder is not in the format"


def deep(depth: int) -> dict:
    return {**BYTE_LEVEL, "decoder": json.loads("[" * depth + "]" * depth)}


@pytest.mark.parametrize(
    "spec, message",
    [
        ([], "its model is a JSON list, not a tokenizer object"),
        (None, "its model is a JSON NoneType, not a tokenizer object"),
        ({**BYTE_LEVEL, "model": {**BYTE_LEVEL["model"], "merges": [5]}}, "model.merges[0] is 5"),
        ({**BYTE_LEVEL, "model": {**BYTE_LEVEL["model"], "merges": 5}}, "model.merges[0] is 5"),
        (
            {**BYTE_LEVEL, "model": {**BYTE_LEVEL["model"], "vocab": {"a": "0"}}},
            "model.vocab maps 'a' to '0': each token needs an integer id",
        ),
        ({**BYTE_LEVEL, "added_tokens": [{"content": "<s>"}]}, "added_tokens maps '<s>' to None"),
        ({**BYTE_LEVEL, "normalizer": {"type": ["x"]}}, STEPS),
        ({**BYTE_LEVEL, "pre_tokenizer": 7}, STEPS),
        (deep(900), "nested more than 100 deep"),
    ],
)
def test_a_malformed_tokenizer_json_is_named(tmp_path, spec, message):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="download") as info:
        HFTokenizer(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_the_well_formed_tokenizer_above_reads(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps(BYTE_LEVEL))
    assert HFTokenizer(tmp_path / "tokenizer.json").encode("ab") == [2]


def test_a_tokenizer_json_nested_thousands_deep_is_named(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(ValueError, match="nested more than 100 deep"):
        HFTokenizer(path)


@pytest.mark.parametrize("field", ["num_attention_heads", "hidden_size", "vocab_size"])
@pytest.mark.parametrize("value", ["2", 2.0, True, 0])
def test_a_size_in_config_json_that_is_not_a_count_is_named(field, value):
    with pytest.raises(PretrainedError, match=f"config.json sets {field}={value!r}, but a size"):
        config_from_hf({**LLAMA_CONFIG, field: value})


def test_a_shard_index_whose_weight_map_is_a_list_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GPT2_CONFIG))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": []}))
    with pytest.raises(PretrainedError, match="its weight_map is a list, not an object mapping"):
        from_pretrained(tmp_path)


# ---- our checkpoints ------------------------------------------------------------------------
def test_a_weights_header_nested_thousands_deep_is_one_line(run_dir, tmp_path):
    ckpt = load_checkpoint(run_dir).path
    copy = tmp_path / "ckpt"
    copy.mkdir()
    for name in (STATE, "tokenizer.json"):
        (copy / name).write_bytes((ckpt / name).read_bytes())
    text = ('{"a": ' + "[" * 5000 + "]" * 5000 + "}").encode()
    (copy / WEIGHTS).write_bytes(struct.pack("<Q", len(text)) + text)
    result = run_cli("decoder.generate", "--checkpoint", str(copy))
    assert_one_line(result, str(copy / WEIGHTS), "nested more than 100 deep")


@pytest.mark.parametrize("extra", [[1, 2], "x", None])
def test_a_state_json_whose_extra_is_not_an_object_is_named(run_dir, tmp_path, extra):
    ckpt = load_checkpoint(run_dir).path
    copy = tmp_path / "ckpt"
    copy.mkdir()
    for name in (WEIGHTS, "tokenizer.json"):
        (copy / name).write_bytes((ckpt / name).read_bytes())
    state = json.loads((ckpt / STATE).read_text())
    (copy / STATE).write_text(json.dumps({**state, "extra": extra}))
    with pytest.raises(CheckpointError, match=f"'extra' is a {type(extra).__name__}, not an"):
        load_checkpoint(copy)


# ---- a run that stops ------------------------------------------------------------------------
def test_a_nan_stop_prints_no_numpy_warnings(tmp_path, text_file, capsys):
    args = ["--preset", "tiny", "--data", str(text_file), "--out", str(tmp_path / "run")]
    args += ["--max_iters=30", "--warmup_iters=0", "--eval_iters=1", "--lr=1e6"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tr.main(args) == 1
    assert "the loss is nan" in capsys.readouterr().err
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []


class _ResetConnection:
    """A pipe end whose peer was killed: the kernel resets the connection."""

    def recv(self):
        raise ConnectionResetError(104, "Connection reset by peer")


@pytest.mark.skipif(not shards_module.fork_available(), reason="no fork here")
def test_a_shard_worker_whose_trainer_was_killed_exits_quietly():
    # forked, so that the worker's own settings (SIGINT ignored, one BLAS thread) stay there
    args = (None, [], [np.zeros(1)], _ResetConnection(), lm_loss, [])
    worker = multiprocessing.get_context("fork").Process(target=shards_module._serve, args=args)
    worker.start()
    worker.join(timeout=30)
    assert worker.exitcode == 0  # an exception would print its traceback and exit with 1


def test_generate_reports_every_error_a_user_can_fix_in_one_line(tmp_path, monkeypatch, capsys):
    import decoder.generate as gen

    def out_of_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 80.0 GiB")

    monkeypatch.setattr(gen, "load_model", out_of_memory)
    monkeypatch.setattr(gen, "check_checkpoint_dir", lambda path: None)
    assert gen.main(["--checkpoint", str(tmp_path)]) == 2  # not a traceback
    assert "error: out of memory (Unable to allocate 80.0 GiB)" in capsys.readouterr().err


def test_finetune_merge_takes_no_verify(capsys):
    import decoder.finetune as ft

    with pytest.raises(SystemExit):
        ft.main(["merge", "--help"])
    assert "--no-verify" in capsys.readouterr().out
