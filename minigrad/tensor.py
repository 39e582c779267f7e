"""Tensor: an array, its gradient, and the operators that record the graph.

A ``Tensor`` wraps a NumPy (or CuPy) array in ``.data``. Every method that computes something
calls an op's ``Function.apply`` (``minigrad/ops``), which is where the graph is recorded; this
file only turns Python syntax (``a + b``, ``x[1:]``, ``x.sum(-1)``) into those calls, lifting
Python numbers and arrays to constant Tensors on the way.

Dtypes follow PyTorch: float32 by default for Python floats, int64 for ints, and NumPy arrays
keep their dtype; only numeric dtypes are accepted, and only floating tensors may require grad.
An op over mixed dtypes uses PyTorch's promotion (``minigrad.dtypes``): int64 * float32 is
float32, and a 0-d tensor or a Python number widens a tensor only into a higher category
(float32 + a 0-d float64 tensor stays float32; int64 + 2.5 is float32). Division and the
transcendental functions (exp, log, sqrt, tanh, sigmoid) of integers give float32, as in
PyTorch; matmul promotes too (PyTorch refuses mixed dtypes there). Composite methods (``var``,
``squeeze``, ``stack``, ``split``, ``gather``) are built from the ops, so their gradients need
no code of their own. Left out on purpose: in-place ops, views that share gradient storage,
complex numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from minigrad import autograd
from minigrad.backend import check_device, device_of, to_device, to_numpy, xp_of
from minigrad.dtypes import DEFAULT_FLOAT, category, result_type
from minigrad.ops.elementwise import (
    Abs,
    Add,
    Cast,
    Clip,
    Div,
    Exp,
    Log,
    Maximum,
    Mul,
    Neg,
    Pow,
    Relu,
    Sigmoid,
    Sqrt,
    Sub,
    Tanh,
    Where,
)
from minigrad.ops.index import GetItem, TakeAlongAxis
from minigrad.ops.matmul import MatMul
from minigrad.ops.movement import Concatenate, Expand, Reshape, Transpose
from minigrad.ops.reduce import Max, Mean, Sum, Var, normalize_axes
from minigrad.ops.routing import Combine, Dispatch, topk_indices

_NUMBERS = (int, float, bool)  # Python numbers stay numbers inside constants (see Tensor._lift)


class Tensor:
    """An n-dimensional array that remembers how it was computed, for backpropagation."""

    __slots__ = ("data", "grad", "requires_grad", "_ctx", "_retains_grad", "__weakref__")
    __array_ufunc__ = None  # ndarray (op) Tensor defers to Tensor's reflected operators

    def __init__(self, data: Any, requires_grad: bool = False, dtype: Any = None, device=None):
        if isinstance(data, Tensor):
            data = data.data
        if not hasattr(data, "dtype"):  # Python numbers and (nested) lists
            try:
                data = np.asarray(data)
            except ValueError:  # NumPy's "inhomogeneous shape"
                raise ValueError(
                    "tensor: nested lists of different lengths; every row along an axis must "
                    "have the same length"
                ) from None
            if dtype is None and data.dtype == np.float64:
                dtype = DEFAULT_FLOAT  # Python floats become float32, as in PyTorch
        data = xp_of(data).asarray(data, dtype=dtype)
        _check_numeric(data.dtype)
        if device is not None:
            data = to_device(data, device)
        self.data = data
        self.grad = None
        self.requires_grad = False
        self._ctx = None
        self._retains_grad = False
        if requires_grad:
            self.requires_grad_()

    @classmethod
    def _from_op(cls, data: Any, requires_grad: bool) -> Tensor:
        """The engine's fast constructor: data is already an array of the right kind."""
        t = object.__new__(cls)
        t.data, t.grad, t.requires_grad, t._ctx, t._retains_grad = (
            data,
            None,
            requires_grad,
            None,
            False,
        )
        return t

    # ---- properties ------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return self.data.size

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def device(self) -> str:
        return device_of(self.data)

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor: it has no first axis (use .item())")
        return len(self.data)

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        dev = ", device='cuda'" if self.device == "cuda" else ""
        body = np.array2string(to_numpy(self.data), separator=", ", prefix="tensor(")
        return f"tensor({body}, dtype={self.dtype}{dev}{grad})"

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError(
                f"the truth value of a tensor with {self.size} elements is ambiguous: "
                f"use .any() or .all()"
            )
        return bool(self.item())

    # ---- autograd --------------------------------------------------------------------------
    def requires_grad_(self, flag: bool = True) -> Tensor:
        if flag and self.dtype.kind != "f":
            raise TypeError(
                f"only floating-point tensors can require gradients, got dtype {self.dtype}: "
                f"cast first with .float() or .double()"
            )
        self.requires_grad = flag
        return self

    def retain_grad(self) -> None:
        """Keep .grad on this non-leaf tensor after backward (leaves always keep theirs)."""
        self._retains_grad = True

    def backward(self, grad: Any = None, retain_graph: bool = False) -> None:
        """Add d(self)/d(leaf) into ``.grad`` of every leaf that requires grad."""
        autograd.backward(self, grad, retain_graph)

    def detach(self) -> Tensor:
        """The same data, cut off from the graph."""
        return Tensor._from_op(self.data, False)

    def zero_grad(self) -> None:
        self.grad = None

    # ---- conversion ------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        return to_numpy(self.data)

    def item(self) -> float | int | bool:
        return self._only_element("item()")

    def __float__(self) -> float:
        return float(self._only_element("float()"))

    def __int__(self) -> int:
        return int(self._only_element("int()"))  # truncates toward zero, as int(2.7) and torch

    def _only_element(self, caller: str) -> float | int | bool:
        """The one element as a Python number, of any shape (as torch: (1, 1) passes too)."""
        if self.size != 1:
            raise ValueError(f"{caller} needs a tensor with one element, got shape {self.shape}")
        return self.data.item()

    def tolist(self) -> Any:
        return to_numpy(self.data).tolist()

    def to(self, device: str) -> Tensor:
        """A copy on ``device`` ("cpu" or "cuda"); gradients flow back across the move."""
        device = check_device(device)
        if device == self.device:
            return self
        return ToDevice.apply(self, device=device)

    def astype(self, dtype: Any) -> Tensor:
        dtype = np.dtype(dtype)
        if dtype == self.dtype:
            return self
        _check_numeric(dtype)
        if dtype.kind != "f":  # as in PyTorch, only floating tensors carry gradients
            return Tensor._from_op(self.data.astype(dtype), False)
        return Cast.apply(self, dtype=dtype)

    def float(self) -> Tensor:
        return self.astype(np.float32)

    def double(self) -> Tensor:
        return self.astype(np.float64)

    def long(self) -> Tensor:
        return self.astype(np.int64)

    # ---- arithmetic ------------------------------------------------------------------------
    def _lift(self, other: Any) -> Tensor:
        """A Python number or an array as a constant Tensor (outside the graph) beside self.

        subtle: a Python number stays a Python number inside the constant: NumPy then treats
        it as "weak", so float32 * 2.0 stays float32, and we skip building a 0-d array.
        """
        if isinstance(other, Tensor):
            return other
        if isinstance(other, np.generic):  # a NumPy scalar counts as a Python number, as in torch
            other = other.item()
        if isinstance(other, _NUMBERS):
            return Tensor._from_op(other, False)
        if isinstance(other, complex):
            raise TypeError(f"{other} with a {self.dtype} tensor: complex numbers are left out")
        data = xp_of(self.data).asarray(other)
        _check_numeric(data.dtype)
        return Tensor._from_op(data, False)

    def __add__(self, other):
        return _binary(Add, self, self._lift(other))

    def __radd__(self, other):
        return _binary(Add, self._lift(other), self)

    def __sub__(self, other):
        return _binary(Sub, self, self._lift(other))

    def __rsub__(self, other):
        return _binary(Sub, self._lift(other), self)

    def __mul__(self, other):
        return _binary(Mul, self, self._lift(other))

    def __rmul__(self, other):
        return _binary(Mul, self._lift(other), self)

    def __truediv__(self, other):
        return _binary(Div, self, self._lift(other), floating=True)

    def __rtruediv__(self, other):
        return _binary(Div, self._lift(other), self, floating=True)

    def __pow__(self, other):
        return _binary(Pow, self, self._lift(other))

    def __rpow__(self, other):
        return _binary(Pow, self._lift(other), self)

    def __matmul__(self, other):
        return _binary(MatMul, self, self._lift(other))

    def __rmatmul__(self, other):
        return _binary(MatMul, self._lift(other), self)

    def __neg__(self):
        return Neg.apply(self)

    # Comparisons give boolean tensors and record no graph (they have no useful gradient).
    def _compare(self, other, op) -> Tensor:
        other = other.data if isinstance(other, Tensor) else other
        return Tensor._from_op(op(self.data, other), False)

    def __lt__(self, other):
        return self._compare(other, np.less)

    def __le__(self, other):
        return self._compare(other, np.less_equal)

    def __gt__(self, other):
        return self._compare(other, np.greater)

    def __ge__(self, other):
        return self._compare(other, np.greater_equal)

    def __eq__(self, other):  # elementwise, as in NumPy and PyTorch
        return self._compare(other, np.equal)

    def __ne__(self, other):
        return self._compare(other, np.not_equal)

    __hash__ = object.__hash__  # identity hashing, kept although == is elementwise

    # ---- unary math ------------------------------------------------------------------------
    def _check_floating(self, op: str) -> None:
        if self.dtype.kind != "f":
            raise TypeError(
                f"{op} of a {self.dtype} tensor: PyTorch refuses to guess the result dtype; "
                f"cast first with .float() or .double()"
            )

    def _floating(self) -> Tensor:
        """Self, or self as float32 if it holds integers (PyTorch's rule for exp, log, ...)."""
        return self if self.dtype.kind == "f" else self.astype(DEFAULT_FLOAT)

    def exp(self) -> Tensor:
        return Exp.apply(self._floating())

    def log(self) -> Tensor:
        return Log.apply(self._floating())

    def sqrt(self) -> Tensor:
        return Sqrt.apply(self._floating())

    def tanh(self) -> Tensor:
        return Tanh.apply(self._floating())

    def sigmoid(self) -> Tensor:
        return Sigmoid.apply(self._floating())

    def relu(self) -> Tensor:
        return Relu.apply(self)

    def abs(self) -> Tensor:
        return Abs.apply(self)

    def clip(self, min: float | None = None, max: float | None = None) -> Tensor:  # noqa: A002
        if min is None and max is None:
            raise ValueError("clip: give at least one of min and max")
        if isinstance(min, Tensor) or isinstance(max, Tensor):
            raise TypeError("clip: min and max are numbers; for a tensor bound use mg.maximum")
        return Clip.apply(self, lo=min, hi=max)

    def maximum(self, other) -> Tensor:
        return _binary(Maximum, self, self._lift(other))

    def where(self, cond, other) -> Tensor:
        """``cond ? self : other`` (torch's ``Tensor.where``)."""
        return where(cond, self, other)

    def masked_fill(self, mask, value: float) -> Tensor:
        """``value`` where ``mask`` is True, self elsewhere; mask broadcasts against self.

        As in PyTorch the result keeps self's dtype (``value`` is converted to it), and
        ``value`` is a number or a 0-d tensor.
        """
        if isinstance(value, (complex, np.complexfloating)):
            raise TypeError(f"masked_fill: value {value} is complex; minigrad tensors are real")
        if isinstance(value, Tensor) and value.ndim != 0:
            raise ValueError(
                f"masked_fill: value must be a number or a 0-d tensor, got shape {value.shape}"
            )
        return where(mask, value, self).astype(self.dtype)

    # ---- reductions ------------------------------------------------------------------------
    def sum(self, axis=None, keepdims: bool = False) -> Tensor:
        return Sum.apply(self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims: bool = False) -> Tensor:
        self._check_floating("mean")
        return Mean.apply(self, axis=axis, keepdims=keepdims)

    def max(self, axis=None, keepdims: bool = False) -> Tensor:
        return Max.apply(self, axis=axis, keepdims=keepdims)

    def min(self, axis=None, keepdims: bool = False) -> Tensor:
        return Max.apply(self, axis=axis, keepdims=keepdims, lowest=True)

    def var(self, axis=None, keepdims: bool = False, correction: int = 0) -> Tensor:
        """Mean squared deviation, divided by n - correction.

        correction=0 is NumPy's default (and what LayerNorm uses); torch.var defaults to 1.
        """
        self._check_floating("var")
        return Var.apply(self, axis=axis, keepdims=keepdims, correction=correction)

    def argmax(self, axis=None) -> Tensor:
        """Indices of the maxima (an integer tensor, outside the graph); the first of ties."""
        if axis is not None and not isinstance(axis, (int, np.integer)):
            raise TypeError(f"argmax: axis must be an int or None, got {axis!r}")
        axes = normalize_axes(axis, self.ndim)
        if any(self.shape[a] == 0 for a in axes):
            raise ValueError(f"argmax over an empty axis of a tensor of shape {self.shape}")
        xp = xp_of(self.data)
        if self.ndim == 0:  # a 0-d tensor accepts axis 0 or -1; its only index is 0
            return Tensor._from_op(xp.zeros((), dtype=np.int64), False)
        return Tensor._from_op(xp.asarray(xp.argmax(self.data, axis=axis)), False)

    # ---- shape -----------------------------------------------------------------------------
    def reshape(self, *shape) -> Tensor:
        shape = shape_arg(shape)
        return self if shape == self.shape else Reshape.apply(self, shape=shape)

    view = reshape

    def transpose(self, *axes) -> Tensor:
        """Permute axes (NumPy's rule); with no axes, reverse them.

        A 0-d tensor accepts axis 0 (or -1) and comes back unchanged, as in PyTorch.
        """
        axes = shape_arg(axes) or tuple(reversed(range(self.ndim)))
        if self.ndim == 0:
            for a in axes:  # only 0 and -1 are valid: check them, then there is nothing to move
                normalize_axes(a, 0)
            return self
        if sorted(a % self.ndim for a in axes) != list(range(self.ndim)):
            raise ValueError(f"transpose: {axes} is not a permutation of {self.ndim} axes")
        return Transpose.apply(self, axes=tuple(a % self.ndim for a in axes))

    def swapaxes(self, a: int, b: int) -> Tensor:
        """Exchange two axes (torch's ``transpose(a, b)``)."""
        if self.ndim == 0:
            return self.transpose(a, b)
        axes = list(range(self.ndim))
        (a,), (b,) = normalize_axes(a, self.ndim), normalize_axes(b, self.ndim)
        axes[a], axes[b] = axes[b], axes[a]
        return self.transpose(*axes)

    @property
    def T(self) -> Tensor:
        return self.transpose()

    def expand(self, *shape) -> Tensor:
        """Broadcast to ``shape`` without copying (-1 keeps a size)."""
        shape = shape_arg(shape)
        lead = len(shape) - self.ndim
        shape = tuple(
            self.shape[i - lead] if n == -1 and i >= lead else n for i, n in enumerate(shape)
        )
        return self if shape == self.shape else Expand.apply(self, shape=shape)

    def broadcast_to(self, shape) -> Tensor:
        return self.expand(*shape)

    def squeeze(self, axis=None) -> Tensor:
        """Drop size-1 axes: all of them, or those named (a named axis of another size stays,
        as in PyTorch)."""
        axes = range(self.ndim) if axis is None else normalize_axes(axis, self.ndim)
        return self.reshape(*(n for i, n in enumerate(self.shape) if not (i in axes and n == 1)))

    def unsqueeze(self, axis: int) -> Tensor:
        """Insert a size-1 axis at ``axis`` (negative counts from the end of the new shape)."""
        (axis,) = normalize_axes(axis, self.ndim + 1)
        return self.reshape(*self.shape[:axis], 1, *self.shape[axis:])

    def flatten(self, start_axis: int = 0) -> Tensor:
        """Merge the axes from ``start_axis`` on into one (a 0-d tensor becomes shape (1,))."""
        if self.ndim == 0:
            return self.reshape(1)
        (start,) = normalize_axes(start_axis, self.ndim)
        # subtle: the merged size is counted, not -1: reshape cannot infer -1 with 0 elements
        return self.reshape(*self.shape[:start], math.prod(self.shape[start:]))

    def __getitem__(self, index) -> Tensor:
        return GetItem.apply(self, index=_index_arg(index))

    def gather(self, axis: int, index) -> Tensor:
        """torch.gather: along ``axis``, out[..i..] = self[..index[..i..]..].

        PyTorch's rules, not NumPy's: the output has the index's shape, the index must have as
        many dimensions as self and be no larger on the other axes (it reads the leading part
        of them; nothing broadcasts), and indices are in [0, size). A 0-d self or index counts
        as one dimension of size 1.
        """
        index = _integer_tensor(index, "gather")
        x = self.reshape(1) if self.ndim == 0 else self
        idx = index.reshape(1) if index.ndim == 0 else index
        if idx.size == 0:  # as PyTorch: an empty index reads nothing, whatever its shape
            normalize_axes(axis, x.ndim)  # but the axis must still be one of x's
            return x.reshape(-1)[:0].reshape(index.shape)  # on the graph: x's gradient is 0
        if idx.ndim != x.ndim:
            raise ValueError(
                f"gather: index has {index.ndim} dimensions but the tensor has {self.ndim}; "
                f"they must match (unsqueeze the index)"
            )
        (axis,) = normalize_axes(axis, x.ndim)
        for d, (n_idx, n) in enumerate(zip(idx.shape, x.shape, strict=True)):
            if d != axis and n_idx > n:
                raise ValueError(
                    f"gather: index shape {idx.shape} is larger than the tensor's {x.shape} at "
                    f"axis {d}; apart from axis {axis} it must be no larger"
                )
        if idx.size and int(idx.data.min()) < 0:
            raise IndexError(
                f"gather: index {int(idx.data.min())} is negative; torch.gather refuses "
                f"negative indices (take_along_axis accepts them, counting from the end)"
            )
        if idx.shape[:axis] + idx.shape[axis + 1 :] != x.shape[:axis] + x.shape[axis + 1 :]:
            # (a, n, b) -> the leading part (a', n, b') that the index reads
            x = x[tuple(slice(None) if d == axis else slice(n) for d, n in enumerate(idx.shape))]
        return take_along_axis(x, idx, axis).reshape(index.shape)

    def topk(self, k: int, axis: int = -1) -> tuple[Tensor, Tensor]:
        """torch.topk: the ``k`` largest values along ``axis``, largest first, and their int64
        indices (no gradient). Ties go to the lower index; NaN counts as the largest. The
        values' gradient goes back to the chosen places (the choice itself is held fixed).
        """
        x = self.reshape(1) if self.ndim == 0 else self
        (axis,) = normalize_axes(axis, x.ndim)
        n = x.shape[axis]
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n:
            raise ValueError(f"topk: k={k!r} must be an integer in [0, {n}], axis {axis}'s size")
        xp = xp_of(x.data)
        index = Tensor(xp.moveaxis(topk_indices(xp.moveaxis(x.data, axis, -1), k), -1, axis))
        values = take_along_axis(x, index, axis)  # the index stays on the device
        if self.ndim == 0:
            return values.reshape(()), index.reshape(())
        return values, index

    def split(self, sections, axis: int = 0) -> list[Tensor]:
        return split(self, sections, axis)

    def matmul(self, other) -> Tensor:
        return self @ other


class ToDevice(autograd.Function):
    """z = x on another device;  dz/dx moves the gradient back to x's device."""

    @staticmethod
    def forward(ctx, x, device="cpu"):
        ctx.device = device_of(x)
        return to_device(x, device)

    @staticmethod
    def backward(ctx, grad_out):
        return to_device(grad_out, ctx.device)


autograd.register_tensor_class(Tensor)


def shape_arg(shape: tuple) -> tuple[int, ...]:
    """Accept f(2, 3) and f((2, 3)) alike."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def _index_arg(index):
    """Replace Tensors inside an index with their arrays (lists become arrays too)."""
    if isinstance(index, tuple):
        return tuple(_index_arg(i) for i in index)
    if isinstance(index, Tensor):
        return index.data
    if isinstance(index, list):
        return np.asarray(index)
    return index


# ---- functions over several tensors ----------------------------------------------------------
def _as_tensor(x: Any, like: Tensor | None = None) -> Tensor:
    if isinstance(x, Tensor):
        return x
    return like._lift(x) if like is not None else Tensor(x)


def where(cond, x, y) -> Tensor:
    """``x`` where ``cond`` is True, else ``y``; all three broadcast together."""
    like = x if isinstance(x, Tensor) else y if isinstance(y, Tensor) else None
    x, y = _as_tensor(x, like), _as_tensor(y, like)
    # subtle: the namespace is like's: x may be a lifted Python number, whose xp_of is NumPy
    xp = xp_of(like.data) if like is not None else np
    cond = cond if isinstance(cond, Tensor) else Tensor._from_op(xp.asarray(cond), False)
    if cond.dtype != bool:
        raise TypeError(f"where: the condition must be boolean, got dtype {cond.dtype}")
    return Where.apply(cond, *_promote(x, y))


def maximum(x, y) -> Tensor:
    like = x if isinstance(x, Tensor) else y
    return _binary(Maximum, _as_tensor(x, like), _as_tensor(y, like))


def concatenate(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    if len(tensors) == 0:
        raise ValueError("concatenate needs at least one tensor")
    tensors = _promote(*(_as_tensor(t) for t in tensors))
    shaped = [t for t in tensors if t.shape != (0,)] or tensors
    if shaped[0].ndim == 0:
        raise ValueError("concatenate: 0-d tensors have no axis to join along (use stack)")
    (axis,) = normalize_axes(axis, shaped[0].ndim)
    # PyTorch's rule: a 1-D empty tensor joins tensors of any shape as nothing (torch.cat skips
    # it); here it becomes an empty slab of their shape, so it stays on the graph
    empty = tuple(0 if d == axis else n for d, n in enumerate(shaped[0].shape))
    tensors = [t.reshape(empty) if t.shape == (0,) else t for t in tensors]
    return Concatenate.apply(*tensors, axis=axis)


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join along a new axis: each tensor gains a size-1 axis, then they are concatenated."""
    if len(tensors) == 0:
        raise ValueError("stack needs at least one tensor")
    tensors = [_as_tensor(t) for t in tensors]
    shapes = {t.shape for t in tensors}
    if len(shapes) > 1:
        raise ValueError(f"stack: every tensor must have the same shape, got {sorted(shapes)}")
    (axis,) = normalize_axes(axis, tensors[0].ndim + 1)
    return concatenate([t.unsqueeze(axis) for t in tensors], axis=axis)


def split(x: Tensor, sections: int | Sequence[int], axis: int = 0) -> list[Tensor]:
    """Split into pieces of the given sizes (a list) or into ``sections`` equal pieces (an int)."""
    (axis,) = normalize_axes(axis, x.ndim)
    n = x.shape[axis]
    if isinstance(sections, int):
        if sections < 1:
            raise ValueError(f"split: sections must be a positive number of pieces, got {sections}")
        if n % sections:
            raise ValueError(f"split: axis {axis} of size {n} does not divide into {sections}")
        sizes = [n // sections] * sections
    else:
        sizes = list(sections)
        if min(sizes, default=0) < 0:
            raise ValueError(f"split: sizes {sizes} must not be negative")
        if sum(sizes) != n:
            raise ValueError(f"split: sizes {sizes} add up to {sum(sizes)}, not to {n}")
    pieces, start = [], 0
    index = [slice(None)] * x.ndim
    for size in sizes:
        index[axis] = slice(start, start + size)
        pieces.append(x[tuple(index)])
        start += size
    return pieces


def take_along_axis(x: Tensor, indices, axis: int) -> Tensor:
    """NumPy's take_along_axis: like torch.gather, but the index and x broadcast against each
    other on the other axes, and negative indices count from the end."""
    indices = _integer_tensor(indices, "take_along_axis")
    if x.ndim == 0:
        raise ValueError("take_along_axis: x is 0-d; it needs an axis (Tensor.gather takes 0-d)")
    (axis,) = normalize_axes(axis, x.ndim)
    return TakeAlongAxis.apply(x, indices, axis=axis)


def dispatch(x: Tensor, rows, check: bool = True) -> Tensor:
    """x's rows (first axis) in the order ``rows`` names them, repeats allowed:
    (n, ...) -> (len(rows), ...). A mixture of experts sends tokens to their experts so.
    ``check=False`` skips the range check of rows (a host copy) for rows known valid."""
    return Dispatch.apply(x, _integer_tensor(rows, "dispatch"), check=check)


def combine(y: Tensor, rows, n: int, check: bool = True) -> Tensor:
    """dispatch's adjoint: (len(rows), ...) -> (n, ...), row j the sum of the rows i of ``y``
    with rows[i] == j (zeros where none). A mixture of experts adds its outputs back so."""
    return Combine.apply(y, _integer_tensor(rows, "combine"), n=n, check=check)


def _integer_tensor(index, op: str) -> Tensor:
    """``index`` as a Tensor (an array stays on its device), refusing anything but integers."""
    if not isinstance(index, Tensor):
        index = Tensor(index if hasattr(index, "dtype") else np.asarray(index))
    if index.dtype.kind not in "iu":
        raise TypeError(f"{op}: indices must be integers, got dtype {index.dtype}")
    return index


def _check_numeric(dtype: np.dtype) -> None:
    if dtype.kind not in "biuf":
        raise TypeError(
            f"a tensor holds real numbers (bool, integer, floating), got dtype {dtype}: "
            f"convert the data first (complex numbers are left out on purpose)"
        )


def _promote(*tensors: Tensor, floating: bool = False) -> list[Tensor]:
    """The tensors cast to PyTorch's result dtype (``minigrad.dtypes.result_type``), or to
    float32 where that is an integer type and ``floating`` asks for a floating result.

    Python numbers (inside constants) stay numbers: NumPy's weak scalars already take the
    dtype of the arrays they meet, and building a 0-d array for each would cost time.
    """
    dtype = result_type(*(t.data for t in tensors))
    if floating and category(dtype) < 2:
        dtype = DEFAULT_FLOAT
    return [t if type(t.data) in _NUMBERS or t.dtype == dtype else t.astype(dtype) for t in tensors]


def _binary(fn: type[autograd.Function], x: Tensor, y: Tensor, floating: bool = False) -> Tensor:
    """``fn`` over x and y after type promotion (``floating``: see ``_promote``)."""
    dx, dy = getattr(x.data, "dtype", None), getattr(y.data, "dtype", None)
    dtype = dx if dy is None else dy if dx is None else dx if dx == dy else None
    # fast path: one dtype, or a floating tensor beside a Python number (NumPy keeps its dtype)
    if dtype is None or (dtype.kind != "f" and (floating or dx is None or dy is None)):
        x, y = _promote(x, y, floating=floating)
    return fn.apply(x, y)


def matmul(x, y) -> Tensor:
    return _as_tensor(x) @ y
