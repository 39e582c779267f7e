"""nanoGPT in PyTorch, written as its ``model.py`` and ``train.py`` are: the reference that
bench/train_vs_torch.py and bench/generate_vs_torch.py hold our engine against.

The model is nanoGPT's GPT: ``transformer.wte``/``wpe``, pre-norm blocks whose attention
computes query, key and value in one matmul (``c_attn``) and calls
``F.scaled_dot_product_attention(is_causal=True)``, an MLP ``c_fc`` -> ``nn.GELU()`` (the
exact erf form) -> ``c_proj``, ``ln_f`` and an ``lm_head`` tied to ``wte``. The recipe is
nanoGPT's: AdamW with decay on 2-D parameters only and the fused kernel only on CUDA (on the
CPU, torch's default implementation), torch's own thread count (nanoGPT sets none), the
cosine schedule with linear warmup, gradient clipping, ``zero_grad(set_to_none=True)``, the
next batch fetched right after the forward pass.

What it takes from us, so that both engines see the same numbers: the initial weights (ours,
copied in by ``load_ours``, which concatenates wq/wk/wv into ``c_attn``), the batches (drawn
by decoder.text.data with the same seeds, where nanoGPT draws them with ``torch.randint``), and
the fixed evaluation batches of decoder.training.step.estimate_loss (nanoGPT draws fresh ones).

Beyond nanoGPT, for our modern preset, the same model takes RoPE (rotate-half pairs), RMSNorm,
grouped-query heads (``c_attn`` then holds nh query and 2 n_kv key/value heads, and SDPA's
``enable_gqa`` shares them) and SwiGLU (gate and up projection fused in ``c_fc``), each
written the way nanoGPT writes the rest. Left out on purpose: post-norm and parallel blocks,
ALiBi and sinusoidal positions, torch.compile, and nanoGPT's bf16 autocast and TF32 on CUDA
(the comparison is in float32).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from decoder.model.config import ModelConfig
from decoder.training.config import TrainConfig

# Our parameter names -> nanoGPT's, applied in order to each name.
RENAMES = (
    ("tok_emb.", "transformer.wte."),
    ("pos_emb.", "transformer.wpe."),
    ("norm_f.", "transformer.ln_f."),
    ("blocks.", "transformer.h."),
    (".norm1.", ".ln_1."),
    (".norm2.", ".ln_2."),
    (".attn.wo.", ".attn.c_proj."),
    (".ffn.w2.", ".mlp.c_proj."),
)
# nanoGPT's fused projections, and ours that they stack, in the order they are stacked.
FUSED = {
    ".attn.c_attn.": (".attn.wq.", ".attn.wk.", ".attn.wv."),
    ".mlp.c_fc.": (".ffn.w1.", ".ffn.w3."),
}


def nanogpt_names(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Our state dict under nanoGPT's names, wq/wk/wv stacked into c_attn (and a SwiGLU's
    w1/w3 into c_fc) along the output dimension.

    >>> names = ("wq", "wk", "wv")
    >>> ours = {f"blocks.0.attn.{n}.weight": np.full((2, 3), i) for i, n in enumerate(names)}
    >>> {k: v[:, 0].tolist() for k, v in nanogpt_names(ours).items()}
    {'transformer.h.0.attn.c_attn.weight': [0, 0, 1, 1, 2, 2]}
    """
    pieces: dict[str, list[tuple[int, np.ndarray]]] = {}
    for name, value in state.items():
        order = 0
        for fused, parts in FUSED.items():
            for i, part in enumerate(parts):
                if part in name:
                    name, order = name.replace(part, fused), i
        for ours, theirs in RENAMES:
            name = name.replace(ours, theirs)
        pieces.setdefault(name, []).append((order, value))
    # subtle: stacked by the order in FUSED, never by the order the state dict lists them
    return {
        name: np.concatenate([v for _, v in sorted(p, key=lambda t: t[0])])
        for name, p in pieces.items()
    }


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
        return nn.LayerNorm(cfg.n_embd, eps=cfg.norm_eps, bias=cfg.bias)  # nanoGPT's, eps 1e-5
    return nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.nh, self.n_kv, self.hs = cfg.n_head, cfg.n_kv_head, cfg.head_size
        self.split_sizes = [self.nh * self.hs, self.n_kv * self.hs, self.n_kv * self.hs]
        # query, key and value projections for all heads in one matmul
        self.c_attn = nn.Linear(cfg.n_embd, sum(self.split_sizes), bias=cfg.bias)
        self.c_proj = nn.Linear(self.nh * self.hs, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.dropout = cfg.dropout
        self.rope = cfg.pos == "rope"
        if self.rope:
            cos, sin = rope_tables(self.hs, cfg.block_size, cfg.rope_theta)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.split_sizes, dim=2)
        q = q.view(B, T, self.nh, self.hs).transpose(1, 2)  # (B, T, C) -> (B, nh, T, hs)
        k = k.view(B, T, self.n_kv, self.hs).transpose(1, 2)  # -> (B, n_kv, T, hs)
        v = v.view(B, T, self.n_kv, self.hs).transpose(1, 2)
        if self.rope:
            q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=True,
            enable_gqa=self.n_kv != self.nh,  # each key/value head serves nh / n_kv queries
        )
        y = y.transpose(1, 2).contiguous().view(B, T, self.nh * self.hs)  # -> (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, gelu: str):
        super().__init__()
        self.swiglu = cfg.ffn == "swiglu"
        hidden = cfg.ffn_hidden
        # a SwiGLU's gate and up projections in one matmul, as c_attn does for q, k and v
        self.c_fc = nn.Linear(cfg.n_embd, 2 * hidden if self.swiglu else hidden, bias=cfg.bias)
        self.gelu = nn.GELU(approximate=gelu)
        self.c_proj = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)  # (B, T, C) -> (B, T, hidden) or (B, T, 2 hidden)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = self.gelu(h)
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, gelu: str):
        super().__init__()
        self.ln_1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = make_norm(cfg)
        self.mlp = MLP(cfg, gelu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT for one of our ModelConfigs; ``gelu`` is nn.GELU's ``approximate``
    ("none", nanoGPT's, or "tanh"). Its weights come from ``load_ours``."""

    def __init__(self, cfg: ModelConfig, gelu: str = "none"):
        super().__init__()
        if cfg.norm_position != "pre" or cfg.parallel_block or cfg.pos not in ("learned", "rope"):
            raise ValueError(
                "the reference implements pre-norm, sequential blocks and "
                f"learned or RoPE positions only, got norm_position={cfg.norm_position!r}, "
                f"parallel_block={cfg.parallel_block}, pos={cfg.pos!r}"
            )
        self.config = cfg
        modules = dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg, gelu) for _ in range(cfg.n_layer)]),
            ln_f=make_norm(cfg),
        )
        if cfg.pos == "learned":
            modules["wpe"] = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.transformer.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.size()
        x = self.transformer.wte(idx)  # (B, T) -> (B, T, C)
        if self.config.pos == "learned":
            x = x + self.transformer.wpe(torch.arange(0, T, dtype=torch.long, device=idx.device))
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)  # (B, T, C) -> (B, T, vocab)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
            return logits, loss
        # inference: the lm_head on the last position only, as nanoGPT does
        return self.lm_head(x[:, [-1], :]), None  # (B, T, C) -> (B, 1, vocab)

    def load_ours(self, state: dict[str, np.ndarray]) -> None:
        """Copy our model's state dict in, checking that every name and shape agrees."""
        theirs = nanogpt_names(state)
        own = dict(self.state_dict())
        if self.config.tie_weights:
            own.pop("lm_head.weight")  # the same tensor as transformer.wte.weight
        if set(own) != set(theirs):
            raise KeyError(
                f"names differ: only in the reference {sorted(set(own) - set(theirs))}, "
                f"only in ours (renamed) {sorted(set(theirs) - set(own))}"
            )
        with torch.no_grad():
            for name, value in theirs.items():
                if tuple(own[name].shape) != value.shape:
                    raise ValueError(
                        f"{name}: reference {tuple(own[name].shape)}, ours {value.shape}"
                    )
                own[name].copy_(torch.from_numpy(np.ascontiguousarray(value)))

    def configure_optimizers(
        self,
        weight_decay: float,
        learning_rate: float,
        betas: tuple[float, float],
        device_type: str,
    ) -> torch.optim.AdamW:
        """nanoGPT's: every 2-D parameter (matmul weights, embeddings) decays, 1-D ones do not;
        the fused AdamW on CUDA; elsewhere torch's default, which on the CPU is the for-loop
        over parameters (its foreach kernels serve CUDA tensors only)."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        extra = dict(fused=True) if device_type == "cuda" else dict()
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **extra)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
    ) -> torch.Tensor:
        """nanoGPT's sampling: no cache; each token re-runs the context cropped to block_size."""
        for _ in range(max_new_tokens):
            block = self.config.block_size
            idx_cond = idx if idx.size(1) <= block else idx[:, -block:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature  # (B, 1, V) -> (B, V)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)  # (B, 1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def get_lr(it: int, cfg: TrainConfig) -> float:
    """nanoGPT's schedule: linear warmup to lr, cosine decay to min_lr, then min_lr."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / (cfg.warmup_iters + 1)
    if it > cfg.lr_decay_iters:
        return cfg.min_lr
    decay_ratio = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


@torch.no_grad()
def estimate_loss(model: GPT, data: Any, cfg: TrainConfig, device: str) -> dict[str, float]:
    """As decoder.training.step.estimate_loss: the same fixed batches, reseeded at every
    evaluation."""
    model.eval()
    out = {}
    for i, split in enumerate(("train", "val")):
        rng = np.random.default_rng([cfg.seed, 1 + i])
        total = 0.0
        for _ in range(cfg.eval_iters):
            x, y = data.get_batch(split, cfg.batch_size, model.config.block_size, rng)
            _, loss = model(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
            total += loss.item()
        out[split] = total / cfg.eval_iters
    model.train()
    return out


def train_reference(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    data: Any,
    init_state: dict[str, np.ndarray],
    gelu: str = "none",
    progress: bool = True,
) -> dict[str, Any]:
    """Train nanoGPT's model from our weights ``init_state`` with nanoGPT's loop, on ``data``
    (a decoder.text.data.TokenDataset), for ``train_cfg.max_iters`` steps.

    Returns {"train_loss", "val_loss", "tokens_per_s", "time_s", "losses", "threads"}:
    tokens/s counts the training steps alone, evaluation excluded, as ours does.
    """
    device = train_cfg.device
    # TF32 as the run asks (ours: minigrad.set_float32_matmul_precision), as nanoGPT's
    # allow_tf32 flags do; on the CPU there is none
    tf32 = train_cfg.matmul_precision == "high"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(train_cfg.seed)
    model = GPT(model_cfg, gelu)
    model.load_ours(init_state)
    model.to(device)
    optimizer = model.configure_optimizers(
        train_cfg.weight_decay, train_cfg.lr, (train_cfg.beta1, train_cfg.beta2), device
    )
    batch_rng = np.random.default_rng(train_cfg.seed)
    B, T = train_cfg.batch_size, model_cfg.block_size

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        x, y = data.get_batch("train", B, T, batch_rng)
        return torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)

    losses, train_time = [], 0.0
    X, Y = get_batch()  # the very first batch
    for it in range(train_cfg.max_iters):
        t0 = time.perf_counter()
        lr = get_lr(it, train_cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        _, loss = model(X, Y)
        X, Y = get_batch()  # the next batch, fetched while a GPU would still be busy
        loss.backward()
        if train_cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())  # nanoGPT's CPU command logs every step; also syncs a GPU
        train_time += time.perf_counter() - t0
        step = it + 1
        last = step == train_cfg.max_iters
        if last or (progress and step % train_cfg.eval_interval == 0):
            final = estimate_loss(model, data, train_cfg, device)
            if progress:
                print(f"reference step {step}: train {final['train']:.4f}, val {final['val']:.4f}")
    return {
        "train_loss": final["train"],
        "val_loss": final["val"],
        "tokens_per_s": B * T * train_cfg.max_iters / train_time,
        "time_s": train_time,
        "losses": losses,
        "threads": torch.get_num_threads(),
    }
