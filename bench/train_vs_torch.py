"""Train our Decoder and nanoGPT's model in PyTorch (bench/torch_reference.py) on the same data
with the same recipe, each in its own process, and compare losses, speed and peak memory.

    python bench/train_vs_torch.py                                   # shakespeare-char, 2000 steps
    python bench/train_vs_torch.py --iters 200                       # shorter
    python bench/train_vs_torch.py --preset shakespeare-char-modern  # RoPE, RMSNorm, SwiGLU, GQA
    python bench/train_vs_torch.py --device cuda                     # baby-gpt on the GPU
    python bench/train_vs_torch.py --seeds 1337,1,2,3,4              # five seeds, and medians
    python bench/train_vs_torch.py --iters 200 --repeat 5            # five timed runs a side

The reference is nanoGPT's model.py and train.py as a user runs them on the CPU (fused qkv,
SDPA, its AdamW set-up, torch's default threads), so its speed is nanoGPT's own. Both sides
start from the same weights (our model's initialisation, copied into the reference), sample
the very same batches (decoder.text.data with the same seeds), follow the same learning rate
schedule and score the same evaluation batches. So their losses agree closely at first, which
checks the whole engine end to end. shakespeare-char and baby-gpt follow nanoGPT's recipe,
its exact GELU included; should a preset drift from it (say back to GPT-2's tanh GELU, read
off the built model), the output lists each difference, and the losses then drift apart by
it as well as by float rounding. tokens/s counts the training steps alone (evaluation
excluded) on both sides; peak memory is each process's own peak resident set (ru_maxrss), so
the reference's includes what importing torch maps in.

A single run's validation loss depends on its seed: for `shakespeare-char` at 2000 steps,
seeds spread it over about 0.05, much more than the engines differ. ``--seeds`` trains both
sides once per seed and compares the medians, which is the fair comparison with a number
such as nanoGPT's 1.88 (itself one seed's run).

Wall-clock time is noisier still: on a small shared machine the same run's speed moves by
20-30% from one run to the next. ``--repeat N`` trains each side N times per seed, in turns
(ours, torch, ours, torch, ...), and compares the medians; it also prints each round's ratio
(adjacent runs share the machine's state, so their ratio is steadier than either speed). A
repeat trains on the same seed and data, so its losses must equal the first run's: the
output checks it.

Separate processes keep each side's thread pools and memory to itself, and let the torch
side import torch while ours never does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from decoder.model.config import ModelConfig  # noqa: E402
from decoder.text.data import TokenDataset, load_shakespeare, load_text  # noqa: E402
from decoder.text.tokenizer import CharTokenizer  # noqa: E402
from decoder.training.config import TrainConfig, build_configs

TARGET_VAL_LOSS = 1.89  # shakespeare-char, 2000 steps: nanoGPT's code measured 1.886
TARGET_RATIO = 0.9  # our tokens/s over the reference's, on the CPU (issue 15)
FIRST_STEPS = 5  # the losses of the first steps must agree to about 1e-6

# nanoGPT's Shakespeare recipe in our field names: config/train_shakespeare_char.py over
# train.py's defaults (its GPU run, our baby-gpt), and its README's CPU command line on top
# (our shakespeare-char).
NANOGPT_GPU = {
    "block_size": 256,
    "n_layer": 6,
    "n_head": 6,
    "n_kv_head": 6,
    "n_embd": 384,
    "ffn": "gelu",
    "ffn_hidden": 4 * 384,
    "norm": "layer",
    "norm_eps": 1e-5,
    "norm_position": "pre",
    "parallel_block": False,
    "pos": "learned",
    "dropout": 0.2,
    "bias": False,
    "tie_weights": True,
    "batch_size": 64,
    "max_iters": 5000,
    "lr": 1e-3,
    "min_lr": 1e-4,
    "warmup_iters": 100,
    "lr_decay_iters": 5000,
    "beta1": 0.9,
    "beta2": 0.99,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "eval_interval": 250,
    "eval_iters": 200,
}
NANOGPT = {
    "baby-gpt": NANOGPT_GPU,
    "shakespeare-char": {
        **NANOGPT_GPU,
        **dict(block_size=64, n_layer=4, n_head=4, n_kv_head=4, n_embd=128, ffn_hidden=512),
        **dict(batch_size=12, max_iters=2000, lr_decay_iters=2000, dropout=0.0, eval_iters=20),
    },
}
# What the reference itself leaves out of nanoGPT's GPU recipe, to train in float32 as we do.
# TF32 is in neither list: both sides take the run's matmul_precision (baby-gpt's: "high",
# TF32, as nanoGPT's allow_tf32; --matmul-precision=highest gives the strict float32 rows).
GPU_DEPARTURES = "bf16 autocast and torch.compile (the reference: float32, eager)"
NANOGPT_GELU = "none"  # nn.GELU(): the exact erf form


def configs(args: argparse.Namespace) -> tuple[ModelConfig, TrainConfig]:
    warmup = build_configs(args.preset)[1].warmup_iters
    extra = {
        "max_iters": args.iters,
        "device": args.device,
        "sample_tokens": 0,
        "warmup_iters": min(warmup, args.iters // 2),
        "seed": args.seed,
    }
    if args.eval_interval:
        extra["eval_interval"] = args.eval_interval
    if getattr(args, "matmul_precision", None):
        extra["matmul_precision"] = args.matmul_precision
    if getattr(args, "attn_impl", None):
        extra["attn_impl"] = args.attn_impl
    return build_configs(args.preset, **extra)


def our_gelu(model) -> str | None:
    """The ``approximate`` of our Decoder's GELU (None: it has none, e.g. a SwiGLU), read off
    the built model rather than its config, so that a config the model ignores shows too."""
    act = getattr(model.blocks[0].ffn, "act", None)
    return getattr(act, "approximate", None)


def recipe_differences(preset: str, gelu: str | None) -> list[str]:
    """Where the preset's own settings (before this run's --iters) and our GELU form ``gelu``
    differ from nanoGPT's recipe, one line each. The preset must be in NANOGPT."""
    model_cfg, train_cfg = build_configs(preset)
    ours = {**dataclasses.asdict(model_cfg), **dataclasses.asdict(train_cfg)}
    recipe = NANOGPT[preset]
    lines = [
        f"{name}: ours {ours[name]!r}, nanoGPT {value!r}"
        for name, value in recipe.items()
        if ours[name] != value
    ]
    if gelu is not None and gelu != NANOGPT_GELU:
        lines.append(f"GELU: ours approximate={gelu!r}, nanoGPT nn.GELU() (exact, erf)")
    return lines


def peak_rss_mb() -> float:
    """This process's peak resident set so far, in MB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def run_side(args: argparse.Namespace) -> dict:
    """One side's training, in this process: the result as a dict."""
    text = load_text(args.data) if args.data else load_shakespeare()
    model_cfg, train_cfg = configs(args)
    tokenizer = CharTokenizer.from_text(text)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=tokenizer.vocab_size)
    keys = ("train_loss", "val_loss", "tokens_per_s", "time_s", "losses")
    if args.side == "ours":
        from decoder.training.loop import train  # it calls reuse_freed_memory() itself
        from decoder.training.shards import workers_peak_rss_bytes

        with tempfile.TemporaryDirectory() as out:
            result = train(model_cfg, train_cfg, text, out, progress=not args.quiet)
        peak = peak_rss_mb()  # before our_shards builds a model of its own
        peak += workers_peak_rss_bytes() / 1e6  # the shard workers', shared pages twice
        return {
            **{k: result[k] for k in keys},
            "peak_rss_mb": peak,
            **our_shards(model_cfg, train_cfg),
        }

    from torch_reference import get_lr, train_reference  # beside this file

    import minigrad as mg
    from decoder.model.model import Decoder
    from minigrad.optim import cosine_lr

    # the same schedule, step for step
    for it in range(train_cfg.max_iters + 1):
        ours = cosine_lr(
            it, train_cfg.lr, train_cfg.min_lr, train_cfg.warmup_iters, train_cfg.lr_decay_iters
        )
        assert abs(ours - get_lr(it, train_cfg)) < 1e-12, f"schedules differ at step {it}"
    mg.manual_seed(train_cfg.seed)  # our initial weights, as decoder.train makes them
    model = Decoder(model_cfg)
    init_state = model.state_dict()
    data = TokenDataset(tokenizer.encode(text))
    result = train_reference(
        model_cfg, train_cfg, data, init_state, gelu=NANOGPT_GELU, progress=not args.quiet
    )
    return {
        **{k: result[k] for k in keys},
        "threads": result["threads"],
        "our_gelu": our_gelu(model),
        "peak_rss_mb": peak_rss_mb(),
    }


def our_shards(model_cfg: ModelConfig, train_cfg: TrainConfig) -> dict:
    """Our side's use of the cores: the ``shards`` setting of its TrainConfig, the shards a
    training micro-batch of this run really splits into (decoder.training.step.shard_count: 1 where
    sharding is off, e.g. under dropout or on the GPU) and the cores this process may use."""
    from decoder.model.model import Decoder
    from decoder.training.step import shard_count
    from minigrad.cpu_tuning import cpu_count

    shards = 1
    if train_cfg.device == "cpu":
        y = np.zeros((train_cfg.batch_size, model_cfg.block_size), dtype=np.int64)
        shards = shard_count(Decoder(model_cfg), train_cfg, y)  # a fresh model trains
    return {"shards_setting": train_cfg.shards, "shards": shards, "cpus": cpu_count()}


def shards_line(ours: dict) -> str:
    """How our side used the cores, from one of its results (``our_shards``'s keys).

    >>> shards_line({"shards_setting": 2, "shards": 2, "cpus": 2})
    'ours: shards=2 (row shards in 2 processes), one BLAS thread each'
    >>> shards_line({"shards_setting": 2, "shards": 2, "cpus": 1})
    'ours: shards=2 (row shards), one after another on 1 core(s)'
    >>> shards_line({"shards_setting": 2, "shards": 1, "cpus": 2})
    'ours: shards=2, not sharded in this run (shard_count 1), default BLAS threads'
    """
    setting = ours["shards_setting"]
    if ours["shards"] < 2:
        return (
            f"ours: shards={setting}, not sharded in this run (shard_count 1), default BLAS threads"
        )
    if ours["cpus"] < ours["shards"]:
        return f"ours: shards={setting} (row shards), one after another on {ours['cpus']} core(s)"
    return (
        f"ours: shards={setting} (row shards in {ours['shards']} processes), one BLAS thread each"
    )


def run_one(args: argparse.Namespace, seed: int, side: str) -> dict:
    """Train one side in a child process with this seed; its result."""
    forwarded = [f"--preset={args.preset}", f"--iters={args.iters}", f"--device={args.device}"]
    forwarded += [f"--data={args.data}"] if args.data else []
    forwarded += [f"--eval-interval={args.eval_interval}"] if args.eval_interval else []
    precision = getattr(args, "matmul_precision", None)
    forwarded += [f"--matmul-precision={precision}"] if precision else []
    attn_impl = getattr(args, "attn_impl", None)
    forwarded += [f"--attn-impl={attn_impl}"] if attn_impl else []
    forwarded += ["--quiet"] if args.quiet else []
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, __file__, *forwarded, f"--seed={seed}", "--side", side]
    subprocess.run(
        [*cmd, "--result", path], check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    result = json.loads(Path(path).read_text())
    os.unlink(path)
    return result


def train_both(args: argparse.Namespace, seed: int) -> dict[str, list[dict]]:
    """Train each side ``args.repeat`` times with this seed, in turns (ours, torch, ours, ...)
    so that both see the machine's slow and quiet spells alike; their results by side."""
    results = {"ours": [], "torch": []}
    for i in range(args.repeat):
        for side in results:
            round_ = f", run {i + 1} of {args.repeat}" if args.repeat > 1 else ""
            print(
                f"== {side}: {args.preset}, {args.iters} steps, seed {seed}, {args.device}{round_}",
                flush=True,
            )
            results[side].append(run_one(args, seed, side))
    return results


def ms_per_step(result: dict) -> float:
    """Milliseconds per training step of one run (its evaluations excluded)."""
    return 1e3 * result["time_s"] / len(result["losses"])


def summarize(results: list[dict]) -> dict:
    """One side's repeats of one seed, as one result: the first run's losses, the median
    tokens/s and ms/step with their (min, max), the largest peak RSS, and ``loss_spread``,
    the largest difference of any loss from the first run's (0.0: the runs agree).

    >>> run = {"train_loss": 2.0, "val_loss": 2.1, "losses": [4.0, 3.0], "peak_rss_mb": 100.0}
    >>> s = summarize([{**run, "tokens_per_s": t, "time_s": 2 / t} for t in (1.0, 3.0, 2.0)])
    >>> s["tokens_per_s"], s["tokens_per_s_range"], s["ms_per_step"], s["loss_spread"]
    (2.0, (1.0, 3.0), 500.0, 0.0)
    """
    first = results[0]
    speeds, ms = [r["tokens_per_s"] for r in results], [ms_per_step(r) for r in results]

    def losses(r: dict) -> list[float]:
        return [r["train_loss"], r["val_loss"], *r["losses"]]

    spread = max(abs(a - b) for r in results for a, b in zip(losses(r), losses(first), strict=True))
    return {
        **first,
        "tokens_per_s": median(speeds),
        "tokens_per_s_range": (min(speeds), max(speeds)),
        "ms_per_step": median(ms),
        "ms_per_step_range": (min(ms), max(ms)),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
        "loss_spread": spread,
    }


def round_ratios(results: dict[str, list[dict]]) -> list[float]:
    """Each round's throughput ratio, ours over torch: run i of each side ran back to back.

    >>> round_ratios({"ours": [{"tokens_per_s": 90.0}], "torch": [{"tokens_per_s": 100.0}]})
    [0.9]
    """
    pairs = zip(results["ours"], results["torch"], strict=True)
    return [ours["tokens_per_s"] / ref["tokens_per_s"] for ours, ref in pairs]


def report(args: argparse.Namespace, runs: dict[int, dict[str, list[dict]]]) -> None:
    """Print the losses and speeds (each side's median over its repeats), then time per step
    and memory, the repeats' agreement and per-round ratios, the loss agreement between the
    sides, the recipe's differences from nanoGPT's and the targets."""
    sides = (("minigrad", "ours"), ("pytorch", "torch"))  # bench/gpu_check.py reads these rows
    repeat = len(next(iter(runs.values()))["ours"])
    summary = {seed: {side: summarize(r[side]) for _, side in sides} for seed, r in runs.items()}
    medians = " (medians of each side's runs)" if repeat > 1 else ""
    precision = ""
    if args.device == "cuda":
        chosen = (
            getattr(args, "matmul_precision", None)
            or build_configs(args.preset)[1].matmul_precision
        )
        precision = ", TF32 products" if chosen == "high" else ", float32 products"
    print(f"\n{args.preset}, {args.iters} steps, {args.device}{precision}{medians}")
    print(f"{'seed':>6}  {'':10}{'train loss':>12}{'val loss':>12}{'tokens/s':>12}")
    for seed, results in summary.items():
        for name, side in sides:
            r = results[side]
            print(
                f"{seed:>6}  {name:10}{r['train_loss']:12.4f}{r['val_loss']:12.4f}"
                f"{r['tokens_per_s']:12,.0f}"
            )
    val = {side: median([r[side]["val_loss"] for r in summary.values()]) for _, side in sides}
    speed = {side: median([r[side]["tokens_per_s"] for r in summary.values()]) for _, side in sides}
    if len(runs) > 1:
        print(f"{'median':>6}  {'minigrad':10}{'':12}{val['ours']:12.4f}{speed['ours']:12,.0f}")
        print(f"{'':>6}  {'pytorch':10}{'':12}{val['torch']:12.4f}{speed['torch']:12,.0f}")
    ratio = speed["ours"] / speed["torch"]
    print(f"throughput ratio minigrad / pytorch: {ratio:.2f}")

    ranges = f"{'tokens/s min-max':>20}{'ms/step min-max':>18}" if repeat > 1 else ""
    print(f"\n{'seed':>6}  {'':10}{'ms/step':>12}{'peak RSS MB':>14}{ranges}")
    for seed, results in summary.items():
        for name, side in sides:
            r = results[side]
            row = f"{seed:>6}  {name:10}{r['ms_per_step']:12.1f}{r['peak_rss_mb']:14.0f}"
            if repeat > 1:
                (t_lo, t_hi), (m_lo, m_hi) = r["tokens_per_s_range"], r["ms_per_step_range"]
                row += f"{f'{t_lo:,.0f}-{t_hi:,.0f}':>20}{f'{m_lo:.1f}-{m_hi:.1f}':>18}"
            print(row)
    threads = {r["torch"]["threads"] for r in summary.values()}
    print(f"the reference ran on {', '.join(map(str, sorted(threads)))} torch thread(s)")
    ours_threads = {shards_line(run) for r in runs.values() for run in r["ours"]}
    print("; ".join(sorted(ours_threads)))

    if repeat > 1:
        print(f"\neach side ran {repeat} times per seed, in turns (ours, torch, ours, ...)")
        all_ratios = []
        for seed, results in runs.items():
            ratios = round_ratios(results)
            all_ratios += ratios
            print(
                f"per-round ratio minigrad / pytorch, seed {seed}: "
                f"{' '.join(f'{x:.2f}' for x in ratios)} (median {median(ratios):.2f})"
            )
        if len(runs) > 1:
            print(f"median per-round ratio over all seeds: {median(all_ratios):.2f}")
        spread = {
            (name, seed): summary[seed][side]["loss_spread"]
            for seed in summary
            for name, side in sides
        }
        worst = max(spread, key=spread.get)
        if spread[worst] == 0:
            print("losses identical across the repeats of each side")
        else:
            print(
                f"losses differ across the repeats of one side by up to {spread[worst]:.2e}"
                f" ({worst[0]}, seed {worst[1]})"
            )

    gaps = []
    for results in summary.values():
        ours, ref = results["ours"]["losses"], results["torch"]["losses"]
        n = min(FIRST_STEPS, len(ours))
        gaps.append(max(abs(a - b) for a, b in zip(ours[:n], ref[:n], strict=True)))
    print(f"largest loss difference over the first {n} steps: {max(gaps):.2e}")

    if args.preset in NANOGPT:
        gelu = next(iter(summary.values()))["torch"]["our_gelu"]
        differences = recipe_differences(args.preset, gelu)
        if differences:
            print("our preset differs from nanoGPT's recipe (the reference follows nanoGPT):")
            print("".join(f"  {line}\n" for line in differences), end="")
        if args.iters != NANOGPT[args.preset]["max_iters"]:
            print(f"this run: {args.iters} steps (nanoGPT's: {NANOGPT[args.preset]['max_iters']})")
    else:
        print(f"{args.preset} has no nanoGPT counterpart: the reference writes its choices")
        print("  the way nanoGPT writes the rest (fused projections, SDPA, its AdamW set-up)")
    if args.device == "cuda":
        print(f"the reference leaves out nanoGPT's {GPU_DEPARTURES}")

    if args.device == "cpu":
        which = "throughput ratio" + (" of the medians" if repeat > 1 else "")
        met = "met" if ratio >= TARGET_RATIO else "missed"
        verdicts = [f"{which} >= {TARGET_RATIO}: {met}"]
        if (args.preset, args.iters) == ("shakespeare-char", 2000):
            which = "median val loss" if len(runs) > 1 else "val loss"
            met = val["ours"] <= TARGET_VAL_LOSS
            verdicts.append(f"{which} <= {TARGET_VAL_LOSS}: {'met' if met else 'missed'}")
        print("targets: " + "; ".join(verdicts))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--preset", default=None, help="default: shakespeare-char (cpu), baby-gpt (cuda)"
    )
    p.add_argument("--iters", type=int, default=None, help="steps (default: the preset's)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--data", default=None, help="a text file (default: tiny Shakespeare)")
    p.add_argument("--eval-interval", type=int, default=None)
    p.add_argument(
        "--matmul-precision",
        default=None,
        choices=("highest", "high"),
        help="GPU float32 products, both sides: highest (float32) or high (TF32); "
        "default: the preset's",
    )
    p.add_argument(
        "--attn-impl",
        default=None,
        choices=("auto", "naive", "flash"),
        help="our attention path (default: the preset's, auto); flash on the GPU runs attention "
        "dropout inside the kernel, where auto takes the naive path",
    )
    p.add_argument(
        "--seeds", default=None, help="comma-separated seeds, e.g. 1337,1,2 (default: the preset's)"
    )
    p.add_argument(
        "--repeat", type=int, default=1, help="runs of each side per seed, in turns (default 1)"
    )
    p.add_argument("--quiet", action="store_true", help="no per-evaluation lines")
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    p.add_argument("--side", choices=("ours", "torch"), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.preset = args.preset or ("baby-gpt" if args.device == "cuda" else "shakespeare-char")
    _, preset_train = build_configs(args.preset)
    if args.iters is None:
        args.iters = preset_train.max_iters
    if args.side:  # a child process: train one side, write its result
        Path(args.result).write_text(json.dumps(run_side(args)))
        return 0
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [preset_train.seed]
    except ValueError:
        p.error(f"--seeds takes comma-separated integers such as 1337,1,2, got {args.seeds!r}")
    if args.repeat < 1:
        p.error(f"--repeat takes a count of at least 1, got {args.repeat}")

    report(args, {seed: train_both(args, seed) for seed in seeds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
