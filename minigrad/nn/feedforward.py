"""The two position-wise feed-forward blocks of a transformer: GPT-2's MLP and Llama's SwiGLU.

Both map (..., n_embd) -> (..., n_embd) through a wider hidden layer and end with the residual
dropout. Names follow Meta's Llama code: ``w1`` up (the gate in SwiGLU), ``w3`` the second up
projection, ``w2`` down.

- MLP (GPT-2): ``w2(gelu(w1(x)))``.
- SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"; Llama): ``w2(silu(w1(x)) * w3(x))``.
  Three matrices instead of two, so models shrink ``hidden`` to about 8/3 * n_embd to keep
  the parameter count of a 4 * n_embd MLP.

Left out on purpose: GPT-2's scaled init of the down projection (0.02 / sqrt(2 * n_layer)):
it depends on the depth, which the model knows and re-initialises.
"""

from __future__ import annotations

import numpy as np

from minigrad import functional as F
from minigrad.nn.layers import GELU, Dropout, Linear
from minigrad.nn.module import Module
from minigrad.tensor import Tensor


class MLP(Module):
    """GPT-2's feed-forward block: Linear -> GELU -> Linear -> Dropout.

    ``approximate`` picks the GELU as torch's ``nn.GELU(approximate=...)`` does: "tanh" is
    GPT-2's form (Hugging Face's ``gelu_new``), "none" the exact erf form that nanoGPT's
    ``nn.GELU()`` computes. They differ by at most about 5e-4, enough to move a loss curve.

    >>> MLP(8, 32, approximate="none")
    MLP(
      (w1): Linear(in=8, out=32, bias=True)
      (act): GELU(approximate='none')
      (w2): Linear(in=32, out=8, bias=True)
      (dropout): Dropout(p=0.0)
    )
    """

    def __init__(
        self,
        n_embd: int,
        hidden: int,
        bias: bool = True,
        dropout: float = 0.0,
        rng: np.random.Generator | None = None,
        approximate: str = "tanh",
    ):
        super().__init__()
        self.w1 = Linear(n_embd, hidden, bias=bias, rng=rng)
        self.act = GELU(approximate=approximate)  # raises, naming the forms, on another value
        self.w2 = Linear(hidden, n_embd, bias=bias, rng=rng)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.w1(x))  # (..., n_embd) -> (..., hidden)
        return self.dropout(self.w2(h))  # (..., hidden) -> (..., n_embd)


class SwiGLU(Module):
    """Llama's gated feed-forward block: ``w2(silu(w1(x)) * w3(x))`` -> Dropout.

    ``w1`` computes the gate, ``w3`` the values it lets through, ``w2`` projects back down.
    """

    def __init__(
        self,
        n_embd: int,
        hidden: int,
        bias: bool = False,
        dropout: float = 0.0,
        rng: np.random.Generator | None = None,
    ):
        super().__init__()
        self.w1 = Linear(n_embd, hidden, bias=bias, rng=rng)
        self.w3 = Linear(n_embd, hidden, bias=bias, rng=rng)
        self.w2 = Linear(hidden, n_embd, bias=bias, rng=rng)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = F.silu(self.w1(x)) * self.w3(x)  # (..., n_embd) -> (..., hidden)
        return self.dropout(self.w2(h))  # (..., hidden) -> (..., n_embd)
