"""LoRA: low-rank adapters that fine-tune a frozen Linear (Hu et al. 2021, "LoRA: Low-Rank
Adaptation of Large Language Models").

A frozen Linear computes y = x W^T + b with W of shape (out, in). LoRA learns a low-rank
change of W^T instead of W itself:

    y = x W^T + b + s * dropout(x) A B,      A (in, r),  B (r, out),  s = alpha / r.

Only A and B train: r * (in + out) numbers instead of in * out. B starts at zero, so the
wrapped model starts out computing exactly what the base model computed. A starts as in the
reference implementation (microsoft/LoRA's ``loralib``, also HF PEFT's default): PyTorch's
Kaiming-uniform with a = sqrt(5), which is U(-1/sqrt(in), 1/sqrt(in)). Since s * A B is just a
matrix, it can be folded into W for inference (``merge``) and taken out again (``unmerge``).

``LoRAHeadLinear`` is a per-head variant for attention projections (see its docstring), and
``apply_lora`` wraps the layers named in ``targets`` anywhere in a model (by default W_Q and
W_V, the paper's choice) and freezes everything else.

Left out on purpose: adapters on Embedding layers, on a weight tied to another layer's (a
tied output head: ``apply_lora`` refuses it, since merging would change the embedding too),
and quantised bases (QLoRA).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from minigrad import creation
from minigrad.backend import to_device, to_numpy, xp_of
from minigrad.functional.dropout import check_p
from minigrad.nn.layers import Dropout, Linear
from minigrad.nn.module import Module, Parameter
from minigrad.tensor import Tensor


def _kaiming_uniform(
    fan_in: int, shape: tuple[int, ...], like: Parameter, rng: np.random.Generator | None
) -> Parameter:
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) samples with ``like``'s dtype, on its device."""
    rng = rng if rng is not None else creation.default_rng()
    bound = 1.0 / np.sqrt(fan_in)
    values = rng.uniform(-bound, bound, size=shape).astype(like.dtype)
    return Parameter(to_device(values, like.device))


def _zeros(shape: tuple[int, ...], like: Parameter) -> Parameter:
    return Parameter(xp_of(like.data).zeros(shape, dtype=like.dtype))


class LoRALinear(Module):
    """A frozen Linear plus a trainable low-rank update: y = base(x) + s * dropout(x) A B.

    >>> lora = LoRALinear(Linear(16, 8), r=2, alpha=4)
    >>> lora.A.shape, lora.B.shape, lora.num_parameters(trainable_only=True)
    ((16, 2), (2, 8), 48)
    """

    def __init__(
        self,
        base: Linear,
        r: int,
        alpha: float,
        dropout: float = 0.0,
        rng: np.random.Generator | None = None,
    ):
        super().__init__()
        if not isinstance(base, Linear):
            raise TypeError(f"LoRA wraps a Linear, got {type(base).__name__}")
        _check_settings(r, alpha, dropout)
        self.base = base.requires_grad_(False)  # frozen: only the adapter trains
        self.r, self.alpha, self.scale = r, alpha, alpha / r
        self.merged = False
        self._init_adapter(rng)
        self.dropout = Dropout(dropout)

    def _init_adapter(self, rng: np.random.Generator | None) -> None:
        n_in, n_out = self.base.in_features, self.base.out_features
        self.A = _kaiming_uniform(n_in, (n_in, self.r), self.base.weight, rng)
        self.B = _zeros((self.r, n_out), self.base.weight)  # zero: the update starts at 0

    # The base's settings, so code that reads them keeps working on a wrapped layer.
    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def weight(self) -> Parameter:
        """The base weight (merged or not): the adapter lives in A and B."""
        return self.base.weight

    @property
    def bias(self) -> Parameter | None:
        return self.base.bias

    def adapter(self, x: Tensor) -> Tensor:
        """x A B, without the scale: (..., in) -> (..., out)."""
        return (x @ self.A) @ self.B  # (..., in) -> (..., r) -> (..., out): r is small

    def delta_weight(self) -> Any:
        """s * A B as an array of shape (in, out): what ``merge`` adds to W^T."""
        return (self.A.data @ self.B.data) * self.scale

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)
        if self.merged:  # the update is already inside base.weight
            return y
        return y + self.adapter(self.dropout(x)) * self.scale

    def merge(self) -> None:
        """Fold s * A B into the base weight: one matmul per call again, for inference."""
        if self.merged:
            raise RuntimeError("LoRA merge(): this layer is already merged; unmerge() first")
        self.base.weight.data += self.delta_weight().T  # in place, on the raw array
        self.merged = True

    def unmerge(self) -> None:
        """Take s * A B out of the base weight again (equal up to float rounding)."""
        if not self.merged:
            raise RuntimeError("LoRA unmerge(): this layer is not merged")
        self.base.weight.data -= self.delta_weight().T
        self.merged = False

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha}, merged={self.merged}"


class LoRAHeadLinear(LoRALinear):
    """LoRA with one adapter per attention head, for a projection like W_Q or W_V.

    The projection's output (out = m) is h heads of size d = m / h. Head i gets its own
    A_i (in, r) and B_i (r, d), which update only that head's slice of the output:
    y[..., i*d:(i+1)*d] += s * x A_i B_i. Side by side, the update of W^T is

        Delta W^T = [A_1 B_1 | ... | A_h B_h] = [A_1 ... A_h] @ blockdiag(B_1, ..., B_h),
                    (in, m)                     (in, h*r)      (h*r, m)

    so this is a LoRA of rank h*r whose B is block-diagonal: rank(Delta W) <= h*r, with
    equality for generic A and B (when h*r <= min(in, m)). It trains h*r*(in + d) numbers,
    where a plain LoRA of the same rank h*r would train h*r*(in + m).

    Stored so the heads batch: ``A`` is [A_1 ... A_h] of shape (in, h*r) (one matmul for all
    heads) and ``B`` stacks B_i as (h, r, d) (one batched matmul over the heads).

    >>> lora = LoRAHeadLinear(Linear(16, 8), n_head=2, r=2, alpha=4)
    >>> lora.A.shape, lora.B.shape
    ((16, 4), (2, 2, 4))
    """

    def __init__(
        self,
        base: Linear,
        n_head: int,
        r: int,
        alpha: float,
        dropout: float = 0.0,
        rng: np.random.Generator | None = None,
    ):
        if base.out_features % n_head:
            raise ValueError(
                f"LoRAHeadLinear: out_features {base.out_features} is not divisible by "
                f"n_head {n_head}; pass the number of heads this projection produces"
            )
        self.n_head = n_head  # set first: the parent's __init__ calls our _init_adapter
        super().__init__(base, r, alpha, dropout, rng)

    def _init_adapter(self, rng: np.random.Generator | None) -> None:
        n_in, h, r = self.base.in_features, self.n_head, self.r
        d = self.base.out_features // h
        self.A = _kaiming_uniform(n_in, (n_in, h * r), self.base.weight, rng)
        self.B = _zeros((h, r, d), self.base.weight)

    def adapter(self, x: Tensor) -> Tensor:
        *lead, n_in = x.shape
        h, r = self.n_head, self.r
        z = (x @ self.A).reshape(-1, h, r)  # (..., in) -> (..., h*r) -> (N, h, r)
        y = z.transpose(1, 0, 2) @ self.B  # (h, N, r) @ (h, r, d) -> (h, N, d)
        return y.transpose(1, 0, 2).reshape(*lead, self.out_features)  # -> (..., h*d)

    def delta_weight(self) -> Any:
        n_in, h, r = self.in_features, self.n_head, self.r
        a = self.A.data.reshape(n_in, h, r).transpose(1, 0, 2)  # (in, h*r) -> (h, in, r)
        blocks = a @ self.B.data  # (h, in, r) @ (h, r, d) -> (h, in, d): A_i B_i
        return blocks.transpose(1, 0, 2).reshape(n_in, -1) * self.scale  # -> (in, h*d)

    def extra_repr(self) -> str:
        return f"n_head={self.n_head}, " + super().extra_repr()


def _lora_modules(model: Module) -> list[tuple[str, Module, str, LoRALinear]]:
    """(dotted name, parent, attribute name, LoRA layer) for every LoRA layer in the model."""
    return [
        (f"{prefix}.{name}" if prefix else name, parent, name, child)
        for prefix, parent in model.named_modules()
        for name, child in parent.named_children()
        if isinstance(child, LoRALinear)
    ]


def _check_settings(r: Any, alpha: Any, dropout: Any) -> None:
    """Raise a ValueError naming the first LoRA setting out of its range.

    >>> _check_settings(8, float("nan"), 0.0)
    Traceback (most recent call last):
    ...
    ValueError: LoRA alpha must be a finite number (the scale is alpha / r), got nan
    """
    if not (isinstance(r, int) and not isinstance(r, bool) and r >= 1):
        raise ValueError(f"LoRA rank r must be a positive integer, got {r!r}")
    if not (isinstance(alpha, numbers.Real) and math.isfinite(alpha)):
        raise ValueError(
            f"LoRA alpha must be a finite number (the scale is alpha / r), got {alpha!r}"
        )
    check_p(dropout, "LoRA", "dropout")


def apply_lora(
    model: Module,
    targets: Sequence[str] = ("wq", "wv"),
    r: int = 8,
    alpha: float = 16,
    dropout: float = 0.0,
    per_head: bool = False,
    n_head: int | Mapping[str, int] | None = None,
    rng: np.random.Generator | None = None,
) -> list[str]:
    """Wrap, in place, every Linear whose attribute name is in ``targets``; freeze the rest.

    Returns the dotted names of the wrapped layers. With ``per_head=True`` each gets a
    ``LoRAHeadLinear``; ``n_head`` is its number of heads: an int for every target, or a dict
    such as ``{"wq": 8, "wv": 2}`` when grouped-query attention gives W_V fewer heads.

    >>> from minigrad.nn import ModuleDict
    >>> model = ModuleDict({"attn": ModuleDict({"wq": Linear(4, 4), "wo": Linear(4, 4)})})
    >>> apply_lora(model, targets=("wq",), r=2)
    ['attn.wq']
    >>> model.num_parameters(trainable_only=True)  # A (4, 2) and B (2, 4)
    16
    """
    if _lora_modules(model):
        raise ValueError("apply_lora: the model already has LoRA layers; call it once per model")
    if per_head and n_head is None:
        raise ValueError("apply_lora(per_head=True) needs n_head (an int, or a dict per target)")
    # First find and check every target, so that a mistake leaves the model untouched.
    found = [
        (f"{prefix}.{name}" if prefix else name, parent, name, child)
        for prefix, parent in model.named_modules()
        for name, child in parent.named_children()
        if name in targets and isinstance(child, Linear)
    ]
    if not found:
        linears = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, Linear)}
        raise ValueError(
            f"apply_lora: no Linear layer is named one of {tuple(targets)}; "
            f"the model's Linear layers are named {sorted(linears)}"
        )
    _check_settings(r, alpha, dropout)
    _refuse_tied(model, found)
    heads = {}
    for dotted, _, name, child in found:
        if per_head:
            heads[dotted] = n_head.get(name) if isinstance(n_head, Mapping) else n_head
            if heads[dotted] is None or child.out_features % heads[dotted]:
                raise ValueError(
                    f"apply_lora: {dotted} has {child.out_features} outputs, which n_head "
                    f"{heads[dotted]} does not divide into heads"
                )
    model.requires_grad_(False)  # freeze everything; the new A and B are the only trainables
    for dotted, parent, name, child in found:
        if per_head:
            lora = LoRAHeadLinear(child, heads[dotted], r, alpha, dropout, rng)
        else:
            lora = LoRALinear(child, r, alpha, dropout, rng)
        parent._set_child(name, lora)
    wrapped = [dotted for dotted, *_ in found]
    return wrapped


def _refuse_tied(model: Module, found: list[tuple[str, Module, str, Linear]]) -> None:
    """Raise a ValueError for a target whose weight is tied to another layer's (a tied output
    head is the token embedding matrix): merging its adapter would change both uses, so the
    merged model would differ from the adapted one."""
    names: dict[int, list[str]] = {}
    for name, p in model._named_tensors_with_aliases():
        names.setdefault(id(p), []).append(name)
    for dotted, _, name, child in found:
        others = [n for n in names.get(id(child.weight), []) if n != f"{dotted}.weight"]
        if others:
            raise ValueError(
                f"apply_lora: {dotted}.weight is tied to {others[0]} (one matrix, two uses), "
                f"so merging an adapter on {dotted} would change {others[0]} too: drop "
                f"{name!r} from the targets, or start from a model with untied weights"
            )


def _adapter_parameters(model: Module) -> dict[str, Parameter]:
    ids = {id(p) for *_, m in _lora_modules(model) for p in (m.A, m.B)}
    return {name: p for name, p in model.named_parameters() if id(p) in ids}


def lora_state_dict(model: Module) -> dict[str, np.ndarray]:
    """Only the adapters' A and B, by dotted name (e.g. ``blocks.0.attn.wq.A``): a small file."""
    return {name: to_numpy(p.data).copy() for name, p in _adapter_parameters(model).items()}


def load_lora_state_dict(model: Module, state: Mapping[str, np.ndarray]) -> None:
    """Copy adapters saved by ``lora_state_dict`` into a model that ``apply_lora`` wrapped."""
    if any(m.merged for *_, m in _lora_modules(model)):
        raise RuntimeError("load_lora_state_dict: unmerge() the LoRA layers before loading")
    params = _adapter_parameters(model)
    missing = [k for k in params if k not in state]
    unexpected = [k for k in state if k not in params]
    if missing or unexpected:
        raise KeyError(
            f"load_lora_state_dict: missing keys {missing}, unexpected keys {unexpected}; "
            f"call apply_lora with the same targets (and per_head) as the saved run first"
        )
    for key, p in params.items():
        if tuple(state[key].shape) != p.shape:
            raise ValueError(
                f"load_lora_state_dict: {key!r} has shape {tuple(state[key].shape)} in the "
                f"state dict but {p.shape} in the model (a different r or n_head?)"
            )
    for key, p in params.items():
        p.data[...] = xp_of(p.data).asarray(state[key], dtype=p.dtype)


def merge_lora(model: Module) -> list[str]:
    """Merge every adapter into its base weight and put the plain Linear back, in place.

    The model then has the original architecture and state-dict keys again (for saving a
    full checkpoint). Its parameters stay frozen: ``model.requires_grad_(True)`` to train on.
    Returns the dotted names of the layers it replaced.
    """
    replaced = []
    for dotted, parent, name, lora in _lora_modules(model):
        if not lora.merged:
            lora.merge()
        parent._set_child(name, lora.base)
        replaced.append(dotted)
    return replaced
