"""Training text and token batches.

Holds the Tiny Shakespeare download (cached, checksummed, written atomically), a loader for
any UTF-8 text file, and ``TokenDataset``: a corpus tokenised once, split 90/10 into train and
validation ids, from which ``get_batch`` draws random windows ``x`` and their next tokens ``y``.
``TokenDataset.from_text`` keeps the ids in a ``.npy`` file keyed by the text and the
tokenizer, opened as a memory map, so a second run skips tokenising. A ``.json`` record beside
it holds the count and SHA-256 of what was written, so a cache file that was truncated or
overwritten is noticed and rebuilt, never trained on.

Left out on purpose: datasets larger than memory while tokenising (the text is read whole),
document boundaries and shuffled epochs (random windows, as in nanoGPT, are enough for a
character- or small-BPE-level model of one corpus), and any framework tensors: batches are
NumPy ``int64`` arrays, and the training loop moves them to its device.

Follows Karpathy's char-rnn (the corpus) and nanoGPT (``data/shakespeare_char/prepare.py``:
the 90/10 split and uint16 ids on disk; ``train.py``'s ``get_batch``).
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from decoder.text.tokenizer import Tokenizer
from minigrad.fileio import atomic_write, parse_json

SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_FILENAME = "tinyshakespeare.txt"
DOWNLOAD_TIMEOUT_S = 30  # per blocking network operation, so no network means an error, not a hang
VAL_FRACTION = 0.1  # the last 10% of the tokens validate
TOKEN_CACHE_VERSION = 3  # part of the cache key: bump it when the file layout changes

# Files whose checksum this process has already checked, as (path, sha256, size, mtime):
# checking costs a read of the whole file, so it is done once per process and version of it.
_verified: set[tuple[str, str, int, int]] = set()


# ---- files --------------------------------------------------------------------------------------
def cache_dir() -> Path:
    """``$MINIGRAD_DATA_DIR`` if set, else ``$XDG_CACHE_HOME/minigrad``, else ``~/.cache/minigrad``.

    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"MINIGRAD_DATA_DIR": "/data/mg"}):
    ...     print(cache_dir())
    /data/mg
    """
    if os.environ.get("MINIGRAD_DATA_DIR"):
        return Path(os.environ["MINIGRAD_DATA_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "minigrad"
    return Path.home() / ".cache" / "minigrad"


def load_text(path: str | os.PathLike) -> str:
    """The contents of a UTF-8 text file, with errors that name the file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"text file not found: {path}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not UTF-8 text: byte {e.start} is {data[e.start : e.start + 1]!r}; "
            "convert it first (for example: iconv -t UTF-8)"
        ) from None


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, as hex, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


NO_VERIFY = "MINIGRAD_NO_VERIFY"  # =1: loads skip the SHA-256 checks (every command's --no-verify)


def sha256_differs(path: str | os.PathLike, recorded: str | None) -> bool:
    """Whether the file ``path`` no longer has the SHA-256 ``recorded`` when it was saved
    (a checkpoint's files, an adapter folder's, a merged model's, and the tokenizer each was
    trained with). False without a record (files saved before the records) and when
    MINIGRAD_NO_VERIFY=1 skips the checks: hashing files of many gigabytes at every load.

    >>> import tempfile; path = Path(tempfile.mkdtemp()) / "f"; _ = path.write_text("a")
    >>> sha256_differs(path, sha256_file(path)), sha256_differs(path, "0" * 64)
    (False, True)
    """
    if recorded is None or os.environ.get(NO_VERIFY) == "1":
        return False
    return sha256_file(path) != recorded


def changed_since(record: str) -> str:
    """What a file whose SHA-256 changed is told (a checkpoint's, an adapter folder's, a
    merged model's), with the switch for files too large to hash at every load."""
    return (
        f"its SHA-256 is not the one recorded in {record} when it was saved: the file was "
        f"changed or corrupted since (--no-verify, or MINIGRAD_NO_VERIFY=1, skips this check "
        f"for files too large to hash at every load)"
    )


def _has_checksum(path: Path, sha256: str) -> bool:
    """Whether ``path`` is a file that hashes to ``sha256``, hashing it again only when its
    size or modification time changed since this process last did."""
    if not path.is_file():
        return False
    stat = path.stat()
    key = (str(path), sha256, stat.st_size, stat.st_mtime_ns)
    if key in _verified:
        return True
    if sha256_file(path) == sha256:
        _verified.add(key)
        return True
    return False


def download(url: str, dest: Path, sha256: str, timeout: float = DOWNLOAD_TIMEOUT_S) -> None:
    """Fetch ``url`` into ``dest`` if its SHA-256 is ``sha256``; otherwise raise ValueError.

    The bytes are written atomically (``minigrad.fileio.atomic_write``) and kept only once
    checked, so ``dest`` is never half written and a failed download leaves nothing behind.
    Network failures raise ``OSError``.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    # raising inside atomic_write discards the temporary file: dest is left as it was
    with atomic_write(dest) as f, urllib.request.urlopen(url, timeout=timeout) as response:
        while block := response.read(1 << 16):
            digest.update(block)
            f.write(block)
        got = digest.hexdigest()
        if got != sha256:
            raise ValueError(
                f"checksum mismatch for {url}: expected sha256 {sha256}, got {got}; "
                "the download was discarded"
            )


def load_shakespeare(
    path: str | os.PathLike | None = None,
    url: str = SHAKESPEARE_URL,
    sha256: str = SHAKESPEARE_SHA256,
) -> str:
    """Tiny Shakespeare (about 1.1 MB): from ``path`` if given, else the cache, else ``url``.

    A cached copy is used when its checksum matches; otherwise it is downloaded again.
    """
    if path is not None:
        return load_text(path)
    target = cache_dir() / SHAKESPEARE_FILENAME
    if not _has_checksum(target, sha256):
        try:
            download(url, target, sha256)
        except OSError as e:  # no network, DNS failure, timeout, HTTP error
            stale = " (the file there now has another checksum)" if target.exists() else ""
            raise RuntimeError(
                f"could not download Tiny Shakespeare from {url}: {e}. Without network, put "
                f"the file at {target}{stale} (sha256 {sha256}), or pass --data PATH to train "
                "on a local text file."
            ) from e
    return load_text(target)


# ---- token ids ----------------------------------------------------------------------------------
def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    """The smallest unsigned type that holds ids ``0 .. vocab_size - 1`` (uint16 or uint32).

    >>> token_dtype(50257).__name__, token_dtype(2**16).__name__, token_dtype(100277).__name__
    ('uint16', 'uint16', 'uint32')
    """
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def _token_cache_key(text: str, tokenizer: Tokenizer) -> str:
    """A hash of everything the ids depend on: the text and the tokenizer's full state."""
    digest = hashlib.sha256()
    digest.update(json.dumps(tokenizer.to_dict(), sort_keys=True).encode("utf-8"))
    digest.update(f"\0v{TOKEN_CACHE_VERSION}\0".encode())
    digest.update(text.encode("utf-8"))
    return digest.hexdigest()[:32]


def write_cache_record(path: Path, key: str, count: int) -> None:
    """Write, beside the cache file ``path`` (already written whole), the record that
    ``read_cache_record`` checks it against: the ``key`` of what it was made from, its
    ``count`` of items and its SHA-256. Written last, so a process killed in between leaves a
    file without a matching record: rebuilt next time, never trusted."""
    record = {"key": key, "count": count, "sha256": sha256_file(path)}
    with atomic_write(path.with_suffix(".json"), text=True) as f:
        json.dump(record, f)


def read_cache_record(path: Path, key: str) -> tuple[int | None, str]:
    """The count of items the cache file ``path`` holds, or None and why it cannot be trusted
    (an empty reason when there is simply no cache yet).

    The record ``path.with_suffix(".json")`` must name ``key``, and the file must have the
    recorded SHA-256 (hashed once per process, as downloads are): a file cut short, or
    overwritten with other contents, fails this. The token cache (``TokenDataset.from_text``)
    and decoder.post.instruct_data's example cache keep their records so.
    """
    record_path = path.with_suffix(".json")
    if not path.exists() and not record_path.exists():
        return None, ""
    try:
        record = parse_json(record_path.read_bytes())
        count, sha256 = record["count"], record["sha256"]
        if record["key"] != key:
            return None, f"its record {record_path.name} is for other contents"
    except FileNotFoundError:
        return None, f"its record {record_path.name} is missing"
    except (ValueError, KeyError, TypeError):  # bad JSON, a missing field, not an object
        return None, f"its record {record_path.name} is unreadable"
    if not path.is_file():
        return None, "the cache file is missing"
    if not _has_checksum(path, sha256):
        return None, (
            f"its contents ({path.stat().st_size} bytes) are not the {count} items recorded "
            f"in {record_path.name}: the file was truncated or overwritten"
        )
    return count, ""


def _read_token_cache(path: Path, key: str) -> tuple[np.ndarray | None, str]:
    """The ids cached at ``path`` as a memory map, or None and why they cannot be trusted
    (``read_cache_record``'s checks, and the number of ids)."""
    n_tokens, problem = read_cache_record(path, key)
    if n_tokens is None:
        return None, problem
    ids = np.load(path, mmap_mode="r")
    if ids.ndim != 1 or len(ids) != n_tokens:
        return None, f"it holds {ids.shape} ids, but its record says {n_tokens}"
    return ids, ""


def _write_token_cache(path: Path, key: str, ids: np.ndarray) -> None:
    """Save ``ids`` at ``path`` whole (``atomic_write``), then its record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        np.save(f, ids)
    write_cache_record(path, key, len(ids))


class TokenDataset:
    """A corpus of token ids, split 90/10 into ``train`` and ``val``, served as random windows.

    >>> data = TokenDataset(list(range(100)))
    >>> len(data.train), len(data.val)
    (90, 10)
    >>> x, y = data.get_batch("val", batch_size=2, block_size=4, rng=np.random.default_rng(0))
    >>> x.shape, x.dtype, bool((y == x + 1).all())
    ((2, 4), dtype('int64'), True)
    """

    def __init__(self, ids: Sequence[int] | np.ndarray, val_fraction: float = VAL_FRACTION):
        if not 0 <= val_fraction < 1:
            raise ValueError(f"val_fraction={val_fraction} must be in [0, 1)")
        if not isinstance(ids, np.ndarray):  # a list from encode(): store it compactly
            ids = np.asarray(ids, dtype=token_dtype(max(ids, default=0) + 1))
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
        self.ids = ids
        self.path: Path | None = None  # the cache file, for a dataset made by from_text
        n_train = int(len(ids) * (1 - val_fraction))
        # Slices of a memmap stay memmaps: nothing is read until a batch asks for it.
        self.train = ids[:n_train]
        self.val = ids[n_train:]

    @classmethod
    def from_text(
        cls,
        text: str,
        tokenizer: Tokenizer,
        cache: str | os.PathLike | None = None,
        val_fraction: float = VAL_FRACTION,
    ) -> TokenDataset:
        """Tokenise ``text`` once; later calls with the same text and tokenizer reuse the ids.

        The ids live in ``cache`` (default ``cache_dir() / "tokens"``) as ``<key>.npy``, keyed
        by a hash of the text and ``tokenizer.to_dict()``, and are opened as a read-only memory
        map, so even a large corpus costs no memory until batches touch it. ``<key>.json``
        records the key, the number of ids and the file's SHA-256; a file that disagrees with
        its record is rebuilt with a warning (see ``_read_token_cache``).
        """
        if not text:
            raise ValueError("the text is empty: there is nothing to train on")
        folder = Path(cache) if cache is not None else cache_dir() / "tokens"
        key = _token_cache_key(text, tokenizer)
        path = folder / f"{key}.npy"
        ids, problem = _read_token_cache(path, key)
        if ids is None:
            if problem:
                warnings.warn(f"token cache {path}: {problem}; rebuilding it", stacklevel=2)
            ids = np.asarray(tokenizer.encode(text), dtype=token_dtype(tokenizer.vocab_size))
            try:
                _write_token_cache(path, key, ids)
            except OSError as e:
                raise OSError(
                    f"could not write the token cache {path}: {e}. Make the folder writable, "
                    "or set MINIGRAD_DATA_DIR to a writable folder"
                ) from e
            ids, problem = _read_token_cache(path, key)
            if ids is None:  # another process rewrote it in between, or the disk lies
                raise OSError(f"token cache {path}: {problem} right after writing it")
        dataset = cls(ids, val_fraction)
        dataset.path = path
        return dataset

    def split(self, name: str) -> np.ndarray:
        """The ids of split ``"train"`` or ``"val"``."""
        if name == "train":
            return self.train
        if name == "val":
            return self.val
        raise ValueError(f"unknown split {name!r}: use 'train' or 'val'")

    def get_batch(
        self, split: str, batch_size: int, block_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """``batch_size`` random windows of ``split``: inputs ``x`` and targets ``y``, (B, T)
        ``int64`` each, where ``y[b, t]`` is the token after ``x[b, t]``."""
        data = self.split(split)
        if len(data) < block_size + 1:
            raise ValueError(
                f"the {split} split has {len(data)} tokens, but a window of block_size="
                f"{block_size} needs {block_size + 1} (inputs plus the next token): use a "
                "longer text or a smaller block_size"
            )
        starts = rng.integers(0, len(data) - block_size, size=batch_size)  # (B,)
        window = starts[:, None] + np.arange(block_size + 1)  # (B,) -> (B, T + 1)
        tokens = np.asarray(data[window], dtype=np.int64)  # (B, T + 1), read from disk here
        x = np.ascontiguousarray(tokens[:, :-1])  # (B, T)
        y = np.ascontiguousarray(tokens[:, 1:])  # (B, T), shifted by one
        return x, y
