"""decoder.training.checkpoint: round trips, atomic replacement, loads during saves, and clear
errors on broken, crafted or old checkpoints."""

import json
import os
import stat
import struct
import threading
import time

import numpy as np
import pytest

import decoder.training.checkpoint as ck
from decoder.model.model import Decoder
from decoder.text.tokenizer import CharTokenizer
from decoder.training.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_model,
    save_checkpoint,
)
from decoder.training.config import build_configs
from minigrad.optim import AdamW

TEXT = "to be or not to be, that is the question\n"


def _parts(seed=0):
    tok = CharTokenizer.from_text(TEXT)
    model_cfg, train_cfg = build_configs("tiny", vocab_size=tok.vocab_size, n_layer=1)
    model = Decoder(model_cfg)
    opt = AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():  # one step, so the optimiser has moments to save
        p.grad = np.full(p.shape, 0.1, dtype=p.dtype)
    opt.step()
    rng = np.random.default_rng(seed)
    rng.random(3)
    return model, opt, tok, model_cfg, train_cfg, rng


def _save(run, step, model, opt, tok, model_cfg, train_cfg, rng):
    return save_checkpoint(
        run,
        step=step,
        model_state=model.state_dict(),
        model_config=model_cfg,
        train_config=train_cfg,
        tokenizer=tok.to_dict(),
        optimizer_state=opt.state_dict(),
        rng={"batches": rng.bit_generator.state},
        extra={"note": "hello"},
    )


def test_round_trip(tmp_path):
    model, opt, tok, model_cfg, train_cfg, rng = _parts()
    path = _save(tmp_path, 7, model, opt, tok, model_cfg, train_cfg, rng)
    assert path == tmp_path / "ckpt-000007"
    assert (tmp_path / "latest").read_text().strip() == "ckpt-000007"
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.step == 7 and ckpt.model_config == model_cfg and ckpt.train_config == train_cfg
    assert ckpt.extra == {"note": "hello"} and ckpt.tokenizer == tok.to_dict()
    for name, array in model.state_dict().items():
        np.testing.assert_array_equal(ckpt.weights[name], array)
    # the optimiser's state comes back loadable, with equal moments
    opt2 = AdamW(Decoder(model_cfg).parameters(), lr=1e-3)
    opt2.load_state_dict(ckpt.optimizer)
    for i, state in opt.state.items():
        np.testing.assert_array_equal(opt2.state[i]["exp_avg_sq"], state["exp_avg_sq"])
        assert opt2.state[i]["step"] == state["step"] == 1
    # the generator continues where it was saved
    restored = np.random.default_rng()
    restored.bit_generator.state = ckpt.rng["batches"]
    assert restored.random() == rng.random()


def test_one_serializer_no_npz(tmp_path):
    path = _save(tmp_path, 7, *_parts())
    names = sorted(p.name for p in path.iterdir())
    assert names == ["model.safetensors", "optimizer.safetensors", "state.json", "tokenizer.json"]


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
def test_files_and_directories_get_the_umask_mode(tmp_path):
    previous = os.umask(0o022)
    try:
        path = _save(tmp_path, 7, *_parts())
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755  # not mkdtemp's 0o700
    for f in [*path.iterdir(), tmp_path / "latest"]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f.name  # not mkstemp's 0o600


def test_a_new_checkpoint_replaces_the_old_one(tmp_path):
    parts = _parts()
    _save(tmp_path, 1, *parts)
    _save(tmp_path, 2, *parts)
    _save(tmp_path, 2, *parts)  # the same step twice gets a fresh directory
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-000002-1", "latest"]
    assert load_checkpoint(tmp_path).step == 2


@pytest.mark.parametrize("failing", ["optimizer", "latest"])
def test_a_failure_mid_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch, failing):
    model, opt, tok, model_cfg, train_cfg, rng = _parts()
    _save(tmp_path, 1, model, opt, tok, model_cfg, train_cfg, rng)
    before = load_checkpoint(tmp_path).weights

    def disk_full(*args, **kwargs):  # fails after the weights are already written
        raise OSError("No space left on device")

    real_atomic_write = ck.atomic_write

    def pointer_disk_full(path, *args, **kwargs):
        if os.path.basename(path) == "latest":
            disk_full()
        return real_atomic_write(path, *args, **kwargs)

    if failing == "optimizer":  # in the middle of the new directory
        monkeypatch.setattr(ck, "save_tree", disk_full)
    else:  # the new directory is complete, but the pointer cannot be moved to it
        monkeypatch.setattr(ck, "atomic_write", pointer_disk_full)
    for p in model.parameters():
        p.data += 1.0
    with pytest.raises(OSError, match="No space left"):
        _save(tmp_path, 2, model, opt, tok, model_cfg, train_cfg, rng)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000001", "latest"]  # no debris
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.step == 1
    for name, array in before.items():
        np.testing.assert_array_equal(ckpt.weights[name], array)


@pytest.fixture
def saved(tmp_path):
    _save(tmp_path, 3, *_parts())
    return tmp_path, tmp_path / "ckpt-000003"


def test_missing_file_is_named(saved):
    run, ckpt_dir = saved
    (ckpt_dir / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: missing"):
        load_checkpoint(run)
    (ckpt_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing"):
        load_checkpoint(run)


def test_truncated_weights_are_named(saved):
    run, ckpt_dir = saved
    path = ckpt_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*truncated"):
        load_checkpoint(run)


def test_corrupt_optimizer_and_state_are_named(saved):
    run, ckpt_dir = saved
    (ckpt_dir / "optimizer.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"optimizer\.safetensors: cannot be read"):
        load_checkpoint(run)
    assert load_checkpoint(run, with_optimizer=False).step == 3  # weights alone still load
    (ckpt_dir / "state.json").write_text("{ broken")
    with pytest.raises(CheckpointError, match=r"state\.json: not valid JSON"):
        load_checkpoint(run)


def test_config_that_does_not_match_the_weights(saved):
    run, ckpt_dir = saved
    state = json.loads((ckpt_dir / "state.json").read_text())
    state["model_config"]["n_embd"] = 64
    (ckpt_dir / "state.json").write_text(json.dumps(state))
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors: .* has shape .* but the config"
    ):
        load_model(run)
    state["model_config"]["n_embd"], state["model_config"]["n_layer"] = 32, 2
    (ckpt_dir / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=r"missing .* weights .*does not match these weights"):
        load_model(run)


def _unrecorded(ckpt_dir):
    """Drop the SHA-256 record from ``state.json``: a checkpoint saved before checksums, whose
    files only the checks after it can refuse."""
    state = json.loads((ckpt_dir / "state.json").read_text())
    del state["sha256"]
    (ckpt_dir / "state.json").write_text(json.dumps(state))


def test_tokenizer_that_does_not_match_the_model(saved):
    run, ckpt_dir = saved
    _unrecorded(ckpt_dir)
    (ckpt_dir / "tokenizer.json").write_text(json.dumps({"type": "char", "chars": "abc"}))
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: the tokenizer has 3 tokens"):
        load_model(run)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint here"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no such directory"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "latest").write_text("ckpt-000009\n")
    with pytest.raises(CheckpointError, match="names 'ckpt-000009', which is not a directory"):
        load_checkpoint(tmp_path)


def test_load_model_gives_the_saved_model_in_eval_mode(saved):
    run, _ = saved
    model, tok, ckpt = load_model(run)
    assert not model.training and tok.vocab_size == ckpt.model_config.vocab_size
    for name, array in model.state_dict().items():
        np.testing.assert_array_equal(array, ckpt.weights[name])


# ---- crafted and hand-edited files -------------------------------------------------------------
def _relabel(path, name, dtype):
    """Rewrite the safetensors header of ``path`` so that tensor ``name`` claims ``dtype``."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header[name]["dtype"] = dtype
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])


def test_a_relabelled_dtype_is_refused(saved):
    # F32 bytes read as I32 have the right length, and would load as numbers near 1e9
    run, ckpt_dir = saved
    _unrecorded(ckpt_dir)
    _relabel(ckpt_dir / "model.safetensors", "tok_emb.weight", "I32")
    with pytest.raises(
        CheckpointError, match="'tok_emb.weight' is int32, but the model holds float32"
    ):
        load_model(run)


CHANGED = (
    "its SHA-256 is not the one recorded in state.json when it was saved: the file was changed"
)


def test_a_flipped_byte_in_the_weights_is_refused(saved):
    run, ckpt_dir = saved
    path = ckpt_dir / "model.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x01  # one bit of the last tensor's last value: still a valid file
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: {CHANGED}"):
        load_model(run)


def test_two_same_shape_tensors_swapped_in_the_header_are_refused(saved):
    run, ckpt_dir = saved
    path = ckpt_dir / "model.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    a, b = (next(k for k in header if k.endswith(end)) for end in ("wq.weight", "wk.weight"))
    header[a]["data_offsets"], header[b]["data_offsets"] = (
        header[b]["data_offsets"],
        header[a]["data_offsets"],
    )
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: {CHANGED}"):
        load_model(run)


def test_a_tokenizer_edited_to_other_ids_is_refused(saved):
    run, ckpt_dir = saved
    path = ckpt_dir / "tokenizer.json"
    tok = json.loads(path.read_text())
    tok["chars"] = tok["chars"][::-1]  # the same characters and size, other ids
    path.write_text(json.dumps(tok))
    with pytest.raises(CheckpointError, match=rf"tokenizer\.json: {CHANGED}"):
        load_model(run)


def test_a_checkpoint_saved_before_checksums_loads(saved):
    run, ckpt_dir = saved
    _unrecorded(ckpt_dir)
    assert load_checkpoint(run).step == 3


def test_a_float64_run_loads_in_float64(tmp_path):
    model, opt, tok, model_cfg, train_cfg, rng = _parts()
    train_cfg = train_cfg.__class__(**{**train_cfg.__dict__, "dtype": "float64"})
    model.double()
    _save(tmp_path, 1, model, opt, tok, model_cfg, train_cfg, rng)
    loaded, _, _ = load_model(tmp_path)
    assert {a.dtype for a in loaded.state_dict().values()} == {np.dtype(np.float64)}


def test_a_pointer_out_of_the_run_is_refused(tmp_path):
    run = tmp_path / "run"
    _save(run, 3, *_parts())
    _save(tmp_path / "other", 5, *_parts())
    (run / "latest").write_text("../other/ckpt-000005\n")
    with pytest.raises(CheckpointError, match=r"latest: should hold the name of a checkpoint"):
        load_checkpoint(run)
    (run / "ckpt-000009").symlink_to(tmp_path / "other" / "ckpt-000005")
    (run / "latest").write_text("ckpt-000009\n")
    with pytest.raises(CheckpointError, match="'ckpt-000009', which leads outside"):
        load_checkpoint(run)
    for name in ("..", ".", "", "ckpt-000003/../ckpt-000003"):
        (run / "latest").write_text(name)
        with pytest.raises(CheckpointError, match="should hold the name"):
            load_checkpoint(run)


def test_a_huge_or_binary_pointer_is_quoted_in_part(saved):
    run, _ = saved
    for garbage in (b"ckpt-" * 200_000, bytes(range(256)) * 4):
        (run / "latest").write_bytes(garbage)
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(run)
        message = str(info.value)
        assert f"{run / 'latest'}: should hold" in message and f"{len(garbage)} bytes" in message
        assert len(message) < 2 * len(str(run)) + 400  # an excerpt, not the whole file


@pytest.mark.parametrize("step", [-1, "3", 2.5, True, None])
def test_a_step_that_is_not_a_count_is_refused(saved, step):
    run, ckpt_dir = saved
    state = json.loads((ckpt_dir / "state.json").read_text())
    state["step"] = step
    (ckpt_dir / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=r"state\.json: step .* is not a count"):
        load_checkpoint(run)


def _replace_with_mt19937(saved: dict) -> None:
    """A valid state of another kind of generator (restoring it gave NumPy's traceback)."""
    state = np.random.MT19937(0).state
    state["state"]["key"] = state["state"]["key"].tolist()  # as JSON holds it
    saved.clear()
    saved.update(state)


@pytest.mark.parametrize(
    "damage",
    [
        lambda s: s.pop("state"),  # a field gone
        lambda s: s["state"].update(state="garbage"),  # a field of the wrong type
        lambda s: s.update(bit_generator="NoSuchGenerator"),
        lambda s: s.update(bit_generator="default_rng"),  # a NumPy name, not a bit generator
        lambda s: s["state"].update(state=2**200),  # beyond the generator's 128 bits
        lambda s: _replace_with_mt19937(s),
    ],
)
def test_a_corrupt_rng_state_is_named(saved, damage):
    run, ckpt_dir = saved
    state = json.loads((ckpt_dir / "state.json").read_text())
    damage(state["rng"]["batches"])
    (ckpt_dir / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=r"state\.json: the state of generator 'batches'"):
        load_checkpoint(run)
    state["rng"] = ["not", "a", "dict"]
    (ckpt_dir / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=r"state\.json: 'rng' is a list"):
        load_checkpoint(run)


def test_a_format_1_checkpoint_loads_its_weights_and_refuses_to_resume(saved):
    # format 1 kept the optimiser in optimizer.npz, which this version no longer reads
    run, ckpt_dir = saved
    state = json.loads((ckpt_dir / "state.json").read_text())
    state["format"], state["optimizer"] = 1, {"state": {}, "param_groups": []}
    (ckpt_dir / "state.json").write_text(json.dumps(state))
    (ckpt_dir / "optimizer.safetensors").rename(ckpt_dir / "optimizer.npz")
    with pytest.raises(CheckpointError, match=r"optimizer\.npz: .*format-1.*no longer reads"):
        load_checkpoint(run)
    model, _, ckpt = load_model(run)  # generation and fine-tuning still work
    assert ckpt.step == 3 and ckpt.optimizer is None


# ---- a reader while a run saves -----------------------------------------------------------------
def test_loads_while_a_run_saves_never_fail(tmp_path):
    """A reader follows ``latest`` to a checkpoint that the next save removes: it must retry,
    not fail. Each save writes weights equal to its step, so a mixed read would show."""
    model, opt, tok, model_cfg, train_cfg, rng = _parts()
    _save(tmp_path, 0, model, opt, tok, model_cfg, train_cfg, rng)
    stop, errors = threading.Event(), []

    def saver():
        step = 0
        while not stop.is_set():
            step += 1
            for p in model.parameters():
                p.data[...] = step
            try:
                _save(tmp_path, step, model, opt, tok, model_cfg, train_cfg, rng)
            except Exception as e:  # reported below
                errors.append(e)
                return
            time.sleep(0.005)  # a run saves between steps, not back to back

    thread = threading.Thread(target=saver)
    thread.start()
    loads, steps = 0, set()
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            ckpt = load_checkpoint(tmp_path)
            weight = ckpt.weights["tok_emb.weight"]
            assert ckpt.step == 0 or (weight == ckpt.step).all()  # one checkpoint, not a mix
            loads += 1
            steps.add(ckpt.step)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert loads > 10 and len(steps) > 3  # the loads did overlap the saves
