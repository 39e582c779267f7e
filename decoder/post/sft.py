"""Supervised fine-tuning (SFT): teach a pre-trained model to answer instructions
(``python -m decoder.sft`` is its command).

The model learns (instruction, response) pairs written in the chat template
(decoder/post/chat.py), with the loss on the response tokens only: the prompt's targets are
ignored. The pairs are made from tiny Shakespeare (decoder/post/instruct_data.py) or read from a
JSONL file of ``{"instruction", "response"}`` lines. Training is decoder.training's loop
(decoder/post/posttrain.py): progress bar, ``log.jsonl``, ``loss.png``, atomic checkpoints and
exact resume. Each evaluation also logs ``exact_match``: the share of held-out questions with
one right answer (the speaker task; every held-out pair for user data) whose greedy answer
is exactly right (then ``<|end|>``), scored teacher-forced in a forward pass per batch, at any
answer length; so the log's first row is the model before SFT and its last after.

Follows Ouyang et al. 2022 (InstructGPT's supervised stage) and Alpaca's data format.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import minigrad as mg
from decoder.model.model import IGNORE_INDEX
from decoder.post.chat import END, encode_pair, pad_batch
from decoder.post.instruct_data import SPEAKER_TASK, ChatDataset, generated, read_jsonl
from decoder.post.posttrain import run_post, start_post_run
from decoder.text.data import load_shakespeare
from decoder.training.run import Run
from minigrad.backend import to_numpy

MAX_EXACT = 100  # held-out questions scored per evaluation
EXACT_BATCH = 32  # turns per forward pass while scoring them


@mg.no_grad()
def exact_match(model: Any, tokenizer: Any, examples: Sequence[dict]) -> float:
    """The share of ``examples`` whose greedy answer is exactly the response, then ``<|end|>``.

    Scored teacher-forced, a forward pass per EXACT_BATCH turns: greedy decoding writes the
    response token by token iff at each of its positions, and at the ``<|end|>`` after it, the
    argmax given the true tokens before is the true token. So one pass answers what generating
    would, at any answer length, in the time of one evaluation batch (a response that decodes
    to the same text through other tokens counts as wrong: a BPE model's rare case).
    """
    if not examples:
        return float("nan")
    turns = [encode_pair(tokenizer, e["instruction"], e["response"]) for e in examples]
    hits = 0
    for start in range(0, len(turns), EXACT_BATCH):
        x, y = pad_batch(turns[start : start + EXACT_BATCH], tokenizer.special_tokens[END])
        logits, _ = model(x)  # (B, T, V)
        right = to_numpy(logits.data.argmax(axis=-1)) == y  # (B, T)
        scored = y != IGNORE_INDEX  # the response's tokens and its <|end|>
        hits += int((right | ~scored).all(axis=1).sum())
    return hits / len(examples)


def scored(examples: Sequence[dict]) -> list[dict]:
    """The held-out examples exact match scores: those of the speaker task if there are
    any (the continue task has many right answers), else all; MAX_EXACT at most."""
    one_answer = [e for e in examples if e.get("task") == SPEAKER_TASK]
    return (one_answer or list(examples))[:MAX_EXACT]


def exact_match_metric(run: Run) -> dict[str, float]:
    """The number each evaluation logs beside the losses (decoder.training.run's Run.metrics)."""
    run.model.eval()
    try:
        return {
            "exact_match": exact_match(run.model, run.tokenizer, scored(run.data.examples["val"]))
        }
    finally:
        run.model.train()


def sft(
    checkpoint: str | Path | None,
    out_dir: str | Path,
    data_path: str | Path | None = None,
    n_examples: int = 4000,
    overrides: dict[str, str] | None = None,
    lora: dict[str, Any] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    until: int | None = None,
    progress: bool = True,
    text: str | None = None,
) -> dict[str, Any]:
    """Fine-tune ``checkpoint`` on instruction pairs into ``out_dir`` (see the module).

    The pairs come from ``data_path`` (JSONL) or are ``n_examples`` made from ``text`` (default tiny
    Shakespeare). ``overrides`` are TrainConfig settings as text; ``lora`` is ``{"r", "alpha",
    "targets"}`` (None: every weight trains); ``until`` stops after that step with a checkpoint, as
    decoder.training.loop.train's. Returns the step, the last losses and the exact match before and
    after: ``{"step", "train_loss", "val_loss", "exact_match_before", "exact_match_after",
    "out_dir"}``.
    """
    say = print if progress else (lambda *a, **k: None)

    def examples(block_size: int, seed: int) -> list[dict]:
        if data_path is not None:
            return read_jsonl(data_path, "sft")
        source = text if text is not None else load_shakespeare()
        return generated("sft", source, n_examples, seed, block_size)

    def start(out: Path) -> Run:
        run = start_post_run(
            checkpoint, out, examples, ChatDataset, overrides or {}, lora, resume, say
        )
        run.metrics, run.command = exact_match_metric, "decoder.sft"
        return run

    run, log = run_post(out_dir, start, resume, overwrite, until, progress)
    before, after = log[0]["exact_match"], log[-1]["exact_match"]
    say(
        f"step {run.step}: val loss {log[-1]['val_loss']:.4f}; exact match on held-out "
        f"questions {before:.1%} before, {after:.1%} now; the run directory is {run.out_dir}"
    )
    return {
        "step": run.step,
        "train_loss": log[-1]["train_loss"],
        "val_loss": log[-1]["val_loss"],
        "exact_match_before": before,
        "exact_match_after": after,
        "out_dir": str(run.out_dir),
    }
