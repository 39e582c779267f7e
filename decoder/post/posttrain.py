"""What supervised fine-tuning (decoder.post.sft) and preference optimisation (decoder.post.dpo)
share: a training run that starts from a trained checkpoint instead of from scratch.

``start_post_run`` loads the base model, gives it the chat template's tokens (decoder/post/chat.py),
optionally wraps it in LoRA adapters, and builds decoder.training.run's ``Run`` around it, so that
``run_post`` trains it with decoder.training.loop's own loop: the same step (decoder.training.step),
progress bar, log, plot, evaluations, atomic checkpoints, Ctrl-C handling and exact resume (the
checkpoint keeps the optimiser and every generator). What differs between SFT and DPO is passed in:
the dataset (its ``get_batch``), the loss and the numbers logged at each evaluation.

A post-training run keeps its base model's shape and training settings, with POST_DEFAULTS
(a short run at a lower learning rate) and the settings given as --key=value on top. With
LoRA the adapters train and so do the embedding and output tables (their new chat-token rows
start untrained; PEFT's ``modules_to_save``); the checkpoint holds the wrapped model, which
``load_post_model`` merges back into a plain Decoder (the base of a later DPO run).

Left out on purpose: a reward model and PPO (DPO needs neither), and several adapters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from decoder.model.config import ModelConfig
from decoder.model.model import Decoder, build_model
from decoder.post.chat import add_chat_tokens, chat_tokenizer
from decoder.training.checkpoint import (
    LATEST,
    CheckpointError,
    build_tokenizer,
    check_weights,
    has_checkpoint,
    load_checkpoint,
)
from decoder.training.config import DEFAULT_PRESET, TrainConfig, build_configs, device_or_cpu
from decoder.training.log import read_log
from decoder.training.loop import loop
from decoder.training.run import (
    RUN_FILES,
    Run,
    announce_resume,
    decay_follows_max_iters,
    generators,
    make_optimizer,
    restore,
)
from decoder.training.rundir import claim_dir
from minigrad.nn.lora import apply_lora, merge_lora

# A short run at a tenth of pre-training's rate: the model knows the text already.
POST_DEFAULTS = dict(
    max_iters=300, lr=3e-4, min_lr=3e-5, warmup_iters=20, lr_decay_iters=None,
    eval_interval=50, eval_iters=10, sample_tokens=0,
)  # fmt: skip
RESUME_FIXED = ("seed", "dtype", "tokenizer", "bpe_vocab_size")  # as decoder.training.run's


def examples_fingerprint(examples: Sequence[dict]) -> str:
    """A short hash of the examples, so a resume can tell it got the same data.

    >>> examples_fingerprint([{"instruction": "a", "response": "b"}])
    'fb5a0fb5066d3fc3'
    """
    text = json.dumps(list(examples), sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def post_config(base: TrainConfig, overrides: dict[str, str], defaults: dict) -> TrainConfig:
    """``base``'s settings with ``defaults``, then the ``overrides`` (text, typed here)."""
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    refused = sorted(model_fields & overrides.keys())
    if refused:
        raise ValueError(
            f"--{refused[0]}: a fine-tune keeps its base model's shape; set only training "
            f"settings (fields of TrainConfig)"
        )
    kept = {**dataclasses.asdict(base), **defaults}
    _, cfg = build_configs(
        DEFAULT_PRESET, overrides, **{k: v for k, v in kept.items() if k not in overrides}
    )
    return cfg


def wrap_lora(model: Decoder, lora: dict[str, Any], seed: int) -> None:
    """Wrap ``model``'s ``lora["targets"]`` in adapters of rank ``r`` and scale ``alpha / r``,
    in place; the token embedding and output tables train too (the chat tokens' rows)."""
    apply_lora(
        model,
        tuple(lora["targets"]),
        r=lora["r"],
        alpha=lora["alpha"],
        rng=np.random.default_rng(seed),
    )
    model.tok_emb.weight.requires_grad = True
    model.lm_head.weight.requires_grad = True  # the same Parameter when the two are tied


def load_post_model(path: str | Path, device: str = "cpu") -> tuple[Decoder, Any, Any]:
    """A checkpoint's plain model (LoRA adapters merged), tokenizer and Checkpoint."""
    ckpt = load_checkpoint(path, with_optimizer=False)
    tokenizer = build_tokenizer(ckpt)
    model = build_model(ckpt.model_config, ckpt.train_config.dtype)
    lora = ckpt.extra.get("lora")
    if lora:
        wrap_lora(model, lora, ckpt.train_config.seed)
    check_weights(ckpt.weights, model.state_dict(), ckpt.path)
    model.load_state_dict(ckpt.weights)
    if lora:
        merge_lora(model)
    model.requires_grad_(True)
    return model.to(device), tokenizer, ckpt


def start_post_run(
    base: str | Path | None,
    out_dir: Path,
    examples: Callable[[int, int], Sequence[dict]],
    make_data: Callable[[Sequence[dict], Any, int], Any],
    overrides: dict[str, str],
    lora: dict[str, Any] | None = None,
    resume: bool = False,
    say: Callable[..., None] = print,
) -> Run:
    """The Run of a post-training of ``base`` in ``out_dir``, or with ``resume`` the run
    saved there (with its base, adapters and settings; ``overrides`` may change those that a
    resume can). It runs on the device ``overrides`` name, else its base's (or the resumed
    run's), by decoder.training.config.device_or_cpu's rule. ``examples(block_size, seed)``
    gives the examples and ``make_data(examples, tokenizer, block_size)`` the dataset."""
    ckpt = None
    if resume:
        ckpt, train_cfg = _resumed(out_dir, overrides, lora)
        tokenizer = build_tokenizer(ckpt)
        model = build_model(ckpt.model_config, train_cfg.dtype)
        lora = ckpt.extra.get("lora")
        extra = {k: v for k, v in ckpt.extra.items() if k != "elapsed_s"}
    else:
        if base is None:
            raise ValueError("give the model to start from: --checkpoint RUN_DIR")
        model, base_tokenizer, base_ckpt = load_post_model(base)
        train_cfg = post_config(base_ckpt.train_config, overrides, POST_DEFAULTS)
        tokenizer = chat_tokenizer(base_tokenizer)
        model = add_chat_tokens(model, tokenizer.vocab_size, train_cfg.seed)
        extra = {"base_checkpoint": str(base_ckpt.path.resolve()), "lora": lora}
    device = device_or_cpu(train_cfg.device, requested="device" in overrides)
    train_cfg = dataclasses.replace(train_cfg, device=device)
    chosen = examples(model.config.block_size, train_cfg.seed)
    extra["data_sha256"] = examples_fingerprint(chosen)
    if ckpt is not None and ckpt.extra.get("data_sha256") != extra["data_sha256"]:
        raise CheckpointError(
            f"{out_dir}: this run was trained on other examples; resume with the same "
            f"--data and --examples, or start a new run with another --out"
        )
    if lora:
        wrap_lora(model, lora, train_cfg.seed)
    model.to(train_cfg.device)
    model.train()
    data = make_data(chosen, tokenizer, model.config.block_size)
    if data.dropped:
        say(f"note: {data.dropped} examples are longer than the context and are left out")
    optimizer = make_optimizer(model, train_cfg)
    run = Run(
        out_dir=out_dir,
        model_cfg=model.config,
        train_cfg=train_cfg,
        model=model,
        optimizer=optimizer,
        tokenizer=tokenizer,
        data=data,
        rngs={"batches": np.random.default_rng(train_cfg.seed), **generators(model)},
        extra=extra,
    )
    if ckpt is not None:
        announce_resume(ckpt, train_cfg, say)
        restore(run, ckpt)
        say(f"resuming {out_dir} from step {run.step}")
    else:
        n = model.num_parameters(trainable_only=True)
        say(f"training {n:,} of {model.num_parameters():,} parameters; the run is in {out_dir}")
    return run


def _resumed(
    out_dir: Path, overrides: dict[str, str], lora: dict[str, Any] | None
) -> tuple[Any, TrainConfig]:
    """The checkpoint in ``out_dir`` and its settings with ``overrides``; refuses what a resume
    cannot change: the settings of RESUME_FIXED, and the adapters (their rank, scale and
    targets shape the weights saved; ``lora`` holds those given now, None or {} none)."""
    if not has_checkpoint(out_dir):
        raise CheckpointError(f"{out_dir}: no checkpoint to resume from (no '{LATEST}' file)")
    ckpt = load_checkpoint(out_dir)
    fixed = sorted(set(RESUME_FIXED) & overrides.keys())
    if fixed:
        raise CheckpointError(f"{out_dir}: a resume cannot change --{fixed[0]}: drop it")
    saved = ckpt.extra.get("lora") or {"r": 0}  # a full-weight run: LoRA's rank 0
    changed = [
        f"{k}: {saved.get(k)!r} -> {v!r}" for k, v in (lora or {}).items() if saved.get(k) != v
    ]
    if changed:
        raise CheckpointError(
            f"{out_dir}: a resume cannot change the LoRA adapters ({'; '.join(changed)}): "
            f"drop --lora-r, --lora-alpha and --targets to keep the run's, or start a new run "
            f"with another --out"
        )
    train_cfg = post_config(ckpt.train_config, overrides, {})
    return ckpt, decay_follows_max_iters(ckpt.train_config, train_cfg, overrides)


def run_post(
    out_dir: str | Path,
    start: Callable[[Path], Run],
    resume: bool = False,
    overwrite: bool = False,
    until: int | None = None,
    progress: bool = True,
) -> tuple[Run, list[dict]]:
    """Hold ``out_dir`` (decoder.training.rundir), build the run with ``start(out_dir)`` (which sets
    its ``loss_fn`` and ``metrics``) and train it with decoder.training.loop's loop; returns the run
    and its log."""
    with claim_dir(out_dir, RUN_FILES, LATEST, resume=resume, overwrite=overwrite) as out_dir:
        run = start(out_dir)
        loop(run, until, progress)
        return run, read_log(out_dir)
