"""Where one training step's time goes, op by op: minigrad beside nanoGPT's PyTorch reference.

    python bench/profile_step.py                                      # shakespeare-char
    python bench/profile_step.py --steps 300 --preset shakespeare-char-modern

A step is split into the phases decoder.training.step.train_step runs: forward (the model and its
loss), backward (``loss.backward()``) and the optimiser (gradient clipping, AdamW's step,
zeroing the gradients). Within forward and backward, the time is given to the ops:

- minigrad: every ``Function`` subclass's ``forward`` and ``backward`` is wrapped in a timer
  (in this process only; the library is untouched), so an op's time is its own arithmetic,
  and what is left of the phase is the engine (graph walk, unbroadcast, gradient
  accumulation, Tensor construction) and the modules' Python.
- PyTorch: torch.profiler on the CPU with each phase under a ``record_function``; an op's
  time is the CPU time of the top-level aten op (forward) or autograd node (backward), with
  whatever it called; what is left is Python and dispatch.

Rows group the ops into the kinds both engines have (KINDS), so the two sides line up; an op
of no kind gets a row of its own. Each side runs in its own process (this script again with
``--side``), first ``--warmup`` untimed steps, then ``--steps`` instrumented steps, then as
many plain steps, whose ms/step ends the table: instrumentation costs a little, more for
torch's profiler than for our timers. The batches are random token ids (loading data costs
the same NumPy indexing on both sides and is left out); the reference's weights are torch's
own initialisation (speed does not depend on them). Timings on a busy machine are noisy:
compare the two columns of one run, not runs.
Left out on purpose: the GPU (timing each op there needs a synchronisation per op).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere

from decoder.training.config import build_configs  # noqa: E402

# The kind of an op, from the first pattern its lowercased name contains (order matters:
# "addmm" is a linear layer before it is an add, "logsoftmax" a loss before it is a softmax).
# Our attention at short T is the naive path (MatMul, Where for the causal mask, Softmax; its
# 1/sqrt(hs) scale is a Mul), torch's one SDPA call; our Linear layers are one Function each.
KINDS = (
    ("linear layers", ("linear", "addmm", "aten::mm", "mmbackward", "tbackward")),
    ("cross-entropy", ("crossentropy", "cross_entropy", "logsoftmax", "nll")),
    ("attention", ("attention", "softmax", "matmul", "bmm", "where")),
    ("layer/RMS norm", ("layernorm", "layer_norm", "rmsnorm", "rms_norm")),
    ("GELU/SiLU", ("gelu", "silu")),
    ("embedding", ("embedding",)),
    ("add", ("add",)),
    ("mul", ("mul",)),
    ("accumulate .grad", ("accumulategrad",)),
    (
        "reshape/split/copy",
        (
            "reshape",
            "view",
            "transpose",
            "split",
            "getitem",
            "concatenate",
            "expand",
            "contiguous",
            "clone",
            "copy",
            "aten::cat",
            "slice",
            "select",
            "permute",
            "chunk",
            "arange",
            "unsqueeze",
        ),
    ),  # fmt: skip
)
PHASES = ("forward", "backward")
OPTIMISER = ("clip_grad_norm_", "AdamW.step", "zero_grad")
TORCH_BACKWARD_PREFIX = "autograd::engine::evaluate_function: "


def kind_of(name: str) -> str:
    """The row an op's time goes to.

    >>> kind_of("aten::addmm"), kind_of("LogSoftmaxBackward0"), kind_of("Sum")
    ('linear layers', 'cross-entropy', 'Sum')
    """
    lowered = name.lower()
    for kind, patterns in KINDS:
        if any(p in lowered for p in patterns):
            return kind
    return name


class Clock:
    """Adds wall time into ``totals`` (ms) under a label: ``with clock("forward"): ...``."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, label: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.totals[label] += (time.perf_counter() - start) * 1e3


def random_batches(vocab_size: int, batch_size: int, block_size: int, n: int, seed: int = 0):
    """``n`` (x, y) pairs of random token ids, (batch_size, block_size) int64 each."""
    rng = np.random.default_rng(seed)
    shape = (n, 2, batch_size, block_size)
    return [(x, y) for x, y in rng.integers(0, vocab_size, size=shape, dtype=np.int64)]


# ---- minigrad --------------------------------------------------------------------------------
def time_functions(op_times: dict[str, float], current_phase: list[str]) -> None:
    """Wrap the ``forward`` and ``backward`` of every Function subclass defining them, adding
    each call's milliseconds into ``op_times["<phase>/<op name>"]``."""
    from minigrad.autograd import Function

    def subclasses(cls: type) -> Iterator[type]:
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    def timed(fn: Callable, name: str) -> staticmethod:
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                key = f"{current_phase[0]}/{name}"
                op_times[key] += (time.perf_counter() - start) * 1e3

        return staticmethod(wrapper)

    for cls in set(subclasses(Function)):
        for method in PHASES:
            found = cls.__dict__.get(method)
            if isinstance(found, staticmethod):
                setattr(cls, method, timed(found.__func__, cls.__name__))


def plain_ms_per_step(step: Callable, batches: list, warmup: int, steps: int) -> float:
    """Warm up on the first batches, then time ``steps`` unprofiled steps on the last ones."""
    for x, y in batches[:warmup]:
        step(x, y)
    start = time.perf_counter()
    for x, y in batches[warmup + steps :]:
        step(x, y)
    return (time.perf_counter() - start) * 1e3 / steps


def profile_ours(preset: str, steps: int, warmup: int, overrides: dict | None = None) -> dict:
    """Milliseconds per step by phase and by op, and the plain ms/step, for minigrad."""
    import minigrad as mg
    from decoder.model.model import Decoder
    from minigrad.cpu_tuning import reuse_freed_memory
    from minigrad.optim import AdamW, clip_grad_norm_, param_groups_for_decay

    reuse_freed_memory()  # as decoder.train does
    model_cfg, train_cfg = build_configs(preset, overrides)
    mg.manual_seed(train_cfg.seed)
    model = Decoder(model_cfg)
    optimizer = AdamW(
        param_groups_for_decay(model, train_cfg.weight_decay),
        lr=train_cfg.lr,
        betas=(train_cfg.beta1, train_cfg.beta2),
        weight_decay=train_cfg.weight_decay,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    B, T = train_cfg.batch_size, model_cfg.block_size
    batches = random_batches(model_cfg.vocab_size, B, T, warmup + 2 * steps)
    clock, phase = Clock(), ["forward"]

    def step(x: np.ndarray, y: np.ndarray) -> None:
        # decoder.training.step.train_step, split into phases (its NaN check left out)
        with clock("forward"):
            phase[0] = "forward"
            _, loss = model(mg.Tensor(x), mg.Tensor(y))
            loss.item()
        with clock("zero_grad"):
            optimizer.zero_grad()
        with clock("backward"):
            phase[0] = "backward"
            loss.backward()
        with clock("clip_grad_norm_"):
            clip_grad_norm_(params, train_cfg.grad_clip)
        with clock("AdamW.step"):
            optimizer.step()

    plain = plain_ms_per_step(step, batches, warmup, steps)
    clock.totals.clear()
    op_times: dict[str, float] = defaultdict(float)
    time_functions(op_times, phase)
    for x, y in batches[warmup : warmup + steps]:
        step(x, y)
    return result(clock.totals, op_times, steps, plain, "minigrad")


# ---- PyTorch ---------------------------------------------------------------------------------
def profile_torch(preset: str, steps: int, warmup: int) -> dict:
    """The same for nanoGPT's model and loop (bench/torch_reference.py), with torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch_reference import GPT  # beside this file

    model_cfg, train_cfg = build_configs(preset)
    torch.manual_seed(train_cfg.seed)
    model = GPT(model_cfg)
    optimizer = model.configure_optimizers(
        train_cfg.weight_decay, train_cfg.lr, (train_cfg.beta1, train_cfg.beta2), "cpu"
    )
    B, T = train_cfg.batch_size, model_cfg.block_size
    batches = [
        (torch.from_numpy(x), torch.from_numpy(y))
        for x, y in random_batches(model_cfg.vocab_size, B, T, warmup + 2 * steps)
    ]

    def step(x: torch.Tensor, y: torch.Tensor) -> None:  # nanoGPT's loop body
        with record_function("forward"):
            _, loss = model(x, y)
        with record_function("backward"):
            loss.backward()
        with record_function("clip_grad_norm_"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        with record_function("AdamW.step"):
            optimizer.step()
        with record_function("zero_grad"):
            optimizer.zero_grad(set_to_none=True)
        loss.item()

    plain = plain_ms_per_step(step, batches, warmup, steps)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for x, y in batches[warmup : warmup + steps]:
            step(x, y)
    totals: dict[str, float] = defaultdict(float)
    op_times: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.cpu_parent is not None or event.name not in (*PHASES, *OPTIMISER):
            continue
        totals[event.name] += event.cpu_time_total / 1e3  # the profiler counts microseconds
        if event.name in PHASES:
            for child in event.cpu_children:
                name = child.name.removeprefix(TORCH_BACKWARD_PREFIX)
                op_times[f"{event.name}/{name}"] += child.cpu_time_total / 1e3
    return result(totals, op_times, steps, plain, f"torch {torch.__version__}")


# ---- both ------------------------------------------------------------------------------------
def result(
    totals: dict[str, float], op_times: dict[str, float], steps: int, plain: float, engine: str
) -> dict:
    """Per-step milliseconds: {"rows": {(phase, kind) as "phase/kind": ms}, "plain", ...}."""
    rows: dict[str, float] = defaultdict(float)
    for key, ms in op_times.items():
        phase, name = key.split("/", 1)
        rows[f"{phase}/{kind_of(name)}"] += ms / steps
    for phase in PHASES:
        ops = sum(ms for key, ms in rows.items() if key.startswith(f"{phase}/"))
        rows[f"{phase}/rest (engine, Python)"] = totals[phase] / steps - ops
    for label in OPTIMISER:
        rows[f"optimiser/{label}"] = totals[label] / steps
    return {"rows": dict(rows), "plain": plain, "engine": engine}


def run_side(side: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, f"--preset={args.preset}", f"--steps={args.steps}"]
    cmd += [f"--warmup={args.warmup}", f"--side={side}"]
    cmd += [f"--set={key}={value}" for key, value in args.set]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        if side == "torch" and "No module named 'torch'" in done.stderr:
            print("PyTorch is not installed: the reference column is left out")
            return {"rows": {}, "plain": float("nan"), "engine": "no torch"}
        sys.exit(f"the {side} side failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(preset: str, steps: int, ours: dict, ref: dict) -> None:
    """One table: each (phase, kind) row's ms/step and share of the step on both sides."""
    step_ours = sum(ours["rows"].values())
    step_ref = sum(ref["rows"].values()) or float("nan")  # nan: no torch
    keys = list(dict.fromkeys([*ours["rows"], *ref["rows"]]))
    order = {phase: i for i, phase in enumerate((*PHASES, "optimiser"))}

    def sort_key(key: str) -> tuple:  # by phase, the largest first, the rest last
        phase, kind = key.split("/", 1)
        largest = max(ours["rows"].get(key, 0.0), ref["rows"].get(key, 0.0))
        return order[phase], kind.startswith("rest"), -largest

    print(
        f"\n{preset}: ms per training step over {steps} steps ({ours['engine']}, {ref['engine']})"
    )
    print(
        f"{'phase':10}{'kind':24}{'minigrad':>10}{'share':>7}{'pytorch':>10}{'share':>7}{'ratio':>7}"
    )
    for key in sorted(keys, key=sort_key):
        phase, kind = key.split("/", 1)
        a, b = ours["rows"].get(key), ref["rows"].get(key)
        cells = ""
        for ms, total in ((a, step_ours), (b, step_ref)):
            cells += f"{ms:10.2f}{100 * ms / total:6.0f}%" if ms is not None else f"{'-':>10}{'':7}"
        ratio = f"{a / b:7.2f}" if a is not None and b and b > 0.005 else f"{'':7}"
        print(f"{phase:10}{kind:24}{cells}{ratio}".rstrip())
    print(f"{'step':10}{'instrumented':24}{step_ours:10.2f}{'':7}{step_ref:10.2f}{'':7}"
          f"{step_ours / step_ref:7.2f}")  # fmt: skip
    print(f"{'step':10}{'plain':24}{ours['plain']:10.2f}{'':7}{ref['plain']:10.2f}{'':7}"
          f"{ours['plain'] / ref['plain']:7.2f}")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="shakespeare-char")
    p.add_argument("--steps", type=int, default=100, help="instrumented steps (and plain ones)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        type=lambda text: tuple(text.split("=", 1)),
        metavar="FIELD=VALUE",
        help="a config field for our side, e.g. --set attn_impl=naive to time a choice A/B",
    )
    p.add_argument("--side", choices=("ours", "torch"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.steps < 1 or args.warmup < 0:
        p.error(f"--steps must be >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
    if args.side:  # a child process: profile one side, answer one JSON line
        if args.side == "ours":
            profiled = profile_ours(args.preset, args.steps, args.warmup, dict(args.set))
        else:
            profiled = profile_torch(args.preset, args.steps, args.warmup)
        print(json.dumps(profiled))
        return 0
    print_table(args.preset, args.steps, run_side("ours", args), run_side("torch", args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
