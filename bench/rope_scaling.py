"""Why RoPE needs scaling to run past its training context: none, linear, NTK and YaRN.

Trains the ``shakespeare-char-modern`` preset (RoPE, RMSNorm, SwiGLU, GQA) at its context of
64 for ``--iters`` steps, then evaluates the same weights at contexts 64, 128, 256 and 512
(``--contexts``) four ways: RoPE as trained, linear position interpolation, NTK-aware base
change and YaRN, each with factor = context / 64 and YaRN's original context 64
(decoder/model/positional.py, ``rope_frequencies``). The loss is the mean next-token cross-entropy
over every position of ``--eval-batches`` x ``--batch-size`` validation windows of the
context's length (the same windows for the four), so a scaling that breaks the positions
past 64 shows as a rising loss. With ``--finetune N``, each of the four is then trained N
more steps at the longest context and evaluated there again (the unscaled one shows what the
extra training alone buys): the papers' claim is that YaRN needs the least of this.

The weights load into each longer model unchanged: RoPE's tables are not saved, so a model
of another block_size and scaling takes the same state dict.
Usage: python bench/rope_scaling.py [--iters 600] [--contexts 64 128 256 512]
       [--finetune 0] [--data PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

import minigrad as mg
from decoder.model.model import Decoder
from decoder.text.data import TokenDataset, load_shakespeare, load_text
from decoder.text.tokenizer import get_tokenizer
from decoder.training.config import build_configs
from minigrad.optim import AdamW, clip_grad_norm_, cosine_lr, param_groups_for_decay, set_lr

PRESET, TRAIN_CONTEXT = "shakespeare-char-modern", 64
SCALINGS = (None, "linear", "ntk", "yarn")


def train(model: Decoder, data: TokenDataset, steps: int, context: int, cfg, seed: int) -> float:
    """``steps`` AdamW steps on random windows of ``context`` tokens; the last loss."""
    optimizer = AdamW(
        param_groups_for_decay(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        weight_decay=cfg.weight_decay,
    )
    rng = np.random.default_rng(seed)
    warmup = min(cfg.warmup_iters, steps // 10)
    model.train()
    loss_value = float("nan")
    for step in range(steps):
        set_lr(optimizer, cosine_lr(step, cfg.lr, cfg.min_lr, warmup, steps))
        x, y = data.get_batch("train", cfg.batch_size, context, rng)
        optimizer.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.grad_clip)
        optimizer.step()
        loss_value = loss.item()
    return loss_value


@mg.no_grad()
def evaluate(model: Decoder, data: TokenDataset, context: int, batches: int, batch: int) -> float:
    """Mean validation loss over every position of the same windows for every model."""
    model.eval()
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(batches):
        x, y = data.get_batch("val", batch, context, rng)
        losses.append(model(x, y)[1].item())
    return float(np.mean(losses))


def scaled(model_cfg, context: int, scaling: str | None) -> Decoder:
    """A model of block_size ``context`` whose RoPE is stretched by ``scaling``."""
    factor = 1.0 if scaling is None else context / TRAIN_CONTEXT
    cfg = dataclasses.replace(
        model_cfg,
        block_size=context,
        rope_scaling=scaling,
        rope_factor=factor,
        rope_original_context=TRAIN_CONTEXT,
    )
    return Decoder(cfg)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=600)
    p.add_argument("--contexts", type=int, nargs="+", default=[64, 128, 256, 512])
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--finetune", type=int, default=0, help="steps at the longest context")
    p.add_argument("--data", default=None, help="a text file (default: Tiny Shakespeare)")
    args = p.parse_args()
    text = load_text(args.data) if args.data else load_shakespeare()
    tokenizer = get_tokenizer("char", text=text)
    data = TokenDataset.from_text(text, tokenizer)
    model_cfg, train_cfg = build_configs(PRESET, vocab_size=tokenizer.vocab_size)
    mg.manual_seed(train_cfg.seed)
    base = Decoder(model_cfg)
    start = time.perf_counter()
    last = train(base, data, args.iters, TRAIN_CONTEXT, train_cfg, train_cfg.seed)
    print(
        f"{PRESET}: {base.num_parameters():,} parameters, {args.iters} steps at context "
        f"{TRAIN_CONTEXT} in {time.perf_counter() - start:.0f} s, last train loss {last:.3f}"
    )
    weights = base.state_dict()
    names = [str(s) for s in SCALINGS]
    print(f"validation loss ({args.eval_batches} x {args.batch_size} windows per context)")
    print(f"{'context':>7} | " + " ".join(f"{n:>7}" for n in names))
    for context in args.contexts:
        row = []
        for scaling in SCALINGS:
            model = scaled(model_cfg, context, scaling)
            model.load_state_dict(weights)
            row.append(evaluate(model, data, context, args.eval_batches, args.batch_size))
        print(f"{context:>7} | " + " ".join(f"{loss:>7.3f}" for loss in row))
    if args.finetune:
        context = max(args.contexts)
        batch_cfg = dataclasses.replace(train_cfg, batch_size=args.batch_size)
        row = []
        for scaling in SCALINGS:
            model = scaled(model_cfg, context, scaling)
            model.load_state_dict(weights)
            train(model, data, args.finetune, context, batch_cfg, seed=1)
            row.append(evaluate(model, data, context, args.eval_batches, args.batch_size))
        print(f"after {args.finetune} steps of fine-tuning at context {context}:")
        print(f"{context:>7} | " + " ".join(f"{loss:>7.3f}" for loss in row))


if __name__ == "__main__":
    main()
