"""Checks of lesson 11 (the capstone): ``block_forward``, ``decoder_forward``, ``train_step``
and ``train_loop``, each against the library on a small model.

The answers wire the model's parts, so they may call a layer (``Module.__call__``), Tensor
methods, and for the step the loss, clipping and the optimiser's methods. What they may not
call is the whole they are asked to write: ``Block.forward``, ``Decoder.forward`` (both
refused by name, and through ``block(x)`` or ``model(ids)`` by ``whole_refused``) and
``decoder.training.step.train_step``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np

import decoder.training.step
import minigrad as mg
from decoder.model.block import Block
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.training.config import TrainConfig
from minigrad.optim import AdamW, set_lr

PARTS = (  # layer(x), x + y, for block in model.blocks
    "minigrad.nn.module.Module.__call__",
    "minigrad.tensor.Tensor",
    "minigrad.nn.module.ModuleList.__iter__",
)
STEP = (
    *PARTS,
    "minigrad.functional.loss.cross_entropy",
    "minigrad.optim.Optimizer.zero_grad",
    "minigrad.optim.Optimizer.step",
    "minigrad.optim.clip_grad_norm_",
    "minigrad.nn.module.Module.parameters",
)
ALLOWED = {
    "block_forward": PARTS,
    "decoder_forward": PARTS,
    "train_step": STEP,
    "train_loop": (*STEP, "minigrad.optim.set_lr"),
}

CONFIG = ModelConfig(vocab_size=30, block_size=16, n_layer=2, n_head=2, n_embd=32)


def model_and_batch(seed: int = 0) -> tuple[Decoder, np.ndarray, np.ndarray]:
    mg.manual_seed(seed)
    model = Decoder(CONFIG)
    g = np.random.default_rng(seed)
    x = g.integers(0, CONFIG.vocab_size, size=(4, CONFIG.block_size))
    return model, x, np.roll(x, -1, axis=1)


@contextlib.contextmanager
def whole_refused(*modules: object) -> Iterator[None]:
    """Within the block, calling one of ``modules`` whole (``block(x)``, ``model(ids)``: the
    library's ``forward``, reached through ``Module.__call__``) fails the check."""

    def refusing(module: object):
        def forward(*args, **kwargs):
            name = type(module).__name__
            raise AssertionError(
                f"the answer called the {name} itself ({name}.forward, through "
                f"{name.lower()}(...)): wire it from its parts instead"
            )

        return forward

    for module in modules:
        module.forward = refusing(module)  # an instance attribute, over the class's method
    try:
        yield
    finally:
        for module in modules:
            del module.forward


def wholes(model: Decoder) -> tuple[object, ...]:
    """The model and its blocks: what ``decoder_forward`` and the step may not call whole."""
    return (model, *model.blocks)


def test_block_forward(fn):
    mg.manual_seed(1)
    block = Block(CONFIG)
    x = mg.randn(2, 5, CONFIG.n_embd, requires_grad=True)
    want = block(x)
    with whole_refused(block):
        got = fn(block, x)
    assert got.shape == x.shape, f"expected shape {x.shape}, got {got.shape}"
    assert np.allclose(got.numpy(), want.numpy(), atol=1e-6), "differs from Block.forward"
    g = np.random.default_rng(1).standard_normal(x.shape)
    got.backward(g)
    grad = x.grad.copy()
    x.grad = None
    want.backward(g)
    assert np.allclose(grad, x.grad, atol=1e-6), "the gradient differs from Block's"


def test_decoder_forward(fn):
    model, x, y = model_and_batch()
    want, _ = model(x)
    with whole_refused(*wholes(model)):
        got = fn(model, x)
    V = CONFIG.vocab_size
    assert got.shape == (*x.shape, V), f"expected shape {(*x.shape, V)}, got {got.shape}"
    assert np.allclose(got.numpy(), want.numpy(), atol=1e-5), "differs from Decoder.forward"
    loss = mg.functional.cross_entropy(got.reshape(-1, V), y.reshape(-1)).item()
    assert abs(loss - math.log(V)) < 0.2, f"a fresh model's loss {loss:.3f} should be near log V"


def test_train_step(fn):
    mine, x, y = model_and_batch()
    library, _, _ = model_and_batch()
    opt_mine, opt_library = AdamW(mine.parameters(), lr=1e-2), AdamW(library.parameters(), lr=1e-2)
    cfg = TrainConfig(grad_clip=1.0, shards=1)  # the whole batch at once, as a student writes it
    for step in range(1, 4):
        want = decoder.training.step.train_step(library, opt_library, x, y, cfg, step)
        with whole_refused(*wholes(mine)):
            got = fn(mine, opt_mine, x, y, 1.0)
        assert math.isclose(got, want, rel_tol=1e-5), f"step {step}: loss {got}, library {want}"
    for (name, p), q in zip(mine.named_parameters(), library.parameters(), strict=True):
        assert np.allclose(p.numpy(), q.numpy(), atol=1e-6), f"{name} differs after 3 steps"


def test_train_loop(fn):
    model, x, y = model_and_batch(1)
    opt = AdamW(model.parameters(), lr=0.0, weight_decay=0.0)
    seen = []

    def lr_at(step):
        seen.append(step)
        return 3e-2 if step < 60 else 1e-2

    with whole_refused(*wholes(model)):
        losses = fn(model, opt, lambda: (x, y), 80, lr_at)
    assert len(losses) == 80, f"one loss per step: got {len(losses)}"
    assert seen == list(range(80)), "ask lr_at for steps 0, 1, ..., steps - 1, in order"
    library, _, _ = model_and_batch(1)
    opt_library = AdamW(library.parameters(), lr=0.0, weight_decay=0.0)
    cfg = TrainConfig(grad_clip=1.0, shards=1)  # the whole batch at once, as a student writes it
    for s in range(5):
        set_lr(opt_library, 3e-2)
        want = decoder.training.step.train_step(library, opt_library, x, y, cfg, s + 1)
        assert math.isclose(losses[s], want, rel_tol=1e-5), (
            f"step {s}: loss {losses[s]}, the library's {want}: set the rate lr_at(s) before "
            f"step s, then take the step"
        )
    assert abs(losses[0] - math.log(CONFIG.vocab_size)) < 0.2, "the first loss is a fresh model's"
    assert losses[-1] < 0.2 * losses[0], (
        f"one batch, 80 steps: the loss went {losses[0]:.2f} -> {losses[-1]:.2f}; it should "
        f"fall close to 0 (is every step's gradient fresh, and the rate the schedule's?)"
    )
