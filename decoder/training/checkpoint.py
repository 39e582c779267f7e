"""Checkpoints: save a training run's whole state, load it back, and explain what is wrong
when a checkpoint cannot be used.

A run directory holds any number of checkpoint directories and one small file, ``latest``,
naming the newest complete one::

    runs/shakespeare-char/
        latest                 "ckpt-000250": the one a reader loads
        ckpt-000250/
            model.safetensors      the weights (minigrad.serialization)
            optimizer.safetensors  the optimiser's state_dict (save_tree); absent when merged
            tokenizer.json         the tokenizer, as tokenizer.to_dict()
            state.json             configs, step, RNG states, the other files' SHA-256,
                                   what else the writer kept

Every array goes through one serializer, safetensors: no pickle, no ``.npz``. Checkpoints of
format 1 (before this layout) kept the optimiser in ``optimizer.npz``; their weights still
load (generate, fine-tune), and resuming them is refused with a message saying so.

A save is atomic and a load checks every file against the SHA-256 the save recorded
(``save_checkpoint`` and ``_check_sha256`` say how and why).

Left out on purpose: keeping the best or the last few checkpoints (only the newest is kept), and
sharded weights.
Follows nanoGPT's ``ckpt.pt`` in content, in separate files so that each is readable alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from decoder.model.config import ModelConfig
from decoder.text.data import changed_since, sha256_differs, sha256_file
from decoder.training.config import TrainConfig, device_or_cpu
from minigrad.backend import to_numpy
from minigrad.fileio import atomic_write, fsync_dir, parse_json
from minigrad.nn.lora import apply_lora, merge_lora
from minigrad.serialization import load_safetensors, load_tree, save_safetensors, save_tree
from minigrad.tensor import Tensor

FORMAT_VERSION = 2  # 1: the optimiser's arrays in optimizer.npz, its plain values in state.json
LATEST = "latest"  # the pointer file inside a run directory
WEIGHTS, OPTIMIZER, TOKENIZER, STATE = (
    "model.safetensors",
    "optimizer.safetensors",
    "tokenizer.json",
    "state.json",
)
_PREFIX, _TMP_PREFIX = "ckpt-", ".tmp-ckpt-"
CHECKPOINT_FILES = (LATEST, f"{_PREFIX}*", f"{_TMP_PREFIX}*")  # what saving puts in a run dir
_POINTER_MAX_BYTES = 1024  # a checkpoint's name is short: more is not a pointer
_READ_ATTEMPTS = 5  # loads a concurrent save may spoil (each reads and hashes) before one counts


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
    tokenizer: dict  # tokenizer.to_dict(); rebuild with decoder.text.tokenizer.tokenizer_from_dict
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

    Why it is atomic: the checkpoint is written into a fresh hidden directory (each file
    flushed to disk by ``minigrad.fileio.atomic_write``), the directory is renamed to its final
    name, and only then is ``latest`` replaced with ``os.replace``, the one atomic step. A crash
    before that leaves ``latest`` naming the previous, complete checkpoint; a crash after it
    leaves the new one complete. Writing every file atomically plus a "complete" marker would
    also work, but a reader would then have to check that all files belong to the same step;
    with one pointer there is nothing to check. Older checkpoint directories are removed once
    ``latest`` has moved on, so a reader that followed the old pointer can find its directory
    gone: ``load_checkpoint`` then reads the pointer again and retries.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    # mkdir, not mkdtemp: the directory gets the umask's mode (mkdtemp's is 0o700)
    tmp = written = run_dir / f"{_TMP_PREFIX}{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        save_safetensors(tmp / WEIGHTS, {name: _as_numpy(a) for name, a in model_state.items()})
        if optimizer_state is not None:
            save_tree(tmp / OPTIMIZER, optimizer_state)
        _write_json(tmp / TOKENIZER, tokenizer)
        files = (WEIGHTS, TOKENIZER, *([OPTIMIZER] if optimizer_state is not None else []))
        state = {
            "format": FORMAT_VERSION,
            "step": step,
            "model_config": dataclasses.asdict(model_config),
            "train_config": dataclasses.asdict(train_config),
            "optimizer": OPTIMIZER if optimizer_state is not None else None,
            "rng": rng or {},
            "extra": extra or {},
            "sha256": {name: sha256_file(tmp / name) for name in files},  # checked on load
        }
        _write_json(tmp / STATE, state)  # written last: a directory without it is incomplete
        final = _free_name(run_dir, f"{_PREFIX}{step:06d}")
        os.rename(tmp, final)
        written = final
        fsync_dir(run_dir)
        with atomic_write(run_dir / LATEST, text=True) as f:  # the one atomic step
            f.write(final.name + "\n")
    except BaseException:  # KeyboardInterrupt too: leave no directory that latest does not name
        shutil.rmtree(written, ignore_errors=True)
        raise
    _remove_old(run_dir, keep=final.name)
    return final


def _as_numpy(a: Any) -> np.ndarray:
    return to_numpy(a.data if isinstance(a, Tensor) else a)


def _write_json(path: Path, obj: Any) -> None:
    with atomic_write(path, text=True) as f:
        json.dump(obj, f, indent=1)


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
    name = _latest_name(path)
    if name is not None:
        target = path / name
        if not target.is_dir():
            raise CheckpointError(
                f"{path / LATEST} names {name!r}, which is not a directory in {path}: the run "
                f"directory was edited by hand or copied in part"
            )
        if target.resolve().parent != path.resolve():  # a symbolic link out of the run
            raise CheckpointError(
                f"{path / LATEST} names {name!r}, which leads outside {path} (to "
                f"{target.resolve()}): a run directory's pointer names one of its own checkpoints"
            )
        return target
    if (path / STATE).is_file() or (path / WEIGHTS).is_file():
        return path
    raise CheckpointError(
        f"{path}: no checkpoint here (neither a '{LATEST}' file nor '{STATE}'); pass the --out "
        f"directory of a training run or one of its ckpt-* directories"
    )


def _latest_name(run_dir: Path) -> str | None:
    """The checkpoint name in ``run_dir/latest``, checked to be a plain name; None if absent.

    The file is read only up to a short length and quoted only in part, so a huge or binary
    file gives a short error, and a name with a path in it (``../elsewhere``) is refused.
    """
    pointer = run_dir / LATEST
    try:
        with open(pointer, "rb") as f:
            raw = f.read(_POINTER_MAX_BYTES + 1)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        name = ""
    plain = name not in ("", ".", "..") and not any(c in name for c in "/\\\0\n")
    if len(raw) > _POINTER_MAX_BYTES or not plain:
        size = os.path.getsize(pointer)
        raise CheckpointError(
            f"{pointer}: should hold the name of a checkpoint directory in {run_dir}, but holds "
            f"{size} bytes starting {raw[:40]!r}: the file was edited or damaged; write the "
            f"name of one of the run's ckpt-* directories into it"
        )
    return name


def has_checkpoint(run_dir: str | os.PathLike) -> bool:
    """True when ``run_dir`` holds a checkpoint that ``load_checkpoint`` would try to read."""
    return (Path(run_dir) / LATEST).is_file()


def load_checkpoint(path: str | os.PathLike, with_optimizer: bool = True) -> Checkpoint:
    """Read a checkpoint (from a run directory or a checkpoint directory).

    Every problem raises CheckpointError naming the file and what is wrong with it. A load
    from a run directory that a training run saves into meanwhile retries: the save may have
    removed the checkpoint the old pointer named while it was being read.
    """
    path = Path(path)
    for _ in range(_READ_ATTEMPTS - 1):
        before = _latest_name(path) if path.is_dir() else None
        try:
            return _read(resolve_checkpoint(path), with_optimizer)
        except CheckpointError:
            # the error is believed unless the pointer moved while we read (a save finished)
            if before is None or _latest_name(path) == before:
                raise
    return _read(resolve_checkpoint(path), with_optimizer)  # the last try: its error stands


def _read(ckpt_dir: Path, with_optimizer: bool) -> Checkpoint:
    """The checkpoint in the directory ``ckpt_dir``, every file checked."""
    state_path = ckpt_dir / STATE
    state = _read_json(state_path)
    if not isinstance(state, dict) or state.get("format") not in (1, FORMAT_VERSION):
        found = state.get("format") if isinstance(state, dict) else state
        raise CheckpointError(
            f"{state_path}: format {found!r}, but this code reads formats 1 and {FORMAT_VERSION}"
        )
    try:
        model_config = ModelConfig(**state["model_config"])
        train_config = TrainConfig(**state["train_config"])
        step = state["step"]
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{state_path}: invalid configs or step: {e}") from e
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(
            f"{state_path}: step {step!r} is not a count of optimiser steps (an integer >= 0); "
            f"the file was edited or damaged"
        )
    rng, extra = state.get("rng", {}), state.get("extra", {})
    _check_rng(rng, state_path)
    recorded = state.get("sha256", {})  # absent from checkpoints saved before the record
    for name, value in (("extra", extra), ("sha256", recorded)):
        if not isinstance(value, dict):
            raise CheckpointError(
                f"{state_path}: {name!r} is a {type(value).__name__}, not an object; the file "
                f"was edited or damaged"
            )
    weights_path = ckpt_dir / WEIGHTS
    try:
        weights, _ = load_safetensors(weights_path)
    except FileNotFoundError:
        raise CheckpointError(f"{weights_path}: missing; the checkpoint is incomplete") from None
    except (OSError, ValueError) as e:  # the reader's message says what is corrupt
        raise CheckpointError(f"{weights_path}: cannot be read: {e}") from e
    _check_sha256(weights_path, recorded)
    tokenizer = _read_json(ckpt_dir / TOKENIZER)
    _check_sha256(ckpt_dir / TOKENIZER, recorded)
    optimizer = None
    if with_optimizer and state.get("optimizer") is not None:
        if state["format"] == 1:
            raise CheckpointError(
                f"{ckpt_dir / 'optimizer.npz'}: the optimiser state of a format-1 checkpoint, "
                f"kept as .npz, which this version no longer reads (checkpoints are safetensors "
                f"only). Its weights still load: decoder.generate and decoder.finetune read it. "
                f"To train further, resume with the version that wrote it, or start a new run"
            )
        opt_path = ckpt_dir / OPTIMIZER
        try:
            optimizer = load_tree(opt_path)
        except FileNotFoundError:
            raise CheckpointError(
                f"{opt_path}: missing, although {STATE} lists optimiser state"
            ) from None
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{opt_path}: cannot be read: {e}") from e
        _check_sha256(opt_path, recorded)
    return Checkpoint(
        path=ckpt_dir,
        step=step,
        model_config=model_config,
        train_config=train_config,
        weights=weights,
        tokenizer=tokenizer,
        optimizer=optimizer,
        rng=rng,
        extra=extra,
    )


def _read_json(path: Path) -> Any:
    try:
        return parse_json(path.read_bytes())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing; the checkpoint is incomplete") from None
    except ValueError as e:  # not JSON, or nested too deep
        raise CheckpointError(f"{path}: {e}; the file is damaged") from e


def _check_sha256(path: Path, recorded: dict[str, str]) -> None:
    """Raise CheckpointError if ``path``'s SHA-256 is not the one ``recorded`` when it was
    saved (a file without a record passes: it was saved before checksums; so does every file
    under MINIGRAD_NO_VERIFY=1, every command's ``--no-verify``, for files too large to hash
    at every load: decoder.text.data.sha256_differs).

    ``_read`` calls it after parsing each file, so a truncated file still gets the reader's own
    message. Without it a flipped byte in the weights, two same-shape tensors swapped in the
    header, or a tokenizer edited to other ids would load and give other numbers in silence.
    """
    try:
        differs = sha256_differs(path, recorded.get(path.name))
    except OSError as e:  # removed by a save since it was read: load_checkpoint retries
        raise CheckpointError(f"{path}: cannot be read: {e}") from e
    if differs:
        raise CheckpointError(f"{path}: {changed_since(STATE)}; put back the saved file")


def _check_rng(rng: Any, source: Path) -> None:
    """Raise CheckpointError unless each saved generator state can be restored into the kind
    of generator a run draws from (``np.random.default_rng``'s PCG64): a valid state of another
    kind (MT19937) would fail only at the restore, with NumPy's traceback.

    >>> _check_rng({"batches": {"bit_generator": "PCG64", "state": "?"}}, Path("s.json"))
    ... # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    decoder.training.checkpoint.CheckpointError: s.json: the state of generator 'batches' is
    damaged ...
    """
    if not isinstance(rng, dict):
        raise CheckpointError(f"{source}: 'rng' is a {type(rng).__name__}, not generator states")
    for name, saved in rng.items():
        bit_generator = np.random.default_rng().bit_generator
        kind = type(bit_generator).__name__
        try:
            if saved["bit_generator"] != kind:
                raise ValueError(
                    f"it is a {saved['bit_generator']!r} state, but a run's generators are "
                    f"{kind} (np.random.default_rng)"
                )
            bit_generator.state = saved  # NumPy checks every field as it restores them
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            raise CheckpointError(
                f"{source}: the state of generator {name!r} is damaged ({type(e).__name__}: "
                f"{e}); the weights still load, but an exact resume needs this state"
            ) from e


def check_weights(
    weights: dict[str, np.ndarray], expected: dict[str, Any], source: str | os.PathLike
) -> None:
    """Raise CheckpointError unless ``weights`` has exactly the names, shapes and dtypes of
    ``expected``.

    ``expected`` is the state dict of a model built from the checkpoint's config, so a
    mismatch means the config and the weights were not saved together, or that the file was
    edited: an F32 tensor relabelled I32 has the right length but would load as other numbers.

    >>> check_weights({"w": np.zeros((2, 3))}, {"w": np.zeros((3, 2))}, "f")
    ... # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    decoder.training.checkpoint.CheckpointError: f: 'w' has shape (2, 3), but the config builds
    (3, 2); ...
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
        if array.dtype != expected[name].dtype:
            raise CheckpointError(
                f"{source}: {name!r} is {array.dtype}, but the model holds "
                f"{expected[name].dtype}; the file was edited, or {hint}"
            )


def load_model(path: str | os.PathLike, device: str | None = "cpu"):
    """The model and tokenizer of a checkpoint, ready for inference: ``(model, tokenizer, ckpt)``.

    The model is in eval mode on ``device``, in the dtype it was trained in; ``device=None``
    is the device it was trained on, or the CPU with a note where CUDA cannot run
    (decoder.training.config.device_or_cpu). A LoRA run's adapters come merged into their
    weights. Used by decoder.generate and decoder.post.lora.
    """
    # here, not at the top: reading a checkpoint needs no model
    from decoder.model.model import build_model

    ckpt = load_checkpoint(path, with_optimizer=False)
    tokenizer = build_tokenizer(ckpt)
    if device is None:
        device = device_or_cpu(ckpt.train_config.device, requested=False)
    model = build_model(ckpt.model_config, ckpt.train_config.dtype, device)
    lora = ckpt.extra.get("lora")  # a LoRA run of decoder.sft or decoder.dpo: merge its adapters
    if lora:
        apply_lora(
            model, tuple(lora["targets"]), lora["r"], lora["alpha"], rng=np.random.default_rng(0)
        )
    check_weights(ckpt.weights, model.state_dict(), ckpt.path / WEIGHTS)
    model.load_state_dict(ckpt.weights)
    merge_lora(model)
    model.eval()
    return model, tokenizer, ckpt


def build_tokenizer(ckpt: Checkpoint):
    """The checkpoint's tokenizer, checked against the model's vocabulary size."""
    from decoder.text.tokenizer import tokenizer_from_dict

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
