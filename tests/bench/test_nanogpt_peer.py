"""bench/nanogpt_peer.py: the data nanoGPT's prepare.py would write, and the reading of its
per-iteration times (running nanoGPT itself is the bench's job, on a GPU)."""

from __future__ import annotations

import doctest
import importlib.util
import pickle
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).parents[2] / "bench" / "nanogpt_peer.py"
spec = importlib.util.spec_from_file_location("nanogpt_peer", SCRIPT)
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)


def test_doctests():
    assert doctest.testmod(peer).failed == 0


def test_prepare_writes_nanogpt_s_character_data(tmp_path, monkeypatch):
    text = "to be, or not to be: that is the question.\n" * 30
    monkeypatch.setattr("decoder.text.data.load_shakespeare", lambda: text)
    (tmp_path / "train.py").write_text("")  # a checkout, as far as prepare can tell
    folder = peer.prepare(tmp_path)
    meta = pickle.loads((folder / "meta.pkl").read_bytes())
    assert meta["itos"] == dict(enumerate(sorted(set(text)))) and meta["vocab_size"] == 17
    ids = [np.fromfile(folder / f"{name}.bin", dtype=np.uint16) for name in ("train", "val")]
    n = int(len(text) * 0.9)  # the first 90% for training, as prepare.py splits
    assert "".join(meta["itos"][int(i)] for i in ids[0]) == text[:n]
    assert "".join(meta["itos"][int(i)] for i in ids[1]) == text[n:]


def test_prepare_refuses_a_folder_without_nanogpt(tmp_path):
    with pytest.raises(SystemExit, match="holds no train.py"):
        peer.prepare(tmp_path)
