"""Saving arrays without pickle: the safetensors format, written and read here in NumPy.

A safetensors file (https://github.com/huggingface/safetensors) is

    8 bytes     N, the header's length, an unsigned little-endian integer
    N bytes     a JSON header: {"name": {"dtype": "F32", "shape": [2, 3],
                "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value"}}
    the rest    every tensor's raw little-endian bytes, C order, at its offsets (counted
                from the end of the header)

Unlike pickle, loading one runs no code, so a checkpoint from anywhere is safe to open; the
Hugging Face hub serves models in it and its own readers accept our files. On top of it:
``save_tree``/``load_tree`` store a nested structure (an optimiser's state, a training
checkpoint) as arrays plus a JSON skeleton in the metadata.

Every write is atomic (``minigrad.fileio.atomic_write``): a crash mid-write leaves the old
file or the new one, never half of one. The reader checks what the reference reader checks
(a sane header length, JSON without duplicate names, known dtypes, data offsets in order,
contiguous and covering the data exactly, each tensor's bytes matching its shape), so a
damaged or hand-edited file raises a ValueError naming the file and the problem instead of
loading wrong numbers.

Reading maps the file into memory (``open_safetensors``), so a model's loader copies one
tensor at a time and never holds the whole file as well as its weights; bfloat16 tensors
(what most released models ship) are read as float32 by shifting their bits. Left out on
purpose: writing bfloat16 (NumPy has no such dtype to hold it).
"""

from __future__ import annotations

import json
import math
import mmap
import os
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import numpy as np

from minigrad.backend import to_numpy
from minigrad.fileio import atomic_write, parse_json

# safetensors' dtype names, and NumPy's little-endian dtype for each
DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("bool"),
}
_NAMES = {(dtype.kind, dtype.itemsize): name for name, dtype in DTYPES.items()}
BF16 = "BF16"  # read only (as float32): NumPy has no bfloat16 to write it from
_ITEMSIZE = {**{name: dtype.itemsize for name, dtype in DTYPES.items()}, BF16: 2}
METADATA_KEY = "__metadata__"
MAX_HEADER_BYTES = 100_000_000  # the reference reader's limit: a larger one is damage


# ---- safetensors ------------------------------------------------------------------------------
def save_safetensors(
    path: str | os.PathLike, arrays: Mapping[str, Any], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``arrays`` (name -> NumPy or CuPy array) and string metadata as a safetensors file.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> save_safetensors(path, {"w": np.eye(2, dtype=np.float32)}, {"step": "10"})
    >>> arrays, meta = load_safetensors(path)
    >>> arrays["w"].tolist(), meta
    ([[1.0, 0.0], [0.0, 1.0]], {'step': '10'})
    """
    header: dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("save_safetensors: metadata must map str to str (json.dumps values)")
        header[METADATA_KEY] = dict(metadata)
    checked = []
    for name, array in arrays.items():
        if not isinstance(name, str) or name == METADATA_KEY:
            raise ValueError(f"save_safetensors: invalid tensor name {name!r}")
        if not hasattr(array, "dtype"):
            raise TypeError(
                f"save_safetensors: {name!r} is a {type(array).__name__}, not an array "
                f"(module.state_dict() gives arrays)"
            )
        dtype_name = _NAMES.get((array.dtype.kind, array.dtype.itemsize))
        if dtype_name is None:
            raise TypeError(
                f"save_safetensors: {name!r} has dtype {array.dtype}, which safetensors cannot "
                f"hold here; use one of {[str(d) for d in DTYPES.values()]}"
            )
        checked.append((name, dtype_name, to_numpy(array)))
    # The reference writer's order: larger items first, so every tensor stays aligned.
    checked.sort(key=lambda item: (-DTYPES[item[1]].itemsize, item[0]))
    blobs, offset = [], 0
    for name, dtype_name, array in checked:
        blob = np.ascontiguousarray(array, dtype=DTYPES[dtype_name]).tobytes()
        header[name] = {
            "dtype": dtype_name,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # pad with spaces, as the reference does: data 8-aligned

    with atomic_write(path) as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def load_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read a safetensors file: (name -> NumPy array, metadata). Raises ValueError if corrupt.

    Each array is a copy that owns writable memory (bfloat16 ones become float32); to read a
    large file one tensor at a time without copying it all, use ``open_safetensors``.
    """
    with open_safetensors(path) as f:
        return {name: np.array(f[name]) for name in f}, f.metadata


def open_safetensors(path: str | os.PathLike) -> SafetensorsFile:
    """Check a safetensors file's header and map the file into memory, copying nothing yet.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> save_safetensors(path, {"w": np.arange(3, dtype=np.float32)})
    >>> with open_safetensors(path) as f:
    ...     list(f), f.shape("w"), f["w"].tolist()
    (['w'], (3,), [0.0, 1.0, 2.0])
    """
    return SafetensorsFile(path)


class SafetensorsFile(Mapping):
    """A checked safetensors file, memory-mapped: name -> a read-only NumPy array.

    ``f[name]`` is a view into the map (the operating system reads its pages on first touch;
    ``release`` drops them), except for bfloat16, which NumPy lacks: those come back as a
    new float32 array (``bfloat16_to_float32``). So a loader that copies one tensor at a time
    into its model never holds a second copy of all the weights. ``close()`` (or leaving a
    ``with`` block) releases the map once no view is left.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self.entries, self.metadata, self._start = _read_header(f, size, self._corrupt)
            covered = max((end for _, _, _, end in self.entries.values()), default=0)
            # mmap refuses to map nothing: a file of empty tensors needs no map
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if covered else None
        self._data = (
            np.frombuffer(self._map, dtype=np.uint8, count=covered, offset=self._start)
            if covered
            else np.empty(0, dtype=np.uint8)
        )

    def _corrupt(self, problem: str) -> ValueError:
        return ValueError(f"{self.path} is not a valid safetensors file: {problem}")

    def __getitem__(self, name: str) -> np.ndarray:
        dtype_name, shape, begin, end = self.entries[name]
        if dtype_name == BF16:
            raw = self._data[begin:end].view(np.dtype("<u2")).reshape(shape)
            return bfloat16_to_float32(raw)
        return self._data[begin:end].view(DTYPES[dtype_name]).reshape(shape)

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][1]

    def dtype(self, name: str) -> str:
        """The dtype's name in the file ("F32", "BF16", ...)."""
        return self.entries[name][0]

    def release(self, name: str) -> None:
        """Drop the pages holding ``name`` from this process's memory, once it was copied.

        A page read through the map stays resident (and counted) until the map closes; a
        loader that releases each tensor after copying it holds one tensor's pages at a
        time. Reading ``name`` again reads the file again. A no-op where the OS lacks it.
        """
        if self._map is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        _, _, begin, end = self.entries[name]
        first = (self._start + begin) // mmap.PAGESIZE * mmap.PAGESIZE  # madvise wants pages
        # subtle: safe for a read-only file map, even for pages shared with a neighbour:
        # a dropped page is read from the file again when touched
        self._map.madvise(mmap.MADV_DONTNEED, first, self._start + end - first)

    def close(self) -> None:
        # the map itself closes when the last view into it is gone
        self._map, self._data = None, np.empty(0, dtype=np.uint8)

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values, given as their uint16 bit patterns, as float32 (exactly).

    bfloat16 is the top half of a float32 (sign, 8 exponent bits, 7 mantissa bits), so
    shifting the bits 16 places up gives the same number as a float32.

    >>> bfloat16_to_float32(np.array([0x3F80, 0xC040, 0x7F80], dtype=np.uint16))
    array([ 1., -3., inf], dtype=float32)
    """
    wide = bits.astype(np.uint32)
    wide <<= 16  # in place: one array of the result's size, not two
    return wide.view(np.float32)


def _read_header(
    f: BinaryIO, size: int, corrupt: Callable[[str], ValueError]
) -> tuple[dict[str, tuple[str, tuple[int, ...], int, int]], dict[str, str], int]:
    """Read and check the header of the open file ``f`` of ``size`` bytes: (name -> (dtype
    name, shape, begin, end), metadata, where the data starts)."""
    if size < 8:
        raise corrupt(f"it has {size} bytes, fewer than the 8 of the header's length")
    n = int.from_bytes(f.read(8), "little")
    if n > MAX_HEADER_BYTES:
        raise corrupt(f"the header claims {n} bytes, more than the {MAX_HEADER_BYTES} allowed")
    if 8 + n > size:
        raise corrupt(f"the header claims {n} bytes but the file has only {size - 8} more")
    try:
        header = parse_json(f.read(n), object_pairs_hook=_no_duplicates)
    except _DuplicateName as e:
        raise corrupt(f"the header names {e.args[0]!r} twice") from None
    except ValueError as e:  # not JSON, or nested too deep
        raise corrupt(f"the header is {e}") from None
    if not isinstance(header, dict):
        raise corrupt("the header is not a JSON object")
    metadata = header.pop(METADATA_KEY, None) or {}
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise corrupt(f"{METADATA_KEY} must map strings to strings, got {metadata!r}")
    n_data = size - 8 - n
    entries = {name: _entry(name, entry, corrupt) for name, entry in header.items()}
    # As the reference reader: in the order of their offsets, each tensor starts where the
    # previous one ended, so no two overlap, no bytes hide between them, and none follow.
    covered = 0
    for name, (dtype_name, shape, begin, end) in sorted(entries.items(), key=lambda e: e[1][2:]):
        if begin != covered:
            problem = "overlaps the tensor before it" if begin < covered else "leaves a gap"
            raise corrupt(
                f"{name!r} has data_offsets [{begin}, {end}] but the tensors before it end at "
                f"{covered}: it {problem}"
            )
        nbytes = math.prod(shape) * _ITEMSIZE[dtype_name]
        if end - begin != nbytes:
            raise corrupt(
                f"{name!r} has {end - begin} bytes but shape {list(shape)} of "
                f"{dtype_name} needs {nbytes}"
            )
        covered = end
    if covered > n_data:
        raise corrupt(
            f"the tensors need {covered} data bytes but the file has {n_data} (the file is "
            f"truncated, or the header is wrong)"
        )
    if covered < n_data:
        raise corrupt(f"{n_data - covered} bytes follow the last tensor's data")
    return entries, metadata, 8 + n


class _DuplicateName(ValueError):
    """A JSON object that names one key twice (``json`` would keep the last silently)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' object hook: a dict, unless a key repeats.

    >>> json.loads('{"a": 1, "a": 2}', object_pairs_hook=_no_duplicates)
    Traceback (most recent call last):
    ...
    minigrad.serialization._DuplicateName: a
    """
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateName(key)
        out[key] = value
    return out


def _is_count(x: Any) -> bool:
    """A JSON non-negative integer (``true`` and ``2.0`` are not)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _entry(
    name: str, entry: Any, corrupt: Callable[[str], ValueError]
) -> tuple[str, tuple[int, ...], int, int]:
    """One header entry, checked: (dtype name, shape, begin, end)."""
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise corrupt(f"entry {name!r} is malformed: {entry!r}")
    if entry["dtype"] not in _ITEMSIZE:
        raise corrupt(f"{name!r} has dtype {entry['dtype']!r}; this reader knows {list(_ITEMSIZE)}")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not (isinstance(shape, list) and all(_is_count(s) for s in shape)):
        raise corrupt(f"{name!r} has shape {shape!r}, not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))):
        raise corrupt(f"{name!r} has data_offsets {offsets!r}, not two non-negative integers")
    begin, end = offsets
    if begin > end:
        raise corrupt(f"{name!r} has data_offsets [{begin}, {end}]: it ends before it begins")
    return entry["dtype"], tuple(shape), begin, end


# ---- nested structures ------------------------------------------------------------------------
_ARRAY = "__array__"  # a skeleton leaf {"__array__": name} stands for the tensor called name
_TREE_KEY = "minigrad.tree"


def save_tree(path: str | os.PathLike, tree: Any) -> None:
    """Save a nested structure of dicts, lists, JSON scalars and arrays as one safetensors file.

    Each array is stored as a tensor named by its path (``state.0.exp_avg``); the rest is a
    JSON skeleton in the metadata. Dict keys become strings and tuples lists, as in JSON.
    Handy for an optimiser's ``state_dict()``, or a whole training checkpoint.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "state.safetensors")
    >>> save_tree(path, {"step": 3, "m": {0: np.ones(2)}, "betas": (0.9, 0.99)})
    >>> load_tree(path)
    {'step': 3, 'm': {'0': array([1., 1.])}, 'betas': [0.9, 0.99]}
    """
    arrays: dict[str, Any] = {}

    def skeleton(node: Any, name: str) -> Any:
        if hasattr(node, "shape") and hasattr(node, "dtype") and not np.isscalar(node):
            if name in arrays:
                raise ValueError(f"save_tree: two arrays would both be named {name!r}")
            arrays[name] = node
            return {_ARRAY: name}
        if isinstance(node, Mapping):
            if _ARRAY in node:
                raise ValueError(f"save_tree: {_ARRAY!r} is reserved and cannot be a dict key")
            return {str(k): skeleton(v, f"{name}.{k}" if name else str(k)) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return [skeleton(v, f"{name}.{i}" if name else str(i)) for i, v in enumerate(node)]
        if isinstance(node, np.generic):
            return node.item()  # a NumPy scalar (e.g. np.float32) becomes a Python number
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        raise TypeError(
            f"save_tree: {name or 'the root'} is a {type(node).__name__}, "
            f"which is neither an array nor JSON"
        )

    text = json.dumps(skeleton(tree, ""))
    save_safetensors(path, arrays, {_TREE_KEY: text})


def load_tree(path: str | os.PathLike) -> Any:
    """Read what ``save_tree`` wrote."""
    arrays, metadata = load_safetensors(path)
    if _TREE_KEY not in metadata:
        raise ValueError(f"{os.fspath(path)} was not written by save_tree (no {_TREE_KEY!r})")

    def fill(node: Any) -> Any:
        if isinstance(node, dict):
            if set(node) == {_ARRAY}:
                return arrays[node[_ARRAY]]
            return {k: fill(v) for k, v in node.items()}
        if isinstance(node, list):
            return [fill(v) for v in node]
        return node

    return fill(parse_json(metadata[_TREE_KEY]))
