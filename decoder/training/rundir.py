"""Output directories that one run at a time writes, and that no run replaces by accident.

``claim_dir`` wraps a run's whole life (training, fine-tuning, merging) and does four things:

- It takes an OS lock on ``DIR/.lock`` (``fcntl.flock``), so a second run on the same
  directory stops at once with an error naming the holder (its pid, host and start time,
  written into the lock file). The OS drops the lock when the process ends, however it ends:
  a crashed run never leaves a stale lock behind.
- It refuses a directory holding a previous run's outputs unless the caller resumes that run
  or asks to overwrite it. Overwriting moves those outputs into a hidden folder first, so
  that no old log row or checkpoint mixes with the new run's, and removes them when the run
  ends; a run killed meanwhile leaves them there (``.previous-run-*``), not lost.
- If the run fails before its result exists (a failed start), it removes what it created,
  and never anything that was there before: an overwritten run is put back.
- It removes the lock file when the run ends.

Why a lock file and not the directory itself: the file holds the holder's details. Removing
it is safe because a run that locks a file checks that the name still leads to the file it
locked, and tries again if the holder removed it in between.

Left out on purpose: waiting for the lock (two runs on one directory is a mistake to report,
not a queue), locks over NFS (flock there is only as good as the server's), and Windows
(no ``fcntl``: the directory is used unlocked there).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from minigrad.fileio import parse_json

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCK = ".lock"
_ASIDE = ".previous-run-"  # the prefix of the folder an overwritten run waits in


class RunDirError(RuntimeError):
    """An output directory that this run may not use: another run holds it, or it holds a
    previous run's outputs that this run would replace."""


@contextlib.contextmanager
def claim_dir(
    path: str | os.PathLike,
    outputs: Sequence[str],
    result: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    resumable: bool = True,
) -> Iterator[Path]:
    """Hold ``path`` for one run, as the module docstring describes; yields it as a Path.

    ``outputs`` are the names (or glob patterns) a run of this kind writes into the
    directory; ``result`` is the one whose existence means the run left something usable.
    With ``resume`` the previous outputs are expected; with ``overwrite`` they are moved
    aside, put back if the run fails before its result exists, and removed when it ends.
    ``resumable=False`` is for a command without ``--resume`` (a fine-tune, a merge): its
    refusal offers only ``--overwrite`` and another ``--out``.
    """
    path = Path(path)
    created = _first_missing(path)
    path.mkdir(parents=True, exist_ok=True)
    with _locked(path / LOCK):
        existing = _previous(path, outputs)
        if existing and not (resume or overwrite):
            again = "pass --resume to continue it, " if resumable else "pass "
            raise RunDirError(
                f"{path} holds a previous run ({', '.join(existing)}): {again}--overwrite to "
                f"replace it, or another --out"
            )
        moved = [] if resume else existing
        aside = None
        if moved:
            aside = _move(path, moved, Path(tempfile.mkdtemp(prefix=_ASIDE, dir=path)))
        try:
            yield path
        except BaseException:  # Ctrl-C too
            if not (path / result).exists():  # a failed start: remove what it wrote
                if created is not None:
                    shutil.rmtree(created, ignore_errors=True)  # all of it
                else:
                    ours = [n for n in _previous(path, outputs) if n in moved or n not in existing]
                    _remove(path, ours)
                    if aside is not None:
                        _move(aside, moved, path)  # the overwritten run comes back
            raise
        finally:
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (mkdir would create it)."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing = folder
    return missing


def _previous(path: Path, outputs: Sequence[str]) -> list[str]:
    """The names in ``path`` that match one of the ``outputs`` patterns, sorted."""
    return sorted(p for p in os.listdir(path) if any(fnmatch.fnmatch(p, o) for o in outputs))


def _move(source: Path, names: Sequence[str], target: Path) -> Path:
    """Rename each of ``names`` from ``source`` into ``target`` (one filesystem: no copy)."""
    for name in names:
        os.rename(source / name, target / name)
    return target


def _remove(path: Path, names: Sequence[str]) -> None:
    for name in names:
        target = path / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (created if missing) with our details in it."""
    if fcntl is None:
        yield
        return
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(fd)
            os.close(fd)
            raise RunDirError(
                f"{lock_path.parent} is in use by another run ({holder}); wait for it to "
                f"finish, stop it, or choose another --out"
            ) from None
        try:
            same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # subtle: the holder removed the file as we locked it: lock the new one
    try:
        details = {"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(details) + "\n").encode("utf-8"))
        yield
    finally:
        lock_path.unlink(missing_ok=True)  # while still locked: see the loop above
        os.close(fd)  # releases the lock


def _describe_holder(fd: int) -> str:
    """The holder's details from its lock file, as "pid 12, host h, started ..." ."""
    try:
        details = parse_json(os.pread(fd, 4096, 0))
        return f"pid {details['pid']} on {details['host']}, started {details['started']}"
    except (OSError, ValueError, KeyError, TypeError):  # it has not written them yet
        return "its details are not written yet"


def _now() -> str:
    """The local time with its UTC offset, as "2026-11-24 03:14:15 +0000"."""
    return time.strftime("%Y-%m-%d %H:%M:%S %z")
