"""decoder.checkpoint: round trips, atomic replacement, and clear errors on broken checkpoints."""

import json

import numpy as np
import pytest

import decoder.checkpoint as ck
from decoder.checkpoint import CheckpointError, load_checkpoint, load_model, save_checkpoint
from decoder.config import build_configs
from decoder.model import Decoder
from decoder.tokenizer import CharTokenizer
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

    if failing == "optimizer":  # in the middle of the new directory
        monkeypatch.setattr(ck.np, "savez", disk_full)
    else:  # the new directory is complete, but the pointer cannot be moved to it
        monkeypatch.setattr(ck, "atomic_write_text", disk_full)
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
    (ckpt_dir / "optimizer.npz").write_bytes(b"not a zip file")
    with pytest.raises(CheckpointError, match=r"optimizer\.npz: cannot be read"):
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


def test_tokenizer_that_does_not_match_the_model(saved):
    run, ckpt_dir = saved
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
