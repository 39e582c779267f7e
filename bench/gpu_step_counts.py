"""What one GPU training step asks of the device, counted on the CuPy stand-in: no GPU needed.

Runs the ``baby-gpt`` preset (nanoGPT's GPU Shakespeare model: 6 layers, 6 heads, dropout 0.2)
at small widths on tests/support/fake_cupy.py, the NumPy-backed stand-in the tests use, and
prints for one training step after the first (which also allocates the optimiser's moments):
kernel launches split into forward, backward and optimiser (with clipping), host transfers,
random generators made, megabytes (10^6 bytes) of device memory allocated and moved (what the
kernels read and write, each array once) and the matrix products' FLOPs. The launches depend on
the number of layers and heads and on the code path, not on the widths, so they say what the
step costs on a GPU in launches: at a few microseconds each, 3,000 launches are about 10 ms a
step before any arithmetic (the H200 ran baby-gpt at 77-80 ms a step, nanoGPT at 14; issue 26).
The bytes and FLOPs grow with the widths: at the preset's own (``--set n_embd=384 --set
block_size=256 --set batch_size=64``, a minute of NumPy) the last line, the device floor, is
what the step costs a GPU at its peak rates (``--gpu h100|h200``, bench/kernel_counts.py's).

    python bench/gpu_step_counts.py [--steps 2] [--set FIELD=VALUE ...] [--sites 30]

``--sites N`` also prints the N lines of minigrad and decoder that launch the most kernels in
that step, and the N that move the most bytes (each launch charged to the innermost such line
and the one that called it): where the next fusion pays.

``--time cpu|cuda`` times real steps instead, each phase apart (the device synchronised at its
end), at two widths: the small ones above, where the device has almost nothing to do and the
step's time is its host side (Python, the graph, one call per kernel), and the preset's own.
Their ratio says what to make faster next: near 1, the step waits on the host (fewer launches,
less Python); near 0, on the device (fused kernels, less memory traffic). `make gpu-check` runs
it on the GPU; on a CPU the small row is minigrad's bookkeeping plus NumPy's tiny-array calls.

    python bench/gpu_step_counts.py --time cuda [--widths small,preset] [--steps 10]

What the stand-in counts as one launch: each operator, CuPy function, reduction, copy and
``add.at`` on device arrays, each RawKernel call and each random draw; views (reshapes,
transposes, basic slices) and ``empty`` count none, as on CuPy.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import itertools
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# baby-gpt's depth, heads and dropout at widths the stand-in runs in a second
SMALL = dict(n_embd=48, block_size=32, batch_size=4, eval_iters=1, sample_tokens=0)
COUNTERS = ("kernel_launches", "host_to_device", "device_to_host", "generators_created")
SIZES = ("bytes_allocated", "bytes_moved", "matmul_flops")


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
    return {name: getattr(cupy, name) for name in (*COUNTERS, *SIZES)}


def count_sites(
    cupy: Any, sites: collections.Counter, on: list[bool], moved: collections.Counter | None = None
) -> None:
    """Charge each launch made while ``on[0]`` to the two innermost minigrad/decoder lines of
    the stack that made it, in ``sites``, and the bytes it moved in ``moved`` (the stand-in's
    launch counter, wrapped)."""
    launched = cupy._launched
    moved = collections.Counter() if moved is None else moved

    def counted(*args: Any, **kwargs: Any) -> Any:
        before, bytes_before = cupy.kernel_launches, cupy.bytes_moved
        result = launched(*args, **kwargs)
        if on[0] and cupy.kernel_launches != before:
            ours = [
                f for f in traceback.extract_stack()[:-1]
                if "/minigrad/" in f.filename or "/decoder/" in f.filename
            ]  # fmt: skip
            where = [f"{Path(f.filename).relative_to(ROOT)}:{f.lineno} {f.name}" for f in ours]
            site = " <- ".join(where[::-1][:2])
            sites[site] += cupy.kernel_launches - before
            moved[site] += cupy.bytes_moved - bytes_before
        return result

    cupy._launched = counted


@contextlib.contextmanager
def phase_marks(mark: Callable[[str], None]) -> Iterator[Callable]:
    """Call ``mark("forward")`` when a step's loss is made and ``mark("backward")`` when its
    clipping norm starts (the backward pass is done then); yields the loss function that
    train_step must be given for the first. The optimiser phase ends with train_step."""
    import decoder.training.step as step_module

    def forward(m, x, y):
        loss = step_module.lm_loss(m, x, y)
        mark("forward")
        return loss

    real_norm = step_module.grad_norm

    def norm(params):  # the optimiser phase starts with clipping's norm
        mark("backward")
        return real_norm(params)

    step_module.grad_norm = norm
    try:
        yield forward
    finally:
        step_module.grad_norm = real_norm


def build(preset: str, overrides: dict[str, str] | None, device: str, **extra: Any):
    """(model in training mode, its optimiser, model config, train config) for ``preset`` with
    ``overrides`` (text, as --set) and ``extra`` (typed) on ``device``."""
    from decoder.model.model import Decoder
    from decoder.training.config import build_configs
    from decoder.training.run import make_optimizer

    model_cfg, train_cfg = build_configs(preset, overrides, **{**extra, "device": device})
    model = Decoder(model_cfg).to(device)
    model.train()
    return model, make_optimizer(model, train_cfg), model_cfg, train_cfg


def run_steps(model, optimizer, model_cfg, train_cfg, steps: int, loss_fn, before_step) -> None:
    """``steps`` training steps on random batches, ``before_step(step)`` ahead of each."""
    from decoder.training.step import train_step

    rng = np.random.default_rng(0)
    for step in range(1, steps + 1):
        x = rng.integers(0, model_cfg.vocab_size, (train_cfg.batch_size, model_cfg.block_size))
        before_step(step)
        train_step(model, optimizer, x, np.roll(x, -1, axis=1), train_cfg, step, loss_fn=loss_fn)


def step_counts(
    preset: str = "baby-gpt",
    steps: int = 2,
    overrides: dict[str, str] | None = None,
    cupy: Any = None,
    sites: collections.Counter | None = None,
    moved_sites: collections.Counter | None = None,
    **extra: Any,
) -> dict[str, dict]:
    """Counts of the last of ``steps`` training steps, by phase: {"forward": {...}, ...};
    ``overrides`` as text (the command line's --set), ``extra`` typed. ``cupy``: the stand-in
    already installed (the tests' fixture), else it is installed for this process. ``sites``:
    a Counter that receives the last step's launches by the lines that made them, and
    ``moved_sites`` their bytes moved."""
    cupy = cupy or install_stand_in()
    last_step = [False]
    if sites is not None:
        count_sites(cupy, sites, last_step, moved_sites)
    small = {k: v for k, v in SMALL.items() if k not in (overrides or {})}
    model, optimizer, model_cfg, train_cfg = build(preset, overrides, "cuda", **small, **extra)
    marks: dict[str, dict[str, int]] = {}

    def start(step: int) -> None:
        marks["start"] = snapshot(cupy)
        last_step[0] = step == steps

    with phase_marks(lambda phase: marks.__setitem__(phase, snapshot(cupy))) as loss_fn:
        run_steps(model, optimizer, model_cfg, train_cfg, steps, loss_fn, start)
    marks["optimiser"] = snapshot(cupy)
    phases, before = {}, marks["start"]
    for phase in ("forward", "backward", "optimiser"):
        phases[phase] = {k: marks[phase][k] - before[k] for k in before}
        before = marks[phase]
    phases["step"] = {k: marks["optimiser"][k] - marks["start"][k] for k in before}
    phases["config"] = {"model": model_cfg, "train": train_cfg}
    return phases


def step_times(
    device: str,
    preset: str = "baby-gpt",
    small: bool = True,
    steps: int = 10,
    warmup: int = 3,
    overrides: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Milliseconds per phase of a real training step on ``device`` ("cpu" or "cuda"), the
    median over ``steps`` steps after ``warmup``, the device synchronised at each phase's end
    (the step reads the loss and the clipping norm anyway, so the marks add little).

    ``small``: at SMALL's widths, where the arrays are so small that the device has almost
    nothing to do: the step's time is then its host side (Python, the graph, one call per
    kernel), the floor under any step of this depth on that host. Without it, at the preset's
    own widths: the real step. Their ratio says whether the step waits on the host or on the
    device. The run's matmul_precision applies, as in a training run."""
    import minigrad as mg

    widths = {k: v for k, v in SMALL.items() if k not in (overrides or {})} if small else {}
    model, optimizer, model_cfg, train_cfg = build(preset, overrides, device, **widths)
    if device == "cuda":
        import cupy

        sync = cupy.cuda.Device().synchronize
    else:
        sync = lambda: None  # noqa: E731 (NumPy has finished when it returns)
    times: list[dict[str, float]] = []

    def mark(phase: str) -> None:
        sync()
        times[-1][phase] = time.perf_counter()

    def start(step: int) -> None:
        if times:
            mark("optimiser")  # the step before has ended
        times.append({"start": time.perf_counter()})

    previous = mg.get_float32_matmul_precision()
    mg.set_float32_matmul_precision(train_cfg.matmul_precision)
    try:
        with phase_marks(mark) as loss_fn:
            run_steps(model, optimizer, model_cfg, train_cfg, warmup + steps, loss_fn, start)
            mark("optimiser")
    finally:
        mg.set_float32_matmul_precision(previous)
    result: dict[str, Any] = {"config": {"model": model_cfg, "train": train_cfg}}
    ends = ("start", "forward", "backward", "optimiser")
    for before, phase in itertools.pairwise(ends):
        result[phase] = 1e3 * statistics.median(t[phase] - t[before] for t in times[warmup:])
    result["step"] = 1e3 * statistics.median(t["optimiser"] - t["start"] for t in times[warmup:])
    return result


def device_floor(step: dict[str, int], matmul_precision: str, gpu: Any) -> dict[str, float]:
    """What one step's device work costs at ``gpu``'s peak rates (a kernel_counts.Gpu), in ms:
    "memory", its bytes moved at the DRAM bandwidth; "products", its matmul FLOPs on the
    tensor cores in TF32 (matmul_precision "high") or on the fp32 lanes ("highest"); "total",
    the two one after the other (the products and the elementwise kernels are separate
    launches). A floor: no kernel reaches its peak, and launches cost time of their own.

    >>> from types import SimpleNamespace as NS
    >>> gpu = NS(dram_tb_s=2.0, tf32_mac_per_s=4e14, fma_per_s=5e13)
    >>> device_floor({"bytes_moved": 4e9, "matmul_flops": 8e11}, "high", gpu)
    {'memory': 2.0, 'products': 1.0, 'total': 3.0}
    >>> device_floor({"bytes_moved": 0, "matmul_flops": 8e11}, "highest", gpu)["products"]
    8.0
    """
    rate = gpu.tf32_mac_per_s if matmul_precision == "high" else gpu.fma_per_s
    memory = 1e3 * step["bytes_moved"] / (gpu.dram_tb_s * 1e12)
    products = 1e3 * step["matmul_flops"] / (2 * rate)
    return {"memory": memory, "products": products, "total": memory + products}


def load_gpus() -> dict[str, Any]:
    """bench/kernel_counts.py's GPUS: the peak rates, stated and sourced once."""
    spec = importlib.util.spec_from_file_location("kernel_counts", ROOT / "bench/kernel_counts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.GPUS


def report(phases: dict[str, dict], gpu: Any = None) -> str:
    """The counts' table; with ``gpu`` (a kernel_counts.Gpu), the step's device floor there."""
    model, train = phases["config"]["model"], phases["config"]["train"]
    lines = [
        f"one training step on the CuPy stand-in: {model.n_layer} layers, {model.n_head} heads, "
        f"n_embd {model.n_embd}, block {model.block_size}, batch {train.batch_size}, "
        f"dropout {model.dropout}",
        f"{'':12s}{'launches':>10s}{'host->dev':>11s}{'dev->host':>11s}{'generators':>12s}"
        f"{'MB alloc':>10s}{'MB moved':>10s}{'GFLOP':>9s}",
    ]
    for phase in ("forward", "backward", "optimiser", "step"):
        c = phases[phase]  # the loss is read at the start of the backward phase
        lines.append(
            f"{phase:12s}{c['kernel_launches']:10,d}{c['host_to_device']:11d}"
            f"{c['device_to_host']:11d}{c['generators_created']:12d}"
            f"{c['bytes_allocated'] / 1e6:10.2f}{c['bytes_moved'] / 1e6:10.2f}"
            f"{c['matmul_flops'] / 1e9:9.3f}"
        )
    if gpu is not None:
        precision = train.matmul_precision
        floor = device_floor(phases["step"], precision, gpu)
        how = "TF32 tensor cores" if precision == "high" else "fp32 lanes"
        lines.append(
            f"device floor on an {gpu.name}, at peak rates: {floor['memory']:.2f} ms moving "
            f"the bytes ({gpu.dram_tb_s} TB/s) + {floor['products']:.2f} ms of products "
            f"({how}, matmul_precision {precision}) = {floor['total']:.2f} ms a step"
        )
    return "\n".join(lines)


def time_report(device: str, rows: list[dict[str, Any]]) -> str:
    """The table of ``step_times`` results, one row per width; with both widths, the share of
    the real step that the host's floor is."""
    first = rows[0]["config"]
    lines = [
        f"one step on {device}, ms per phase (median, synchronised): "
        f"{first['model'].n_layer} layers, {first['model'].n_head} heads, "
        f"matmul_precision {first['train'].matmul_precision}",
        f"{'widths':34s}{'forward':>9s}{'backward':>10s}{'optimiser':>11s}{'step':>9s}",
    ]
    for row in rows:
        m, t = row["config"]["model"], row["config"]["train"]
        widths = f"n_embd {m.n_embd}, block {m.block_size}, batch {t.batch_size}"
        lines.append(
            f"{widths:34s}{row['forward']:9.2f}{row['backward']:10.2f}{row['optimiser']:11.2f}"
            f"{row['step']:9.2f}"
        )
    if len(rows) == 2:
        floor, real = rows[0]["step"], rows[1]["step"]
        lines.append(
            f"host floor / step: {floor / real:.2f} (near 1, waiting on the host; near 0, "
            f"on the device)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="baby-gpt")
    p.add_argument(
        "--steps", type=int, help="count the last of these steps (2), or time this many (10)"
    )
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--sites", type=int, default=0, metavar="N", help="the N busiest lines")
    p.add_argument("--gpu", choices=("h100", "h200"), default="h100", help="for the floor")
    p.add_argument(
        "--time",
        choices=("cpu", "cuda"),
        help="time real steps on this device instead of counting on the stand-in",
    )
    p.add_argument(
        "--widths",
        default="small,preset",
        help="with --time: small (the host's floor), preset (the real step) or both",
    )
    args = p.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.set)
    if args.time:
        chosen = args.widths.split(",")
        if not chosen or set(chosen) - {"small", "preset"}:
            p.error(f"--widths takes small, preset or small,preset, not {args.widths!r}")
        rows = [
            step_times(args.time, args.preset, small=w == "small", steps=args.steps or 10,
                       overrides=overrides)
            for w in ("small", "preset") if w in chosen
        ]  # fmt: skip
        print(time_report(args.time, rows))
        return
    sites: collections.Counter = collections.Counter()
    moved: collections.Counter = collections.Counter()
    gpu = load_gpus()[args.gpu]
    counts = step_counts(args.preset, args.steps or 2, overrides, sites=sites, moved_sites=moved)
    print(report(counts, gpu))
    if args.sites:
        print(f"\nthe {args.sites} lines that launch the most kernels in that step:")
        for where, n in sites.most_common(args.sites):
            print(f"{n:6d}  {where}")
        total = counts["step"]["bytes_moved"]
        print(f"\nthe {args.sites} lines that move the most bytes (MB, share of the step's):")
        for where, n in moved.most_common(args.sites):
            print(f"{n / 1e6:9.1f} {n / total:5.1%}  {where}")


if __name__ == "__main__":
    main()
