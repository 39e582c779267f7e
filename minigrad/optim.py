"""Optimisers (SGD, AdamW), parameter groups for weight decay, gradient clipping, and
learning-rate schedules.

An optimiser holds parameter groups (lists of Parameters with their own settings, such as a
learning rate or a weight decay) and, per parameter, a small state (AdamW's moments). ``step``
updates each parameter's array in place from its ``.grad``, on whichever backend holds it
(NumPy or CuPy: the update is written once, against ``xp``). Parameters whose ``.grad`` is
None (frozen ones, or ones the loss did not reach) are skipped, as in PyTorch.

``state_dict`` holds only plain data: numbers, lists and NumPy arrays keyed by the parameter's
index (its position across the groups), so it saves to a safetensors file
(``minigrad.serialization.save_tree``) and a run resumes exactly.

Semantics follow ``torch.optim.SGD`` and ``torch.optim.AdamW`` (the tests compare them step by
step); the schedule follows nanoGPT's ``get_lr``. On the GPU, AdamW's update runs as one fused
elementwise kernel per parameter (``fused``), beside the plain form it is tested equal to.
Left out on purpose: SGD's dampening, AMSGrad, foreach kernels, and schedulers as objects (a
schedule here is a function of the step).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from minigrad.backend import elementwise_kernel, to_numpy, use_fused, xp_of
from minigrad.tensor import Tensor

if TYPE_CHECKING:
    from minigrad.nn.module import Module


class Optimizer:
    """Base class: parameter groups, ``zero_grad``, ``step`` and the state dict.

    ``params`` is a list of Parameters, or a list of groups: dicts with a "params" list and
    any settings that differ from ``defaults`` (e.g. ``{"params": biases, "weight_decay": 0}``).
    Subclasses define ``update`` for one parameter and ``ranges``, the interval each numeric
    setting must lie in, checked for every group, every loaded state and every ``set_lr``.
    """

    # setting -> (low, high, low included?); high is never included, so inf never passes
    ranges: dict[str, tuple[float, float, bool]] = {}

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]):
        self.defaults = dict(defaults)
        groups = [params] if isinstance(params, Tensor) else list(params)
        if groups and not isinstance(groups[0], Mapping):
            groups = [{"params": groups}]  # a plain list of parameters is one group
        self.param_groups: list[dict[str, Any]] = []
        seen: set[int] = set()
        for i, group in enumerate(groups):
            unknown = set(group) - set(defaults) - {"params"}
            if unknown:
                raise ValueError(
                    f"{type(self).__name__}: group {i} has unknown settings {sorted(unknown)}; "
                    f"the settings are {sorted(defaults)}"
                )
            ps = group["params"]
            ps = [ps] if isinstance(ps, Tensor) else list(ps)
            for p in ps:
                if not isinstance(p, Tensor):
                    raise TypeError(f"{type(self).__name__}: expected Tensors, got {type(p)}")
                if id(p) in seen:
                    raise ValueError(f"{type(self).__name__}: a parameter is in two groups")
                seen.add(id(p))
            settings = {**self.defaults, **group, "params": ps}
            self.check_settings(settings, f" (group {i})" if len(groups) > 1 else "")
            self.param_groups.append(settings)
        if not seen:
            raise ValueError(
                f"{type(self).__name__} got no parameters: pass model.parameters() (is every "
                f"parameter frozen?)"
            )
        self.state: dict[int, dict[str, Any]] = {}  # parameter index -> its state

    def check_settings(self, settings: Mapping[str, Any], where: str = "") -> None:
        """Raise a ValueError naming the first setting outside its range (NaN never passes).

        A sequence setting (AdamW's betas) is checked element by element; an absent one is
        left to the caller.
        """
        for name, (low, high, low_included) in self.ranges.items():
            if name not in settings:
                continue
            value = settings[name]
            for v in value if isinstance(value, tuple | list) else (value,):
                real = isinstance(v, numbers.Real) and not isinstance(v, bool)
                if not (real and (low <= v if low_included else low < v) and v < high):
                    interval = f"{'[' if low_included else '('}{low:g}, {high:g})"
                    raise ValueError(
                        f"{type(self).__name__}: {name} must be in {interval}{where}, got {value!r}"
                    )

    def _indexed(self) -> Iterable[tuple[int, Tensor, dict[str, Any]]]:
        """(index, parameter, its group) in a fixed order: the state's keys."""
        i = 0
        for group in self.param_groups:
            for p in group["params"]:
                yield i, p, group
                i += 1

    def zero_grad(self) -> None:
        """Drop every gradient (None, not zeros: the next backward writes fresh arrays)."""
        for _, p, _ in self._indexed():
            p.grad = None

    def step(self, grad_scale: float = 1.0) -> None:
        """Update every parameter that has a gradient, in place.

        ``grad_scale``: update as if each gradient had been multiplied by it first, leaving
        .grad as it is: clipping's factor (``clip_scale``) handed to the optimiser, so that
        AdamW's fused kernel applies it in the launch it makes anyway instead of one more
        launch per gradient (``clip_grad_norm_`` then ``step()`` gives the same update).
        """
        if not (isinstance(grad_scale, numbers.Real) and 0.0 <= grad_scale < math.inf):
            raise ValueError(
                f"{type(self).__name__}.step: grad_scale must be finite and >= 0, got "
                f"{grad_scale!r} (the factor every gradient is multiplied by)"
            )
        for i, p, group in self._indexed():
            if p.grad is None:
                continue
            state = self.state.setdefault(i, {})
            if grad_scale == 1.0:
                self.update(p.data, p.grad, group, state)
            else:
                self.update_scaled(p.data, p.grad, grad_scale, group, state)

    def update(self, p: Any, grad: Any, group: dict[str, Any], state: dict[str, Any]) -> None:
        """Change the array ``p`` in place, given its gradient, settings and state."""
        raise NotImplementedError

    def update_scaled(self, p: Any, grad: Any, grad_scale: float, group: dict, state: dict) -> None:
        """``update`` with the gradient ``grad * grad_scale``: one more array operation here; an
        optimiser that can fold the factor into its own arithmetic overrides this."""
        self.update(p, grad * grad.dtype.type(grad_scale), group, state)

    # ---- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """{"state": {index: {name: array or number}}, "param_groups": [settings + indices]}.

        Arrays are NumPy copies; the parameters themselves appear only as indices.
        """
        state = {
            i: {k: to_numpy(v).copy() if hasattr(v, "shape") else v for k, v in s.items()}
            for i, s in self.state.items()
        }
        groups, start = [], 0
        for group in self.param_groups:
            n = len(group["params"])
            groups.append({**group, "params": list(range(start, start + n))})
            start += n
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore settings and state saved by ``state_dict`` (index keys may be strings).

        Checked first, so a failed load changes nothing: the groups must have the same sizes
        and every saved array the shape of its parameter.
        """
        groups = state_dict["param_groups"]
        for i, saved_group in enumerate(groups):
            self.check_settings(saved_group, f" (saved group {i})")
        sizes = [len(g["params"]) for g in self.param_groups]
        saved_sizes = [len(g["params"]) for g in groups]
        if sizes != saved_sizes:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the saved groups hold {saved_sizes} "
                f"parameters but this optimiser's hold {sizes}; build it over the same "
                f"parameters (and groups) as the saved run"
            )
        params = {i: p for i, p, _ in self._indexed()}
        state = {}
        for key, saved in state_dict["state"].items():
            i = int(key)
            if i not in params:
                raise ValueError(f"{type(self).__name__}.load_state_dict: no parameter {i}")
            p = params[i]
            for name, value in saved.items():
                if hasattr(value, "shape") and tuple(value.shape) != p.shape:
                    raise ValueError(
                        f"{type(self).__name__}.load_state_dict: state {i}.{name} has shape "
                        f"{tuple(value.shape)} but parameter {i} has shape {p.shape}"
                    )
            xp = xp_of(p.data)
            state[i] = {
                name: xp.array(value, dtype=p.dtype) if hasattr(value, "shape") else int(value)
                for name, value in saved.items()
            }
        for group, saved_group in zip(self.param_groups, groups, strict=True):
            # a JSON round trip turns tuples (betas) into lists: turn them back
            settings = {k: tuple(v) if isinstance(v, list) else v for k, v in saved_group.items()}
            group.update({k: v for k, v in settings.items() if k != "params"})
        self.state = state


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov momentum and L2 decay.

    As ``torch.optim.SGD`` (dampening 0): g = grad + wd * p; with momentum,
    buf = mu * buf + g (buf = g on the first step) and g = buf, or g + mu * buf for Nesterov;
    then p -= lr * g.
    """

    ranges = {
        "lr": (0.0, math.inf, True),
        "momentum": (0.0, math.inf, True),
        "weight_decay": (0.0, math.inf, True),
    }

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        if nesterov and momentum == 0:
            raise ValueError("SGD: nesterov=True needs momentum > 0")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
        }
        super().__init__(params, defaults)

    def update(self, p, grad, group, state):
        lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
        if wd:
            grad = grad + wd * p  # L2 regularisation: coupled to the gradient, unlike AdamW
        if mu:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.copy()
            else:
                buf *= mu
                buf += grad
            grad = grad + mu * buf if group["nesterov"] else buf
        p -= lr * grad


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019), as ``torch.optim.AdamW``.

    Per step t (from 1), with g the gradient:
        p = p * (1 - lr * wd)                        decay first, apart from the gradient
        m = b1 * m + (1 - b1) * g                    first moment (mean)
        v = b2 * v + (1 - b2) * g^2                  second moment (uncentred variance)
        p = p - lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)
    The (1 - b^t) factors undo the moments' bias towards their zero start.

    ``fused``: the whole update as one elementwise CUDA kernel per parameter (``_ADAMW_KERNEL``)
    instead of a dozen array operations that each launch their own (855 launches of a baby-gpt
    step's optimiser, bench/gpu_step_counts.py). None, the default: fused where a parameter is
    on the GPU and ``minigrad.set_fast_paths`` leaves the fast paths on; False: the plain
    form everywhere. The CPU always runs the plain form.
    """

    # subtle: eps > 0, not PyTorch's eps >= 0: with eps = 0 a zero gradient makes 0 / 0 = NaN
    ranges = {
        "lr": (0.0, math.inf, True),
        "betas": (0.0, 1.0, True),
        "eps": (0.0, math.inf, False),
        "weight_decay": (0.0, math.inf, True),
    }

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        fused: bool | None = None,
    ):
        if len(tuple(betas)) != 2:
            raise ValueError(f"AdamW: betas must be a pair (b1, b2), got {betas!r}")
        if fused not in (None, False):
            raise ValueError(
                f"AdamW: fused={fused!r}: None (fused on the GPU, the default) or False "
                f"(the plain form everywhere)"
            )
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.fused = fused

    def update_scaled(self, p, grad, grad_scale, group, state):
        self.update(p, grad, group, state, grad_scale)  # in the fused kernel's one launch

    def update(self, p, grad, group, state, grad_scale=1.0):
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        b1, b2 = group["betas"]
        xp = xp_of(p)
        if not state:  # the first step: moments start at zero
            state.update(step=0, exp_avg=xp.zeros_like(p), exp_avg_sq=xp.zeros_like(p))
        state["step"] += 1
        t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
        if self.fused is None and use_fused(p) and _fusable(p, grad):
            step_size, bias2_sqrt = lr / (1 - b1**t), math.sqrt(1 - b2**t)
            kernel = elementwise_kernel(xp, *_ADAMW_KERNEL)
            args = (1 - lr * wd, b1, b2, 1 - b1, 1 - b2, step_size, bias2_sqrt, eps)
            kernel(grad, grad_scale, *args, p, m, v)
            return
        if grad_scale != 1.0:  # from update_scaled: the product first, .grad left as it is
            grad = grad * grad.dtype.type(grad_scale)
        if wd:
            p *= 1 - lr * wd
        # in place through two scratch arrays, not a temporary per operation, each rounding
        # as in the formula above (subtle: out= keeps a 0-d parameter an array, not a scalar)
        denom = xp.multiply(grad, grad, out=xp.empty_like(p))
        denom *= 1 - b2
        v *= b2
        v += denom
        step = xp.multiply(grad, 1 - b1, out=xp.empty_like(p))
        m *= b1
        m += step
        xp.sqrt(v, out=denom)
        denom /= math.sqrt(1 - b2**t)
        denom += eps
        xp.multiply(m, lr / (1 - b1**t), out=step)
        step /= denom
        p -= step


# The update above as one CUDA kernel: the same operations in the same order, each rounding to
# T (CuPy casts the Python-float settings to the parameter's dtype, as NumPy does); on a GPU
# nvcc contracts a * b + c into one fused multiply-add, so the last bit may differ.
_ADAMW_KERNEL = (
    "T grad, T grad_scale, T decay, T b1, T b2, T one_minus_b1, T one_minus_b2, T step_size, "
    "T bias2_sqrt, T eps",
    "T p, T m, T v",
    """
    T g = grad * grad_scale;  // clipping's factor (1: exact, the gradient as it is)
    p = p * decay;
    v = v * b2 + g * g * one_minus_b2;
    m = m * b1 + g * one_minus_b1;
    p = p - m * step_size / (sqrt(v) / bias2_sqrt + eps);
    """,
    "minigrad_adamw",
)


def _fusable(p: Any, grad: Any) -> bool:
    """The kernel takes one dtype and contiguous arrays of one shape; else the plain form."""
    same = grad.dtype == p.dtype and grad.shape == p.shape
    return same and p.flags.c_contiguous and grad.flags.c_contiguous


def param_groups_for_decay(model: Module, weight_decay: float) -> list[dict[str, Any]]:
    """nanoGPT's two groups: every trainable parameter with ndim >= 2 decays (weight matrices
    and embeddings); 1-D ones (biases, norm gains) do not. Frozen parameters are left out.

    >>> from minigrad.nn import Linear, Sequential, LayerNorm
    >>> groups = param_groups_for_decay(Sequential(Linear(4, 4), LayerNorm(4)), 0.1)
    >>> [(len(g["params"]), g["weight_decay"]) for g in groups]
    [(1, 0.1), (3, 0.0)]
    """
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def clip_grad_norm_(params: Iterable[Tensor] | Tensor, max_norm: float) -> float:
    """Scale all gradients together so their global L2 norm is at most ``max_norm``, in place.

    Returns the norm before clipping. As ``torch.nn.utils.clip_grad_norm_``: the scale is
    max_norm / (norm + 1e-6), applied only when it is below 1. A training step can instead hand
    ``clip_scale(grad_norm(params), max_norm)`` to ``optimizer.step(grad_scale=...)``: the same
    update, without a pass over every gradient first.

    >>> import numpy as np
    >>> p = Tensor(np.zeros(2), requires_grad=True); p.grad = np.array([3.0, 4.0])
    >>> clip_grad_norm_([p], max_norm=1.0), p.grad.round(4).tolist()
    (5.0, [0.6, 0.8])
    """
    params = [params] if isinstance(params, Tensor) else list(params)
    norm = grad_norm(params)
    scale = clip_scale(norm, max_norm)
    if scale < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad *= scale
    return norm


def grad_norm(params: Iterable[Tensor]) -> float:
    """The global L2 norm of the gradients of ``params`` (0.0 when none has one), read to the
    host once.

    >>> import numpy as np
    >>> p = Tensor(np.zeros(2), requires_grad=True); p.grad = np.array([3.0, 4.0])
    >>> grad_norm([p])
    5.0
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    xp = xp_of(grads[0])
    # subtle: sum on the device and convert once: float() per gradient would sync a GPU each time
    if xp is np:
        squares = sum(np.vdot(g.ravel(), g.ravel()) for g in grads)
    else:  # one copy and one dot on the GPU, not a dot and an add (two launches) per gradient
        flat = xp.concatenate([g.ravel() for g in grads])
        squares = xp.vdot(flat, flat)
    return float(xp.sqrt(squares))


def clip_scale(norm: float, max_norm: float) -> float:
    """The factor clipping multiplies every gradient by: max_norm / (norm + 1e-6), or 1.0 when
    that is not below 1 (PyTorch's rule).

    >>> clip_scale(5.0, 1.0) < 1.0, clip_scale(0.5, 1.0)
    (True, 1.0)
    """
    scale = max_norm / (norm + 1e-6)
    return scale if scale < 1.0 else 1.0


# ---- learning-rate schedules: plain functions of the step --------------------------------------
def constant_lr(step: int, lr: float) -> float:
    """The same rate at every step.

    >>> constant_lr(100, 3e-4)
    0.0003
    """
    return lr


def cosine_lr(
    step: int, max_lr: float, min_lr: float, warmup_steps: int, decay_steps: int
) -> float:
    """Linear warmup, then a cosine decay to ``min_lr`` at ``decay_steps``, then ``min_lr``.

    As nanoGPT's ``get_lr``:
        step < warmup_steps:         max_lr * (step + 1) / (warmup_steps + 1)
        warmup <= step < decay:      min_lr + (max_lr - min_lr) * (1 + cos(pi * ratio)) / 2,
                                     ratio = (step - warmup_steps) / (decay_steps - warmup_steps)
        step >= decay_steps:         min_lr
    The warmup never returns 0: the first step already moves the weights a little.

    >>> [round(cosine_lr(s, 1.0, 0.1, warmup_steps=4, decay_steps=8), 3) for s in (0, 3, 4, 6, 9)]
    [0.2, 0.8, 1.0, 0.55, 0.1]
    """
    if decay_steps < warmup_steps:
        raise ValueError(f"cosine_lr: decay_steps {decay_steps} < warmup_steps {warmup_steps}")
    if step < warmup_steps:
        return max_lr * (step + 1) / (warmup_steps + 1)
    if step >= decay_steps:
        return min_lr
    ratio = (step - warmup_steps) / (decay_steps - warmup_steps)
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * ratio))


def set_lr(optimizer: Optimizer, lr: float) -> None:
    """Set the learning rate of every group (call it before each ``step`` with the schedule's
    value); a NaN or negative ``lr`` is refused before any group changes."""
    for group in optimizer.param_groups:
        optimizer.check_settings({**group, "lr": lr})
    for group in optimizer.param_groups:
        group["lr"] = lr
