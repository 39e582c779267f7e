"""The layers a decoder-only transformer is built from: Linear, Embedding, the two norms,
Dropout and the two activations.

Each layer holds its Parameters and calls one function of ``minigrad.functional`` in
``forward``: the math and its hand-derived backward live there, the weights and their
initialisation live here. Initialisation follows GPT-2 as nanoGPT does it: weights normal with
std 0.02, biases zero, norm gains one. Random draws come from the ``rng`` passed in, or from
minigrad's global generator (``mg.manual_seed``), so one seed rebuilds the same model.

Parameters are float32; ``module.double()`` converts a whole model to float64 for gradchecks.
Left out on purpose: device arguments (build on the CPU, then ``model.to("cuda")``), and
other init schemes (a model re-initialises the weights it wants scaled, as GPT-2's residual
projections).
"""

from __future__ import annotations

import numpy as np

from minigrad import creation
from minigrad import functional as F
from minigrad.functional.activations import check_approximate
from minigrad.functional.dropout import check_p
from minigrad.nn.module import Module, Parameter
from minigrad.tensor import Tensor

INIT_STD = 0.02  # GPT-2's weight init std (Radford et al. 2019; nanoGPT's _init_weights)


def normal_parameter(
    shape: tuple[int, ...], std: float, rng: np.random.Generator | None = None
) -> Parameter:
    """A float32 Parameter of normal samples with mean 0 and the given std.

    >>> p = normal_parameter((2, 3), std=0.02, rng=np.random.default_rng(0))
    >>> p.shape, p.dtype
    ((2, 3), dtype('float32'))
    """
    rng = rng if rng is not None else creation.default_rng()  # read now: manual_seed replaces it
    return Parameter((rng.standard_normal(shape) * std).astype(np.float32))


class Linear(Module):
    """y = x @ W^T + b, with W of shape (out_features, in_features) as in PyTorch.

    >>> Linear(128, 512)
    Linear(in=128, out=512, bias=True)
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        rng: np.random.Generator | None = None,
        init_std: float = INIT_STD,
    ):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = normal_parameter((out_features, in_features), init_std, rng)
        self.bias = Parameter(np.zeros(out_features, dtype=np.float32)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)  # (..., in) -> (..., out)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """A lookup table: integer ids (...) -> rows of ``weight`` (num_embeddings, embedding_dim)."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        rng: np.random.Generator | None = None,
        init_std: float = INIT_STD,
    ):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = normal_parameter((num_embeddings, embedding_dim), init_std, rng)

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight)  # (...) -> (..., embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    """Normalise the last axis to mean 0 and variance 1, then scale (and shift) it.

    ``bias=False`` drops the shift, as nanoGPT's LayerNorm (and Llama's norms) do.
    """

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = Parameter(np.ones(dim, dtype=np.float32))
        self.bias = Parameter(np.zeros(dim, dtype=np.float32)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight, self.bias, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, bias={self.bias is not None}"


class RMSNorm(Module):
    """Scale the last axis by its root mean square, then by a learned gain (Zhang & Sennrich
    2019; Llama). No centring and no bias: cheaper than LayerNorm and as good in practice."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = Parameter(np.ones(dim, dtype=np.float32))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class Dropout(Module):
    """Zero each element with probability p while training, scaling the rest by 1 / (1 - p).

    Each Dropout owns a NumPy Generator, seeded from minigrad's global one when it is built
    (or passed as ``rng``), so a seeded model drops the same elements on every run.
    """

    def __init__(self, p: float = 0.0, rng: np.random.Generator | None = None):
        super().__init__()
        check_p(p, "Dropout")
        self.p = p
        if rng is None:  # a child seed drawn from the global generator (read now, not at import)
            rng = np.random.default_rng(int(creation.default_rng().integers(2**63)))
        self.rng = rng

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x  # the identity: no mask to draw, nothing to record
        return F.dropout(x, self.p, training=True, rng=self.rng)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class GELU(Module):
    """The Gaussian error linear unit; ``approximate="tanh"`` is GPT-2's form, "none" exact."""

    def __init__(self, approximate: str = "tanh"):
        super().__init__()
        check_approximate(approximate, "GELU")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    """x * sigmoid(x), the activation inside SwiGLU (also called swish)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x)
