"""A PyTorch twin of decoder.Decoder and of decoder.train's recipe, for bench/train_vs_torch.py.

The same architecture (token and position embeddings, pre-norm blocks of causal
self-attention with separate wq/wk/wv/wo and grouped-query heads, a GELU MLP or a SwiGLU,
LayerNorm or RMSNorm, RoPE, a tied lm_head), with parameters of the same names and shapes,
so it can start from our model's very weights. The same recipe: AdamW with decay on matrices
only, nanoGPT's cosine schedule with linear warmup, gradient clipping, the same batches
(drawn by decoder.data with the same seeds) and the same fixed evaluation batches.

Left out on purpose: post-norm and parallel blocks, ALiBi and sinusoidal positions, the KV
cache and sampling (the benchmark only trains). Written in the style of nanoGPT's model.py.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from decoder.config import ModelConfig, TrainConfig


def get_lr(it: int, cfg: TrainConfig) -> float:
    """nanoGPT's schedule: linear warmup to lr, cosine decay to min_lr, then min_lr."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / (cfg.warmup_iters + 1)
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


def rope_tables(hs: int, block_size: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (block_size, hs) for the rotate-half pairing (i, i + hs/2)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs)  # (hs/2,)
    angles = torch.outer(torch.arange(block_size, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)  # (T, hs/2) -> (T, hs)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    T, half = x.shape[-2], x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # rotate-half
    return x * cos[:T] + rotated * sin[:T]


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "layer":
        return nn.LayerNorm(cfg.n_embd, eps=1e-5, bias=cfg.bias)
    return nn.RMSNorm(cfg.n_embd, eps=1e-6)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.nh, self.n_kv, self.hs = cfg.n_head, cfg.n_kv_head, cfg.head_size
        self.wq = nn.Linear(cfg.n_embd, self.nh * self.hs, bias=cfg.bias)
        self.wk = nn.Linear(cfg.n_embd, self.n_kv * self.hs, bias=cfg.bias)
        self.wv = nn.Linear(cfg.n_embd, self.n_kv * self.hs, bias=cfg.bias)
        self.wo = nn.Linear(self.nh * self.hs, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.rope = cfg.pos == "rope"
        if self.rope:
            cos, sin = rope_tables(self.hs, cfg.block_size, cfg.rope_theta)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.nh, self.hs).transpose(1, 2)  # (B, T, C) -> (B, nh, T, hs)
        k = self.wk(x).view(B, T, self.n_kv, self.hs).transpose(1, 2)  # -> (B, n_kv, T, hs)
        v = self.wv(x).view(B, T, self.n_kv, self.hs).transpose(1, 2)
        if self.rope:
            q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        if self.n_kv != self.nh:  # each key/value head serves nh / n_kv query heads
            k = k.repeat_interleave(self.nh // self.n_kv, dim=1)  # -> (B, nh, T, hs)
            v = v.repeat_interleave(self.nh // self.n_kv, dim=1)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, nh, T, hs) -> (B, T, C)
        return self.resid_dropout(self.wo(y))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.swiglu = cfg.ffn == "swiglu"
        self.w1 = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=cfg.bias)
        if self.swiglu:
            self.w3 = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=cfg.bias)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            h = F.silu(self.w1(x)) * self.w3(x)
        else:
            h = F.gelu(self.w1(x), approximate="tanh")
        return self.dropout(self.w2(h))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.norm2 = make_norm(cfg)
        self.ffn = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class TorchDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.norm_position != "pre" or cfg.parallel_block or cfg.pos not in ("learned", "rope"):
            raise ValueError(
                "the reference implements pre-norm, sequential blocks and "
                "learned or RoPE positions only"
            )
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        if cfg.pos == "learned":
            self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.norm_f = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled residual projections
            if name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        x = self.tok_emb(idx)  # (B, T) -> (B, T, C)
        if self.cfg.pos == "learned":
            x = x + self.pos_emb(torch.arange(T, device=idx.device))
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.norm_f(x))  # (B, T, C) -> (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def load_numpy_state(self, state: dict[str, np.ndarray]) -> None:
        """Copy our model's state dict in, checking that every name and shape agrees."""
        own = {k: v for k, v in self.state_dict().items()}
        if self.cfg.tie_weights:
            own.pop("lm_head.weight")  # the same tensor as tok_emb.weight
        if set(own) != set(state):
            raise KeyError(
                f"names differ: only in torch {sorted(set(own) - set(state))}, "
                f"only in ours {sorted(set(state) - set(own))}"
            )
        with torch.no_grad():
            for name, value in state.items():
                if tuple(own[name].shape) != value.shape:
                    raise ValueError(f"{name}: torch {tuple(own[name].shape)}, ours {value.shape}")
                own[name].copy_(torch.from_numpy(np.ascontiguousarray(value)))


@torch.no_grad()
def estimate_loss(model, data, cfg: TrainConfig, block_size: int, device: str) -> dict[str, float]:
    """As decoder.train.estimate_loss: the same fixed batches, reseeded at every evaluation."""
    model.eval()
    out = {}
    for i, split in enumerate(("train", "val")):
        rng = np.random.default_rng([cfg.seed, 1 + i])
        total = 0.0
        for _ in range(cfg.eval_iters):
            x, y = data.get_batch(split, cfg.batch_size, block_size, rng)
            _, loss = model(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
            total += loss.item()
        out[split] = total / cfg.eval_iters
    model.train()
    return out


def train_reference(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    data: Any,
    init_state: dict[str, np.ndarray] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train the twin with our recipe on ``data`` (a decoder.data dataset); as decoder.train.

    Returns {"train_loss", "val_loss", "tokens_per_s", "time_s", "losses"}.
    """
    device = train_cfg.device
    torch.manual_seed(train_cfg.seed)
    model = TorchDecoder(model_cfg)
    if init_state is not None:
        model.load_numpy_state(init_state)
    model.to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": train_cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=train_cfg.lr,
        betas=(train_cfg.beta1, train_cfg.beta2),
    )
    batch_rng = np.random.default_rng(train_cfg.seed)
    B, T = train_cfg.batch_size, model_cfg.block_size
    losses, train_time = [], 0.0
    for it in range(train_cfg.max_iters):
        t0 = time.perf_counter()
        lr = get_lr(it, train_cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = data.get_batch("train", B, T, batch_rng)
        _, loss = model(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if train_cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        optimizer.step()
        losses.append(loss.item())  # also waits for the GPU, so the timing is honest
        train_time += time.perf_counter() - t0
        step = it + 1
        last = step == train_cfg.max_iters
        if last or (progress and step % train_cfg.eval_interval == 0):
            final = estimate_loss(model, data, train_cfg, T, device)
            if progress:
                print(f"torch step {step}: train {final['train']:.4f}, val {final['val']:.4f}")
    return {
        "train_loss": final["train"],
        "val_loss": final["val"],
        "tokens_per_s": B * T * train_cfg.max_iters / train_time,
        "time_s": train_time,
        "losses": losses,
    }
