"""Checkpoints: save a training run's whole state, load it back, and explain what is wrong
when a checkpoint cannot be used.

A run directory holds any number of checkpoint directories and one small file, ``latest``,
naming the newest complete one::

    runs/shakespeare-char/
        latest                 "ckpt-000250": the one a reader loads
        ckpt-000250/
            model.safetensors  the weights (minigrad.serialization)
            optimizer.npz      the optimiser's arrays (AdamW's moments); absent when merged
            tokenizer.json     the tokenizer, as tokenizer.to_dict()
            state.json         configs, step, RNG states, the optimiser's plain values

Atomicity (the choice, and why): a checkpoint is written into a fresh hidden directory, its
files are flushed to disk, the directory is renamed to its final name, and only then is
``latest`` replaced with ``os.replace``, the one atomic step. A crash or an error at any
point before that leaves ``latest`` naming the previous, complete checkpoint; a crash after
it leaves the new one complete. Writing every file atomically plus a "complete" marker would
also work, but a reader would then have to check that all files belong to the same step;
with one pointer there is nothing to check. Older checkpoint directories are removed once
``latest`` has moved on.

Left out on purpose: keeping the best or the last few checkpoints (only the newest is kept),
sharded weights, and checksums (a truncated or mismatched file is caught by the safetensors
reader and by the shape check against the config, which give clearer messages).
Follows nanoGPT's ``ckpt.pt`` in content, in separate files so that each is readable alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from decoder.config import ModelConfig, TrainConfig
from minigrad.backend import to_numpy
from minigrad.serialization import atomic_write_text, load_safetensors, save_safetensors
from minigrad.tensor import Tensor

FORMAT_VERSION = 1
LATEST = "latest"  # the pointer file inside a run directory
WEIGHTS, OPTIMIZER, TOKENIZER, STATE = (
    "model.safetensors",
    "optimizer.npz",
    "tokenizer.json",
    "state.json",
)
_PREFIX, _TMP_PREFIX = "ckpt-", ".tmp-ckpt-"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt, or does not match what it is loaded into."""


@dataclass
class Checkpoint:
    """Everything one checkpoint holds, as plain Python and NumPy values."""

    path: Path  # the checkpoint directory itself (not the run directory)
    step: int  # optimiser steps done
    model_config: ModelConfig
    train_config: TrainConfig
    weights: dict[str, np.ndarray]
    tokenizer: dict  # tokenizer.to_dict(); rebuild with decoder.tokenizer.tokenizer_from_dict
    optimizer: dict | None = None  # optimizer.state_dict(); None for a weights-only checkpoint
    rng: dict = field(default_factory=dict)  # name -> numpy bit_generator.state
    extra: dict = field(default_factory=dict)  # anything else the writer kept (data hash, ...)


# ---- writing ------------------------------------------------------------------------------------
def save_checkpoint(
    run_dir: str | os.PathLike,
    *,
    step: int,
    model_state: dict[str, Any],
    model_config: ModelConfig,
    train_config: TrainConfig,
    tokenizer: dict,
    optimizer_state: dict | None = None,
    rng: dict | None = None,
    extra: dict | None = None,
) -> Path:
    """Write a complete checkpoint into ``run_dir`` and point ``latest`` at it; return its path.

    ``model_state`` may hold NumPy or CuPy arrays (or Tensors); they are stored as NumPy.
    If anything fails before ``latest`` moves, the previous checkpoint stays the latest and
    the half-written directory is removed.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = written = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=run_dir))
    try:
        weights = {name: _as_numpy(a) for name, a in model_state.items()}
        save_safetensors(tmp / WEIGHTS, weights)
        optimizer_plain = None
        if optimizer_state is not None:
            arrays: dict[str, np.ndarray] = {}
            optimizer_plain = _split_arrays(optimizer_state, arrays, "")
            with open(tmp / OPTIMIZER, "wb") as f:
                np.savez(f, **arrays)
        _write_json(tmp / TOKENIZER, tokenizer)
        state = {
            "format": FORMAT_VERSION,
            "step": step,
            "model_config": dataclasses.asdict(model_config),
            "train_config": dataclasses.asdict(train_config),
            "optimizer": optimizer_plain,
            "rng": rng or {},
            "extra": extra or {},
        }
        _write_json(tmp / STATE, state)  # written last: a directory without it is incomplete
        for f in tmp.iterdir():
            _fsync(f)
        final = _free_name(run_dir, f"{_PREFIX}{step:06d}")
        os.rename(tmp, final)
        written = final
        _fsync(run_dir)
        atomic_write_text(run_dir / LATEST, final.name + "\n")  # the one atomic step
    except BaseException:  # KeyboardInterrupt too: leave no directory that latest does not name
        shutil.rmtree(written, ignore_errors=True)
        raise
    _remove_old(run_dir, keep=final.name)
    return final


def _as_numpy(a: Any) -> np.ndarray:
    return to_numpy(a.data if isinstance(a, Tensor) else a)


def _split_arrays(obj: Any, arrays: dict[str, np.ndarray], key: str) -> Any:
    """A copy of a nested dict/list with each array replaced by ``{"__array__": name}``.

    The arrays go into ``arrays`` (for ``np.savez``); what is left is plain JSON.

    >>> arrays = {}
    >>> _split_arrays({"step": 3, "m": [np.zeros(2)]}, arrays, "")
    {'step': 3, 'm': [{'__array__': 'm.0'}]}
    >>> list(arrays)
    ['m.0']
    """
    if isinstance(obj, dict):
        return {
            k: _split_arrays(v, arrays, f"{key}.{k}" if key else str(k)) for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [
            _split_arrays(v, arrays, f"{key}.{i}" if key else str(i)) for i, v in enumerate(obj)
        ]
    if isinstance(obj, np.generic):  # NumPy scalars (a step count, a float) become Python's
        return obj.item()
    if hasattr(obj, "shape") and hasattr(obj, "dtype"):  # NumPy or CuPy arrays
        arrays[key] = _as_numpy(obj)
        return {"__array__": key}
    return obj


def _join_arrays(obj: Any, arrays: Any) -> Any:
    """The inverse of ``_split_arrays``: put the arrays back in place of their markers."""
    if isinstance(obj, dict):
        if set(obj) == {"__array__"}:
            return arrays[obj["__array__"]]
        return {k: _join_arrays(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join_arrays(v, arrays) for v in obj]
    return obj


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)


def _fsync(path: Path) -> None:
    """Flush a file (or a directory's entries) to disk; a no-op where the OS refuses."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # directories cannot be fsync'ed on some systems (Windows)
        pass
    finally:
        os.close(fd)


def _free_name(run_dir: Path, name: str) -> Path:
    """``run_dir / name``, or ``name-1``, ``name-2``... if taken (a step saved twice)."""
    path, n = run_dir / name, 0
    while path.exists():
        n += 1
        path = run_dir / f"{name}-{n}"
    return path


def _remove_old(run_dir: Path, keep: str) -> None:
    for p in run_dir.iterdir():
        if p.is_dir() and p.name != keep and p.name.startswith((_PREFIX, _TMP_PREFIX)):
            shutil.rmtree(p, ignore_errors=True)


# ---- reading ------------------------------------------------------------------------------------
def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """The checkpoint directory that ``path`` means: a run directory (via its ``latest``) or
    a checkpoint directory itself. Raises CheckpointError saying what was found instead."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such directory (expected a run or checkpoint directory)")
    if (path / LATEST).is_file():
        name = (path / LATEST).read_text(encoding="utf-8").strip()
        target = path / name
        if not name or not target.is_dir():
            raise CheckpointError(
                f"{path / LATEST} names {name!r}, which is not a directory in {path}: the run "
                f"directory was edited by hand or copied in part"
            )
        return target
    if (path / STATE).is_file() or (path / WEIGHTS).is_file():
        return path
    raise CheckpointError(
        f"{path}: no checkpoint here (neither a '{LATEST}' file nor '{STATE}'); pass the --out "
        f"directory of a training run or one of its ckpt-* directories"
    )


def has_checkpoint(run_dir: str | os.PathLike) -> bool:
    """True when ``run_dir`` holds a checkpoint that ``load_checkpoint`` would try to read."""
    return (Path(run_dir) / LATEST).is_file()


def load_checkpoint(path: str | os.PathLike, with_optimizer: bool = True) -> Checkpoint:
    """Read a checkpoint (from a run directory or a checkpoint directory).

    Every problem raises CheckpointError naming the file and what is wrong with it.
    """
    ckpt_dir = resolve_checkpoint(path)
    state = _read_json(ckpt_dir / STATE)
    if state.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{ckpt_dir / STATE}: format {state.get('format')!r}, but this code reads format "
            f"{FORMAT_VERSION}"
        )
    try:
        model_config = ModelConfig(**state["model_config"])
        train_config = TrainConfig(**state["train_config"])
        step = int(state["step"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{ckpt_dir / STATE}: invalid configs or step: {e}") from e
    weights_path = ckpt_dir / WEIGHTS
    if not weights_path.is_file():
        raise CheckpointError(f"{weights_path}: missing; the checkpoint is incomplete")
    try:
        weights, _ = load_safetensors(weights_path)
    except Exception as e:  # the reader's own message says what is corrupt; we add the file
        raise CheckpointError(f"{weights_path}: cannot be read: {e}") from e
    tokenizer = _read_json(ckpt_dir / TOKENIZER)
    optimizer = None
    if with_optimizer and state.get("optimizer") is not None:
        opt_path = ckpt_dir / OPTIMIZER
        if not opt_path.is_file():
            raise CheckpointError(f"{opt_path}: missing, although {STATE} lists optimiser state")
        try:
            with np.load(opt_path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            optimizer = _join_arrays(state["optimizer"], arrays)
        except CheckpointError:
            raise
        except Exception as e:  # zipfile, KeyError, ValueError: all mean a damaged file
            raise CheckpointError(f"{opt_path}: cannot be read ({type(e).__name__}: {e})") from e
    return Checkpoint(
        path=ckpt_dir,
        step=step,
        model_config=model_config,
        train_config=train_config,
        weights=weights,
        tokenizer=tokenizer,
        optimizer=optimizer,
        rng=state.get("rng", {}),
        extra=state.get("extra", {}),
    )


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; the checkpoint is incomplete")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e}); the file is damaged") from e


def check_weights(
    weights: dict[str, np.ndarray], expected: dict[str, Any], source: str | os.PathLike
) -> None:
    """Raise CheckpointError unless ``weights`` has exactly the names and shapes of ``expected``.

    ``expected`` is the state dict of a model built from the checkpoint's config, so a
    mismatch means the config and the weights were not saved together.

    >>> check_weights({"w": np.zeros((2, 3))}, {"w": np.zeros((3, 2))}, "f")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    decoder.checkpoint.CheckpointError: f: 'w' has shape (2, 3), but the config builds (3, 2); ...
    """
    hint = f"the config in {STATE} does not match these weights"
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise CheckpointError(
            f"{source}: missing {len(missing)} weights ({missing[:5]}...); {hint}"
        )
    unexpected = sorted(set(weights) - set(expected))
    if unexpected:
        raise CheckpointError(f"{source}: unexpected weights {unexpected[:5]}; {hint}")
    for name, array in weights.items():
        want = tuple(expected[name].shape)
        if tuple(array.shape) != want:
            raise CheckpointError(
                f"{source}: {name!r} has shape {tuple(array.shape)}, but the config builds "
                f"{want}; {hint}"
            )


def load_model(path: str | os.PathLike, device: str = "cpu"):
    """The model and tokenizer of a checkpoint, ready for inference: ``(model, tokenizer, ckpt)``.

    The model is in eval mode on ``device``. Used by decoder.generate and decoder.finetune.
    """
    from decoder.model import Decoder  # here, not at the top: reading a checkpoint needs no model

    ckpt = load_checkpoint(path, with_optimizer=False)
    tokenizer = build_tokenizer(ckpt)
    model = Decoder(ckpt.model_config)
    check_weights(ckpt.weights, model.state_dict(), ckpt.path / WEIGHTS)
    model.load_state_dict(ckpt.weights)
    model.to(device)
    model.eval()
    return model, tokenizer, ckpt


def build_tokenizer(ckpt: Checkpoint):
    """The checkpoint's tokenizer, checked against the model's vocabulary size."""
    from decoder.tokenizer import tokenizer_from_dict

    path = ckpt.path / TOKENIZER
    try:
        tokenizer = tokenizer_from_dict(ckpt.tokenizer)
    except Exception as e:
        raise CheckpointError(f"{path}: not a tokenizer this code can rebuild: {e}") from e
    if tokenizer.vocab_size != ckpt.model_config.vocab_size:
        raise CheckpointError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} tokens, but the model in "
            f"{STATE} was built for vocab_size={ckpt.model_config.vocab_size}: the tokenizer "
            f"does not belong to these weights"
        )
    return tokenizer
