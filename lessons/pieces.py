"""Your answers, reused: the pieces the capstone builds its model from.

When ``check`` passes on an answer you wrote in a notebook, it records the answer's source in
``lessons/mine/<lesson>_<name>.py`` (git ignores that folder), with the imports it needs and
the notebook helpers it calls. A later lesson asks for it back:

- ``load(lesson, name)`` returns your answer if one is recorded, loads, and still passes its
  check; otherwise the reference answer from ``solutions/``, with a note saying why.
- ``report()`` prints each piece a lesson used and whose it is.
- ``assemble(model)`` rewires a ``Decoder`` so that its layers run on the pieces: every linear
  layer's backward is your ``matmul_backward`` (lesson 1), attention's forward your
  ``causal_attention`` (lesson 5) with a backward from your ``softmax_backward`` (lesson 2)
  and ``matmul_backward``, the norms' backward your ``layer_norm_backward`` (lesson 6), the
  embeddings' backward your ``embedding_backward`` (lesson 4).
- ``PiecesAdamW`` is an optimiser made of lesson 8's pieces: your ``clip_by_global_norm``, then
  your ``adam_l2_step`` (with its L2 term at 0) plus decoupled weight decay.

Only answers written in a notebook (module ``__main__``) are recorded: never a stub (its check
ran on the solution), never a reference solution, never a test's answer.

>>> import minigrad as mg
>>> from decoder.model.config import ModelConfig
>>> from decoder.model.model import Decoder
>>> _ = mg.manual_seed(0)
>>> model = Decoder(ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
>>> want = model(np.arange(8)[None] % 11)[0].numpy()
>>> _ = assemble(model, quiet=True)
>>> bool(np.allclose(model(np.arange(8)[None] % 11)[0].numpy(), want, atol=1e-5))
True
"""

from __future__ import annotations

import ast
import builtins
import dis
import inspect
import math
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from exercises import run_check, solution

from minigrad import Function, Tensor
from minigrad.nn import Module
from minigrad.optim import AdamW, Optimizer

MINE = Path(__file__).resolve().parent / "mine"
"""Where recorded answers live (one file per answer); tests point it at a temporary folder."""

HEADER = (
    '"""Recorded by check(): your answer to {lesson} {name}, for later lessons."""\n\n'
    "import math\n\nimport numpy as np\n\n"
    "import minigrad as mg\nfrom minigrad import functional as F\n"
)

WHOSE: dict[tuple[str, str], str] = {}
"""(lesson, name) -> whose the piece in use is: "yours", or "solution: <why>"."""


# ---- recording ----------------------------------------------------------------------------------
def path_of(lesson: str, name: str) -> Path:
    return MINE / f"{lesson}_{name}.py"


def record(lesson: str, name: str, answer: Any) -> Path | None:
    """Save ``answer``'s source for later lessons; the file, or None when it is not recorded
    (not written in a notebook, or its source cannot be read back)."""
    if not inspect.isfunction(answer) or answer.__module__ != "__main__":
        return None  # a solution, a test's answer, a bound method: never recorded
    if not answer.__name__.isidentifier():
        return None  # a lambda: no name to give it back by
    try:
        body = _sources(answer)
    except (OSError, TypeError, ValueError):
        return None  # no source to read (a lambda typed at a prompt): nothing to save
    MINE.mkdir(exist_ok=True)
    path = path_of(lesson, name)
    path.write_text(
        HEADER.format(lesson=lesson, name=name)
        + "\n\n"
        + body
        + f"\n\nANSWER = {answer.__name__}\n"
    )
    return path


def _sources(answer: Callable[..., Any]) -> str:
    """The source of ``answer``, with what it needs from the notebook before it: the helpers
    it calls (defined there), the modules and names it imported, the constants it reads."""
    imports: list[str] = []
    defined: list[str] = []
    seen: set[str] = set()

    def visit(fn: Any) -> None:
        for name in sorted(_global_names(fn)):
            if name in seen or not hasattr(fn, "__globals__") or name not in fn.__globals__:
                continue
            seen.add(name)
            value = fn.__globals__[name]
            if isinstance(value, types.ModuleType):
                imports.append(f"import {value.__name__} as {name}")
            elif getattr(value, "__module__", None) == "__main__" and (
                inspect.isfunction(value) or inspect.isclass(value)
            ):
                visit(value)
                defined.append(inspect.getsource(value))
            elif inspect.isfunction(value) or inspect.isclass(value) or callable(value):
                module = getattr(value, "__module__", None)
                qualname = getattr(value, "__qualname__", "<an object>")
                if not module or "." in qualname or "<" in qualname:
                    raise ValueError(f"cannot record {name}")
                imports.append(f"from {module} import {qualname} as {name}")
            else:
                text = repr(value)
                ast.literal_eval(text)  # a constant that reads back, or ValueError
                imports.append(f"{name} = {text}")

    visit(answer)
    parts = ["\n".join(imports)] if imports else []
    return "\n\n".join([*parts, *defined, inspect.getsource(answer)]).rstrip() + "\n"


def _global_names(fn: Any) -> set[str]:
    """Names a function (or a class's methods) reads from its module, builtins left out."""
    codes = [fn.__code__] if inspect.isfunction(fn) else []
    if inspect.isclass(fn):
        codes = [f.__code__ for f in vars(fn).values() if inspect.isfunction(f)]
        codes += [f.__func__.__code__ for f in vars(fn).values() if isinstance(f, staticmethod)]
    names: set[str] = set()
    while codes:
        code = codes.pop()
        # the names it loads as globals; co_names also holds attribute names (layer.base)
        names.update(
            op.argval
            for op in dis.get_instructions(code)
            if op.opname in ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL")
        )
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return {n for n in names if not hasattr(builtins, n)}


# ---- loading ------------------------------------------------------------------------------------
def load(lesson: str, name: str, verify: bool = True) -> Callable[..., Any]:
    """Your recorded answer to ``name`` of ``lesson``, or the reference one where there is none
    or it does not load (or, with ``verify``, no longer passes its check); ``WHOSE`` notes which.
    An answer under its check may not call it: ``exercises.own_work`` watches this module.
    """
    path = path_of(lesson, name)
    if not path.exists():
        WHOSE[lesson, name] = "solution: not written yet"
        return solution(lesson, name)
    key = (str(path), path.stat().st_mtime_ns)
    if key in _LOADED:  # loaded (and checked) already in this session
        WHOSE[lesson, name] = _LOADED[key][1]
        return _LOADED[key][0]
    answer, WHOSE[lesson, name] = _load_file(lesson, name, path, verify)
    _LOADED[key] = answer, WHOSE[lesson, name]
    return answer


_LOADED: dict[tuple[str, int], tuple[Callable[..., Any], str]] = {}


def _load_file(lesson: str, name: str, path: Path, verify: bool) -> tuple[Callable[..., Any], str]:
    try:
        module = types.ModuleType(f"mine.{lesson}_{name}")
        module.__file__ = str(path)
        exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
        answer = module.ANSWER
        if verify:
            run_check(lesson, name, answer)
    except Exception as e:  # noqa: BLE001 (any failure: fall back, and say why)
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:120]
        print(f"{lesson} {name}: {path.name} did not load ({why}); using the solution")
        return solution(lesson, name), f"solution: yours did not load ({why})"
    return answer, "yours"


def note(lesson: str, name: str, answer: Any) -> None:
    """Note whose a function of the lesson at hand is: "yours" unless it is still a stub."""
    WHOSE[lesson, name] = "solution: not written yet" if _is_stub(answer) else "yours"


def _is_stub(answer: Any) -> bool:
    try:
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(answer)))
    except (OSError, TypeError, SyntaxError):
        return False
    body = [
        s for s in tree.body[0].body if not isinstance(s, ast.Expr | ast.Pass) or _calls_todo(s)
    ]
    return len(body) == 1 and _calls_todo(body[0])


def _calls_todo(statement: ast.stmt) -> bool:
    value = getattr(statement, "value", None)
    return isinstance(value, ast.Call) and getattr(value.func, "id", None) == "todo"


def report() -> None:
    """A table of each piece used so far and whose it is."""
    width = max((len(f"{lesson} {name}") for lesson, name in WHOSE), default=10)
    for (lesson, name), whose in WHOSE.items():
        print(f"{lesson + ' ' + name:<{width}}  {whose}")
    mine = sum(w == "yours" for w in WHOSE.values())
    print(f"{mine} of {len(WHOSE)} pieces are yours.")


# ---- the model's layers, on the pieces ----------------------------------------------------------
class LinearFn(Function):
    """y = x W^T for x (..., in), W (out, in); the backward is lesson 1's matmul_backward."""

    @staticmethod
    def forward(ctx, x, w, matmul_backward):
        x2 = x.reshape(-1, x.shape[-1])  # (..., in) -> (N, in)
        ctx.save_for_backward(x2, w)
        ctx.shape, ctx.matmul_backward = x.shape, matmul_backward
        return (x2 @ w.T).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, grad_out):
        x2, w = ctx.saved
        g2 = grad_out.reshape(-1, w.shape[0])  # (..., out) -> (N, out)
        grad_x, grad_wt = ctx.matmul_backward(x2, w.T, g2)  # for z = x2 @ W^T
        return np.asarray(grad_x).reshape(ctx.shape), np.asarray(grad_wt).T


class EmbeddingFn(Function):
    """Rows of W (V, C) looked up by ids; the backward is lesson 4's embedding_backward."""

    @staticmethod
    def forward(ctx, w, ids, embedding_backward):
        ctx.ids, ctx.V, ctx.embedding_backward = ids, w.shape[0], embedding_backward
        return w[ids]

    @staticmethod
    def backward(ctx, grad_out):
        return ctx.embedding_backward(ctx.ids, grad_out, ctx.V)


class LayerNormFn(Function):
    """(x - mean) / sqrt(var + eps) * weight over the last axis, no shift; the input gradient
    is lesson 6's layer_norm_backward, the gain's is sum(grad_out * xhat)."""

    @staticmethod
    def forward(ctx, x, weight, eps, layer_norm_backward):
        xhat = (x - x.mean(axis=-1, keepdims=True)) / np.sqrt(x.var(axis=-1, keepdims=True) + eps)
        ctx.save_for_backward(x, weight, xhat)
        ctx.eps, ctx.layer_norm_backward = eps, layer_norm_backward
        return xhat * weight

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, xhat = ctx.saved
        grad_x = ctx.layer_norm_backward(x, weight, grad_out, ctx.eps)
        grad_w = (grad_out * xhat).reshape(-1, x.shape[-1]).sum(axis=0)
        return np.asarray(grad_x, dtype=x.dtype), grad_w


class AttentionFn(Function):
    """Causal attention of every head of q, k, v (B, nh, T, hs): the forward is lesson 5's
    causal_attention, one head at a time; the backward recomputes each head's probabilities
    and runs lesson 1's matmul_backward and lesson 2's softmax_backward through them."""

    @staticmethod
    def forward(ctx, q, k, v, causal_attention, softmax_backward, matmul_backward):
        ctx.save_for_backward(q, k, v)
        ctx.softmax_backward, ctx.matmul_backward = softmax_backward, matmul_backward
        out = np.empty_like(q)
        for b, h in np.ndindex(*q.shape[:2]):
            out[b, h] = causal_attention(q[b, h].copy(), k[b, h].copy(), v[b, h].copy())
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved
        T, hs = q.shape[-2:]
        scale = 1.0 / math.sqrt(hs)
        future = np.triu(np.ones((T, T), dtype=bool), k=1)
        grads = [np.empty_like(a) for a in (q, k, v)]
        for b, h in np.ndindex(*q.shape[:2]):
            s = np.where(future, -np.inf, q[b, h] @ k[b, h].T * scale)  # (T, T) scores
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            grad_p, grad_v = ctx.matmul_backward(p, v[b, h], grad_out[b, h])  # out = p @ v
            grad_s = ctx.softmax_backward(p, grad_p) * scale  # p = softmax(s)
            grad_q, grad_kt = ctx.matmul_backward(q[b, h], k[b, h].T, grad_s)  # s = q @ k^T
            grads[0][b, h], grads[1][b, h], grads[2][b, h] = grad_q, grad_kt.T, grad_v
        return tuple(grads)


class PiecesLinear(Module):
    def __init__(self, linear: Module, matmul_backward: Callable[..., Any]):
        super().__init__()
        if getattr(linear, "bias", None) is not None:
            raise ValueError("pieces: a Linear with a bias is not wired (the course's has none)")
        self.weight, self.matmul_backward = linear.weight, matmul_backward

    def forward(self, x: Tensor) -> Tensor:
        return LinearFn.apply(x, self.weight, matmul_backward=self.matmul_backward)


class PiecesEmbedding(Module):
    """A token table (``tok_emb(ids)``) or a position table (``pos_emb(T)``: ids 0..T-1)."""

    def __init__(self, table: Module, embedding_backward: Callable[..., Any], positions: bool):
        super().__init__()
        self.weight, self.positions = table.weight, positions
        self.embedding_backward = embedding_backward

    def forward(self, ids: Any, offset: int = 0) -> Tensor:
        if self.positions:
            ids = np.arange(offset, offset + ids)  # pos_emb(T): the rows of positions 0 .. T-1
        ids = np.asarray(ids.data if isinstance(ids, Tensor) else ids).astype(np.int64)
        return EmbeddingFn.apply(self.weight, ids=ids, embedding_backward=self.embedding_backward)


class PiecesLayerNorm(Module):
    def __init__(self, norm: Module, layer_norm_backward: Callable[..., Any]):
        super().__init__()
        if getattr(norm, "bias", None) is not None:
            raise ValueError(
                "pieces: a LayerNorm with a shift is not wired (the course's has none)"
            )
        self.weight, self.eps, self.backward = norm.weight, norm.eps, layer_norm_backward

    def forward(self, x: Tensor) -> Tensor:
        return LayerNormFn.apply(x, self.weight, eps=self.eps, layer_norm_backward=self.backward)


class PiecesAttention(Module):
    """The layer's projections (on the pieces) around ``attention``: AttentionFn on the
    pieces, or another function of q, k, v (B, nh, T, hs) for an ablation."""

    def __init__(self, attn: Module, wrap: Callable[[Module], Module], attention: Callable):
        super().__init__()
        self.n_head, self.attention = attn.n_head, attention
        self.wq, self.wk, self.wv, self.wo = (
            wrap(getattr(attn, n)) for n in ("wq", "wk", "wv", "wo")
        )

    def forward(self, x: Tensor, cache: Any = None) -> Tensor:
        if cache is not None:
            raise ValueError("pieces: attention on the pieces keeps no KV cache")
        B, T, C = x.shape
        nh, hs = self.n_head, C // self.n_head
        q, k, v = (
            w(x).reshape(B, T, nh, hs).transpose(0, 2, 1, 3) for w in (self.wq, self.wk, self.wv)
        )
        y = self.attention(q, k, v)  # (B, nh, T, hs)
        return self.wo(y.transpose(0, 2, 1, 3).reshape(B, T, C))


def assemble(model: Module, attention: Callable | None = None, quiet: bool = False) -> list[str]:
    """Rewire ``model`` (a ``Decoder`` with learned positions, LayerNorms without shift,
    GELU MLPs, no biases) in place to run on the pieces; the same Parameters, so an optimiser
    built before or after sees the same tensors. ``attention(q, k, v)`` replaces the
    attention of every head (for an ablation); by default it is AttentionFn on the pieces.
    Returns the pieces it used, as "lessonNN name" strings."""
    use = {
        ("lesson01", "matmul_backward"),
        ("lesson02", "softmax_backward"),
        ("lesson04", "embedding_backward"),
        ("lesson05", "causal_attention"),
        ("lesson06", "layer_norm_backward"),
    }
    if attention is not None:
        use -= {("lesson02", "softmax_backward"), ("lesson05", "causal_attention")}
    got = {name: load(lesson, name) for lesson, name in sorted(use)}
    matmul_backward = got["matmul_backward"]

    def linear(layer: Module) -> Module:
        return PiecesLinear(layer, matmul_backward)

    def norm(layer: Module) -> Module:
        return PiecesLayerNorm(layer, got["layer_norm_backward"])

    if attention is None:

        def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return AttentionFn.apply(
                q,
                k,
                v,
                causal_attention=got["causal_attention"],
                softmax_backward=got["softmax_backward"],
                matmul_backward=matmul_backward,
            )

    model.tok_emb = PiecesEmbedding(model.tok_emb, got["embedding_backward"], positions=False)
    model.pos_emb = PiecesEmbedding(model.pos_emb, got["embedding_backward"], positions=True)
    for block in model.blocks:
        block.norm1, block.norm2 = norm(block.norm1), norm(block.norm2)
        block.attn = PiecesAttention(block.attn, linear, attention)
        block.ffn.w1, block.ffn.w2 = linear(block.ffn.w1), linear(block.ffn.w2)
    model.norm_f, model.lm_head = norm(model.norm_f), linear(model.lm_head)
    if not quiet:
        print("the model runs on:", ", ".join(f"{lesson} {name}" for lesson, name in sorted(use)))
    return [f"{lesson} {name}" for lesson, name in sorted(use)]


# ---- the optimiser, on lesson 8's pieces --------------------------------------------------------
class PiecesAdamW(Optimizer):
    """AdamW from lesson 8's pieces: the gradients clipped together to ``grad_clip`` by your
    ``clip_by_global_norm``, then per tensor the decoupled decay p *= 1 - lr * weight_decay
    and your ``adam_l2_step`` with its own (L2) decay at 0. ``set_lr`` works on it as on
    ``AdamW``. ``last_norm`` is the gradient norm before the last clipping.
    """

    ranges = AdamW.ranges

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
    ):
        super().__init__(
            params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        )
        self.grad_clip, self.last_norm = grad_clip, math.nan
        self.clip = load("lesson08", "clip_by_global_norm")
        self.adam_step = load("lesson08", "adam_l2_step")

    def step(self, grad_scale: float = 1.0) -> None:
        live = [(i, p, group) for i, p, group in self._indexed() if p.grad is not None]
        grads, self.last_norm = self.clip([p.grad * grad_scale for _, p, _ in live], self.grad_clip)
        for (i, p, group), g in zip(live, grads, strict=True):
            state = self.state.setdefault(
                i, {"t": 0, "m": np.zeros_like(p.data), "v": np.zeros_like(p.data)}
            )
            state["t"] += 1
            lr = group["lr"]
            p.data *= 1.0 - lr * group["weight_decay"]  # decoupled: apart from the gradient
            new, state["m"], state["v"] = self.adam_step(
                p.data, g, state["m"], state["v"], state["t"], lr, group["betas"], group["eps"], 0.0
            )
            p.data[...] = new
