"""Training: the loop, its log and plot, and the command line.

    python -m decoder.train                                  # nanoGPT's CPU Shakespeare run
    python -m decoder.train --preset tiny --max_iters=200    # any config field as --key=value
    python -m decoder.train --out runs/shakespeare-char --resume

One step: set the learning rate of a cosine schedule with linear warmup, sample a batch,
then decoder.step.train_step: forward, backward, clip the gradient's global norm, take an
AdamW step. Every ``eval_interval`` steps (and at the end) the model is evaluated on fixed
batches of both splits (decoder.step.estimate_loss), a checkpoint is written (see
decoder.checkpoint for the directory layout and why it is atomic), and only then does a row
go into ``log.jsonl`` and ``loss.png`` get redrawn: the log never claims a step whose
checkpoint did not land.

The run directory (``--out``) is locked while a run uses it, a new run refuses one that
holds a previous run unless told ``--resume`` or ``--overwrite``, and a run that fails
before its first checkpoint removes what it wrote (and puts back a run it was overwriting;
see decoder.rundir).

Reproducibility: the weights, the batches and dropout each draw from a seeded NumPy
generator, and a checkpoint keeps every generator's state, so a resumed run repeats the
losses of an uninterrupted one exactly. Evaluation draws from its own generator, reseeded
at every evaluation, so it never shifts the training batches and always scores the same
tokens (which also makes evaluations comparable across steps and across runs). What a
resume cannot change (the model, the tokenizer, the seed, the dtype) it refuses to change.

Ctrl-C finishes the current step, writes a checkpoint and exits with status 130; a second
Ctrl-C stops at once. A loss that is NaN or infinite stops the run before the bad step
touches the weights, naming the step; the last checkpoint stays as it was.

Each step draws ``batch_size * grad_accum_steps`` windows per rank from the one batches
generator, which every rank of a data-parallel run (``--ddp``, see decoder.dist) seeds alike;
rank r trains on the r-th share, so N ranks take the steps one process takes with N times the
rows, and a resume with another N continues the same stream of windows, grouped N'/N times as
wide per step (the same run, up to float rounding, wherever N * grad_accum_steps stays the
same). Rank 0 alone evaluates, logs, draws the bar and writes the checkpoints.

With ``--dtype=float16`` the weights and AdamW's state stay float32 while the forward and
backward passes run in float16 on a scaled loss (decoder.mixed_precision); each log row
carries the loss scale and the steps skipped for an overflow.

Left out on purpose: several GPUs, dropout under --ddp (each rank would
draw the same masks), and keeping the best checkpoint (the newest is kept). Follows
nanoGPT's ``train.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import minigrad as mg
from decoder.checkpoint import (
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
from decoder.config import (
    DEFAULT_PRESET,
    PRESETS,
    ModelConfig,
    TrainConfig,
    build_configs,
    device_or_cpu,
)
from decoder.data import TokenDataset, load_shakespeare, load_text
from decoder.generate import default_prompt
from decoder.mixed_precision import LOW_PRECISION, LossScaler
from decoder.model import Decoder
from decoder.moe import expert_postfix
from decoder.rundir import claim_dir
from decoder.step import LossFn, TrainingDiverged, estimate_loss, lm_loss, train_step
from decoder.tokenizer import get_tokenizer
from minigrad.backend import DEVICES, reuse_freed_memory
from minigrad.fileio import atomic_write
from minigrad.optim import AdamW, cosine_lr, param_groups_for_decay, set_lr

if TYPE_CHECKING:  # decoder.dist imports mpi4py only when a run asks for it
    from decoder.dist import DataParallel

LOG, PLOT = "log.jsonl", "loss.png"
RUN_FILES = (*CHECKPOINT_FILES, LOG, PLOT)  # what a run writes into its directory
# Settings a resume cannot change: the tokenizer and the dtype are the checkpoint's, and the
# seed chose the weights and the evaluation batches (the model's shape is checked apart).
RESUME_FIXED = ("tokenizer", "bpe_vocab_size", "seed", "dtype")


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


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The learning rate of optimiser step ``step`` (0-based): warmup, then cosine decay."""
    return cosine_lr(step, cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.lr_decay_iters)


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
    no newline (decoder.generate.default_prompt); any other prompt must be writable in the
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


# ---- the log and the plot -----------------------------------------------------------------------
def append_log(out_dir: Path, row: dict) -> None:
    """Add one evaluation's row to ``log.jsonl``."""
    with open(out_dir / LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def read_log(out_dir: Path) -> list[dict]:
    """The rows of ``log.jsonl`` (none if it is missing).

    The log is only ever appended to, so a last line without its newline is a write that a
    crash or a full disk cut short: it is dropped with a warning. Any other damage is an
    error naming the file and the line.
    """
    path = out_dir / LOG
    if not path.is_file():
        return []
    lines = path.read_bytes().split(b"\n")  # the last item is b"" after a final newline
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("not an object with an integer 'step'")
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            if number == len(lines):
                warnings.warn(
                    f"{path}: dropped its last line, a row whose writing was cut short "
                    f"({len(line)} bytes, no newline)",
                    stacklevel=2,
                )
                break
            raise ValueError(
                f"{path}, line {number}: not a log row ({e}); delete that line (the log is "
                f"only read to draw the plot and to carry the rows over on a resume)"
            ) from None
        rows.append(row)
    return rows


def plot_losses(out_dir: Path, title: str = "", metrics: Sequence[str] = ()) -> None:
    """Redraw ``loss.png`` from ``log.jsonl``: train and val loss against the step, for a
    mixture of experts a panel with each expert's share of the routed tokens, and a panel
    with the ``metrics`` (names of other columns of the log, as decoder.dpo's)."""
    # matplotlib's object API with the Agg canvas: no pyplot global state, no display needed
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = read_log(out_dir)
    routed = [r for r in rows if "expert_share" in r]  # none before the first step
    n_panels = 1 + bool(routed) + bool(metrics)
    fig = Figure(figsize=(6, 1 + 3 * n_panels), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(n_panels, 1, 1)
    steps = [r["step"] for r in rows]
    ax.plot(steps, [r["train_loss"] for r in rows], "o-", label="train")
    ax.plot(steps, [r["val_loss"] for r in rows], "o-", label="val")
    ax.set(xlabel="step", ylabel="cross-entropy loss (nats/token)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    if routed:
        shares = np.array([r["expert_share"] for r in routed])  # (rows, n_experts)
        share_ax = fig.add_subplot(n_panels, 1, 2, sharex=ax)
        for e in range(shares.shape[1]):
            share_ax.plot([r["step"] for r in routed], shares[:, e], ".-", label=f"expert {e}")
        share_ax.axhline(1 / shares.shape[1], color="gray", ls="--", label="balanced")
        share_ax.set(xlabel="step", ylabel="share of routed tokens")
        share_ax.grid(alpha=0.3)
        share_ax.legend(fontsize="x-small", ncol=4)
    if metrics:
        metric_ax = fig.add_subplot(n_panels, 1, n_panels, sharex=ax)
        for name in metrics:
            shown = [r for r in rows if name in r]
            metric_ax.plot([r["step"] for r in shown], [r[name] for r in shown], "o-", label=name)
        metric_ax.set(xlabel="step")
        metric_ax.grid(alpha=0.3)
        metric_ax.legend()
    fig.tight_layout()
    with atomic_write(out_dir / PLOT) as f:  # a viewer never sees a half-drawn file
        fig.savefig(f, format="png")


def parameters_text(model: Decoder) -> str:
    """The model's size for the log and the plot: with experts, also the parameters one token
    uses."""
    total, active = model.num_parameters(), model.num_active_parameters()
    return f"{total:,} parameters" + (f" ({active:,} active per token)" if active < total else "")


# ---- a run: its state, its start, its checkpoints and evaluations -------------------------------
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
    loss_fn: LossFn = lm_loss  # a batch's loss: decoder.dpo gives its own
    metrics: Callable[[Run], dict[str, float]] | None = None  # more numbers per evaluation
    command: str = "decoder.train"  # the module that resumes the run, for messages
    scaler: LossScaler | None = None  # the loss scale of a mixed-precision run

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
    if ckpt is not None:
        _check_resume(ckpt, model_cfg, train_cfg, fingerprint)

    # The data: 90% of the tokens to train on, the rest to validate (ids cached on disk).
    data = TokenDataset.from_text(text, tokenizer)

    # The model and optimiser. The global generator seeds the weights and each Dropout's own.
    mg.manual_seed(train_cfg.seed)
    model = Decoder(model_cfg)
    if train_cfg.dtype == "float64":
        model.double()
    model.to(train_cfg.device)
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
        return run
    changed = _differences(ckpt.train_config, train_cfg)
    if changed:
        say("note: resuming with changed settings: " + "; ".join(changed))
    restore(run, ckpt)
    say(f"resuming {out_dir} from step {run.step}")
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
    gathers the optimiser's state; rank 0 writes)."""
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


def evaluate(run: Run, tokens_per_s: float, checkpoint: bool = True) -> None:
    """Score both splits, write a checkpoint, and only then log the row and redraw the plot
    (under --ddp every rank calls it; rank 0 alone scores and logs)."""
    # the routing of the last training batch, read before the evaluation's forwards replace it
    router = run.model.router_stats()  # None without experts (and before the first step)
    if run.is_main:
        run.losses = estimate_loss(
            run.model, run.data, run.train_cfg, run.model_cfg.block_size, loss_fn=run.loss_fn
        )
    if checkpoint:
        save(run)
    if not run.is_main:
        return
    row = {
        "step": run.step,
        "train_loss": run.losses["train"],
        "val_loss": run.losses["val"],
        "lr": lr_at(max(run.step - 1, 0), run.train_cfg),
        "tokens_per_s": tokens_per_s,
        "time": run.elapsed,
        **(router or {}),  # aux_loss and expert_share, for a mixture of experts
    }
    extra = run.metrics(run) if run.metrics is not None else {}  # e.g. decoder.dpo's
    row.update(extra)
    if run.scaler is not None:
        row.update(loss_scale=run.scaler.scale, skipped_steps=run.scaler.skipped)
    append_log(run.out_dir, row)
    plot_losses(run.out_dir, title=parameters_text(run.model), metrics=extra)


# ---- the loop -----------------------------------------------------------------------------------
def train(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    text: str,
    out_dir: str | os.PathLike,
    resume: bool = False,
    progress: bool = True,
    until: int | None = None,
    data_path: str | None = None,
    overwrite: bool = False,
    dist: DataParallel | None = None,
) -> dict[str, Any]:
    """Train a Decoder on ``text``, writing checkpoints, log and plot into ``out_dir``.

    ``resume`` continues from the checkpoint in ``out_dir`` (the model config and the
    settings in RESUME_FIXED must match it; other train-config changes are reported and
    used). Without it, a directory holding a previous run is refused unless ``overwrite``:
    that run is moved aside, removed when this one ends, or put back if this one fails
    before its first checkpoint. ``until`` stops after that many steps as if interrupted
    (checkpoint, then return): a run can be split in pieces. ``data_path`` is only recorded,
    so that ``--resume`` can find the text again. ``progress=False`` prints nothing (no bar,
    no sample). ``dist`` makes this process one rank of a data-parallel run (decoder.dist):
    rank 0 alone claims ``out_dir`` and prints.

    Returns the last evaluation's losses, training throughput and per-step losses:
    ``{"step", "train_loss", "val_loss", "tokens_per_s", "time_s", "losses", "out_dir"}``.
    Raises TrainingDiverged on a NaN or infinite loss, KeyboardInterrupt (after saving) on
    Ctrl-C, and RunDirError when ``out_dir`` is in use or holds a run it may not replace.
    """
    reuse_freed_memory()  # each step frees and reallocates the same arrays: keep the pages
    progress = progress and (dist is None or dist.is_main)
    say = print if progress else (lambda *a, **k: None)
    if dist is None or dist.is_main:
        claim = claim_dir(out_dir, RUN_FILES, LATEST, resume=resume, overwrite=overwrite)
    else:
        claim = contextlib.nullcontext(Path(out_dir))
    previous = mg.get_float32_matmul_precision()
    mg.set_float32_matmul_precision(train_cfg.matmul_precision)  # the run's, until it ends
    try:
        with claim as out_dir:
            run = start_run(model_cfg, train_cfg, text, out_dir, resume, data_path, say, dist)
            show_sample = progress and train_cfg.sample_tokens > 0
            prompt = sample_prompt(run.tokenizer, train_cfg, run.data) if show_sample else ""
            losses, tokens_per_s = loop(run, until, progress)
    finally:
        mg.set_float32_matmul_precision(previous)
    result = {
        "step": run.step,
        "train_loss": run.losses.get("train", float("nan")),
        "val_loss": run.losses.get("val", float("nan")),
        "tokens_per_s": tokens_per_s,
        "time_s": run.elapsed,
        "losses": losses,
        "out_dir": str(out_dir),
    }
    if show_sample and run.step == train_cfg.max_iters:
        from decoder.generate import print_sample

        print("\n---- a sample ----")
        print_sample(
            run.model,
            run.tokenizer,
            prompt,
            train_cfg.sample_tokens,
            temperature=0.8,
            seed=train_cfg.seed,
        )
        print("------------------")
    say(
        f"step {run.step}: val loss {result['val_loss']:.4f}, {result['tokens_per_s']:,.0f} "
        f"tokens/s; the run directory is {out_dir} (sample from it with: python -m "
        f"decoder.generate --checkpoint {out_dir})"
    )
    return result


def loop(run: Run, until: int | None, progress: bool) -> tuple[list[float], float]:
    """Train from ``run.step`` to ``max_iters`` (or ``until``), evaluating and saving on
    schedule; returns this call's per-step losses and its training tokens per second."""
    cfg = run.train_cfg
    T, ranks = run.model_cfg.block_size, run.dist.size if run.dist else 1
    B = cfg.batch_size * cfg.grad_accum_steps  # this rank's rows per step
    losses: list[float] = []
    train_time, interval_time, interval_steps = 0.0, 0.0, 0  # for tokens/s
    if run.step == 0:
        evaluate(run, 0.0, checkpoint=False)  # the curve's start: about ln(vocab_size)
    bar = _progress_bar(progress, run.step, cfg.max_iters)
    with _deferred_sigint() as interrupt:
        try:
            while run.step < cfg.max_iters:
                t0 = time.perf_counter()
                lr = lr_at(run.step, cfg)
                set_lr(run.optimizer, lr)
                x, y = run.data.get_batch("train", B * ranks, T, run.rngs["batches"])
                if run.dist is not None:  # (B * ranks, T) -> (B, T): this rank's share
                    x, y = x[run.dist.rows(B)], y[run.dist.rows(B)]
                loss = train_step(
                    run.model,
                    run.optimizer,
                    x,
                    y,
                    cfg,
                    run.step + 1,
                    run.dist,
                    run.scaler,
                    loss_fn=run.loss_fn,
                )
                losses.append(loss)
                run.step += 1

                dt = time.perf_counter() - t0
                run.elapsed += dt
                train_time += dt
                interval_time += dt
                interval_steps += 1
                tokens_per_s = B * ranks * T * interval_steps / interval_time
                if run.step % cfg.log_interval == 0:
                    bar.set_postfix(
                        loss=f"{losses[-1]:.4f}",
                        tok_s=f"{tokens_per_s:,.0f}",
                        lr=f"{lr:.2e}",
                        **expert_postfix(run.model.router_stats()),
                        **({"scale": f"{run.scaler.scale:g}"} if run.scaler else {}),
                    )
                bar.update(1)

                if run.step % cfg.eval_interval == 0 or run.step == cfg.max_iters:
                    evaluate(run, tokens_per_s)
                    interval_time, interval_steps = 0.0, 0
                    if run.is_main:  # the other ranks do not evaluate
                        bar.write(
                            f"step {run.step}: train loss {run.losses['train']:.4f}, "
                            f"val loss {run.losses['val']:.4f}"
                        )
                stop = interrupt.requested
                if run.dist is not None:  # all ranks stop at one step, or a collective hangs
                    stop = run.dist.any(stop)
                if stop or run.step == until:
                    if run.saved_step != run.step:
                        save(run)
                    if stop:
                        raise KeyboardInterrupt
                    break
        except TrainingDiverged as e:
            raise TrainingDiverged(f"{e}; {run.kept()}") from None
        except KeyboardInterrupt:
            bar.close()
            if not run.is_main:  # rank 0 says it
                raise
            if run.saved_step == run.step:
                print(
                    f"\ninterrupted at step {run.step}: checkpoint saved in {run.out_dir}\n"
                    f"resume with: python -m {run.command} --out {run.out_dir} --resume",
                    file=sys.stderr,
                )
            else:  # a second Ctrl-C, in the middle of a step: nothing consistent to save
                print(f"\nstopped at once: {run.kept()}", file=sys.stderr)
            raise
        finally:
            bar.close()
    return losses, B * ranks * T * len(losses) / train_time if train_time > 0 else 0.0


class _Interrupt:
    """Turns the first Ctrl-C into a flag that the loop reads between steps."""

    requested = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.requested = True
        # a second Ctrl-C gets Python's default behaviour: KeyboardInterrupt right away
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def _deferred_sigint() -> Iterator[_Interrupt]:
    flag = _Interrupt()
    try:
        previous = signal.signal(signal.SIGINT, flag)
    except ValueError:  # not the main thread: signals cannot be caught here
        yield flag
        return
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def _progress_bar(enabled: bool, start: int, total: int) -> Any:
    """A tqdm bar on stderr (its ETA is the run's), or a stand-in that does nothing."""
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, file=sys.stderr)


class _NoBar:
    def set_postfix(self, **kwargs: Any) -> None: ...

    def update(self, n: int) -> None: ...

    def write(self, text: str) -> None: ...

    def close(self) -> None: ...


# ---- the command line ---------------------------------------------------------------------------
def parse_overrides(items: list[str]) -> dict[str, str]:
    """``["--n_layer=6", "--max-iters", "100"]`` -> ``{"n_layer": "6", "max_iters": "100"}``.

    >>> parse_overrides(["--n_layer=6", "--max-iters", "100"])
    {'n_layer': '6', 'max_iters': '100'}
    """
    overrides, i = {}, 0
    while i < len(items):
        item = items[i]
        if not item.startswith("--") or item == "--":
            raise ValueError(f"unexpected argument {item!r}: settings are written --key=value")
        key, eq, value = item[2:].partition("=")
        if not eq:  # "--key value"
            if i + 1 >= len(items) or items[i + 1].startswith("--"):
                raise ValueError(f"--{key} needs a value: write --{key}=VALUE")
            value, i = items[i + 1], i + 1
        overrides[key.replace("-", "_")] = value
        i += 1
    return overrides


def list_presets() -> str:
    lines = []
    for name, preset in PRESETS.items():
        default = " (default)" if name == DEFAULT_PRESET else ""
        lines.append(f"{name}{default}\n    {preset.description}")
    return "\n".join(lines)


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
    return model_cfg, train_cfg, saved


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the process exit code."""
    p = argparse.ArgumentParser(
        prog="python -m decoder.train",
        description="Train a decoder-only transformer. Any field of ModelConfig or TrainConfig "
        "(decoder/config.py) can be set as --key=value, e.g. --n_layer=6 --lr=3e-4.",
    )
    p.add_argument("--preset", default=None, help=f"a named config (default {DEFAULT_PRESET})")
    p.add_argument("--list-presets", action="store_true", help="print the presets and exit")
    p.add_argument("--data", default=None, help="a UTF-8 text file (default: tiny Shakespeare)")
    p.add_argument("--out", default=None, help="the run directory (default: runs/<preset>)")
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out with its saved settings; settings given alongside "
        "replace those (e.g. --max_iters=4000 to go on longer)",
    )
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run in --out (without it, a new run refuses a directory that holds one)",
    )
    p.add_argument("--device", default=None, choices=DEVICES, help="same as --device=")
    p.add_argument(
        "--ddp",
        action="store_true",
        help="one rank of a data-parallel run: launch with mpirun -n N (needs the dist extra)",
    )
    p.add_argument("--zero", action="store_true", help="with --ddp: shard AdamW's state (ZeRO-1)")
    args, rest = p.parse_known_args(argv)
    if args.list_presets:
        print(list_presets())
        return 0
    if args.zero and not args.ddp:
        p.error("--zero shards the optimiser over the ranks of a --ddp run: add --ddp")
    if not args.ddp:
        return _run(args, rest)
    from decoder.dist import DataParallel

    try:
        dist = DataParallel.from_mpi(zero=args.zero)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with dist.abort_on_failure():
        code = _run(args, rest, dist)
    # subtle: a Ctrl-C stops every rank after the same step (DataParallel.any), so all of them
    # end with 130 by themselves; an abort then would kill rank 0 while it writes the checkpoint
    if code not in (0, 130):  # the other ranks would wait for this one for ever
        dist.abort(code)
    return code


def run_command(body: Callable[[], object]) -> int:
    """Run a command's body and return its exit code, the same for every trainer's command line.

    0 done; 1 the loss diverged (TrainingDiverged); 2 an error the user can fix, printed as one
    line (ValueError, OSError, RuntimeError, KeyError: CheckpointError, RunDirError, and
    load_shakespeare offline are among them); 130 interrupted, after the loop saved.
    """
    try:
        body()
    except KeyboardInterrupt:
        return 130
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, OSError, RuntimeError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _run(args: argparse.Namespace, rest: list[str], dist: DataParallel | None = None) -> int:
    """Train as the parsed command line asks; returns the exit code."""

    def body() -> None:
        overrides = parse_overrides(rest)
        if args.device is not None:
            overrides["device"] = args.device
        out_dir = Path(args.out or Path("runs") / (args.preset or DEFAULT_PRESET))
        data_path = str(Path(args.data).resolve()) if args.data else None
        if args.resume:
            model_cfg, train_cfg, saved = resume_configs(out_dir, args.preset, overrides)
            data_path = data_path or saved.extra.get("data_path")
        else:
            model_cfg, train_cfg = build_configs(args.preset or DEFAULT_PRESET, overrides)
        train_cfg = device_or_cpu(train_cfg, requested="device" in overrides)
        text = load_text(data_path) if data_path else load_shakespeare()
        train(
            model_cfg,
            train_cfg,
            text,
            out_dir,
            resume=args.resume,
            data_path=data_path,
            overwrite=args.overwrite,
            dist=dist,
        )

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
