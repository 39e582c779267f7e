"""decoder.training.rundir: one run per directory, no run replaced by accident, failed starts
cleaned."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from decoder.training.rundir import LOCK, RunDirError, claim_dir

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS, RESULT = ("result.txt", "ckpt-*"), "result.txt"


def test_a_second_claim_names_the_holder_and_the_first_keeps_its_files(tmp_path):
    run = tmp_path / "run"
    with claim_dir(run, OUTPUTS, RESULT) as path:
        details = json.loads((path / LOCK).read_text())
        assert details["pid"] == os.getpid() and details["host"] == socket.gethostname()
        (path / RESULT).write_text("mine")
        # subtle: flock locks an open file, so a second open in this process is refused too
        holder = f"pid {os.getpid()} on {socket.gethostname()}, started {details['started']}"
        with pytest.raises(RunDirError, match=re.escape(f"in use by another run ({holder})")):
            with claim_dir(run, OUTPUTS, RESULT, overwrite=True):
                pass
        assert (path / RESULT).read_text() == "mine"
    assert sorted(p.name for p in run.iterdir()) == [RESULT]  # the lock file is gone


def test_a_killed_holder_leaves_no_lock(tmp_path):
    run = tmp_path / "run"
    holder = (
        "import os, signal, sys\n"
        "from decoder.training.rundir import claim_dir\n"
        "with claim_dir(sys.argv[1], ('x',), 'x'):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", holder, str(run)], env=env, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert (run / LOCK).exists()  # the file stays, but the OS dropped its lock
    with claim_dir(run, ("x",), "x", resume=True):
        assert json.loads((run / LOCK).read_text())["pid"] == os.getpid()


def test_a_previous_run_is_refused_unless_resumed_or_overwritten(tmp_path):
    (tmp_path / RESULT).write_text("old")
    (tmp_path / "ckpt-000004").mkdir()
    (tmp_path / "notes.txt").write_text("the user's")
    with pytest.raises(RunDirError, match=r"holds a previous run \(ckpt-000004, result.txt\)"):
        with claim_dir(tmp_path, OUTPUTS, RESULT):
            pass
    with claim_dir(tmp_path, OUTPUTS, RESULT, resume=True):
        assert (tmp_path / RESULT).read_text() == "old"
    with pytest.raises(ValueError, match="failed start"):  # the overwritten run comes back
        with claim_dir(tmp_path, OUTPUTS, RESULT, overwrite=True):
            assert _visible(tmp_path) == ["notes.txt"]
            (tmp_path / "ckpt-000001").mkdir()
            raise ValueError("a failed start")
    assert _visible(tmp_path) == ["ckpt-000004", "notes.txt", RESULT]
    assert (tmp_path / RESULT).read_text() == "old"
    with claim_dir(tmp_path, OUTPUTS, RESULT, overwrite=True):
        (tmp_path / RESULT).write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", RESULT]
    assert (tmp_path / RESULT).read_text() == "new"


def _visible(path):
    return sorted(p.name for p in path.iterdir() if not p.name.startswith("."))


def test_a_failed_start_removes_only_what_it_created(tmp_path):
    new = tmp_path / "a" / "b"
    with pytest.raises(ValueError, match="bad input"):
        with claim_dir(new, OUTPUTS, RESULT) as path:
            (path / "log.jsonl").write_text("{}\n")
            raise ValueError("bad input")
    assert not (tmp_path / "a").exists()

    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("the user's")
    with pytest.raises(KeyboardInterrupt):
        with claim_dir(existing, OUTPUTS, RESULT):
            raise KeyboardInterrupt
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]

    with pytest.raises(ValueError, match="later"):  # a result landed: the directory stays
        with claim_dir(tmp_path / "c", OUTPUTS, RESULT) as path:
            (path / RESULT).write_text("saved")
            raise ValueError("later")
    assert (tmp_path / "c" / RESULT).read_text() == "saved"
