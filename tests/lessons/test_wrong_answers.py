"""Every exercise's check rejects known-wrong answers, and passes the reference solutions.

Each wrong answer is a mistake a learner makes: an off-by-one, a missing term, a call to the
function the exercise asks them to write, a softmax that reads the whole row at once. A
check that let one through would tell the learner "correct" for it.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from itertools import pairwise
from pathlib import Path

import checks
import numpy as np
import pytest
from exercises import NotAttempted, check, exercise_test, or_solution, solution, todo
from solutions import (
    lesson01,
    lesson05,
    lesson07,
    lesson08,
    lesson09,
    lesson10,
    lesson11,
    lesson15,
    lesson16,
)

import minigrad as mg
from decoder.hf.pretrained import to_ours
from decoder.model.positional import RoPE, rope_frequencies
from decoder.post.chat import pad_batch
from decoder.post.losses import dpo_loss
from decoder.text.bpe import BPETokenizer, merge_pair, split_text
from decoder.training.config import TrainConfig
from decoder.training.step import train_step
from minigrad import autograd
from minigrad import functional as F
from minigrad.backend import xp_of
from minigrad.optim import clip_grad_norm_, cosine_lr, set_lr
from minigrad.serialization import bfloat16_to_float32, open_safetensors


# ---- lesson 1 ----------------------------------------------------------------------------------
def topological_sort_recursive(root, parents):
    """Right order, but recursive: it needs a raised recursion limit for the deep chain."""
    order, seen = [], set()

    def visit(node):
        if id(node) not in seen:
            seen.add(id(node))
            for p in parents(node):
                visit(p)
            order.append(node)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(50_000)
    try:
        visit(root)
    finally:
        sys.setrecursionlimit(limit)
    return order


def topological_sort_children_first(root, parents):
    """Iterative, but a plain DFS preorder: every node before its parents."""
    return lesson01.topological_sort(root, parents)[::-1]


def matmul_backward_untransposed(x, w, grad_out):
    return grad_out @ w.T, grad_out.T @ x  # grad_w is transposed: (M, K), not (K, M)


class SinIgnoresUpstream(mg.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.sin(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        return np.cos(x)  # forgets grad_out


def sin_ignores_upstream(x):
    return SinIgnoresUpstream.apply(x)


def sin_taylor(x):
    """Right to 1e-11 on [-3, 3], from minigrad's ops: not the new op the exercise asks for."""
    term, total = x, x
    for n in range(3, 24, 2):
        term = term * x * x * (-1.0 / (n * (n - 1)))  # x^n / n!, alternating
        total = total + term
    return total


# ---- lesson 2 ----------------------------------------------------------------------------------
def unbroadcast_leading_only(grad, shape):
    return grad.sum(axis=tuple(range(grad.ndim - len(shape))))  # misses stretched size-1 axes


def unbroadcast_library(grad, shape):
    return autograd.unbroadcast(grad, shape)


def central_difference_forward(f, x, eps=1e-6):
    grad = np.zeros(x.shape)
    base = f(x)
    flat = x.reshape(-1)
    for i in range(flat.size):
        flat[i] += eps
        grad.reshape(-1)[i] = (f(x) - base) / eps  # a forward difference: error of order eps
        flat[i] -= eps
    return grad


class SoftplusNaive(mg.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.log(1 + np.exp(x))  # exp(800) overflows

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        return grad_out / (1 + np.exp(-x))


def softplus_naive(x):
    return SoftplusNaive.apply(x)


def softplus_composite(x):
    """Right values from minigrad's own ops: not the one Function the exercise asks for."""
    return mg.maximum(x, 0.0) + ((-(x.abs())).exp() + 1.0).log()


def softmax_backward_no_correction(p, grad_p):
    return p * grad_p  # the diagonal of diag(p) - p p^T only


# ---- lesson 3 ----------------------------------------------------------------------------------
def build_vocab_off_by_one(merges):
    vocab = [bytes([b]) for b in range(256)]
    for a, b in merges:
        vocab.append(vocab[a - 1] + vocab[b])  # off by one in the first id
    return vocab


def train_bpe_first_seen_tie(text, num_merges):
    words = [list(chunk.encode()) for chunk in split_text(text)]
    merges = []
    for new_id in range(256, 256 + num_merges):
        counts = {}
        for ids in words:
            for pair in pairwise(ids):
                counts[pair] = counts.get(pair, 0) + 1
        pair = max(counts, key=counts.get)  # ties go to the first pair seen
        words = [merge_pair(ids, pair, new_id) for ids in words]
        merges.append(pair)
    return merges


def train_bpe_library(text, num_merges):
    return BPETokenizer.train(text, vocab_size=256 + num_merges).merges


# ---- lesson 4 ----------------------------------------------------------------------------------
def embedding_backward_buffered(ids, grad_out, vocab_size):
    grad_w = np.zeros((vocab_size, grad_out.shape[-1]))
    grad_w[ids.reshape(-1)] += grad_out.reshape(-1, grad_out.shape[-1])  # repeats overwrite
    return grad_w


def rope_rotate_adjacent_pairs(x, pos, theta=10000.0):
    """GPT-J's convention (pairs (2i, 2i + 1)), where the library rotates halves."""
    hs = x.shape[-1]
    out = np.empty(hs)
    for i in range(hs // 2):
        angle = pos * theta ** (-2 * i / hs)
        c, s = math.cos(angle), math.sin(angle)
        a, b = x[2 * i], x[2 * i + 1]
        out[2 * i], out[2 * i + 1] = a * c - b * s, a * s + b * c
    return out


def rope_rotate_library(x, pos, theta=10000.0):
    module = RoPE(head_size=x.shape[-1], block_size=pos + 1, theta=theta)
    return module(mg.tensor(x[None, None, None, :]), offset=pos).numpy()[0, 0, 0]


# ---- lesson 5 ----------------------------------------------------------------------------------
def causal_attention_unmasked(q, k, v):
    s = q @ k.T / math.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True) @ v


def causal_attention_library(q, k, v):
    tensors = (mg.tensor(a[None, None]) for a in (q, k, v))
    return F.scaled_dot_product_attention(*tensors, impl="naive").numpy()[0, 0]


def repeat_kv_tiled(k, n_rep):
    return mg.concatenate([k] * n_rep, axis=1)  # heads 0, 1, 0, 1: not 0, 0, 1, 1


def sliding_window_off_by_one(q, k, v, window):
    return lesson05.sliding_window_attention(q, k, v, window + 1)


# ---- lesson 6 ----------------------------------------------------------------------------------
def rms_norm_library(x, weight, eps=1e-6):
    return F.rms_norm(x, weight, eps=eps)


def rms_norm_eps_outside(x, weight, eps=1e-6):
    return x / ((x * x).mean(axis=-1, keepdims=True).sqrt() + eps) * weight


def layer_norm_backward_missing_term(x, weight, grad_out, eps=1e-5):
    r = 1.0 / np.sqrt(x.var(axis=-1, keepdims=True) + eps)
    g = grad_out * weight
    return r * (g - g.mean(axis=-1, keepdims=True))  # without - xhat mean(g xhat)


def swiglu_gelu(x, w1, w2, w3):
    return F.linear(F.gelu(F.linear(x, w1)) * F.linear(x, w3), w2)  # GeGLU, not SwiGLU


# ---- lesson 7 ----------------------------------------------------------------------------------
def cross_entropy_grad_summed(logits, targets):
    return lesson07.cross_entropy_grad(logits, targets) * len(targets)  # the sum, not the mean


def count_parameters_no_final_norm(config):
    total = lesson07.count_parameters(config)
    return total - config.n_embd if config.norm_position == "pre" else total


def count_parameters_by_building(config):
    from decoder.model.model import Decoder

    return Decoder(config).num_parameters()


# ---- lesson 8 ----------------------------------------------------------------------------------
def warmup_cosine_off_by_one(step, max_lr, min_lr, warmup_steps, decay_steps):
    if step < warmup_steps:
        return max_lr * step / warmup_steps  # starts at 0, where the library starts above it
    return lesson08.warmup_cosine(step, max_lr, min_lr, warmup_steps, decay_steps)


def warmup_cosine_library(step, max_lr, min_lr, warmup_steps, decay_steps):
    return cosine_lr(step, max_lr, min_lr, warmup_steps, decay_steps)


def clip_each_separately(grads, max_norm):
    norm = float(np.sqrt(sum(np.sum(g * g) for g in grads)))
    return [g * min(1.0, max_norm / (np.linalg.norm(g) + 1e-6)) for g in grads], norm


def clip_with_library(grads, max_norm):
    tensors = [mg.Tensor(np.zeros(g.shape), requires_grad=True) for g in grads]
    for t, g in zip(tensors, grads, strict=True):
        t.grad = g.copy()
    norm = clip_grad_norm_(tensors, max_norm)
    return [t.grad for t in tensors], norm


def adam_decoupled(p, g, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    p = p * (1 - lr * weight_decay)  # AdamW's decay, not L2's
    return lesson08.adam_l2_step(p, g, m, v, t, lr, betas, eps, 0.0)


# ---- lesson 9 ----------------------------------------------------------------------------------
def min_p_absolute(logits, min_p):
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    probs = np.where(probs >= min_p, probs, 0.0)  # the cut must scale with the top probability
    return probs / probs.sum()


def greedy_with_generate(model, ids, n):
    return list(model.generate(ids, n, temperature=0, use_cache=False))


def greedy_uncropped(model, ids, n):
    context, new = list(ids), []
    with mg.no_grad():
        for _ in range(n):
            logits, _ = model([context[-model.config.block_size - 1 :]])  # one token too many
            new.append(int(np.argmax(logits.numpy()[0, -1])))
            context.append(new[-1])
    return new


def greedy_cached_without_cache(model, ids, n):
    return lesson09.greedy_generate(model, ids, n)


# ---- lesson 12 ---------------------------------------------------------------------------------
def online_softmax_whole_row(tiles):
    """Gathers every tile, then one softmax over the row: nothing online about it."""
    s, v = zip(*tiles, strict=True)
    s, v = np.concatenate(s), np.concatenate(v)
    p = np.exp(s - s.max())
    return p @ v / p.sum(), s.max() + math.log(p.sum())


def online_softmax_global_max_first(tiles):
    """A tiled loop, but over two passes: the global max first, then the sums."""
    tiles = list(tiles)  # kept for the second pass
    m = max(float(s.max()) for s, _ in tiles)
    l, acc = 0.0, 0.0
    for s, v in tiles:
        p = np.exp(s - m)
        l, acc = l + p.sum(), acc + p @ v
    return acc / l, m + math.log(l)


def online_softmax_no_rescale(tiles):
    m, l, acc = -math.inf, 0.0, 0.0
    for s, v in tiles:
        m = max(m, float(s.max()))
        p = np.exp(s - m)
        l, acc = l + p.sum(), acc + p @ v  # forgets to re-base l and acc on the new max
    return acc / l, m + math.log(l)


def merge_states_no_rescale(state_a, state_b):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state_a, state_b
    return max(m_a, m_b), l_a + l_b, acc_a + acc_b


# ---- lesson 15 ---------------------------------------------------------------------------------
def merged_with_delta_weight(layer):
    return layer.base.weight.numpy() + layer.delta_weight().T


def merged_without_scale(layer):
    return layer.base.weight.numpy() + (layer.A.numpy() @ layer.B.numpy()).T


def block_diagonal_transposed(B):
    h, r, d = B.shape
    out = np.zeros((h * r, h * d))
    for i in range(h):
        out[i * r : (i + 1) * r, i * d : (i + 1) * d] = B[h - 1 - i]  # blocks in reverse order
    return out


def lora_count_per_head_ignored(config, targets, r, per_head=False):
    return lesson15.lora_trainable_count(config, targets, r, per_head=False)


# ---- lesson 14 ---------------------------------------------------------------------------------
def logsumexp_numpy_only(a):
    m = a.max(axis=-1, keepdims=True)
    return m[..., 0] + np.log(np.exp(a - m).sum(axis=-1))  # np, not xp_of(a)


def logsumexp_unshifted(a):
    xp = xp_of(a)
    return xp.log(xp.exp(a).sum(axis=-1))


class SoftplusWrongGradient(mg.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        xp = xp_of(x)
        return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved
        return grad_out * (x > 0)  # relu's gradient, not sigmoid


def softplus_wrong_gradient(x):
    return SoftplusWrongGradient.apply(x)


# ---- lesson 10 ---------------------------------------------------------------------------------
def grad_rms_as_std(named_params):
    return {n: 0.0 if p.grad is None else float(np.std(p.grad)) for n, p in named_params}


def update_ratios_by_std(before, after):
    """The std instead of the RMS: a LayerNorm gain of ones has std 0, and its ratio is inf."""
    with np.errstate(divide="ignore"):
        return {n: float(np.log10(np.std(after[n] - b) / np.std(b))) for n, b in before.items()}


def update_ratios_not_logged(before, after):
    return {n: 10**r for n, r in lesson10.update_ratios(before, after).items()}


# ---- lesson 11 ---------------------------------------------------------------------------------
def block_post_norm(block, x):
    x = block.norm1(x + block.attn(x))
    return block.norm2(x + block.ffn(x))


def block_without_residual(block, x):
    return block.ffn(block.norm2(block.attn(block.norm1(x))))


def block_library(block, x):
    return block(x)


def decoder_without_positions(model, ids):
    x = model.tok_emb(ids)
    for block in model.blocks:
        x = lesson11.block_forward(block, x)
    return model.lm_head(model.norm_f(x))


def decoder_library(model, ids):
    return model(ids)[0]


def train_step_without_zero_grad(model, optimizer, x, y, grad_clip):
    logits = lesson11.decoder_forward(model, x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()  # onto the previous step's gradients
    clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()


def train_step_library(model, optimizer, x, y, grad_clip):
    return train_step(model, optimizer, x, y, TrainConfig(grad_clip=grad_clip), 1)


def train_loop_without_schedule(model, optimizer, get_batch, steps, lr_at, grad_clip=1.0):
    return [lesson11.train_step(model, optimizer, *get_batch(), grad_clip) for _ in range(steps)]


def train_loop_rate_after_step(model, optimizer, get_batch, steps, lr_at, grad_clip=1.0):
    losses = []
    for s in range(steps):
        losses.append(lesson11.train_step(model, optimizer, *get_batch(), grad_clip))
        set_lr(optimizer, lr_at(s))  # one step late: step 0 runs at the optimiser's own rate
    return losses


# ---- lesson 16 ---------------------------------------------------------------------------------
def read_header_shapes_as_lists(path):
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    return {n: (e["dtype"], e["shape"]) for n, e in header.items()}  # [5, 3] != (5, 3)


def read_header_library(path):
    with open_safetensors(path) as f:
        return {n: (f.dtype(n), f.shape(n)) for n in f}


def split_c_attn_untransposed(weight, bias):
    weights, biases = lesson16.split_c_attn(weight, bias)
    return [w.T for w in weights], biases  # each third left in Conv1D's (in, out)


def split_c_attn_interleaved(weight, bias):
    """Reads q, k, v as interleaved columns (q0 k0 v0 q1 ...), not three blocks side by side."""
    return [weight[:, k::3].T for k in range(3)], [bias[k::3] for k in range(3)]


def split_c_attn_library(weight, bias):
    parts = [(k, 3) for k in range(3)]
    return [to_ours(weight, p, rows=0) for p in parts], [to_ours(bias, p, rows=0) for p in parts]


def bfloat16_by_value(bits):
    return bits.astype(np.float32)  # the integer 16256, not the number 1.0 its bits encode


def bfloat16_as_float16(bits):
    return bits.view(np.float16).astype(np.float32)  # float16 splits the bits 5/10, not 8/7


def bfloat16_library(bits):
    return bfloat16_to_float32(bits)


# ---- lesson 17 ---------------------------------------------------------------------------------
def global_mean_grad_unweighted(rank_grads, rank_rows):
    return np.mean(rank_grads, axis=0)  # a mean of means: right only when the ranks are equal


def global_mean_grad_library(rank_grads, rank_rows):
    return np.average(rank_grads, axis=0, weights=rank_rows)


def zero_slices_floor(sizes, n_ranks, rank):
    shard = sum(sizes) // n_ranks  # floor: the last few elements belong to no rank
    pieces, offset = [], 0
    for i, n in enumerate(sizes):
        lo, hi = max(offset, rank * shard), min(offset + n, (rank + 1) * shard)
        if lo < hi:
            pieces.append((i, lo - offset, hi - offset))
        offset += n
    return pieces


def zero_slices_whole_parameters(sizes, n_ranks, rank):
    # every element owned once, but a rank that draws the big parameters holds far over 1/N
    return [(i, 0, n) for i, n in enumerate(sizes) if i % n_ranks == rank]


def update_scale_keeps_count(scale, clean_steps, finite, growth_interval):
    if not finite:
        return scale * 0.5, clean_steps, False  # the clean run goes on across the overflow
    clean_steps += 1
    if clean_steps == growth_interval:
        return scale * 2.0, 0, True
    return scale, clean_steps, True


def update_scale_steps_anyway(scale, clean_steps, finite, growth_interval):
    if not finite:
        return scale * 0.5, 0, True  # the inf reaches the weights
    clean_steps += 1
    if clean_steps == growth_interval:
        return scale * 2.0, 0, True
    return scale, clean_steps, True


# ---- lesson 13 ---------------------------------------------------------------------------------
def window_mask_off_by_one(T, W):
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return (j > i) | (j < i - W)  # each query sees W + 1 positions


def window_mask_two_sided(T, W):
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return np.abs(i - j) >= W  # a band, but the next W - 1 tokens stay visible


def window_mask_library(T, W):
    # the library's weights when every score is equal: zero exactly where a key is hidden
    zeros, eye = mg.zeros(1, 1, T, T), mg.tensor(np.eye(T, dtype=np.float32)[None, None])
    return F.scaled_dot_product_attention(zeros, zeros, eye, window=W).numpy()[0, 0] == 0


def absorb_query_one_head(q_nope, w_uk):
    return q_nope @ w_uk[0]  # every head absorbs head 0's W_UK


def absorb_query_explicit_keys(q_nope, w_uk):
    return q_nope @ w_uk.swapaxes(-1, -2)  # W_UK transposed: the wrong space (or a shape error)


def yarn_ramp_reversed(head_size, factor, original_context, theta=10000.0):
    freqs = theta ** -(np.arange(0, head_size, 2) / head_size)
    turns = original_context * freqs / (2 * math.pi)
    gamma = np.clip((turns - 1.0) / 31.0, 0.0, 1.0)
    return gamma * freqs / factor + (1 - gamma) * freqs  # interpolates the fast pairs instead


def yarn_turns_without_two_pi(head_size, factor, original_context, theta=10000.0):
    freqs = theta ** -(np.arange(0, head_size, 2) / head_size)
    turns = original_context * freqs  # radians over the context, not turns
    gamma = np.clip((turns - 1.0) / 31.0, 0.0, 1.0)
    return (1 - gamma) * freqs / factor + gamma * freqs


def yarn_library(head_size, factor, original_context, theta=10000.0):
    return rope_frequencies(head_size, theta, "yarn", factor, original_context)[0]


def kv_bytes_all_heads(config, dtype_bytes=4):
    return config.n_layer * 2 * config.n_head * config.head_size * dtype_bytes  # GQA ignored


def kv_bytes_mla_without_rotary_key(config, dtype_bytes=4):
    if config.attention == "mla":  # forgets the shared rotary key cached beside the latent
        return config.n_layer * config.kv_lora_rank * dtype_bytes
    return config.n_layer * 2 * config.n_kv_head * config.head_size * dtype_bytes


def kv_bytes_library(config, dtype_bytes=4):
    from decoder.model.mla import cache_floats_per_token

    return cache_floats_per_token(config) * dtype_bytes


def load_balancing_per_token(probs, k):
    # Hugging Face's Mixtral count: f over tokens sums to k, so the loss is k times too big
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    share = np.bincount(chosen.ravel(), minlength=probs.shape[1]) / len(probs)
    return probs.shape[1] * (share * probs.mean(0)).sum()


def load_balancing_soft_share(probs, k):
    return probs.shape[1] * (probs.mean(0) ** 2).sum()  # f from probabilities, not the choice


def load_balancing_library(probs, k):
    from minigrad.ops.routing import topk_indices

    share = np.bincount(topk_indices(probs, k).ravel(), minlength=probs.shape[1]) / (len(probs) * k)
    return probs.shape[1] * (share * probs.mean(0)).sum()


def greedy_accept_no_bonus(drafts, target_choices):
    kept = []
    for d, t in zip(drafts, target_choices, strict=False):
        if d != t:
            return kept + [t]
        kept.append(d)
    return kept  # all k kept: forgets the target's (k + 1)-th token


def greedy_accept_every_match(drafts, target_choices):
    kept = [d for d, t in zip(drafts, target_choices, strict=False) if d == t]  # past mismatches
    return kept + [target_choices[len(kept)]]


def greedy_accept_library(drafts, target_choices):
    from decoder.model.decoding import accept_drafts

    p, q = np.eye(10)[target_choices], np.eye(10)[drafts]
    return accept_drafts(p, q, list(drafts), np.random.default_rng(0))


# ---- lesson 19 ---------------------------------------------------------------------------------
def masked_targets_off_by_one(ids, n_prompt):
    ids = np.asarray(ids)
    y = ids[1:].copy()
    y[:n_prompt] = -100  # one too many: the first response token is never trained
    return ids[:-1], y


def masked_targets_unshifted(ids, n_prompt):
    ids = np.asarray(ids)
    y = ids[:-1].copy()  # each position "predicts" its own token
    y[: n_prompt - 1] = -100
    return ids[:-1], y


def masked_targets_library(ids, n_prompt):
    x, y = pad_batch([(ids, n_prompt)], pad_id=0)
    return x[0], y[0]


def _log_softmax(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def response_logp_mean(logits, y):
    keep = y != -100
    picked = np.take_along_axis(_log_softmax(logits), np.where(keep, y, 0)[..., None], -1)[..., 0]
    return np.where(keep, picked, 0.0).sum(-1) / np.maximum(keep.sum(-1), 1)  # per token


def response_logp_unmasked(logits, y):
    picked = np.take_along_axis(_log_softmax(logits), np.where(y < 0, 0, y)[..., None], -1)
    return picked[..., 0].sum(-1)  # the ignored positions add log p(token 0)


def response_logp_unstable(logits, y):
    with np.errstate(over="ignore", invalid="ignore"):  # e^1000 is inf: inf - inf at 1000s
        logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    keep = y != -100
    picked = np.take_along_axis(logp, np.where(keep, y, 0)[..., None], -1)[..., 0]
    return np.where(keep, picked, 0.0).sum(-1)


def response_logp_library(logits, y):
    return -F.cross_entropy(mg.tensor(logits), y, reduction="none").numpy().sum(-1)


def dpo_loss_naive(pc, pr, rc, rr, beta):
    z = beta * ((pc - rc) - (pr - rr))
    with np.errstate(over="ignore"):
        return float(np.log(1 + np.exp(-z)).mean())  # e^(1e4) overflows to inf


def dpo_loss_without_reference(pc, pr, rc, rr, beta):
    return float(np.logaddexp(0.0, -beta * (pc - pr)).mean())


def dpo_loss_library(pc, pr, rc, rr, beta):
    return dpo_loss(*(mg.tensor(a, dtype="float64") for a in (pc, pr, rc, rr)), beta=beta).item()


WRONG = [
    ("lesson01", "topological_sort", topological_sort_recursive),
    ("lesson01", "topological_sort", topological_sort_children_first),
    ("lesson01", "matmul_backward", matmul_backward_untransposed),
    ("lesson01", "sin", sin_ignores_upstream),
    ("lesson01", "sin", sin_taylor),
    ("lesson02", "unbroadcast", unbroadcast_leading_only),
    ("lesson02", "unbroadcast", unbroadcast_library),
    ("lesson02", "central_difference", central_difference_forward),
    ("lesson02", "softplus", softplus_naive),
    ("lesson02", "softplus", softplus_composite),
    ("lesson02", "softmax_backward", softmax_backward_no_correction),
    ("lesson03", "build_vocab", build_vocab_off_by_one),
    ("lesson03", "train_bpe", train_bpe_first_seen_tie),
    ("lesson03", "train_bpe", train_bpe_library),
    ("lesson04", "embedding_backward", embedding_backward_buffered),
    ("lesson04", "rope_rotate", rope_rotate_adjacent_pairs),
    ("lesson04", "rope_rotate", rope_rotate_library),
    ("lesson05", "causal_attention", causal_attention_unmasked),
    ("lesson05", "causal_attention", causal_attention_library),
    ("lesson05", "repeat_kv", repeat_kv_tiled),
    ("lesson05", "sliding_window_attention", sliding_window_off_by_one),
    ("lesson06", "rms_norm", rms_norm_library),
    ("lesson06", "rms_norm", rms_norm_eps_outside),
    ("lesson06", "layer_norm_backward", layer_norm_backward_missing_term),
    ("lesson06", "swiglu", swiglu_gelu),
    ("lesson07", "cross_entropy_grad", cross_entropy_grad_summed),
    ("lesson07", "count_parameters", count_parameters_no_final_norm),
    ("lesson07", "count_parameters", count_parameters_by_building),
    ("lesson08", "warmup_cosine", warmup_cosine_off_by_one),
    ("lesson08", "warmup_cosine", warmup_cosine_library),
    ("lesson08", "clip_by_global_norm", clip_each_separately),
    ("lesson08", "clip_by_global_norm", clip_with_library),
    ("lesson08", "adam_l2_step", adam_decoupled),
    ("lesson09", "min_p_probs", min_p_absolute),
    ("lesson09", "greedy_generate", greedy_with_generate),
    ("lesson09", "greedy_generate", greedy_uncropped),
    ("lesson09", "greedy_generate_cached", greedy_cached_without_cache),
    ("lesson12", "online_softmax", online_softmax_whole_row),
    ("lesson12", "online_softmax", online_softmax_global_max_first),
    ("lesson12", "online_softmax", online_softmax_no_rescale),
    ("lesson12", "merge_states", merge_states_no_rescale),
    ("lesson15", "merged_weight", merged_with_delta_weight),
    ("lesson15", "merged_weight", merged_without_scale),
    ("lesson15", "block_diagonal", block_diagonal_transposed),
    ("lesson15", "lora_trainable_count", lora_count_per_head_ignored),
    ("lesson14", "logsumexp", logsumexp_numpy_only),
    ("lesson14", "logsumexp", logsumexp_unshifted),
    ("lesson14", "softplus", softplus_wrong_gradient),
    ("lesson10", "grad_rms", grad_rms_as_std),
    ("lesson10", "update_ratios", update_ratios_by_std),
    ("lesson10", "update_ratios", update_ratios_not_logged),
    ("lesson11", "block_forward", block_post_norm),
    ("lesson11", "block_forward", block_without_residual),
    ("lesson11", "block_forward", block_library),
    ("lesson11", "decoder_forward", decoder_without_positions),
    ("lesson11", "decoder_forward", decoder_library),
    ("lesson11", "train_step", train_step_without_zero_grad),
    ("lesson11", "train_step", train_step_library),
    ("lesson11", "train_loop", train_loop_without_schedule),
    ("lesson11", "train_loop", train_loop_rate_after_step),
    ("lesson16", "read_header", read_header_shapes_as_lists),
    ("lesson16", "read_header", read_header_library),
    ("lesson16", "split_c_attn", split_c_attn_untransposed),
    ("lesson16", "split_c_attn", split_c_attn_interleaved),
    ("lesson16", "split_c_attn", split_c_attn_library),
    ("lesson16", "bfloat16_to_float32", bfloat16_by_value),
    ("lesson16", "bfloat16_to_float32", bfloat16_as_float16),
    ("lesson16", "bfloat16_to_float32", bfloat16_library),
    ("lesson17", "global_mean_grad", global_mean_grad_unweighted),
    ("lesson17", "global_mean_grad", global_mean_grad_library),
    ("lesson17", "zero_slices", zero_slices_floor),
    ("lesson17", "zero_slices", zero_slices_whole_parameters),
    ("lesson17", "update_scale", update_scale_keeps_count),
    ("lesson17", "update_scale", update_scale_steps_anyway),
    ("lesson13", "window_mask", window_mask_off_by_one),
    ("lesson13", "window_mask", window_mask_two_sided),
    ("lesson13", "window_mask", window_mask_library),
    ("lesson13", "absorb_query", absorb_query_one_head),
    ("lesson13", "absorb_query", absorb_query_explicit_keys),
    ("lesson13", "yarn_frequencies", yarn_ramp_reversed),
    ("lesson13", "yarn_frequencies", yarn_turns_without_two_pi),
    ("lesson13", "yarn_frequencies", yarn_library),
    ("lesson18", "kv_bytes_per_token", kv_bytes_all_heads),
    ("lesson18", "kv_bytes_per_token", kv_bytes_mla_without_rotary_key),
    ("lesson18", "kv_bytes_per_token", kv_bytes_library),
    ("lesson18", "load_balancing_loss", load_balancing_per_token),
    ("lesson18", "load_balancing_loss", load_balancing_soft_share),
    ("lesson18", "load_balancing_loss", load_balancing_library),
    ("lesson18", "greedy_accept", greedy_accept_no_bonus),
    ("lesson18", "greedy_accept", greedy_accept_every_match),
    ("lesson18", "greedy_accept", greedy_accept_library),
    ("lesson19", "masked_targets", masked_targets_off_by_one),
    ("lesson19", "masked_targets", masked_targets_unshifted),
    ("lesson19", "masked_targets", masked_targets_library),
    ("lesson19", "response_logp", response_logp_mean),
    ("lesson19", "response_logp", response_logp_unmasked),
    ("lesson19", "response_logp", response_logp_unstable),
    ("lesson19", "response_logp", response_logp_library),
    ("lesson19", "dpo_loss", dpo_loss_naive),
    ("lesson19", "dpo_loss", dpo_loss_without_reference),
    ("lesson19", "dpo_loss", dpo_loss_library),
]

CHECKS = sorted(p.stem for p in (Path(checks.__file__).parent).glob("lesson*.py"))
EXERCISES = [
    (lesson, test[len("test_") :])
    for lesson in CHECKS
    for test in vars(importlib.import_module(f"checks.{lesson}"))
    if test.startswith("test_")
]


def test_every_lesson_has_checks():
    notebooks = sorted(Path(checks.__file__).parents[1].glob("[0-9][0-9]_*.ipynb"))
    assert CHECKS == [f"lesson{p.name[:2]}" for p in notebooks]


@pytest.mark.parametrize(
    ("lesson", "name", "answer"), WRONG, ids=[f"{w[1]}-{w[2].__name__}" for w in WRONG]
)
def test_the_check_rejects_a_wrong_answer(lesson, name, answer, capsys):
    with pytest.raises(Exception) as failure:  # an assertion, or the answer's own error
        check(lesson, name, answer)
    assert failure.type is not NotAttempted
    assert "correct" not in capsys.readouterr().out


def test_every_exercise_has_a_wrong_answer():
    assert {(lesson, name) for lesson, name, _ in WRONG} == set(EXERCISES)


@pytest.mark.parametrize(("lesson", "name"), EXERCISES, ids=lambda v: v)
def test_the_reference_solution_passes_its_check(lesson, name):
    exercise_test(lesson, name)(solution(lesson, name))


def test_an_untouched_stub_runs_the_check_on_the_solution(capsys):
    def stub(root, parents):
        todo()

    check("lesson01", "topological_sort", stub)
    assert "not attempted yet" in capsys.readouterr().out


def test_a_bug_raising_not_implemented_error_reaches_the_learner():
    """A misspelt ``backward`` lands in Function's base class, which raises
    NotImplementedError: that is a bug to show, not an exercise left untouched."""

    class SinMisspelt(mg.Function):
        @staticmethod
        def forward(ctx, x):
            return np.sin(x)

        @staticmethod
        def backwards(ctx, grad_out):  # the typo
            return grad_out * np.cos(ctx.saved[0])

    with pytest.raises(NotImplementedError):
        check("lesson01", "sin", SinMisspelt.apply)


def test_or_solution_answers_for_a_stub_and_lets_a_written_answer_through():
    def stub(*args):
        todo()

    def written(*args):
        return "mine"

    assert or_solution("lesson08", "warmup_cosine", stub)(0, 1.0, 0.1, 4, 8) == 0.2
    assert or_solution("lesson08", "warmup_cosine", written)(0, 1.0, 0.1, 4, 8) == "mine"
