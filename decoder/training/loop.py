"""Training: the loop that every trainer runs (pre-training, SFT, DPO and LoRA fine-tuning;
``python -m decoder.train`` is its command).

One step: set the learning rate of a cosine schedule with linear warmup, sample a batch, then
decoder.training.step.train_step: forward, backward, clip the gradient's global norm, take an AdamW
step. Every ``eval_interval`` steps (and at the end) the model is evaluated on fixed batches of both
splits (decoder.training.step.estimate_loss), a checkpoint is written (see
decoder.training.checkpoint for the directory layout and why it is atomic), and only then does a row
go into ``log.jsonl`` and ``loss.png`` get redrawn: the log never claims a step whose checkpoint did
not land.

A run's state, its start, and its exact resume are decoder.training.run's.

The run directory is held while the run uses it (``train``), Ctrl-C and a NaN loss stop it
cleanly (``loop``), and data-parallel ranks and float16 share its steps (``take_step``).

Left out on purpose: several GPUs, dropout under --ddp (each rank would draw the same masks), and
keeping the best checkpoint (the newest is kept). Follows nanoGPT's ``train.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.text.stream import print_sample
from decoder.training.checkpoint import LATEST
from decoder.training.config import TrainConfig
from decoder.training.log import (
    append_log,
    expert_postfix,
    parameters_text,
    plot_losses,
    progress_bar,
)
from decoder.training.run import RUN_FILES, Run, lr_at, sample_prompt, save, start_run
from decoder.training.rundir import claim_dir
from decoder.training.step import TrainingDiverged, estimate_loss, train_step
from minigrad.cpu_tuning import reuse_freed_memory
from minigrad.optim import set_lr

if TYPE_CHECKING:  # decoder.training.dist imports mpi4py only when a run asks for it
    from decoder.training.dist import DataParallel


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
    extra = run.metrics(run) if run.metrics is not None else {}  # e.g. decoder.post.dpo's
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
    no sample). ``dist`` makes this process one rank of a data-parallel run (decoder.training.dist):
    rank 0 alone claims ``out_dir`` and prints.

    The run directory (``--out``) is locked while a run uses it, a new run refuses one that
    holds a previous run unless told ``--resume`` or ``--overwrite``, and a run that fails
    before its first checkpoint removes what it wrote (and puts back a run it was overwriting;
    see decoder.training.rundir).

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
    schedule; returns this call's per-step losses and its training tokens per second.

    Ctrl-C finishes the current step, writes a checkpoint and exits with status 130; a second
    Ctrl-C stops at once. A loss that is NaN or infinite stops the run before the bad step
    touches the weights, naming the step; the last checkpoint stays as it was.
    """
    cfg = run.train_cfg
    T, ranks = run.model_cfg.block_size, run.dist.size if run.dist else 1
    B = cfg.batch_size * cfg.grad_accum_steps  # this rank's rows per step
    losses: list[float] = []
    train_time, interval_time, interval_steps = 0.0, 0.0, 0  # for tokens/s
    if run.step == 0:
        evaluate(run, 0.0, checkpoint=False)  # the curve's start: about ln(vocab_size)
    bar = progress_bar(progress, run.step, cfg.max_iters)
    with _deferred_sigint() as interrupt:
        try:
            while run.step < cfg.max_iters:
                t0 = time.perf_counter()
                lr = lr_at(run.step, cfg)
                losses.append(take_step(run, lr, B))

                dt = time.perf_counter() - t0
                run.elapsed += dt
                train_time += dt
                interval_time += dt
                interval_steps += 1
                tokens_per_s = B * ranks * T * interval_steps / interval_time
                if run.step % cfg.log_interval == 0:
                    bar.set_postfix(**_postfix(run, losses[-1], tokens_per_s, lr))
                bar.update(1)

                if evaluates_at(run.step, cfg):
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
                resume = f"python -m {run.command} --out {run.out_dir} --resume"
                print(
                    f"\ninterrupted at step {run.step}: checkpoint saved in {run.out_dir}"
                    + (f"\nresume with: {resume}" if run.writer is None else ""),
                    file=sys.stderr,
                )
            else:  # a second Ctrl-C, in the middle of a step: nothing consistent to save
                print(f"\nstopped at once: {run.kept()}", file=sys.stderr)
            raise
        finally:
            bar.close()
    return losses, B * ranks * T * len(losses) / train_time if train_time > 0 else 0.0


def evaluates_at(step: int, cfg: TrainConfig) -> bool:
    """Whether the loop evaluates (and saves) after ``step``: every ``eval_interval`` steps and
    at the last."""
    return step % cfg.eval_interval == 0 or step == cfg.max_iters


def take_step(run: Run, lr: float, B: int) -> float:
    """One optimiser step at learning rate ``lr`` on this rank's ``B`` rows of the step's fresh
    windows (decoder.training.step.train_step); returns its loss.

    Each step draws ``batch_size * grad_accum_steps`` windows per rank from the one batches
    generator, which every rank of a data-parallel run (``--ddp``, decoder.training.dist) seeds
    alike; rank r trains on the r-th share, so N ranks take the steps one process takes with N
    times the rows, and a resume with another N continues the same stream of windows, grouped
    N'/N times as wide per step (the same run, up to float rounding, wherever N *
    grad_accum_steps stays the same). Rank 0 alone evaluates, logs, draws the bar and writes
    the checkpoints. With ``--dtype=float16`` the weights and AdamW's state stay float32 while
    the forward and backward passes run in float16 on a scaled loss
    (decoder.training.mixed_precision); each log row carries the loss scale and the steps
    skipped for an overflow.
    """
    ranks = run.dist.size if run.dist else 1
    set_lr(run.optimizer, lr)
    x, y = run.data.get_batch("train", B * ranks, run.model_cfg.block_size, run.rngs["batches"])
    if run.dist is not None:  # (B * ranks, T) -> (B, T): this rank's share
        x, y = x[run.dist.rows(B)], y[run.dist.rows(B)]
    args = (run.train_cfg, run.step + 1, run.dist, run.scaler)
    loss = train_step(run.model, run.optimizer, x, y, *args, loss_fn=run.loss_fn)
    run.step += 1
    return loss


def _postfix(run: Run, loss: float, tokens_per_s: float, lr: float) -> dict[str, str]:
    """The numbers the progress bar shows beside the step count."""
    return {
        "loss": f"{loss:.4f}",
        "tok_s": f"{tokens_per_s:,.0f}",
        "lr": f"{lr:.2e}",
        **expert_postfix(run.model.router_stats()),
        **({"scale": f"{run.scaler.scale:g}"} if run.scaler else {}),
    }


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
