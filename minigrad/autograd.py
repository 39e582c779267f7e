"""The reverse-mode autograd engine: Function, Context, grad mode, unbroadcast and backward.

A ``Function`` subclass holds one op's math as two static methods on raw arrays:
``forward(ctx, *arrays, **params)`` and ``backward(ctx, grad_out)``. ``Function.apply`` runs
``forward`` on the ``.data`` of its Tensor inputs and, when gradients are wanted, records the
inputs on a ``Context`` attached to the output: that record *is* the graph.

``backward(root)`` walks the graph in reverse topological order. Three rules live here and
nowhere else, so every op's backward stays textbook-simple:

1. unbroadcast: a gradient is summed back to its input's shape (see ``unbroadcast``);
2. accumulation: a tensor used twice receives the sum of both contributions;
3. freeing: after a backward, every Context drops what it saved, unless ``retain_graph``.

The walk is iterative (micrograd's recursive walk dies near depth 1000). Left out on purpose:
higher-order gradients (backward is not itself recorded), hooks (but for
``anomaly_hook``, which ``minigrad.anomaly`` sets), and in-place ops.
Follows the design of minitorch (``autodiff.py``) and tinygrad v0.8 (``mlops.py``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from minigrad.backend import device_of, xp_of

if TYPE_CHECKING:
    from minigrad.tensor import Tensor

_grad_enabled = True
_tensor_cls: type | None = None  # set by tensor.py: the engine builds outputs of this class
anomaly_hook = None  # set inside minigrad.anomaly.detect_anomaly: checks every op's outputs


def register_tensor_class(cls: type) -> None:
    """Called once by ``minigrad.tensor``, so the engine builds outputs without an import cycle."""
    global _tensor_cls
    _tensor_cls = cls


def is_grad_enabled() -> bool:
    return _grad_enabled


class no_grad:
    """Context manager (and decorator) in which ops record no graph, as ``torch.no_grad``.

    >>> import minigrad as mg
    >>> w = mg.ones(2, requires_grad=True)
    >>> with mg.no_grad():
    ...     y = w * 2
    >>> y.requires_grad
    False
    """

    def __enter__(self) -> None:
        global _grad_enabled
        self._prev = _grad_enabled
        _grad_enabled = False

    def __exit__(self, *exc: object) -> None:
        global _grad_enabled
        _grad_enabled = self._prev

    def __call__(self, fn):  # used as @no_grad()
        def wrapper(*args, **kwargs):
            with no_grad():
                return fn(*args, **kwargs)

        wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
        return wrapper


class Context:
    """What one op remembers between its forward and its backward.

    Arrays that backward needs go through ``save_for_backward`` (read back as ``ctx.saved``);
    small settings (an axis, a shape) may be plain attributes. ``release`` drops all of it.
    """

    freed = False

    def save_for_backward(self, *arrays: Any) -> None:
        self.saved = arrays

    def release(self) -> None:
        # subtle: clearing __dict__ also drops the inputs, so the whole graph can be collected.
        name = self.fn.__name__
        self.__dict__.clear()
        self.fn_name, self.freed = name, True


class Function:
    """Base class of every op. Subclasses define ``forward`` and ``backward`` on raw arrays.

    ``backward`` returns one gradient per Tensor input (a tuple, or a bare array for one input),
    shaped like the *output* broadcast: the engine sums it back to each input's shape. It may
    return None for an input that needs no gradient (see ``ctx.needs_input_grad``).
    """

    # classmethods here only so the error can name the subclass; subclasses write staticmethods
    @classmethod
    def forward(cls, ctx: Context, *arrays: Any, **params: Any) -> Any:
        raise NotImplementedError(f"{cls.__name__} defines no forward(ctx, *arrays)")

    @classmethod
    def backward(cls, ctx: Context, grad_out: Any) -> Any:
        raise NotImplementedError(
            f"{cls.__name__} defines no backward(ctx, grad_out): add one to differentiate it"
        )

    @classmethod
    def apply(cls, *inputs: Tensor, **params: Any) -> Tensor:
        """Run the op on Tensors and, if any input requires grad, record it in the graph."""
        ctx = Context()
        try:
            out = cls.forward(ctx, *[t.data for t in inputs], **params)
        except Exception as e:
            _explain_failure(cls.__name__, inputs, e)
            raise
        if isinstance(out, np.generic):  # numpy reductions return scalars; keep arrays throughout
            out = np.asarray(out)
        if anomaly_hook is not None:
            anomaly_hook("forward", cls, ctx, [t.data for t in inputs], (out,))
        if _grad_enabled:
            needs = tuple([t.requires_grad for t in inputs])
            if True in needs:
                ctx.fn, ctx.inputs, ctx.needs_input_grad = cls, inputs, needs
                result = _tensor_cls._from_op(out, True)
                result._ctx = ctx
                return result
        return _tensor_cls._from_op(out, False)


def _explain_failure(op: str, inputs: tuple, error: Exception) -> None:
    """Called when a forward fails: re-raise the two common mistakes with a clearer message.

    Checking only after a failure keeps the checks off the hot path: NumPy and CuPy both
    refuse to mix their arrays and to broadcast mismatched shapes, so both always land here.
    """
    arrays = [t.data for t in inputs if hasattr(t.data, "shape")]
    devices = [device_of(a) for a in arrays]
    if len(set(devices)) > 1:
        raise RuntimeError(
            f"{op}: inputs are on different devices {devices}; "
            f"move them to one device first with .to('cpu') or .to('cuda')"
        ) from error
    # NumPy and CuPy both say "operands could not be broadcast"; our own ops word theirs better
    if isinstance(error, ValueError) and "could not be broadcast" in str(error):
        shapes = " and ".join(str(a.shape) for a in arrays)
        raise ValueError(
            f"{op}: shapes {shapes} do not broadcast together: aligned from the right, each "
            f"pair of sizes must be equal or one of them 1 (reshape or unsqueeze an input)"
        ) from error


def unbroadcast(grad: Any, shape: tuple[int, ...]) -> Any:
    """Sum ``grad`` over the axes that broadcasting added or stretched, to get back ``shape``.

    If x of shape (3, 1) was broadcast to (2, 3, 4) in the forward pass, each x element fed
    2 * 4 outputs, so its gradient is the sum of theirs: sum over axis 0 (added) and the
    last axis (stretched from 1).

    >>> unbroadcast(np.ones((2, 3, 4)), (3, 1)).tolist()
    [[8.0], [8.0], [8.0]]
    >>> unbroadcast(np.ones((2, 3)), ()).item()
    6.0
    """
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    stretched = tuple(
        i + extra for i, n in enumerate(shape) if n == 1 and grad.shape[i + extra] != 1
    )
    grad = grad.sum(axis=tuple(range(extra)) + stretched, keepdims=True)
    return grad.reshape(shape)


def topological_order(root: Tensor) -> list[Tensor]:
    """Every non-leaf tensor that ``root`` depends on, each after all of its inputs.

    An iterative depth-first search: a stack of (node, children_done) pairs replaces the call
    stack, so a chain of any depth works.
    """
    order: list[Tensor] = []
    visited: set[int] = set()
    stack = [(root, False)]
    push, pop, seen = stack.append, stack.pop, visited.add  # bound once: this loop is hot
    while stack:
        node, children_done = pop()
        if children_done:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        seen(id(node))
        push((node, True))
        ctx = node._ctx
        if not ctx.freed:
            for parent in ctx.inputs:
                if parent._ctx is not None and id(parent) not in visited:
                    push((parent, False))
    return order


def backward(
    root: Tensor, grad: Any = None, retain_graph: bool = False, into: dict | None = None
) -> None:
    """Backpropagate from ``root``: add d(root)/d(leaf) (times ``grad``) into every leaf's .grad.

    With ``into`` (a dict), the leaves' gradients go there instead, as ``{id(leaf): (leaf,
    grad)}``, and no ``.grad`` is touched: the gradients of several backward passes (one per
    shard of a batch, say) can then be summed on their own and added together after, and
    backward passes in two threads through graphs that share leaves (the parameters) do not
    write into one array.
    """
    if not root.requires_grad:
        raise RuntimeError(
            "backward() on a tensor that does not require grad: no input of the computation "
            "had requires_grad=True (or it ran under no_grad())"
        )
    xp = xp_of(root.data)
    if grad is None:
        if root.data.size != 1:
            raise RuntimeError(
                f"backward() on a non-scalar tensor of shape {root.shape} needs a gradient: "
                f"pass grad= with that shape, or reduce it first (e.g. .sum() or .mean())"
            )
        grad = xp.ones_like(root.data)
    else:
        # subtle: a Tensor's array is .data, but so is a CuPy array's memory pointer (and a
        # NumPy array's memoryview): only a Tensor is unwrapped
        raw = grad.data if isinstance(grad, _tensor_cls) else grad
        grad = xp.asarray(raw, dtype=root.data.dtype)
        if grad.shape != root.shape:
            raise ValueError(f"backward(): grad has shape {grad.shape}, expected {root.shape}")
    if root._ctx is None:  # a leaf: nothing to walk
        _accumulate_leaf(root, grad, into)
        return

    grads = {id(root): grad}  # gradients of non-leaf tensors, filled as the walk reaches them
    for node in reversed(topological_order(root)):
        grad_out = grads.pop(id(node), None)
        if grad_out is None:  # not on a path from root (cannot happen for a connected graph)
            continue
        ctx = node._ctx
        if ctx.freed:
            raise RuntimeError(
                f"backward through a graph that was already freed (at {ctx.fn_name}): the first "
                f"backward() released its saved arrays; pass retain_graph=True to it to go twice"
            )
        if node._retains_grad:
            # a copy, as for leaves: grad_out may be shared with a sibling input or read-only
            node.grad = grad_out.copy() if node.grad is None else node.grad + grad_out
        input_grads = ctx.fn.backward(ctx, grad_out)
        if type(input_grads) is not tuple:
            input_grads = (input_grads,)
        if anomaly_hook is not None:
            anomaly_hook("backward", ctx.fn, ctx, (grad_out,), input_grads)
        if len(input_grads) != len(ctx.inputs):
            raise ValueError(
                f"{ctx.fn.__name__}.backward returned {len(input_grads)} gradients for "
                f"{len(ctx.inputs)} inputs: return one per input (None where none is needed)"
            )
        input_grads = list(input_grads)  # emptied as we go: see _accumulate_leaf's `owned`
        for k, (t, need) in enumerate(zip(ctx.inputs, ctx.needs_input_grad, strict=True)):
            g, input_grads[k] = input_grads[k], None
            if not need or g is None:
                continue
            if g.shape != t.data.shape:
                g = unbroadcast(g, t.data.shape)
            dtype = t.data.dtype
            if g.dtype is not dtype and g.dtype != dtype:  # `is` first: dtypes are singletons
                g = g.astype(dtype)
            if isinstance(g, np.generic):  # NumPy math on 0-d arrays gives scalars: keep arrays
                g = np.asarray(g)
            if t._ctx is None:
                # subtle: counted before the call below, whose arguments would hold g too
                owned = _refcount(g) == _REFS_OF_A_LOCAL
                _accumulate_leaf(t, g, into, owned)
            else:
                key = id(t)
                # subtle: never add in place: g may be the very array another input received.
                grads[key] = grads[key] + g if key in grads else g
        if not retain_graph:
            ctx.release()


def _accumulate_leaf(t: Tensor, g: Any, into: dict | None = None, owned: bool = False) -> None:
    """Add ``g`` into the leaf's gradient (or into ``into``), taking ``g`` itself as the first
    gradient when ``owned`` says the engine holds the only reference to it.

    Otherwise the first gradient is a copy: g may be shared with another input (Add passes one
    array to both), held elsewhere (a view, a saved array, the caller's ``grad``) or read-only,
    and the leaf's .grad is written in place later (the next accumulation, clipping). PyTorch's
    AccumulateGrad has the same rule: it steals a gradient nothing else references. Taking it
    saves a copy of every parameter per step (on a GPU, one kernel launch each).
    """
    owned = owned and g.base is None and getattr(g.flags, "writeable", True)  # CuPy: no flag
    if into is not None:
        if id(t) in into:
            into[id(t)][1][...] += g
        else:
            into[id(t)] = (t, g if owned else g.copy())
        return
    if t.grad is None:
        t.grad = g if owned else g.copy()
    else:
        t.grad += g


def _refcount(a: Any) -> int:
    return sys.getrefcount(a)


def _refs_of_a_local() -> int:
    """What ``_refcount`` reports for an object that one local name alone refers to: the
    engine compares with this instead of a number that the Python version decides."""
    a = np.empty(0)
    return _refcount(a)


_REFS_OF_A_LOCAL = _refs_of_a_local()
