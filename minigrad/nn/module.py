"""Module and Parameter: how layers hold their weights, and the containers that nest them.

A ``Parameter`` is a Tensor that the optimiser should train. A ``Module`` finds its Parameters
and sub-modules by walking its own attributes in the order they were assigned (``vars(self)``
is an insertion-ordered dict), so nothing has to be registered by hand and every walk is
deterministic: ``named_parameters()`` always lists ``blocks.0.attn.wq.weight`` before
``blocks.0.attn.wk.weight`` when ``wq`` was assigned first.

Containers: ``ModuleList``, ``ModuleDict`` and ``Sequential``. A plain Python list (or tuple,
or dict) of modules assigned to an attribute raises a TypeError that names the fix: PyTorch
silently ignores such a list, and its layers then silently never train.

A tensor used by the same module twice (tied weights) is listed once, under the first name
the walk reaches; ``state_dict`` and ``load_state_dict`` follow the same rule.

Buffers (``register_buffer``) are non-trainable tensors such as a RoPE table: they move with
``.to()`` and are cast by ``.double()``; persistent ones also go into ``state_dict``.

Left out on purpose: hooks, ``apply``, and parameters of mixed devices.
Follows ``torch.nn.Module``'s interface, so code written against either reads the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from minigrad.backend import check_device, to_device, to_numpy, xp_of
from minigrad.tensor import Tensor


class Parameter(Tensor):
    """A Tensor that requires grad by default: the weights a Module trains.

    >>> Parameter(np.zeros(2, dtype=np.float32))
    Parameter([0., 0.], dtype=float32, requires_grad=True)
    """

    __slots__ = ()

    def __init__(self, data: Any, requires_grad: bool = True):
        data = data.data if isinstance(data, Tensor) else data
        if not hasattr(data, "dtype"):  # nested lists and numbers: float32, as everywhere
            data = np.asarray(data, dtype=np.float32)
        if data.dtype.kind != "f":
            raise TypeError(
                f"a Parameter must be floating point, got dtype {data.dtype}: integer tensors "
                f"cannot be trained (keep them as a buffer with register_buffer)"
            )
        super().__init__(data, requires_grad=requires_grad)

    def __repr__(self) -> str:
        return "Parameter" + super().__repr__()[len("tensor") :]


class LoadResult(NamedTuple):
    """What ``load_state_dict(strict=False)`` left out (both empty after a strict load)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class of every layer: subclasses set attributes in ``__init__`` and define ``forward``.

    >>> class Affine(Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.w = Parameter(np.ones(3, dtype=np.float32))
    ...         self.b = Parameter(np.zeros(3, dtype=np.float32))
    ...     def forward(self, x):
    ...         return x * self.w + self.b
    >>> [name for name, _ in Affine().named_parameters()]
    ['w', 'b']
    """

    def __init__(self) -> None:
        # object.__setattr__: our own __setattr__ checks for _buffers, which does not exist yet
        object.__setattr__(self, "_buffers", {})  # buffer name -> persistent?
        object.__setattr__(self, "training", True)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, (Module, Parameter)) and "_buffers" not in self.__dict__:
            raise AttributeError(
                f"cannot assign {name!r} before Module.__init__() ran: call super().__init__() "
                f"first in {type(self).__name__}.__init__"
            )
        if _holds_modules(value):
            kind = "ModuleDict" if isinstance(value, Mapping) else "ModuleList"
            raise TypeError(
                f"{type(self).__name__}.{name}: a plain {type(value).__name__} of modules or "
                f"Parameters would hide them from the optimiser; wrap modules: "
                f"self.{name} = {kind}(...), and give each Parameter its own attribute"
            )
        object.__setattr__(self, name, value)

    # ---- walking the tree ------------------------------------------------------------------
    def _members(self) -> Iterator[tuple[str, Any]]:
        """This module's own Parameters and sub-modules, by name, in assignment order.

        The one place the tree is read; ModuleList and ModuleDict override it.
        """
        for name, value in vars(self).items():
            if isinstance(value, (Parameter, Module)):
                yield name, value

    def _set_child(self, name: str, module: Module) -> None:
        """Replace the sub-module called ``name`` (used by LoRA to wrap layers in place)."""
        setattr(self, name, module)

    def named_children(self) -> list[tuple[str, Module]]:
        return [(name, m) for name, m in self._members() if isinstance(m, Module)]

    def children(self) -> list[Module]:
        return [m for _, m in self.named_children()]

    def named_modules(self, prefix: str = "") -> list[tuple[str, Module]]:
        """Every module in the tree, this one first (named ``prefix``), each listed once."""
        out: list[tuple[str, Module]] = []
        seen: set[int] = set()

        def visit(module: Module, name: str) -> None:
            if id(module) in seen:
                return
            seen.add(id(module))
            out.append((name, module))
            for child_name, child in module.named_children():
                visit(child, f"{name}.{child_name}" if name else child_name)

        visit(self, prefix)
        return out

    def modules(self) -> list[Module]:
        return [m for _, m in self.named_modules()]

    def _named_tensors_with_aliases(self) -> list[tuple[str, Tensor]]:
        """Every (dotted name, Parameter) pair, a tied Parameter once per name it has."""
        out = []
        for prefix, module in self.named_modules():
            for name, value in module._members():
                if isinstance(value, Parameter):
                    out.append((f"{prefix}.{name}" if prefix else name, value))
        return out

    def named_parameters(self) -> list[tuple[str, Parameter]]:
        """(dotted name, Parameter) pairs, e.g. ``("blocks.0.attn.wq.weight", p)``.

        Deterministic: modules in assignment order, depth first. A tied Parameter appears
        once, under the first name reached.
        """
        seen: set[int] = set()
        out = []
        for name, p in self._named_tensors_with_aliases():
            if id(p) not in seen:
                seen.add(id(p))
                out.append((name, p))
        return out

    def parameters(self) -> list[Parameter]:
        """Every Parameter, frozen ones included (as in PyTorch); a list, so it can be reused."""
        return [p for _, p in self.named_parameters()]

    def register_buffer(self, name: str, tensor: Any, persistent: bool = False) -> None:
        """Attach a non-trainable tensor (e.g. a RoPE table) that moves and casts with the module.

        ``persistent=True`` also puts it into ``state_dict``. It stays a plain attribute, so
        ``self.name`` reads it and assigning ``self.name = ...`` later keeps it a buffer.
        """
        if "_buffers" not in self.__dict__:
            raise AttributeError(f"call super().__init__() before register_buffer({name!r})")
        if isinstance(tensor, Parameter) or isinstance(getattr(self, name, None), Parameter):
            raise TypeError(f"register_buffer({name!r}): a Parameter cannot also be a buffer")
        if tensor is not None and not isinstance(tensor, Tensor):
            tensor = Tensor(tensor)
        setattr(self, name, tensor)
        self._buffers[name] = persistent

    def named_buffers(self, persistent_only: bool = False) -> list[tuple[str, Tensor]]:
        out = []
        for prefix, module in self.named_modules():
            for name, persistent in module._buffers.items():
                value = getattr(module, name)
                if value is not None and (persistent or not persistent_only):
                    out.append((f"{prefix}.{name}" if prefix else name, value))
        return out

    # ---- modes and gradients ---------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Set ``.training`` on every module in the tree (Dropout reads it)."""
        for _, m in self.named_modules():
            m.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def requires_grad_(self, flag: bool = True) -> Module:
        """Freeze (False) or unfreeze (True) every Parameter in the tree."""
        for p in self.parameters():
            p.requires_grad_(flag)
            if not flag:
                p.grad = None
        return self

    def num_parameters(self, trainable_only: bool = False) -> int:
        """How many numbers the model holds (tied weights counted once)."""
        return sum(p.size for p in self.parameters() if p.requires_grad or not trainable_only)

    # ---- devices and dtypes ----------------------------------------------------------------
    def to(self, device: str) -> Module:
        """Move every Parameter, gradient and buffer to ``device``, in place; returns self.

        In place, so an optimiser built earlier still holds the same Parameter objects (but
        build it after the move: its moment arrays stay where they were created).
        """
        device = check_device(device)
        for t in self.parameters() + [b for _, b in self.named_buffers()]:
            t.data = to_device(t.data, device)
            if t.grad is not None:
                t.grad = to_device(t.grad, device)
        return self

    def _cast(self, dtype: Any) -> Module:
        for t in self.parameters() + [b for _, b in self.named_buffers()]:
            if t.dtype.kind == "f":  # integer buffers (token ids, masks) keep their dtype
                t.data = t.data.astype(dtype)
                t.grad = None
        return self

    def double(self) -> Module:
        """Convert floating Parameters and buffers to float64 in place (for gradchecks)."""
        return self._cast(np.float64)

    def float(self) -> Module:
        """Convert floating Parameters and buffers to float32 in place."""
        return self._cast(np.float32)

    # ---- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Dotted name -> a NumPy copy of every Parameter and persistent buffer."""
        return {name: to_numpy(t.data).copy() for name, t in self._state_tensors()}

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> LoadResult:
        """Copy arrays from ``state`` into the Parameters and persistent buffers, in place.

        Every key is checked before anything is copied, so a failed load leaves the model as it
        was. ``strict=True`` raises on missing and unexpected keys; ``strict=False`` loads what
        matches and returns them. A wrong shape always raises. A tied Parameter may appear
        under any one of its names (or several, as in a PyTorch state dict).
        """
        targets = self._named_tensors_with_aliases() + self.named_buffers(persistent_only=True)
        by_name = dict(targets)
        found = {id(by_name[k]) for k in state if k in by_name}
        missing = [name for name, t in self._state_tensors() if id(t) not in found]
        unexpected = [k for k in state if k not in by_name]
        if strict and (missing or unexpected):
            raise KeyError(
                f"load_state_dict: missing keys {missing} (in the model, not in the state "
                f"dict) and unexpected keys {unexpected} (in the state dict, not in the model); "
                f"check the model's config, or pass strict=False to load the keys that match"
            )
        state = {k: v.data if isinstance(v, Tensor) else v for k, v in state.items()}
        for key, value in state.items():
            if key in by_name and tuple(value.shape) != by_name[key].shape:
                raise ValueError(
                    f"load_state_dict: {key!r} has shape {tuple(value.shape)} in the state dict "
                    f"but {by_name[key].shape} in the model; the checkpoint was made for a "
                    f"different config"
                )
        for key, value in state.items():
            if key in by_name:
                t = by_name[key]
                t.data[...] = xp_of(t.data).asarray(to_numpy(value), dtype=t.dtype)
        return LoadResult(missing, unexpected)

    def _state_tensors(self) -> list[tuple[str, Tensor]]:
        """The (name, tensor) pairs ``state_dict`` saves, not copied."""
        return self.named_parameters() + self.named_buffers(persistent_only=True)

    # ---- printing --------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """The settings shown between the parentheses, e.g. ``in=128, out=512, bias=True``."""
        return ""

    def __repr__(self) -> str:
        children = self.named_children()
        if not children:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, child in children:
            body = repr(child).replace("\n", "\n  ")  # indent the child's own lines
            lines.append(f"  ({name}): {body}")
        return "\n".join(lines) + "\n)"


def _holds_modules(value: Any) -> bool:
    """True for a plain list, tuple, set or dict that contains a Module or a Parameter."""
    if isinstance(value, Module):  # a ModuleDict is a Mapping too: it is fine
        return False
    if isinstance(value, Mapping):
        value = value.values()
    elif not isinstance(value, (list, tuple, set)):
        return False
    return any(isinstance(v, (Module, Parameter)) for v in value)


class ModuleList(Module):
    """A list of modules whose parameters are found, named by index: ``blocks.0.attn...``.

    >>> from minigrad.nn import Linear
    >>> layers = ModuleList([Linear(2, 2), Linear(2, 3)])
    >>> [name for name, _ in layers.named_parameters()]
    ['0.weight', '0.bias', '1.weight', '1.bias']
    """

    def __init__(self, modules: Iterable[Module] = ()):
        super().__init__()
        self._list: list[Module] = []
        self.extend(modules)

    def _members(self) -> Iterator[tuple[str, Any]]:
        return ((str(i), m) for i, m in enumerate(self._list))

    def _set_child(self, name: str, module: Module) -> None:
        self[int(name)] = module

    def append(self, module: Module) -> ModuleList:
        self._list.append(_check_module(module, f"{type(self).__name__}.append"))
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return type(self)(self._list[index])
        return self._list[index]

    def __setitem__(self, index: int, module: Module) -> None:
        self._list[index] = _check_module(module, f"{type(self).__name__}[{index}]")

    def __len__(self) -> int:
        return len(self._list)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._list)


class Sequential(ModuleList):
    """Modules applied one after another: ``Sequential(a, b)(x) == b(a(x))``."""

    def __init__(self, *modules: Module):
        super().__init__(modules)

    def forward(self, x: Any) -> Any:
        for module in self:
            x = module(x)
        return x


class ModuleDict(Module):
    """A dict of modules whose parameters are found, named by key: ``heads.mlp.w1.weight``."""

    def __init__(self, modules: Mapping[str, Module] | None = None):
        super().__init__()
        self._dict: dict[str, Module] = {}
        for key, module in (modules or {}).items():
            self[key] = module

    def _members(self) -> Iterator[tuple[str, Any]]:
        return iter(list(self._dict.items()))

    def _set_child(self, name: str, module: Module) -> None:
        self[name] = module

    def __getitem__(self, key: str) -> Module:
        return self._dict[key]

    def __setitem__(self, key: str, module: Module) -> None:
        if not isinstance(key, str) or "." in key or not key:
            raise KeyError(f"ModuleDict keys must be non-empty strings without '.', got {key!r}")
        self._dict[key] = _check_module(module, f"ModuleDict[{key!r}]")

    def __contains__(self, key: object) -> bool:
        return key in self._dict

    def __len__(self) -> int:
        return len(self._dict)

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict)

    def keys(self) -> list[str]:
        return list(self._dict)

    def values(self) -> list[Module]:
        return list(self._dict.values())

    def items(self) -> list[tuple[str, Module]]:
        return list(self._dict.items())


def _check_module(module: Any, where: str) -> Module:
    if not isinstance(module, Module):
        raise TypeError(f"{where}: expected a Module, got {type(module).__name__}")
    return module
