"""LoRA fine-tuning of a trained checkpoint on new text, and merging the adapters back
(``python -m decoder.finetune`` is its command).

Fine-tuning freezes the base model, wraps the target projections in LoRA adapters
(minigrad.nn.lora) and trains only those, with the base run's batch size and context. It
prints the validation loss on the new text before (the base model: LoRA's B starts at
zero) and after, and saves only the adapters: ``adapters.safetensors`` and ``lora.json``
(the LoRA settings, the losses, the path of the base checkpoint and the sha256 of its
weights, of its tokenizer.json and of the adapters' file), a few kilobytes where the base is
megabytes, beside the loop's ``log.jsonl`` and ``loss.png``. Loading adapters refuses a
base whose weights or tokenizer changed since (and adapters changed since they were saved),
and names the base run's newer checkpoint when
training that run further removed the one they were trained on (a run keeps only its
newest): copy a base checkpoint elsewhere to keep it. ``--merge`` (or the ``merge``
command) folds the adapters into the base weights and writes a full checkpoint that
decoder.generate reads like any other;
for a Hugging Face base (``--from-pretrained``), a Hugging Face directory, to share, with the
base's whole context (``--block-size`` crops it for training only) and a ``sha256.json`` of its
files that loading checks (decoder.hf.pretrained.check_checksums). A merge refuses an output
directory that is, holds or lies in its inputs.

The new text must be written in the base tokenizer's vocabulary: a character-level model
cannot read characters it has never seen (the error lists them). Training is
decoder.training.loop's loop, the one every trainer runs (its progress bar, evaluations,
``log.jsonl`` and ``loss.png``, Ctrl-C and NaN handling), with the adapters and ``lora.json`` as
its checkpoint.
``--out`` is held as decoder.training.rundir describes: locked while in use, and a previous
fine-tune's adapters (or a merged checkpoint) are replaced only with ``--overwrite``.

Left out on purpose: QLoRA (quantised bases), adapters on embeddings or on a tied output head
(minigrad.nn.lora.apply_lora refuses it: merging would change the embedding), several adapters
at once, and resuming a fine-tune (they take minutes). Follows Hu et al. 2021 ("LoRA") and
the shape of HF PEFT's save format (adapter weights + a small JSON config).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import minigrad as mg
from decoder.hf.pretrained import (
    CHECKSUMS,
    CONFIG,
    HF_FILES,
    TOKENIZER_JSON,
    load_pretrained,
    resolve_source,
    save_pretrained,
    write_checksums,
)
from decoder.text.data import TokenDataset, changed_since, sha256_differs, sha256_file
from decoder.training.checkpoint import (
    CHECKPOINT_FILES,
    LATEST,
    CheckpointError,
    has_checkpoint,
    load_checkpoint,
    load_model,
    resolve_checkpoint,
    save_checkpoint,
)
from decoder.training.config import TrainConfig
from decoder.training.log import LOG, PLOT, read_log
from decoder.training.loop import evaluates_at, loop
from decoder.training.run import Run
from decoder.training.rundir import claim_dir
from minigrad.backend import to_numpy
from minigrad.cpu_tuning import reuse_freed_memory
from minigrad.fileio import atomic_write, parse_json
from minigrad.nn.lora import apply_lora, load_lora_state_dict, lora_state_dict, merge_lora
from minigrad.optim import AdamW
from minigrad.serialization import load_safetensors, save_safetensors

ADAPTERS, SETTINGS, MERGED = "adapters.safetensors", "lora.json", "merged"


def _head_counts(model: Any) -> dict[str, int]:
    """How many heads each attention projection produces (W_K and W_V fewer under GQA)."""
    c = model.config
    return {"wq": c.n_head, "wk": c.n_kv_head, "wv": c.n_kv_head, "wo": c.n_head}


def _encode(tokenizer: Any, text: str, source: str) -> list[int]:
    try:
        return tokenizer.encode(text)
    except ValueError as e:
        raise ValueError(
            f"{source} cannot be written with the base checkpoint's tokenizer: {e}; fine-tune "
            f"on text in the base model's vocabulary"
        ) from None


def finetune(
    checkpoint: str | Path,
    text: str,
    out_dir: str | Path,
    r: int = 8,
    alpha: float = 16.0,
    targets: tuple[str, ...] = ("wq", "wv"),
    per_head: bool = False,
    dropout: float = 0.0,
    max_iters: int = 200,
    lr: float = 1e-3,
    seed: int = 1337,
    device: str | None = "cpu",
    progress: bool = True,
    data_path: str | None = None,
    overwrite: bool = False,
    pretrained: bool = False,
    block_size: int | None = None,
) -> dict[str, Any]:
    """Train LoRA adapters on ``text`` and save them (only them) into ``out_dir``.

    ``checkpoint`` is one of our checkpoints, or with ``pretrained`` a Hugging Face model
    directory or hub name (decoder/hf/pretrained.py), trained with TrainConfig's batch settings
    and a context of ``block_size`` tokens (default: the model's), on ``device`` (None: the one
    the base checkpoint was trained on, as decoder.training.checkpoint.load_model's; the CPU
    for a Hugging Face base). ``lr``, ``max_iters`` and
    ``seed`` become TrainConfig fields, so a value outside their range is a ValueError naming
    the field, as for decoder.train's.

    ``out_dir`` is held as decoder.training.rundir describes: a directory holding a previous
    fine-tune's adapters is refused unless ``overwrite``. Returns ``{"val_loss_before",
    "val_loss_after", "trainable", "wrapped", "out_dir"}``. A NaN or infinite loss raises
    decoder.training.step.TrainingDiverged, as in decoder.training.loop.
    """
    reuse_freed_memory()  # as decoder.training.loop: keep the pages each step frees
    say = print if progress else (lambda *a, **k: None)
    files = (ADAPTERS, SETTINGS, MERGED, LOG, PLOT)
    with claim_dir(out_dir, files, SETTINGS, overwrite=overwrite, resumable=False) as out_dir:
        model, tokenizer, base_cfg, base = _load_base(checkpoint, device, pretrained, block_size)
        cfg = _finetune_config(base_cfg, model.device, lr, max_iters, seed)
        data = TokenDataset(_encode(tokenizer, text, data_path or "the fine-tune text"))
        mg.manual_seed(seed)  # the adapters' A init and their dropout generators
        lora = dict(r=r, alpha=alpha, dropout=dropout, per_head=per_head)
        wrapped = _apply(model, targets, lora)
        model.to(cfg.device)
        n_trainable = sum(p.size for p in model.parameters() if p.requires_grad)
        names = ", ".join(sorted({w.split(".")[-1] for w in wrapped}))
        say(
            f"LoRA on {len(wrapped)} layers ({names}): {n_trainable:,} trainable of "
            f"{model.num_parameters():,} parameters"
        )
        settings = {**lora, "targets": list(targets), **base, "data": data_path}
        settings |= {"max_iters": max_iters, "lr": lr, "seed": seed}
        run = _adapters_run(model, tokenizer, data, cfg, out_dir, settings)
        loop(run, None, progress)
        before, after = read_log(out_dir)[0]["val_loss"], run.losses["val"]
    say(f"val loss on the new text before fine-tuning: {before:.4f}")
    say(f"val loss on the new text after {max_iters} steps ({run.elapsed:.1f} s): {after:.4f}")
    say(f"adapters saved in {out_dir} ({ADAPTERS}, {SETTINGS})")
    return {
        "val_loss_before": before,
        "val_loss_after": after,
        "trainable": n_trainable,
        "wrapped": wrapped,
        "out_dir": str(out_dir),
    }


def _adapters_run(
    model: Any, tokenizer: Any, data: TokenDataset, cfg: TrainConfig, out_dir: Path, settings: dict
) -> Run:
    """decoder.training.loop's run around a wrapped model: AdamW without weight decay on the
    trainable parameters, batches drawn from ``cfg.seed``, the adapters as its checkpoint."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return Run(
        out_dir=out_dir,
        model_cfg=model.config,
        train_cfg=cfg,
        model=model,
        optimizer=AdamW(trainable, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=0.0),
        tokenizer=tokenizer,
        data=data,
        rngs={"batches": np.random.default_rng(cfg.seed)},
        extra={},
        command="decoder.finetune",
        writer=lambda run: _save_adapters(run, settings),
    )


def _save_adapters(run: Run, settings: dict[str, Any]) -> None:
    """A fine-tune's checkpoint: its adapters, then ``lora.json`` (the manifest, written last)
    with the validation loss before training and, where the loop has just evaluated, now."""
    cfg, out_dir = run.train_cfg, run.out_dir
    save_safetensors(out_dir / ADAPTERS, lora_state_dict(run.model))
    record = {
        **settings,
        "step": run.step,
        "val_loss_before": read_log(out_dir)[0]["val_loss"],  # the loop's evaluation at step 0
        "val_loss_after": run.losses["val"] if evaluates_at(run.step, cfg) else None,
        "sha256": {ADAPTERS: sha256_file(out_dir / ADAPTERS)},  # checked on load
    }
    with atomic_write(out_dir / SETTINGS, text=True) as f:
        json.dump(record, f, indent=1)


def _finetune_config(
    base_cfg: TrainConfig, device: str, lr: float, max_iters: int, seed: int
) -> TrainConfig:
    """The base run's batch size, evaluation batches and clipping, with this seed and a cosine
    schedule from lr to lr / 10 after a tenth of the steps: TrainConfig checks lr, max_iters
    and seed by the rules decoder.train's settings meet."""
    return dataclasses.replace(
        base_cfg,
        seed=seed,
        device=device,
        lr=lr,
        min_lr=lr / 10,
        max_iters=max_iters,
        warmup_iters=max_iters // 10,
        lr_decay_iters=max_iters,
    )


def _apply(model: Any, targets: Sequence[str], lora: dict[str, Any]) -> list[str]:
    """Wrap ``targets`` in adapters of the settings ``lora`` (r, alpha, dropout, per_head, as
    lora.json keeps them); returns the wrapped layers' names."""
    n_head = _head_counts(model) if lora["per_head"] else None
    return apply_lora(model, tuple(targets), **lora, n_head=n_head)


def _load_base(
    source: str | Path,
    device: str | None,
    pretrained: bool,
    block_size: int | None = None,
    trained_block_size: int | None = None,
) -> tuple[Any, Any, TrainConfig, dict[str, Any]]:
    """The base model, its tokenizer, its training settings, and where it came from (for
    lora.json): one of our checkpoints, or a Hugging Face model, its context cropped to
    ``block_size``; its digest is that of the model cropped to ``trained_block_size`` (the
    fine-tune's context; default: the one loaded), so a base loaded whole for a merge is
    checked against the digest its fine-tune recorded."""
    if pretrained:
        model, tokenizer = load_pretrained(source, device=device or "cpu", block_size=block_size)
        where = str(resolve_source(source).resolve())  # a hub name: its cache directory
        trained = trained_block_size or model.config.block_size
        base = {"base_pretrained": where, "block_size": trained, **_tokenizer_sha256(where)}
        return model, tokenizer, TrainConfig(), {**base, "base_sha256": _digest(model, trained)}
    model, tokenizer, ckpt = load_model(source, device=device)
    where = {"base_checkpoint": str(ckpt.path.resolve()), "base_step": ckpt.step}
    where |= _tokenizer_sha256(ckpt.path)
    return model, tokenizer, ckpt.train_config, {**where, "base_sha256": _digest(model)}


def _tokenizer_sha256(base_dir: str | Path) -> dict[str, str]:
    """lora.json's record of the base's tokenizer.json, which the adapters learned to read
    (none for a Hugging Face GPT-2: tiktoken's gpt2 encoding, fixed by its name)."""
    path = Path(base_dir) / TOKENIZER_JSON
    return {"tokenizer_sha256": sha256_file(path)} if path.is_file() else {}


def _digest(model: Any, rows: int | None = None) -> str:
    """The sha256 of a model's weights (names, dtypes, shapes and values): lora.json records
    the base's, so adapters are never applied to a base that changed since (retrained,
    overwritten, or another download under the same name). ``rows``: hash the learned
    positions' first rows only, as loading with that block_size crops them."""
    digest = hashlib.sha256()
    # what state_dict saves, without its copies: a base of billions of weights is hashed once
    tensors = model.named_parameters() + model.named_buffers(persistent_only=True)
    for name, tensor in sorted(tensors, key=lambda named: named[0]):
        array = to_numpy(tensor.data)  # a GPU base: one tensor at a time
        array = np.ascontiguousarray(array[:rows] if name == "pos_emb.weight" else array)
        digest.update(f"{name} {array.dtype.str} {array.shape}\n".encode())
        digest.update(array.data)
    return digest.hexdigest()


def _read_settings(adapters_dir: Path) -> tuple[dict[str, Any], str, bool]:
    """A fine-tune's lora.json, the base it names, and whether that is a Hugging Face model."""
    path = adapters_dir / SETTINGS
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; is {adapters_dir} the --out of a fine-tune?")
    try:
        settings = parse_json(path.read_bytes())
    except ValueError as e:  # not JSON, or nested too deep
        raise CheckpointError(f"{path}: {e}") from e
    pretrained = "base_pretrained" in settings
    return settings, settings["base_pretrained" if pretrained else "base_checkpoint"], pretrained


def load_adapted(
    adapters_dir: str | Path, device: str = "cpu", full_context: bool = False
) -> tuple[Any, Any, dict]:
    """The base model with the saved adapters applied (not merged): (model, tokenizer, settings).

    A Hugging Face base comes with the context its fine-tune trained with, or with
    ``full_context`` its own (what a merge saves: a crop for training is not the model's)."""
    adapters_dir = Path(adapters_dir)
    settings, base, pretrained = _read_settings(adapters_dir)
    path = adapters_dir / SETTINGS
    if not pretrained and not Path(base).is_dir():
        run_dir = Path(base).parent
        now = resolve_checkpoint(run_dir).name if has_checkpoint(run_dir) else "no checkpoint"
        raise CheckpointError(
            f"{path}: these adapters were trained on {base} (step {settings['base_step']}), "
            f"which is gone: {run_dir} now holds {now} (a run keeps only its newest "
            f"checkpoint). Fine-tune again on the current base; to keep a base, copy its "
            f"checkpoint directory elsewhere and fine-tune from the copy"
        )
    trained = settings.get("block_size")
    crop = None if full_context else trained
    model, tokenizer, _, where = _load_base(base, "cpu", pretrained, crop, trained)
    if where["base_sha256"] != settings.get("base_sha256", where["base_sha256"]):
        raise CheckpointError(
            f"{path}: the base {base} holds other weights than the ones these adapters were "
            f"trained on (sha256 {where['base_sha256'][:12]}..., recorded "
            f"{settings['base_sha256'][:12]}...): it was retrained or replaced since. "
            f"Fine-tune again on it"
        )
    lora = {k: settings[k] for k in ("r", "alpha", "dropout", "per_head")}
    _apply(model, settings["targets"], lora)
    try:
        arrays, _ = load_safetensors(adapters_dir / ADAPTERS)
        load_lora_state_dict(model, arrays)
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{adapters_dir / ADAPTERS}: {e}") from e
    recorded = settings.get("sha256") if isinstance(settings.get("sha256"), dict) else {}
    base_dir = Path(where.get("base_pretrained") or where["base_checkpoint"])
    for file, want in (
        (adapters_dir / ADAPTERS, recorded.get(ADAPTERS)),
        (base_dir / TOKENIZER_JSON, settings.get("tokenizer_sha256")),
    ):
        if sha256_differs(file, want):
            raise CheckpointError(f"{file}: {changed_since(path)}; put it back or fine-tune again")
    model.to(device)
    model.eval()
    return model, tokenizer, settings


def merge(adapters_dir: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Fold saved adapters into their base and write a full checkpoint (no optimiser state),
    or for a Hugging Face base, a Hugging Face directory (with the base's tokenizer.json).

    ``out_dir`` is held as decoder.training.rundir describes: one holding a checkpoint is refused
    unless ``overwrite``; one that is, holds or lies in the base (or is, or holds, the
    adapters' directory) is refused. A Hugging Face base keeps its own context (not the one a
    fine-tune's ``block_size`` cropped it to).
    """
    settings, base, _ = _read_settings(Path(adapters_dir))
    _refuse_overlap(out_dir, adapters_dir, base)
    model, tokenizer, settings = load_adapted(adapters_dir, full_context=True)
    merge_lora(model)
    if "base_pretrained" in settings:
        base_dir = Path(settings["base_pretrained"])
        hf_files = (*HF_FILES, CHECKSUMS)
        with claim_dir(out_dir, hf_files, CONFIG, overwrite=overwrite, resumable=False) as out_dir:
            if (base_dir / TOKENIZER_JSON).is_file():
                shutil.copyfile(base_dir / TOKENIZER_JSON, out_dir / TOKENIZER_JSON)
            saved = save_pretrained(model, out_dir)
            write_checksums(out_dir)  # ties the merged weights to their tokenizer
            return saved
    base = load_checkpoint(settings["base_checkpoint"], with_optimizer=False)
    with claim_dir(
        out_dir, CHECKPOINT_FILES, LATEST, overwrite=overwrite, resumable=False
    ) as out_dir:
        return save_checkpoint(
            out_dir,
            step=base.step,
            model_state=model.state_dict(),
            model_config=base.model_config,
            train_config=base.train_config,
            tokenizer=tokenizer.to_dict(),
            extra={"merged_adapters": str(Path(adapters_dir).resolve()), **settings},
        )


def _refuse_overlap(out_dir: str | Path, adapters_dir: str | Path, base: str | Path) -> None:
    """Raise a ValueError when a merge's ``out_dir`` is, holds or lies inside the base, or is
    or holds the adapters' directory (their own ``merged`` folder is where --merge writes):
    claiming ``out_dir`` with --overwrite moves its files aside, inputs included."""
    out = Path(out_dir).resolve()
    for role, where, inside_ok in (("base", base, False), ("adapters", adapters_dir, True)):
        where = Path(where).resolve()
        if out == where or where.is_relative_to(out):
            relation = "is" if out == where else "holds"
        elif out.is_relative_to(where) and not inside_ok:
            relation = "lies inside"
        else:
            continue
        raise ValueError(
            f"--out {out_dir} {relation} the {role} {where}: the merge would move the input "
            f"aside (or write into it) before reading it; choose an --out outside {where}"
        )
