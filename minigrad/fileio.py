"""Writing files so that a reader, a crash or a full disk never leaves half of one.

``atomic_write(path)`` opens a temporary file beside ``path``; when the ``with`` block ends
without an error, the bytes are flushed to disk (fsync), the temporary file is renamed over
``path`` (``os.replace``: atomic on POSIX and Windows within one folder, which is why the
temporary file lives there and not in /tmp), and the folder's entry is flushed too, so the
rename itself survives a power cut. If the block raises (a full disk, a failed checksum,
Ctrl-C), the temporary file is removed and ``path`` keeps its old contents, or stays absent.

The file gets the permissions any new file gets (0o666 less the umask), not the 0o600 of
``tempfile.mkstemp``: a checkpoint or a plot is meant to be shared like any other output.

Every file this project writes whole goes through here: safetensors files, checkpoints'
JSON, tokenizers, the token cache, downloads and the loss plot. Follows the recipe of
LWN's "Ensuring data reaches disk". Left out on purpose: appending (a log grows by
``open(path, "a")``; its torn last line is the reader's to handle) and Windows' folder fsync
(the OS has no such call, so it is skipped there).
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

_TEMP_SUFFIX = ".tmp"


@contextmanager
def atomic_write(path: str | os.PathLike, text: bool = False) -> Iterator[IO]:
    """A file object that replaces ``path`` in one step once the ``with`` block succeeds.

    ``text=True`` gives a UTF-8 text file, otherwise a binary one.

    >>> import tempfile, os, json
    >>> path = os.path.join(tempfile.mkdtemp(), "config.json")
    >>> with atomic_write(path, text=True) as f:
    ...     json.dump({"lr": 0.1}, f)
    >>> open(path).read(), os.listdir(os.path.dirname(path))
    ('{"lr": 0.1}', ['config.json'])
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp, fd = _create_beside(path, folder)
    try:
        with os.fdopen(fd, "w" if text else "wb", encoding="utf-8" if text else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:  # KeyboardInterrupt too: no temporary file is left behind
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise
    fsync_dir(folder)


def _create_beside(path: str, folder: str) -> tuple[str, int]:
    """A new, empty, hidden file in ``folder`` named after ``path``: (its path, an open fd).

    subtle: ``os.open`` with mode 0o666 lets the OS apply the umask, as ``open()`` would;
    ``O_EXCL`` makes the name ours alone (another writer's random name cannot collide).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = os.path.join(
            folder, f".{os.path.basename(path)}.{secrets.token_hex(4)}{_TEMP_SUFFIX}"
        )
        try:
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename, a new file) to disk; skipped where the OS cannot
    open a folder (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except (PermissionError, IsADirectoryError):  # Windows: folders cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:  # EINVAL: this filesystem does not sync folders
            raise
    finally:
        os.close(fd)
