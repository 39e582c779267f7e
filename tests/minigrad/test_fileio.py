"""Tests of minigrad.fileio.atomic_write: the old file survives a failed write, no temporary
file is left, the new file gets the umask's mode, and the bytes and the rename are synced."""

import os
import re
import stat
from pathlib import Path

import pytest

from minigrad import fileio
from minigrad.fileio import atomic_write


def test_writes_bytes_and_text(tmp_path):
    with atomic_write(tmp_path / "b.bin") as f:
        f.write(b"\x00\x01")
    with atomic_write(tmp_path / "t.txt", text=True) as f:
        f.write("h\u00e9\n")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "t.txt").read_bytes() == "h\u00e9\n".encode()
    assert sorted(os.listdir(tmp_path)) == ["b.bin", "t.txt"]


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_the_file_gets_the_umask_mode(tmp_path, umask):
    previous = os.umask(umask)
    try:
        with atomic_write(tmp_path / "new.json", text=True) as f:
            f.write("{}")
        (tmp_path / "old.json").write_text("{}")
        with atomic_write(tmp_path / "old.json", text=True) as f:  # replacing keeps it too
            f.write("[]")
    finally:
        os.umask(previous)
    for name in ("new.json", "old.json"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o666 & ~umask, name


@pytest.mark.parametrize("where", ["write", "fsync", "replace", "interrupt"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch, where):
    path = tmp_path / "ckpt.bin"
    path.write_bytes(b"old")

    def disk_full(*args):
        raise OSError(28, "No space left on device")

    if where == "fsync":
        monkeypatch.setattr(fileio.os, "fsync", disk_full)
    if where == "replace":
        monkeypatch.setattr(fileio.os, "replace", disk_full)
    error = KeyboardInterrupt if where == "interrupt" else OSError
    with pytest.raises(error):
        with atomic_write(path) as f:
            f.write(b"new, half")
            if where == "write":
                disk_full()
            if where == "interrupt":
                raise KeyboardInterrupt
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["ckpt.bin"]
    with pytest.raises(error):  # and a file that did not exist stays absent
        with atomic_write(tmp_path / "new.bin") as f:
            if where in ("write", "interrupt"):
                raise error
    assert os.listdir(tmp_path) == ["ckpt.bin"]


def test_the_bytes_and_the_folder_are_synced(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(fileio.os, "fsync", fsync)
    with atomic_write(tmp_path / "x.bin") as f:
        f.write(b"x")
    assert synced == [False, True]  # the file first, then the folder's new entry


def test_no_second_atomic_write_or_serializer():
    # one mechanism each: a new os.replace or mkstemp is a second atomic write, np.savez a
    # second serializer (checkpoints are safetensors)
    root = Path(__file__).resolve().parents[2]
    second = re.compile(r"\bos\.replace\(|\bmkstemp\(|\.savez(_compressed)?\(|\bpickle\.")
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for package in ("minigrad", "decoder")
        for path in sorted((root / package).rglob("*.py"))
        if path.name != "fileio.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if second.search(line)
    ]
    assert not found, "use minigrad.fileio.atomic_write / minigrad.serialization:\n" + "\n".join(
        found
    )
