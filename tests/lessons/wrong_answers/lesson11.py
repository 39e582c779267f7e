"""Known-wrong answers to lesson 11's exercises: each a mistake a learner makes.

Each is written on its own (no call into ``solutions``), so that its check rejects it for the
mistake it makes, not for reaching the reference answer.
"""

from __future__ import annotations

import decoder.training.step as library_step
from decoder.model.block import Block
from decoder.model.model import Decoder
from decoder.training.config import TrainConfig
from decoder.training.step import train_step
from minigrad import functional as F
from minigrad.optim import clip_grad_norm_, set_lr

CFG = TrainConfig(grad_clip=1.0, shards=1)  # made here: the step itself is what is refused


def _block(block, x):  # a right block, for the answers that go wrong elsewhere
    x = x + block.attn(block.norm1(x))
    return x + block.ffn(block.norm2(x))


def _decoder(model, ids):
    x = model.tok_emb(ids) + model.pos_emb(ids.shape[1])
    for block in model.blocks:
        x = _block(block, x)
    return model.lm_head(model.norm_f(x))


def _step(model, optimizer, x, y, grad_clip):
    logits = _decoder(model, x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()


def block_post_norm(block, x):
    x = block.norm1(x + block.attn(x))
    return block.norm2(x + block.ffn(x))


def block_without_residual(block, x):
    return block.ffn(block.norm2(block.attn(block.norm1(x))))


def block_library(block, x):
    return block(x)


def block_forward_in_a_default(block, x, _f=Block.forward):
    """The block's own forward, captured when the function was defined."""
    return _f(block, x)


def block_through_the_class_call(block, x):
    return type(block).__call__(block, x)


def decoder_without_positions(model, ids):
    x = model.tok_emb(ids)
    for block in model.blocks:
        x = _block(block, x)
    return model.lm_head(model.norm_f(x))


def decoder_library(model, ids):
    return model(ids)[0]


def decoder_forward_in_a_default(model, ids, _f=Decoder.forward):
    return _f(model, ids)[0]


def decoder_calling_each_block_whole(model, ids):
    """Right numbers, but each block runs the library's forward, not block_forward."""
    x = model.tok_emb(ids) + model.pos_emb(ids.shape[1])
    for block in model.blocks:
        x = block(x)
    return model.lm_head(model.norm_f(x))


def train_step_without_zero_grad(model, optimizer, x, y, grad_clip):
    logits = _decoder(model, x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()  # onto the previous step's gradients
    clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()


def train_step_library(model, optimizer, x, y, grad_clip):
    return train_step(model, optimizer, x, y, CFG, 1)


def train_step_through_the_module(model, optimizer, x, y, grad_clip):
    """``decoder.training.step.train_step`` reached through the module's alias."""
    return library_step.train_step(model, optimizer, x, y, CFG, 1)


def train_step_loss_from_the_model(model, optimizer, x, y, grad_clip):
    """The loss from Decoder.forward, not from decoder_forward and the cross-entropy."""
    _, loss = model(x, y)
    optimizer.zero_grad()
    loss.backward()
    clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()


def train_loop_without_schedule(model, optimizer, get_batch, steps, lr_at, grad_clip=1.0):
    return [_step(model, optimizer, *get_batch(), grad_clip) for _ in range(steps)]


def train_loop_rate_after_step(model, optimizer, get_batch, steps, lr_at, grad_clip=1.0):
    losses = []
    for s in range(steps):
        losses.append(_step(model, optimizer, *get_batch(), grad_clip))
        set_lr(optimizer, lr_at(s))  # one step late: step 0 runs at the optimiser's own rate
    return losses


def train_loop_with_the_library_step(model, optimizer, get_batch, steps, lr_at, grad_clip=1.0):
    losses = []
    for s in range(steps):
        set_lr(optimizer, lr_at(s))
        losses.append(train_step(model, optimizer, *get_batch(), CFG, s + 1))
    return losses


WRONG = [
    ("block_forward", block_post_norm),
    ("block_forward", block_without_residual),
    ("block_forward", block_library),
    ("block_forward", block_forward_in_a_default),
    ("block_forward", block_through_the_class_call),
    ("decoder_forward", decoder_without_positions),
    ("decoder_forward", decoder_library),
    ("decoder_forward", decoder_forward_in_a_default),
    ("decoder_forward", decoder_calling_each_block_whole),
    ("train_step", train_step_without_zero_grad),
    ("train_step", train_step_library),
    ("train_step", train_step_through_the_module),
    ("train_step", train_step_loss_from_the_model),
    ("train_loop", train_loop_without_schedule),
    ("train_loop", train_loop_rate_after_step),
    ("train_loop", train_loop_with_the_library_step),
]
