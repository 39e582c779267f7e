"""Training: the loop, its evaluation, its log and plot, and the command line.

    python -m decoder.train                                  # nanoGPT's CPU Shakespeare run
    python -m decoder.train --preset tiny --max_iters=200    # any config field as --key=value
    python -m decoder.train --out runs/shakespeare-char --resume

One step: sample a batch, forward, backward, clip the gradient's global norm, set the
learning rate of a cosine schedule with linear warmup, take an AdamW step. Every
``eval_interval`` steps (and at the end) the model is evaluated on fixed batches of both
splits, a row goes into ``log.jsonl``, ``loss.png`` is redrawn, and a checkpoint is written
(see decoder.checkpoint for the directory layout and why it is atomic).

Reproducibility: the weights, the batches and dropout each draw from a seeded NumPy
generator, and a checkpoint keeps every generator's state, so a resumed run repeats the
losses of an uninterrupted one exactly. Evaluation draws from its own generator, reseeded
at every evaluation, so it never shifts the training batches and always scores the same
tokens (which also makes evaluations comparable across steps and across runs).

Ctrl-C finishes the current step, writes a checkpoint and exits with status 130; a second
Ctrl-C stops at once. A loss that is NaN or infinite stops the run before the bad step
touches the weights, naming the step; the last checkpoint stays as it was.

Left out on purpose: gradient accumulation, mixed precision, several GPUs, and keeping the
best checkpoint (the newest is kept). Follows nanoGPT's ``train.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import minigrad as mg
from decoder.checkpoint import (
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
from decoder.model import Decoder
from decoder.tokenizer import get_tokenizer
from minigrad.backend import reuse_freed_memory
from minigrad.fileio import atomic_write
from minigrad.optim import AdamW, clip_grad_norm_, cosine_lr, param_groups_for_decay, set_lr

LOG, PLOT = "log.jsonl", "loss.png"


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


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


@mg.no_grad()
def estimate_loss(
    model: Decoder, data: TokenDataset, train_cfg: TrainConfig, block_size: int
) -> dict[str, float]:
    """Mean loss over ``eval_iters`` batches of each split, in eval mode (no dropout).

    The batches come from a generator seeded afresh each time, so every evaluation scores
    the same tokens and leaves the training generators untouched.
    """
    model.eval()
    losses = {}
    for i, split in enumerate(("train", "val")):
        rng = np.random.default_rng([train_cfg.seed, 1 + i])  # subtle: never the batch rng
        total = 0.0
        for _ in range(train_cfg.eval_iters):
            x, y = data.get_batch(split, train_cfg.batch_size, block_size, rng)
            _, loss = model(
                mg.Tensor(x, device=train_cfg.device), mg.Tensor(y, device=train_cfg.device)
            )
            total += loss.item()
        losses[split] = total / train_cfg.eval_iters
    model.train()
    return losses


def append_log(out_dir: Path, row: dict) -> None:
    """Add one evaluation's row to ``log.jsonl``."""
    with open(out_dir / LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def read_log(out_dir: Path) -> list[dict]:
    path = out_dir / LOG
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def plot_losses(out_dir: Path, title: str = "") -> None:
    """Redraw ``loss.png`` from ``log.jsonl`` (train and val loss against the step)."""
    # matplotlib's object API with the Agg canvas: no pyplot global state, no display needed
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = read_log(out_dir)
    fig = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    steps = [r["step"] for r in rows]
    ax.plot(steps, [r["train_loss"] for r in rows], "o-", label="train")
    ax.plot(steps, [r["val_loss"] for r in rows], "o-", label="val")
    ax.set(xlabel="step", ylabel="cross-entropy loss (nats/token)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_write(out_dir / PLOT) as f:  # a viewer never sees a half-drawn file
        fig.savefig(f, format="png")


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


def generators(model: Decoder) -> dict[str, np.random.Generator]:
    """Every NumPy Generator the model draws from (each Dropout owns one), by a stable name,
    and minigrad's global one: a checkpoint keeps all of their states."""
    found = {"minigrad": mg.default_rng()}
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, np.random.Generator):
                found[f"{name}.{attr}" if name else attr] = value
    return found


def _rng_states(rngs: dict[str, np.random.Generator]) -> dict[str, dict]:
    return {name: rng.bit_generator.state for name, rng in rngs.items()}


def _differences(a: Any, b: Any) -> list[str]:
    """The fields in which two configs of one class differ, as "name: a -> b"."""
    return [
        f"{f.name}: {getattr(a, f.name)!r} -> {getattr(b, f.name)!r}"
        for f in dataclasses.fields(a)
        if getattr(a, f.name) != getattr(b, f.name)
    ]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The learning rate of optimiser step ``step`` (0-based): warmup, then cosine decay."""
    return cosine_lr(step, cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.lr_decay_iters)


def _check_resume(ckpt: Checkpoint, model_cfg: ModelConfig, fingerprint: str) -> None:
    """Refuse to resume a run on other text or with another model, naming the difference."""
    if ckpt.extra.get("data_sha256") not in (None, fingerprint):
        raise CheckpointError(
            f"{ckpt.path}: this run was trained on other text (hash "
            f"{ckpt.extra['data_sha256']}, file {ckpt.extra.get('data_path')}); resume "
            f"with the same --data, or start a new run with another --out"
        )
    if model_cfg != ckpt.model_config:
        changed = "; ".join(_differences(ckpt.model_config, model_cfg))
        raise CheckpointError(
            f"{ckpt.path}: the checkpoint's model differs from the one asked for ({changed}): "
            f"resume with the run's own settings, or start a new run with another --out"
        )


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
) -> dict[str, Any]:
    """Train a Decoder on ``text``, writing checkpoints, log and plot into ``out_dir``.

    ``resume`` continues from the checkpoint in ``out_dir`` (the model config must match it;
    train-config changes are reported and used). ``until`` stops after that many steps as
    if interrupted (checkpoint, then return): a run can be split in pieces. ``data_path`` is
    only recorded, so that ``--resume`` can find the text again. ``progress=False`` prints
    nothing (no bar, no sample).

    Returns the last evaluation's losses, training throughput and per-step losses:
    ``{"step", "train_loss", "val_loss", "tokens_per_s", "time_s", "losses", "out_dir"}``.
    Raises TrainingDiverged on a NaN or infinite loss and KeyboardInterrupt (after saving)
    on Ctrl-C.
    """
    if train_cfg.warmup_iters > train_cfg.lr_decay_iters:
        raise ValueError(
            f"warmup_iters={train_cfg.warmup_iters} is longer than lr_decay_iters="
            f"{train_cfg.lr_decay_iters} (which defaults to max_iters): lower --warmup_iters too"
        )
    reuse_freed_memory()  # each step frees and reallocates the same arrays: keep the pages
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    say = print if progress else (lambda *a, **k: None)
    fingerprint = text_fingerprint(text)
    ckpt = load_checkpoint(out_dir) if resume else None
    tokenizer = build_tokenizer(ckpt) if ckpt else make_tokenizer(train_cfg, text)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    if ckpt is not None:
        _check_resume(ckpt, model_cfg, fingerprint)
        changed = _differences(ckpt.train_config, train_cfg)
        if changed:
            say("note: resuming with changed settings: " + "; ".join(changed))

    # The data: 90% of the tokens to train on, the rest to validate (ids cached on disk).
    data = TokenDataset.from_text(text, tokenizer)
    B, T, device = train_cfg.batch_size, model_cfg.block_size, train_cfg.device

    # The model and optimiser. The global generator seeds the weights and each Dropout's own.
    mg.manual_seed(train_cfg.seed)
    model = Decoder(model_cfg)
    if train_cfg.dtype == "float64":
        model.double()
    model.to(device)
    model.train()
    optimizer = AdamW(
        param_groups_for_decay(model, train_cfg.weight_decay),
        lr=train_cfg.lr,
        betas=(train_cfg.beta1, train_cfg.beta2),
        weight_decay=train_cfg.weight_decay,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    rngs = {"batches": np.random.default_rng(train_cfg.seed), **generators(model)}

    step, elapsed, losses = 0, 0.0, {}
    if ckpt is not None:
        check_weights(ckpt.weights, model.state_dict(), ckpt.path / WEIGHTS)
        model.load_state_dict(ckpt.weights)
        optimizer.load_state_dict(ckpt.optimizer)
        missing = sorted(set(rngs) - set(ckpt.rng))
        if missing:
            raise CheckpointError(f"{ckpt.path / STATE}: no state for the generators {missing}")
        for name, rng in rngs.items():
            rng.bit_generator.state = ckpt.rng[name]  # subtle: in place: the model holds them
        step, elapsed = ckpt.step, ckpt.extra.get("elapsed_s", 0.0)
        # keep the log rows up to the checkpoint (a run that died later wrote more)
        rows = [r for r in read_log(out_dir) if r["step"] <= step]
        (out_dir / LOG).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        if rows:
            losses = {"train": rows[-1]["train_loss"], "val": rows[-1]["val_loss"]}
        say(f"resuming {out_dir} from step {step}")
    else:
        (out_dir / LOG).unlink(missing_ok=True)
        say(f"training {model.num_parameters():,} parameters; the run directory is {out_dir}")

    def checkpoint() -> None:
        save_checkpoint(
            out_dir,
            step=step,
            model_state=model.state_dict(),
            model_config=model_cfg,
            train_config=train_cfg,
            tokenizer=tokenizer.to_dict(),
            optimizer_state=optimizer.state_dict(),
            rng=_rng_states(rngs),
            extra={"data_sha256": fingerprint, "data_path": data_path, "elapsed_s": elapsed},
        )

    def evaluate(tokens_per_s: float) -> dict[str, float]:
        """Score both splits, log a row, redraw the plot."""
        est = estimate_loss(model, data, train_cfg, T)
        row = {
            "step": step,
            "train_loss": est["train"],
            "val_loss": est["val"],
            "lr": lr_at(max(step - 1, 0), train_cfg),
            "tokens_per_s": tokens_per_s,
            "time": elapsed,
        }
        append_log(out_dir, row)
        plot_losses(out_dir, title=f"{model.num_parameters():,} parameters")
        return est

    def kept(saved_step: int | None) -> str:
        if saved_step is None:
            return "no checkpoint was written"
        return f"the checkpoint of step {saved_step} in {out_dir} is kept"

    if step == 0:
        losses = evaluate(0.0)  # the starting point of the curve: about ln(vocab_size)
    step_losses: list[float] = []  # this call's training losses, one per step
    train_time, interval_time, interval_steps = 0.0, 0.0, 0  # for tokens/s
    last_saved = step if ckpt is not None else None
    bar = _progress_bar(progress, step, train_cfg.max_iters)
    with _deferred_sigint() as interrupt:
        try:
            while step < train_cfg.max_iters:
                t0 = time.perf_counter()
                lr = lr_at(step, train_cfg)
                set_lr(optimizer, lr)
                x, y = data.get_batch("train", B, T, rngs["batches"])
                _, loss = model(mg.Tensor(x, device=device), mg.Tensor(y, device=device))
                loss_value = loss.item()
                if not math.isfinite(loss_value):
                    raise TrainingDiverged(
                        f"the loss is {loss_value} at step {step + 1}: training stopped before "
                        f"that step changed the weights; {kept(last_saved)}. Try a lower --lr "
                        f"or a longer warmup."
                    )
                optimizer.zero_grad()
                loss.backward()
                if train_cfg.grad_clip > 0:
                    clip_grad_norm_(params, train_cfg.grad_clip)
                optimizer.step()
                step += 1

                dt = time.perf_counter() - t0
                elapsed += dt
                train_time += dt
                interval_time += dt
                interval_steps += 1
                step_losses.append(loss_value)
                tokens_per_s = B * T * interval_steps / interval_time
                if step % train_cfg.log_interval == 0:
                    bar.set_postfix(
                        loss=f"{loss_value:.4f}", tok_s=f"{tokens_per_s:,.0f}", lr=f"{lr:.2e}"
                    )
                bar.update(1)

                if step % train_cfg.eval_interval == 0 or step == train_cfg.max_iters:
                    losses = evaluate(tokens_per_s)
                    interval_time, interval_steps = 0.0, 0
                    checkpoint()
                    last_saved = step
                    bar.write(
                        f"step {step}: train loss {losses['train']:.4f}, "
                        f"val loss {losses['val']:.4f}"
                    )
                if interrupt.requested or step == until:
                    if last_saved != step:
                        checkpoint()
                        last_saved = step
                    if interrupt.requested:
                        raise KeyboardInterrupt
                    break
        except KeyboardInterrupt:
            bar.close()
            if last_saved == step:
                print(
                    f"\ninterrupted at step {step}: checkpoint saved in {out_dir}\n"
                    f"resume with: python -m decoder.train --out {out_dir} --resume",
                    file=sys.stderr,
                )
            else:  # a second Ctrl-C, in the middle of a step: nothing consistent to save
                print(f"\nstopped at once: {kept(last_saved)}", file=sys.stderr)
            raise
        finally:
            bar.close()

    result = {
        "step": step,
        "train_loss": losses.get("train", float("nan")),
        "val_loss": losses.get("val", float("nan")),
        "tokens_per_s": B * T * len(step_losses) / train_time if train_time > 0 else 0.0,
        "time_s": elapsed,
        "losses": step_losses,
        "out_dir": str(out_dir),
    }
    if progress and train_cfg.sample_tokens > 0 and step == train_cfg.max_iters:
        from decoder.generate import print_sample

        print("\n---- a sample ----")
        print_sample(
            model,
            tokenizer,
            train_cfg.sample_prompt,
            train_cfg.sample_tokens,
            temperature=0.8,
            seed=train_cfg.seed,
        )
        print("------------------")
    say(
        f"step {step}: val loss {result['val_loss']:.4f}, {result['tokens_per_s']:,.0f} "
        f"tokens/s; the run directory is {out_dir} (sample from it with: python -m "
        f"decoder.generate --checkpoint {out_dir})"
    )
    return result


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


def _shakespeare() -> str:
    try:
        return load_shakespeare()
    except RuntimeError as e:  # no network and no cached copy: the message says what to do
        raise OSError(str(e)) from e


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
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out with its saved settings; settings given alongside "
        "replace those (e.g. --max_iters=4000 to go on longer)",
    )
    p.add_argument("--device", default=None, choices=("cpu", "cuda"), help="same as --device=")
    args, rest = p.parse_known_args(argv)
    if args.list_presets:
        print(list_presets())
        return 0
    try:
        overrides = parse_overrides(rest)
        if args.device is not None:
            overrides["device"] = args.device
        preset = args.preset or DEFAULT_PRESET
        out_dir = Path(args.out or Path("runs") / preset)
        data_path = str(Path(args.data).resolve()) if args.data else None
        if args.resume:
            if not has_checkpoint(out_dir):
                raise CheckpointError(f"{out_dir}: no checkpoint to resume from (no 'latest' file)")
            saved = load_checkpoint(out_dir, with_optimizer=False)
            # the run's own settings, except those given now
            kept = {
                k: v
                for cfg in (saved.model_config, saved.train_config)
                for k, v in dataclasses.asdict(cfg).items()
                if k not in overrides
            }
            model_cfg, train_cfg = build_configs(preset, overrides, **kept)
            data_path = data_path or saved.extra.get("data_path")
        else:
            model_cfg, train_cfg = build_configs(preset, overrides)
        train_cfg = device_or_cpu(train_cfg, requested="device" in overrides)
        text = load_text(data_path) if data_path else _shakespeare()
        train(model_cfg, train_cfg, text, out_dir, resume=args.resume, data_path=data_path)
    except KeyboardInterrupt:
        return 130
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, CheckpointError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
