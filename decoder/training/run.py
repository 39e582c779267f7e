"""A training run's state between steps (``Run``), how it starts, and how it is saved and
restored: the half of the loop (decoder.training.loop) that a resume must get exactly right.

``start_run`` builds the tokenizer, the data, the model and the optimiser, or with a resume
restores them from the run's checkpoint (decoder.training.checkpoint) after checking it
belongs to this text and these settings. ``save`` and ``restore`` write and read everything a
step depends on.

Reproducibility: the weights, the batches and dropout each draw from a seeded NumPy
generator, and a checkpoint keeps every generator's state, so a resumed run repeats the
losses of an uninterrupted one exactly. Evaluation draws from its own generator, reseeded
at every evaluation, so it never shifts the training batches and always scores the same
tokens (which also makes evaluations comparable across steps and across runs). What a
resume cannot change (the model, the tokenizer, the seed, the dtype) it refuses to change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.memory import check_memory, memory_floor
from decoder.model.model import Decoder, build_model
from decoder.text.data import TokenDataset
from decoder.text.stream import default_prompt
from decoder.text.tokenizer import get_tokenizer
from decoder.training.checkpoint import (
    CHECKPOINT_FILES,
    LATEST,
    STATE,
    WEIGHTS,
    Checkpoint,
    CheckpointError,
    build_tokenizer,
    check_weights,
    has_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from decoder.training.config import DEFAULT_PRESET, TrainConfig, build_configs
from decoder.training.dist import weights_digest
from decoder.training.log import LOG, PLOT, parameters_text, read_log
from decoder.training.mixed_precision import LOW_PRECISION, LossScaler
from decoder.training.step import LossFn, lm_loss
from minigrad.fileio import atomic_write
from minigrad.optim import AdamW, cosine_lr, param_groups_for_decay

if TYPE_CHECKING:  # decoder.training.dist imports mpi4py only when a run asks for it
    from decoder.training.dist import DataParallel

RUN_FILES = (*CHECKPOINT_FILES, LOG, PLOT)  # what a run writes into its directory
# Settings a resume cannot change: the tokenizer and the dtype are the checkpoint's, and the
# seed chose the weights and the evaluation batches (the model's shape is checked apart).
RESUME_FIXED = ("tokenizer", "bpe_vocab_size", "seed", "dtype")
SCHEDULE = ("lr", "min_lr", "warmup_iters", "lr_decay_iters", "max_iters")  # lr_at's fields
TRAIN_FIXES = {  # memory_floor's largest part -> the setting to lower
    "n_embd": "lower --n_embd (or --n_layer)",
    "block_size": "lower --block_size",
    "batch_size": "lower --batch_size or --block_size (--grad_accum_steps=N trains on as many "
    "tokens per step with batches N times smaller)",
}
SAME_COMMAND = "launch every rank with the same command line, data and run directory"


# ---- pieces of the run --------------------------------------------------------------------------
def make_tokenizer(train_cfg: TrainConfig, text: str) -> Any:
    """The tokenizer the config names, trained on ``text`` where it needs training."""
    if train_cfg.tokenizer == "bpe":
        return get_tokenizer("bpe", text=text, vocab_size=train_cfg.bpe_vocab_size)
    return get_tokenizer(train_cfg.tokenizer, text=text)


def text_fingerprint(text: str) -> str:
    """A short hash of the training text, so a resume can tell it got the same data.

    >>> text_fingerprint("hello")
    '2cf24dba5fb0a30e'
    """
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def make_optimizer(model: Decoder, train_cfg: TrainConfig) -> AdamW:
    """AdamW as every trainer sets it up: weight decay on the matrices only (nanoGPT's groups)."""
    return AdamW(
        param_groups_for_decay(model, train_cfg.weight_decay),
        lr=train_cfg.lr,
        betas=(train_cfg.beta1, train_cfg.beta2),
        weight_decay=train_cfg.weight_decay,
    )


def generators(model: Decoder) -> dict[str, np.random.Generator]:
    """Every NumPy Generator the model draws from (each Dropout owns one), by a stable name,
    and minigrad's global one: a checkpoint keeps all of their states."""
    found = {"minigrad": mg.default_rng()}
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, np.random.Generator):
                found[f"{name}.{attr}" if name else attr] = value
    return found


def _differences(a: Any, b: Any, names: tuple[str, ...] | None = None) -> list[str]:
    """The fields (of ``names``, or all) in which two configs of one class differ, as
    "name: a -> b"."""
    return [
        f"{f.name}: {getattr(a, f.name)!r} -> {getattr(b, f.name)!r}"
        for f in dataclasses.fields(a)
        if (names is None or f.name in names) and getattr(a, f.name) != getattr(b, f.name)
    ]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The learning rate of optimiser step ``step`` (0-based): warmup, then cosine decay."""
    return cosine_lr(step, cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.lr_decay_iters)


def decay_follows_max_iters(
    saved: TrainConfig, cfg: TrainConfig, overrides: dict[str, str]
) -> TrainConfig:
    """``cfg``, a resume's settings, with the decay ending at its ``max_iters`` where the run's
    ended at the run's own (the default) and the run goes on longer: its added steps would
    otherwise all run at ``min_lr``. A decay set apart or given now, or a shorter run, keeps
    the end it had (the steps already taken keep their rates).

    >>> old, longer = TrainConfig(max_iters=1000), TrainConfig(max_iters=2000, lr_decay_iters=1000)
    >>> decay_follows_max_iters(old, longer, {"max_iters": "2000"}).lr_decay_iters
    2000
    >>> decay_follows_max_iters(old, longer, {"lr_decay_iters": "1000"}).lr_decay_iters
    1000
    """
    follows = saved.lr_decay_iters == saved.max_iters and "lr_decay_iters" not in overrides
    if follows and cfg.max_iters > saved.max_iters:
        return dataclasses.replace(cfg, lr_decay_iters=cfg.max_iters)
    return cfg


def announce_resume(ckpt: Checkpoint, train_cfg: TrainConfig, say: Any) -> None:
    """Say what a resume changes and, where it changes the schedule, the learning rate it
    gives from here; refuse a new ``lr`` or ``warmup_iters`` that no remaining step would use
    (the same rule in every trainer). A run with no step left to take is refused: resuming it
    would do nothing."""
    step, cfg = ckpt.step, train_cfg
    if step >= cfg.max_iters:
        where = "complete" if step == cfg.max_iters else f"past --max_iters={cfg.max_iters}"
        raise CheckpointError(
            f"{ckpt.path}: the run is {where} at step {step}: there is nothing to resume; to "
            f"train further, resume with --max_iters=M for some M > {step}"
        )
    changed = _differences(ckpt.train_config, train_cfg)
    if changed:
        say("note: resuming with changed settings: " + "; ".join(changed))
    if not _differences(ckpt.train_config, train_cfg, SCHEDULE):
        return
    unused = _differences(ckpt.train_config, cfg, ("lr", "warmup_iters"))
    if unused and cfg.lr_decay_iters <= step < cfg.max_iters:
        raise CheckpointError(
            f"{ckpt.path}: {'; '.join(unused)} would change no step: from step {step} the "
            f"schedule stays at min_lr={cfg.min_lr:g} (lr_decay_iters={cfg.lr_decay_iters}); "
            f"give --lr_decay_iters beyond {step} too, or change --min_lr instead"
        )
    to = f"cosine decay to min_lr={cfg.min_lr:g} at step {cfg.lr_decay_iters}"
    if step >= cfg.lr_decay_iters:
        to = f"min_lr={cfg.min_lr:g} from here on"
    say(f"learning rate: {lr_at(step, cfg):.3g} at step {step + 1}, {to}, to step {cfg.max_iters}")


def _check_resume(
    ckpt: Checkpoint, model_cfg: ModelConfig, train_cfg: TrainConfig, fingerprint: str
) -> None:
    """Refuse to resume a run on other text, with another model, or with a setting a resume
    cannot change, naming the difference."""
    if ckpt.extra.get("data_sha256") not in (None, fingerprint):
        raise CheckpointError(
            f"{ckpt.path}: this run was trained on other text (hash "
            f"{ckpt.extra['data_sha256']}, file {ckpt.extra.get('data_path')}); resume "
            f"with the same --data, or start a new run with another --out"
        )
    changed = _differences(ckpt.model_config, model_cfg)
    if changed:
        raise CheckpointError(
            f"{ckpt.path}: the checkpoint's model differs from the one asked for "
            f"({'; '.join(changed)}): resume with the run's own settings, or start a new run "
            f"with another --out"
        )
    fixed = _differences(ckpt.train_config, train_cfg, RESUME_FIXED)
    if fixed:
        raise CheckpointError(
            f"{ckpt.path}: a resume cannot change {'; '.join(fixed)} (the run keeps its "
            f"tokenizer, seed and dtype): drop those settings, or start a new run with "
            f"another --out"
        )


def sample_prompt(tokenizer: Any, train_cfg: TrainConfig, data: TokenDataset) -> str:
    """The prompt of the sample printed at the end, checked now, before any training.

    The default prompt, a newline, becomes the text's first token where the vocabulary has
    no newline (decoder.text.stream.default_prompt); any other prompt must be writable in the
    vocabulary, or the error names the characters that are not.
    """
    prompt = train_cfg.sample_prompt
    if prompt == TrainConfig.sample_prompt:
        return default_prompt(tokenizer, int(data.ids[0]))
    try:
        ids = tokenizer.encode(prompt)
    except ValueError as e:
        raise ValueError(
            f"--sample_prompt={prompt!r} cannot be written with this run's tokenizer: {e}; "
            f"choose a prompt from the text's own characters, or --sample_tokens=0"
        ) from None
    if not ids:
        raise ValueError("--sample_prompt is empty: give at least one character")
    return prompt


# ---- a run: its state, its start and its checkpoints -------------------------------
@dataclass
class Run:
    """What a training run holds between steps."""

    out_dir: Path
    model_cfg: ModelConfig
    train_cfg: TrainConfig
    model: Decoder
    optimizer: AdamW
    tokenizer: Any
    data: TokenDataset
    rngs: dict[str, np.random.Generator]  # the batches' generator and the model's
    extra: dict  # kept in each checkpoint: the text's hash and path
    step: int = 0  # optimiser steps done
    elapsed: float = 0.0  # seconds of training steps, over every resume
    saved_step: int | None = None  # the step of the newest checkpoint on disk
    losses: dict[str, float] = field(default_factory=dict)  # the last evaluation's
    dist: DataParallel | None = None  # this process's rank in a data-parallel run
    loss_fn: LossFn = lm_loss  # a batch's loss: decoder.post.dpo gives its own
    metrics: Callable[[Run], dict[str, float]] | None = None  # more numbers per evaluation
    command: str = "decoder.train"  # the module that resumes the run, for messages
    scaler: LossScaler | None = None  # the loss scale of a mixed-precision run
    # what a checkpoint writes: None, the whole run (resumable); decoder.post.lora its adapters
    writer: Callable[[Run], None] | None = None

    @property
    def is_main(self) -> bool:
        """Whether this process evaluates, logs and writes (one process, or rank 0)."""
        return self.dist is None or self.dist.is_main

    def kept(self) -> str:
        """What a run that stops now leaves behind, for error messages."""
        if self.saved_step is None:
            return "no checkpoint was written"
        return f"the checkpoint of step {self.saved_step} in {self.out_dir} is kept"


def start_run(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    text: str,
    out_dir: Path,
    resume: bool,
    data_path: str | None,
    say: Any = print,
    dist: DataParallel | None = None,
) -> Run:
    """Build the tokenizer, data, model and optimiser, from the checkpoint in ``out_dir``
    when resuming (after checking it belongs to this text and these settings)."""
    if dist is not None and model_cfg.dropout > 0:
        raise ValueError(
            f"--ddp with dropout={model_cfg.dropout}: every rank would draw the same dropout "
            f"masks; train data-parallel with --dropout=0"
        )
    fingerprint = text_fingerprint(text)
    ckpt = load_checkpoint(out_dir) if resume else None
    tokenizer = build_tokenizer(ckpt) if ckpt else make_tokenizer(train_cfg, text)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    itemsize = np.dtype(train_cfg.dtype).itemsize
    floor = memory_floor(model_cfg, itemsize, train_cfg.batch_size, training=True)
    check_memory(floor, train_cfg.device, TRAIN_FIXES)  # before anything of that size exists
    if ckpt is not None:
        _check_resume(ckpt, model_cfg, train_cfg, fingerprint)
    if dist is not None:  # the first collective: ranks that disagree would hang in a later one
        start = {"start step": ckpt.step if ckpt else 0, "--resume": resume, "--zero": dist.zero}
        settings = {**dataclasses.asdict(model_cfg), **dataclasses.asdict(train_cfg), **start}
        dist.agree("the run", {**settings, "data (sha256)": fingerprint}, SAME_COMMAND)

    # The data: 90% of the tokens to train on, the rest to validate (ids cached on disk).
    data = TokenDataset.from_text(text, tokenizer)

    # The model and optimiser. The global generator seeds the weights and each Dropout's own.
    mg.manual_seed(train_cfg.seed)
    model = build_model(model_cfg, train_cfg.dtype, train_cfg.device)
    model.train()
    optimizer = make_optimizer(model, train_cfg)
    run = Run(
        out_dir=out_dir,
        model_cfg=model_cfg,
        train_cfg=train_cfg,
        model=model,
        optimizer=optimizer,
        tokenizer=tokenizer,
        data=data,
        rngs={"batches": np.random.default_rng(train_cfg.seed), **generators(model)},
        extra={"data_sha256": fingerprint, "data_path": data_path},
        dist=dist,
        scaler=LossScaler(train_cfg.dtype) if train_cfg.dtype in LOW_PRECISION else None,
    )
    matmul_line = matmul_text(train_cfg)
    if matmul_line:
        say(matmul_line)
    if ckpt is None:
        say(f"training {parameters_text(model)}; the run directory is {out_dir}")
    else:
        announce_resume(ckpt, train_cfg, say)
        restore(run, ckpt)
        say(f"resuming {out_dir} from step {run.step}")
    if dist is not None:
        digest = {"the weights' sha256": weights_digest(model.state_dict())}
        dist.agree("the initial weights", digest, SAME_COMMAND)
    return run


def matmul_text(train_cfg: TrainConfig) -> str:
    """The header line that says how a GPU run multiplies float32 matrices ("" on the CPU,
    where NumPy has no TF32, unless the run asked for it).

    >>> matmul_text(TrainConfig(device="cuda", matmul_precision="high"))
    'float32 products: TF32 on the GPU (matmul_precision=high: 10-bit inputs, float32 sums)'
    >>> matmul_text(TrainConfig())
    ''
    """
    tf32 = train_cfg.matmul_precision == "high"
    if train_cfg.device == "cpu":
        return (
            "note: matmul_precision=high (TF32) is a GPU mode: the CPU ignores it" if tf32 else ""
        )
    if train_cfg.dtype != "float32":
        return f"{train_cfg.dtype} products (matmul_precision applies to float32 only)"
    if tf32:
        return (
            "float32 products: TF32 on the GPU (matmul_precision=high: 10-bit inputs, float32 sums)"
        )
    return "float32 products: float32 on the GPU (matmul_precision=high allows TF32)"


def restore(run: Run, ckpt: Checkpoint) -> None:
    """Put the checkpoint's weights, optimiser state, generators and step into ``run``."""
    check_weights(ckpt.weights, run.model.state_dict(), ckpt.path / WEIGHTS)
    run.model.load_state_dict(ckpt.weights)
    if run.dist is not None:  # under ZeRO-1 each rank keeps its slice of the state
        run.dist.load_optimizer_state(run.optimizer, ckpt.optimizer)
    else:
        run.optimizer.load_state_dict(ckpt.optimizer)
    missing = sorted(set(run.rngs) - set(ckpt.rng))
    if missing:
        raise CheckpointError(f"{ckpt.path / STATE}: no state for the generators {missing}")
    for name, rng in run.rngs.items():
        rng.bit_generator.state = ckpt.rng[name]  # subtle: in place: the model holds them
    run.step = run.saved_step = ckpt.step
    run.elapsed = ckpt.extra.get("elapsed_s", 0.0)
    if run.scaler is not None:
        run.scaler.load_state_dict(ckpt.extra["loss_scaler"])
    if not run.is_main:
        return
    # keep the log rows up to the checkpoint (a run that died later may have written more)
    rows = [r for r in read_log(run.out_dir) if r["step"] <= run.step]
    with atomic_write(run.out_dir / LOG, text=True) as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    if rows:
        run.losses = {"train": rows[-1]["train_loss"], "val": rows[-1]["val_loss"]}


def save(run: Run) -> None:
    """Write a checkpoint of the run as it is now (under --ddp every rank calls it: ZeRO-1
    gathers the optimiser's state; rank 0 writes), or what ``run.writer`` writes instead."""
    if run.writer is not None:
        run.writer(run)
        run.saved_step = run.step
        return
    if run.dist is not None:
        optimizer_state = run.dist.optimizer_state(run.optimizer)
    else:
        optimizer_state = run.optimizer.state_dict()
    if run.is_main:
        save_checkpoint(
            run.out_dir,
            step=run.step,
            model_state=run.model.state_dict(),
            model_config=run.model_cfg,
            train_config=run.train_cfg,
            tokenizer=run.tokenizer.to_dict(),
            optimizer_state=optimizer_state,
            rng={name: rng.bit_generator.state for name, rng in run.rngs.items()},
            extra={**run.extra, "elapsed_s": run.elapsed, **_scaler_state(run)},
        )
    run.saved_step = run.step


def _scaler_state(run: Run) -> dict[str, Any]:
    """What a checkpoint keeps of the loss scale: nothing outside mixed precision."""
    return {"loss_scaler": run.scaler.state_dict()} if run.scaler is not None else {}


def resume_configs(
    out_dir: Path, preset: str | None, overrides: dict[str, str]
) -> tuple[ModelConfig, TrainConfig, Checkpoint]:
    """The configs of the run in ``out_dir`` with ``overrides`` applied, and its checkpoint.

    A ``preset`` given with a resume must build the run's own model: a resume cannot change
    the model, so a preset that would is refused rather than ignored.
    """
    if not has_checkpoint(out_dir):
        raise CheckpointError(f"{out_dir}: no checkpoint to resume from (no '{LATEST}' file)")
    saved = load_checkpoint(out_dir, with_optimizer=False)
    if preset is not None:  # the preset's model, with the model settings given now
        model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
        asked, _ = build_configs(preset, {k: overrides[k] for k in model_fields & set(overrides)})
        asked = dataclasses.replace(asked, vocab_size=saved.model_config.vocab_size)
        changed = _differences(saved.model_config, asked)
        if changed:
            raise CheckpointError(
                f"{out_dir}: --preset {preset} builds another model than the run's "
                f"({'; '.join(changed)}), and a resume cannot change the model: drop --preset"
            )
    # the run's own settings, except those given now
    kept = {
        k: v
        for cfg in (saved.model_config, saved.train_config)
        for k, v in dataclasses.asdict(cfg).items()
        if k not in overrides
    }
    model_cfg, train_cfg = build_configs(preset or DEFAULT_PRESET, overrides, **kept)
    return model_cfg, decay_follows_max_iters(saved.train_config, train_cfg, overrides), saved
