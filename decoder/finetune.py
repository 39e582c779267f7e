"""LoRA fine-tuning of a trained checkpoint on new text, and merging the adapters back.

    python -m decoder.finetune --checkpoint runs/shakespeare-char --data my.txt \\
        --lora-r 8 --lora-alpha 16 --targets wq,wv --max-iters 200 --out runs/my-lora
    python -m decoder.finetune merge --adapters runs/my-lora --out runs/my-merged
    python -m decoder.generate --checkpoint runs/my-merged

Fine-tuning freezes the base model, wraps the target projections in LoRA adapters
(minigrad.nn.lora) and trains only those, with the base run's batch size and context. It
prints the validation loss on the new text before (the base model: LoRA's B starts at
zero) and after, and saves only the adapters: ``adapters.safetensors`` and ``lora.json``
(the LoRA settings, the losses, and the path of the base checkpoint), a few kilobytes
where the base is megabytes. ``--merge`` (or the ``merge`` command) folds the adapters into
the base weights and writes a full checkpoint that decoder.generate reads like any other.

The new text must be written in the base tokenizer's vocabulary: a character-level model
cannot read characters it has never seen (the error lists them).

Left out on purpose: QLoRA (quantised bases), adapters on embeddings, several adapters at
once, and resuming a fine-tune (they take minutes). Follows Hu et al. 2021 ("LoRA") and
the shape of HF PEFT's save format (adapter weights + a small JSON config).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import minigrad as mg
from decoder.checkpoint import CheckpointError, load_model, save_checkpoint
from decoder.data import TokenDataset, load_text
from decoder.train import estimate_loss
from minigrad.backend import reuse_freed_memory
from minigrad.fileio import atomic_write
from minigrad.nn.lora import apply_lora, load_lora_state_dict, lora_state_dict, merge_lora
from minigrad.optim import AdamW, clip_grad_norm_, cosine_lr, set_lr
from minigrad.serialization import load_safetensors, save_safetensors

ADAPTERS, SETTINGS = "adapters.safetensors", "lora.json"


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
    device: str = "cpu",
    progress: bool = True,
    data_path: str | None = None,
) -> dict[str, Any]:
    """Train LoRA adapters on ``text`` and save them (only them) into ``out_dir``.

    Returns ``{"val_loss_before", "val_loss_after", "trainable", "wrapped", "out_dir"}``.
    """
    reuse_freed_memory()  # as decoder.train: keep the pages each step frees
    say = print if progress else (lambda *a, **k: None)
    model, tokenizer, base = load_model(checkpoint, device=device)
    train_cfg = base.train_config
    data = TokenDataset(_encode(tokenizer, text, data_path or "the fine-tune text"))
    T = model.config.block_size

    mg.manual_seed(seed)  # the adapters' A init and their dropout generators
    wrapped = apply_lora(
        model,
        targets,
        r=r,
        alpha=alpha,
        dropout=dropout,
        per_head=per_head,
        n_head=_head_counts(model) if per_head else None,
    )
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.size for p in params)
    say(
        f"LoRA on {len(wrapped)} layers ({', '.join(sorted({w.split('.')[-1] for w in wrapped}))}"
        f"): {n_trainable:,} trainable of {model.num_parameters():,} parameters"
    )

    eval_cfg = dataclasses.replace(train_cfg, seed=seed, device=device)  # the base's batches
    before = estimate_loss(model, data, eval_cfg, T)["val"]
    say(f"val loss on the new text before fine-tuning: {before:.4f}")

    optimizer = AdamW(params, lr=lr, betas=(train_cfg.beta1, train_cfg.beta2), weight_decay=0.0)
    rng = np.random.default_rng(seed)
    warmup = max_iters // 10
    model.train()
    t0 = time.perf_counter()
    for step in range(max_iters):
        set_lr(optimizer, cosine_lr(step, lr, lr / 10, warmup, max_iters))
        x, y = data.get_batch("train", train_cfg.batch_size, T, rng)
        _, loss = model(mg.Tensor(x, device=device), mg.Tensor(y, device=device))
        if not math.isfinite(loss.item()):
            raise FloatingPointError(
                f"the loss is {loss.item()} at step {step + 1}; try a lower --lr"
            )
        optimizer.zero_grad()
        loss.backward()
        if train_cfg.grad_clip > 0:
            clip_grad_norm_(params, train_cfg.grad_clip)
        optimizer.step()
        if progress and (step + 1) % max(1, max_iters // 10) == 0:
            say(f"step {step + 1}/{max_iters}: loss {loss.item():.4f}")
    after = estimate_loss(model, data, eval_cfg, T)["val"]
    say(
        f"val loss on the new text after {max_iters} steps ({time.perf_counter() - t0:.1f} s): "
        f"{after:.4f}"
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_safetensors(out_dir / ADAPTERS, lora_state_dict(model))
    settings = {
        "r": r,
        "alpha": alpha,
        "targets": list(targets),
        "per_head": per_head,
        "dropout": dropout,
        "base_checkpoint": str(base.path.resolve()),
        "base_step": base.step,
        "data": data_path,
        "max_iters": max_iters,
        "lr": lr,
        "seed": seed,
        "val_loss_before": before,
        "val_loss_after": after,
    }
    with atomic_write(out_dir / SETTINGS, text=True) as f:  # last: the manifest
        json.dump(settings, f, indent=1)
    say(f"adapters saved in {out_dir} ({ADAPTERS}, {SETTINGS})")
    return {
        "val_loss_before": before,
        "val_loss_after": after,
        "trainable": n_trainable,
        "wrapped": wrapped,
        "out_dir": str(out_dir),
    }


def load_adapted(adapters_dir: str | Path, device: str = "cpu") -> tuple[Any, Any, dict]:
    """The base model with the saved adapters applied (not merged): (model, tokenizer, settings)."""
    adapters_dir = Path(adapters_dir)
    path = adapters_dir / SETTINGS
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; is {adapters_dir} the --out of a fine-tune?")
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    model, tokenizer, _ = load_model(settings["base_checkpoint"], device="cpu")
    apply_lora(
        model,
        tuple(settings["targets"]),
        r=settings["r"],
        alpha=settings["alpha"],
        dropout=settings["dropout"],
        per_head=settings["per_head"],
        n_head=_head_counts(model) if settings["per_head"] else None,
    )
    try:
        arrays, _ = load_safetensors(adapters_dir / ADAPTERS)
        load_lora_state_dict(model, arrays)
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{adapters_dir / ADAPTERS}: {e}") from e
    model.to(device)
    model.eval()
    return model, tokenizer, settings


def merge(adapters_dir: str | Path, out_dir: str | Path) -> Path:
    """Fold saved adapters into their base and write a full checkpoint (no optimiser state)."""
    from decoder.checkpoint import load_checkpoint

    model, tokenizer, settings = load_adapted(adapters_dir)
    merge_lora(model)
    base = load_checkpoint(settings["base_checkpoint"], with_optimizer=False)
    return save_checkpoint(
        out_dir,
        step=base.step,
        model_state=model.state_dict(),
        model_config=base.model_config,
        train_config=base.train_config,
        tokenizer=tokenizer.to_dict(),
        extra={"merged_adapters": str(Path(adapters_dir).resolve()), **settings},
    )


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["merge"]:
            p = argparse.ArgumentParser(
                prog="python -m decoder.finetune merge",
                description="Merge LoRA adapters into a full checkpoint.",
            )
            p.add_argument("--adapters", required=True, help="the --out of a fine-tune")
            p.add_argument("--out", required=True, help="where to write the merged checkpoint")
            args = p.parse_args(argv[1:])
            path = merge(args.adapters, args.out)
            print(f"merged checkpoint written to {path}")
            return 0
        p = argparse.ArgumentParser(
            prog="python -m decoder.finetune",
            description="LoRA fine-tuning of a checkpoint on new text (see also: merge).",
        )
        p.add_argument("--checkpoint", required=True, help="the base run (or checkpoint) dir")
        p.add_argument("--data", required=True, help="a UTF-8 text file to fine-tune on")
        p.add_argument("--out", required=True, help="where to save the adapters")
        p.add_argument("--lora-r", type=int, default=8, help="the adapters' rank")
        p.add_argument("--lora-alpha", type=float, default=16.0, help="scale: alpha / r")
        p.add_argument("--lora-dropout", type=float, default=0.0)
        p.add_argument("--targets", default="wq,wv", help="comma-separated Linear names")
        p.add_argument("--per-head", action="store_true", help="one adapter per head")
        p.add_argument("--max-iters", type=int, default=200)
        p.add_argument("--lr", type=float, default=1e-3)
        p.add_argument("--seed", type=int, default=1337)
        p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
        p.add_argument(
            "--merge", action="store_true", help="also write a merged checkpoint into OUT/merged"
        )
        args = p.parse_args(argv)
        finetune(
            args.checkpoint,
            load_text(args.data),
            args.out,
            r=args.lora_r,
            alpha=args.lora_alpha,
            targets=tuple(t.strip() for t in args.targets.split(",") if t.strip()),
            per_head=args.per_head,
            dropout=args.lora_dropout,
            max_iters=args.max_iters,
            lr=args.lr,
            seed=args.seed,
            device=args.device,
            data_path=str(Path(args.data).resolve()),
        )
        if args.merge:
            path = merge(args.out, Path(args.out) / "merged")
            print(f"merged checkpoint written to {path}")
    except (CheckpointError, ValueError, KeyError, OSError, FloatingPointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
