"""What one GPU training step asks of the device, counted on the CuPy stand-in: no GPU needed.

Runs the ``baby-gpt`` preset (nanoGPT's GPU Shakespeare model: 6 layers, 6 heads, dropout 0.2)
at small widths on tests/support/fake_cupy.py, the NumPy-backed stand-in the tests use, and
prints for one training step after the first (which also allocates the optimiser's moments):
kernel launches split into forward, backward and optimiser (with clipping), host transfers,
random generators made and bytes of device memory allocated. The counts depend on the number
of layers and heads and on the code path, not on the widths, so they say what the step costs
on a GPU in launches: at a few microseconds each, 3,000 launches are about 10 ms a step before
any arithmetic (the H200 ran baby-gpt at 77-80 ms a step, nanoGPT at 14; issue 26).

    python bench/gpu_step_counts.py [--steps 2] [--set FIELD=VALUE ...] [--sites 30]

``--sites N`` also prints the N lines of minigrad and decoder that launch the most kernels in
that step (each launch charged to the innermost such line and the one that called it): where
the next fusion pays.

What the stand-in counts as one launch: each operator, CuPy function, reduction, copy and
``add.at`` on device arrays, each RawKernel call and each random draw; views (reshapes,
transposes, basic slices) and ``empty`` count none, as on CuPy.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# baby-gpt's depth, heads and dropout at widths the stand-in runs in a second
SMALL = dict(n_embd=48, block_size=32, batch_size=4, eval_iters=1, sample_tokens=0)
COUNTERS = ("kernel_launches", "host_to_device", "device_to_host", "generators_created")


def install_stand_in() -> Any:
    """Load the stand-in as ``cupy`` for this process (the tests' fixture does it per test)."""
    from minigrad import backend

    spec = importlib.util.spec_from_file_location("cupy", ROOT / "tests/support/fake_cupy.py")
    cupy = importlib.util.module_from_spec(spec)
    sys.modules["cupy"] = cupy
    spec.loader.exec_module(cupy)
    sys.modules.update(cupy.MODULES)
    backend._cupy = None  # the backend looks for CuPy again and finds the stand-in
    return cupy


def snapshot(cupy: Any) -> dict[str, int]:
    return {name: getattr(cupy, name) for name in (*COUNTERS, "bytes_allocated")}


def count_sites(cupy: Any, sites: collections.Counter, on: list[bool]) -> None:
    """Charge each launch made while ``on[0]`` to the two innermost minigrad/decoder lines of
    the stack that made it, in ``sites`` (the stand-in's launch counter, wrapped)."""
    launched = cupy._launched

    def counted(*args: Any) -> Any:
        before = cupy.kernel_launches
        result = launched(*args)
        if on[0] and cupy.kernel_launches != before:
            ours = [
                f for f in traceback.extract_stack()[:-1]
                if "/minigrad/" in f.filename or "/decoder/" in f.filename
            ]  # fmt: skip
            where = [f"{Path(f.filename).relative_to(ROOT)}:{f.lineno} {f.name}" for f in ours]
            sites[" <- ".join(where[::-1][:2])] += cupy.kernel_launches - before
        return result

    cupy._launched = counted


def step_counts(
    preset: str = "baby-gpt",
    steps: int = 2,
    overrides: dict[str, str] | None = None,
    cupy: Any = None,
    sites: collections.Counter | None = None,
    **extra: Any,
) -> dict[str, dict]:
    """Counts of the last of ``steps`` training steps, by phase: {"forward": {...}, ...};
    ``overrides`` as text (the command line's --set), ``extra`` typed. ``cupy``: the stand-in
    already installed (the tests' fixture), else it is installed for this process. ``sites``:
    a Counter that receives the last step's launches by the lines that made them."""
    cupy = cupy or install_stand_in()
    last_step = [False]
    if sites is not None:
        count_sites(cupy, sites, last_step)
    import decoder.training.step as step_module
    from decoder.model.model import Decoder
    from decoder.training.config import build_configs
    from decoder.training.run import make_optimizer
    from decoder.training.step import lm_loss, train_step

    small = {k: v for k, v in SMALL.items() if k not in (overrides or {})}
    model_cfg, train_cfg = build_configs(preset, overrides, **{**small, **extra, "device": "cuda"})
    model = Decoder(model_cfg).to("cuda")
    model.train()
    optimizer = make_optimizer(model, train_cfg)
    marks: dict[str, dict[str, int]] = {}

    def forward(m, x, y):
        loss = lm_loss(m, x, y)
        marks["forward"] = snapshot(cupy)
        return loss

    real_norm = step_module.grad_norm

    def norm(params):  # the optimiser phase starts with clipping's norm
        marks["backward"] = snapshot(cupy)
        return real_norm(params)

    step_module.grad_norm = norm
    try:
        rng = np.random.default_rng(0)
        for step in range(1, steps + 1):
            x = rng.integers(0, model_cfg.vocab_size, (train_cfg.batch_size, model_cfg.block_size))
            marks["start"] = snapshot(cupy)
            last_step[0] = step == steps
            train_step(
                model, optimizer, x, np.roll(x, -1, axis=1), train_cfg, step, loss_fn=forward
            )
            marks["optimiser"] = snapshot(cupy)
    finally:
        step_module.grad_norm = real_norm
    phases, before = {}, marks["start"]
    for phase in ("forward", "backward", "optimiser"):
        phases[phase] = {k: marks[phase][k] - before[k] for k in before}
        before = marks[phase]
    phases["step"] = {k: marks["optimiser"][k] - marks["start"][k] for k in before}
    phases["config"] = {"model": model_cfg, "train": train_cfg}
    return phases


def report(phases: dict[str, dict]) -> str:
    model = phases["config"]["model"]
    lines = [
        f"one training step on the CuPy stand-in: {model.n_layer} layers, {model.n_head} heads, "
        f"n_embd {model.n_embd}, block {model.block_size}, dropout {model.dropout}",
        f"{'':12s}{'launches':>10s}{'host->dev':>11s}{'dev->host':>11s}{'generators':>12s}"
        f"{'MB alloc':>10s}",
    ]
    for phase in ("forward", "backward", "optimiser", "step"):
        c = phases[phase]  # the loss is read at the start of the backward phase
        lines.append(
            f"{phase:12s}{c['kernel_launches']:10,d}{c['host_to_device']:11d}"
            f"{c['device_to_host']:11d}{c['generators_created']:12d}"
            f"{c['bytes_allocated'] / 2**20:10.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="baby-gpt")
    p.add_argument("--steps", type=int, default=2, help="count the last of these steps")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--sites", type=int, default=0, metavar="N", help="the N busiest lines")
    args = p.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.set)
    sites: collections.Counter = collections.Counter()
    print(report(step_counts(args.preset, args.steps, overrides, sites=sites)))
    if args.sites:
        print(f"\nthe {args.sites} lines that launch the most kernels in that step:")
        for where, n in sites.most_common(args.sites):
            print(f"{n:6d}  {where}")


if __name__ == "__main__":
    main()
