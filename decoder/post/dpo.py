"""Direct preference optimisation (DPO): align a fine-tuned model with preference pairs
(``python -m decoder.dpo`` is its command).

Each pair is a prompt, a chosen and a rejected response (made from tiny Shakespeare by
decoder/post/instruct_data.py, or read from a JSONL file of ``{"prompt", "chosen", "rejected"}``
lines), written in the chat template (decoder/post/chat.py). The policy starts as the checkpoint
and trains; the reference is the same checkpoint, frozen. A response's log-likelihood is
the sum of its tokens' log-probabilities (the prompt's targets are ignored); the loss is
decoder.post.losses.dpo_loss with ``beta`` = TrainConfig.dpo_beta, and the reference's
log-likelihoods are computed once per batch without a graph. Training is decoder.training's
loop (decoder/post/posttrain.py): progress bar, ``log.jsonl``, ``loss.png``, atomic checkpoints
and exact resume; ``train_loss`` and ``val_loss`` are DPO losses, and each evaluation also
logs, on held-out pairs, the implicit reward margin (mean of beta times the log-ratio
difference), the preference accuracy (the share of pairs whose chosen response has the
larger implicit reward: 0 at the start, where policy and reference agree) and the
likelihood accuracy (the share whose chosen response the policy finds more likely: the
model's own preference, before DPO in the log's first row and after in its last).

Follows Rafailov et al. 2023 and the shape of TRL's DPOTrainer (its logged margins and
accuracies).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import minigrad as mg
from decoder.model.model import Decoder
from decoder.post.chat import add_chat_tokens
from decoder.post.instruct_data import PreferenceDataset, generated, read_jsonl
from decoder.post.losses import dpo_loss
from decoder.post.posttrain import load_post_model, run_post, start_post_run
from decoder.text.data import load_shakespeare
from decoder.training.run import Run
from minigrad import functional as F
from minigrad.tensor import Tensor


def sequence_logps(model: Decoder, x: np.ndarray, y: np.ndarray) -> Tensor:
    """log p(response | prompt) of each turn: x and y (N, T) from decoder.post.chat.pad_batch,
    the log-probabilities of the kept targets summed along each row -> (N,)."""
    logits, _ = model(x)  # (N, T) -> (N, T, V)
    nll = F.cross_entropy(logits, y, reduction="none")  # (N, T), 0 where a target is ignored
    return -nll.sum(axis=-1)  # (N, T) -> (N,)


class DPOObjective:
    """The DPO loss of a policy against ``reference`` (frozen, in eval mode), as
    decoder.training.step's ``loss_fn``: x and y are (B, 2, T), each pair's chosen turn first."""

    def __init__(self, reference: Decoder, beta: float):
        self.reference, self.beta = reference, beta
        reference.requires_grad_(False)
        reference.eval()

    def log_ratios(self, model: Decoder, x: np.ndarray, y: np.ndarray) -> tuple[Tensor, ...]:
        """The policy's log-likelihoods (B, 2) and the reference's, computed once, no graph."""
        B, _, T = x.shape
        x, y = x.reshape(2 * B, T), y.reshape(2 * B, T)  # (B, 2, T) -> (2B, T)
        with mg.no_grad():
            ref = sequence_logps(self.reference, x, y).reshape(B, 2)
        return sequence_logps(model, x, y).reshape(B, 2), ref

    def __call__(self, model: Decoder, x: np.ndarray, y: np.ndarray) -> Tensor:
        policy, ref = self.log_ratios(model, x, y)
        return dpo_loss(policy[:, 0], policy[:, 1], ref[:, 0], ref[:, 1], beta=self.beta)

    @mg.no_grad()
    def held_out(self, run: Run) -> dict[str, float]:
        """The reward margin and the two accuracies on the evaluation's held-out batches (seeded as
        decoder.training.step.estimate_loss's, so every evaluation scores the same pairs)."""
        cfg = run.train_cfg
        rng = np.random.default_rng([cfg.seed, 2])  # estimate_loss's val generator
        run.model.eval()
        margins, likelier = [], []
        for _ in range(cfg.eval_iters):
            x, y = run.data.get_batch("val", cfg.batch_size, run.model_cfg.block_size, rng)
            policy, ref = self.log_ratios(run.model, x, y)
            policy = policy.numpy()  # (B, 2): log-likelihoods of the chosen, the rejected
            rewards = self.beta * (policy - ref.numpy())  # (B, 2): implicit rewards
            margins.append(rewards[:, 0] - rewards[:, 1])
            likelier.append(policy[:, 0] > policy[:, 1])
        run.model.train()
        margin = np.concatenate(margins)
        return {
            "reward_margin": float(margin.mean()),
            # a tie (as at the start: policy = reference) counts as wrong, as in TRL
            "preference_accuracy": float((margin > 0).mean()),
            # the policy's own preference, which does not start at 0: the model before DPO
            "likelihood_accuracy": float(np.concatenate(likelier).mean()),
        }


def reference_model(run_extra: dict[str, Any], vocab_size: int, seed: int) -> Decoder:
    """The frozen reference: the run's starting checkpoint with the same chat-token rows
    (add_chat_tokens draws them from the run's seed, so they equal the policy's first ones)."""
    model, _, _ = load_post_model(run_extra["base_checkpoint"])
    return add_chat_tokens(model, vocab_size, seed)


def dpo(
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
    """Train ``checkpoint`` (usually decoder.post.sft's) with DPO into ``out_dir``; the
    arguments are decoder.post.sft.sft's. Returns ``{"step", "train_loss", "val_loss",
    "reward_margin", "preference_accuracy", "likelihood_accuracy_before",
    "likelihood_accuracy_after", "out_dir"}`` (the first three of the last evaluation)."""
    say = print if progress else (lambda *a, **k: None)

    def examples(block_size: int, seed: int) -> list[dict]:
        if data_path is not None:
            return read_jsonl(data_path, "dpo")
        source = text if text is not None else load_shakespeare()
        return generated("dpo", source, n_examples, seed, block_size)

    def start(out: Path) -> Run:
        run = start_post_run(
            checkpoint, out, examples, PreferenceDataset, overrides or {}, lora, resume, say
        )
        reference = reference_model(run.extra, run.model_cfg.vocab_size, run.train_cfg.seed)
        objective = DPOObjective(reference.to(run.train_cfg.device), run.train_cfg.dpo_beta)
        run.loss_fn, run.metrics, run.command = objective, objective.held_out, "decoder.dpo"
        return run

    run, log = run_post(out_dir, start, resume, overwrite, until, progress)
    first, last = log[0], log[-1]
    say(
        f"step {run.step}: on held-out pairs, the chosen response is the likelier in "
        f"{first['likelihood_accuracy']:.1%} before, {last['likelihood_accuracy']:.1%} now; "
        f"reward margin {last['reward_margin']:.3f}, preference accuracy "
        f"{last['preference_accuracy']:.1%}; the run directory is {run.out_dir}"
    )
    return {
        "step": run.step,
        "train_loss": last["train_loss"],
        "val_loss": last["val_loss"],
        "reward_margin": last["reward_margin"],
        "preference_accuracy": last["preference_accuracy"],
        "likelihood_accuracy_before": first["likelihood_accuracy"],
        "likelihood_accuracy_after": last["likelihood_accuracy"],
        "out_dir": str(run.out_dir),
    }
