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

Left out on purpose: bfloat16 (NumPy has no such dtype) and memory-mapped loading.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from minigrad.backend import to_numpy
from minigrad.fileio import atomic_write

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
    """Read a safetensors file: (name -> NumPy array, metadata). Raises ValueError if corrupt."""
    with open(path, "rb") as f:
        raw = f.read()

    def corrupt(problem: str) -> ValueError:
        return ValueError(f"{os.fspath(path)} is not a valid safetensors file: {problem}")

    if len(raw) < 8:
        raise corrupt(f"it has {len(raw)} bytes, fewer than the 8 of the header's length")
    n = int.from_bytes(raw[:8], "little")
    if n > MAX_HEADER_BYTES:
        raise corrupt(f"the header claims {n} bytes, more than the {MAX_HEADER_BYTES} allowed")
    if 8 + n > len(raw):
        raise corrupt(f"the header claims {n} bytes but the file has only {len(raw) - 8} more")
    try:
        header = json.loads(raw[8 : 8 + n].decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _DuplicateName as e:
        raise corrupt(f"the header names {e.args[0]!r} twice") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise corrupt(f"the header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise corrupt("the header is not a JSON object")
    metadata = header.pop(METADATA_KEY, None) or {}
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise corrupt(f"{METADATA_KEY} must map strings to strings, got {metadata!r}")
    data = memoryview(raw)[8 + n :]
    entries = {name: _entry(name, entry, corrupt) for name, entry in header.items()}
    # As the reference reader: in the order of their offsets, each tensor starts where the
    # previous one ended, so no two overlap, no bytes hide between them, and none follow.
    covered = 0
    for name, (dtype, shape, begin, end) in sorted(entries.items(), key=lambda e: e[1][2:]):
        if begin != covered:
            problem = "overlaps the tensor before it" if begin < covered else "leaves a gap"
            raise corrupt(
                f"{name!r} has data_offsets [{begin}, {end}] but the tensors before it end at "
                f"{covered}: it {problem}"
            )
        if end - begin != math.prod(shape) * dtype.itemsize:
            raise corrupt(
                f"{name!r} has {end - begin} bytes but shape {list(shape)} of "
                f"{header[name]['dtype']} needs {math.prod(shape) * dtype.itemsize}"
            )
        covered = end
    if covered > len(data):
        raise corrupt(
            f"the tensors need {covered} data bytes but the file has {len(data)} (the file is "
            f"truncated, or the header is wrong)"
        )
    if covered < len(data):
        raise corrupt(f"{len(data) - covered} bytes follow the last tensor's data")
    arrays = {}
    for name, (dtype, shape, begin, end) in entries.items():
        # a copy: the arrays own writable memory, and the file's buffer can be freed
        arrays[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(shape).copy()
    return arrays, metadata


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
) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """One header entry, checked: (dtype, shape, begin, end)."""
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise corrupt(f"entry {name!r} is malformed: {entry!r}")
    if entry["dtype"] not in DTYPES:
        raise corrupt(f"{name!r} has dtype {entry['dtype']!r}; this reader knows {list(DTYPES)}")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not (isinstance(shape, list) and all(_is_count(s) for s in shape)):
        raise corrupt(f"{name!r} has shape {shape!r}, not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))):
        raise corrupt(f"{name!r} has data_offsets {offsets!r}, not two non-negative integers")
    begin, end = offsets
    if begin > end:
        raise corrupt(f"{name!r} has data_offsets [{begin}, {end}]: it ends before it begins")
    return DTYPES[entry["dtype"]], tuple(shape), begin, end


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

    return fill(json.loads(metadata[_TREE_KEY]))
