"""Mixed precision: float32 master weights, a float16 forward and backward pass, and dynamic
loss scaling (Micikevicius et al. 2018, "Mixed Precision Training").

With ``TrainConfig.dtype = "float16"`` the model and AdamW keep float32 weights and moments,
the masters: float16 has 10 bits of mantissa, so an update of 1e-4 to a weight near 1 would
round away. For each step ``LossScaler.low_precision`` swaps every floating parameter and
buffer for a float16 copy, and the forward and backward passes run on those. Each
micro-batch's loss is multiplied by the scale S before its backward pass, so that small
gradients are not flushed to zero (float16's smallest normal number is 6e-5); the float16
gradients are added into float32 sums, and on leaving, each parameter gets back its master
and the sum / S as its gradient. Softmax, cross-entropy and the norms accumulate in float32
whatever the dtype (minigrad.functional.rows.widen), and the loss comes out in float32.
Evaluation, checkpoints and generation see only the float32 masters.

S changes as in ``torch.amp.GradScaler``: it starts at 2^16; a step whose gradients hold an
inf or NaN is skipped (the weights and the optimiser's state stay as they were) and S is
halved; after ``growth_interval`` clean steps in a row S doubles. The scale, the clean-step
count and the skipped steps go into each checkpoint, so a resumed run goes on exactly.

Left out on purpose: bfloat16 (neither NumPy nor CuPy has the dtype; on hardware that has it
its 8-bit exponent makes loss scaling unnecessary), and float16 matrix products at full speed:
NumPy has no float16 BLAS, so on the CPU this mode teaches, it does not speed anything up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from minigrad.backend import xp_of
from minigrad.nn.module import Module
from minigrad.tensor import Tensor

LOW_PRECISION = {"float16": np.float16}  # TrainConfig.dtype -> the forward and backward dtype


class LossScaler:
    """Dynamic loss scaling over float32 masters, as ``torch.amp.GradScaler``'s defaults."""

    def __init__(
        self,
        dtype: str = "float16",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ):
        if dtype not in LOW_PRECISION:
            raise ValueError(f"LossScaler: dtype {dtype!r} is not one of {tuple(LOW_PRECISION)}")
        self.dtype = np.dtype(LOW_PRECISION[dtype])
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.clean_steps = 0  # steps since the last overflow or growth
        self.skipped = 0  # steps skipped for an overflow, over the run
        self._sums: dict[int, Any] = {}  # id(parameter) -> its float32 gradient sum

    @contextlib.contextmanager
    def low_precision(self, model: Module) -> Iterator[None]:
        """Run the block on float16 copies of the model's floating tensors; on leaving, the
        float32 masters are back, with the unscaled float32 sums of ``backward``'s gradients
        (None where no backward pass reached a parameter)."""
        buffers = [b for _, b in model.named_buffers()]
        tensors = [t for t in model.parameters() + buffers if t.dtype.kind == "f"]
        masters = [t.data for t in tensors]
        self._sums = {}
        # an overflow in float16 is expected now and then: update() finds it and skips the step
        quiet = np.errstate(over="ignore", invalid="ignore")
        try:
            for t in tensors:
                t.data = t.data.astype(self.dtype)
            with quiet:
                yield
        finally:
            for t, master in zip(tensors, masters, strict=True):
                t.data = master
                t.grad = None
        for p in model.parameters():
            if id(p) in self._sums:
                p.grad = self._sums[id(p)] / self.scale  # float32, unscaled
        self._sums = {}

    def backward(self, loss: Tensor, params: Sequence[Tensor]) -> None:
        """Backpropagate ``loss`` times the scale, then move the float16 gradients of
        ``params`` into their float32 sums (so micro-batches add up in float32)."""
        (loss * self.scale).backward()
        for p in params:
            if p.grad is None:
                continue
            grad = p.grad.astype(np.float32)
            seen = self._sums.get(id(p))
            self._sums[id(p)] = grad if seen is None else seen + grad
            p.grad = None

    def update(self, params: Sequence[Tensor]) -> bool:
        """After the gradients are unscaled (and averaged over the ranks): whether they are all
        finite, so the optimiser may step; halves the scale on an overflow, and grows it after
        ``growth_interval`` clean steps."""
        grads = [p.grad for p in params if p.grad is not None]
        finite = bool(grads) and all(bool(xp_of(g).isfinite(g).all()) for g in grads)
        if finite:
            self.clean_steps += 1
            if self.clean_steps == self.growth_interval:
                self.scale *= self.growth_factor
                self.clean_steps = 0
        else:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            self.skipped += 1
        return finite

    def state_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "clean_steps": self.clean_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scale = float(state["scale"])
        self.clean_steps, self.skipped = int(state["clean_steps"]), int(state["skipped"])
