"""Writing files so that a reader, a crash or a full disk never leaves half of one; and
reading JSON with a bound on its nesting.

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

``parse_json`` is the one JSON reader for every file this project parses (checkpoints,
safetensors headers, tokenizers, Hugging Face configs): it raises ValueError, never
``json``'s RecursionError, for a document nested deeper than ``MAX_JSON_DEPTH``, so that the
code walking the result may recurse.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

_TEMP_SUFFIX = ".tmp"
MAX_JSON_DEPTH = 100  # our files nest 6 deep at most; json itself dies near 1000


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


def parse_json(
    data: str | bytes, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None
) -> Any:
    """``json.loads(data)``, raising ValueError for text that is not UTF-8 JSON and for a
    document nested deeper than MAX_JSON_DEPTH (checked without recursion).

    >>> parse_json(b'{"a": [1, 2]}')
    {'a': [1, 2]}
    >>> parse_json("[" * 5000 + "]" * 5000)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: nested more than 100 deep (...)
    """
    limit = f"nested more than {MAX_JSON_DEPTH} deep (no file of ours nests so: damaged or hostile)"
    try:
        root = json.loads(data, object_pairs_hook=object_pairs_hook)
    except RecursionError:  # json's own C parser gives up near the interpreter's limit
        raise ValueError(limit) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not valid JSON ({e})") from None
    level = [root]  # breadth first, one level per pass: a comprehension, fast on big files
    for _ in range(MAX_JSON_DEPTH):
        level = [
            c
            for node in level
            for c in (node.values() if type(node) is dict else node if type(node) is list else ())
            if type(c) is dict or type(c) is list
        ]
        if not level:
            return root
    raise ValueError(limit)
