"""The architecture comparison (issue 17): every comparison preset trained on tiny Shakespeare
with the same budget and seeds, side by side.

For each preset of decoder/training/config.py's comparison (gpt2, gpt2-pre, gpt3, llama3, mistral,
deepseek-v2, granite) and each ``--seeds`` value, train ``--max_iters`` steps (default: the
presets' own 2000, shakespeare-char's budget; fewer scale the warmup down with them) and
measure:

- val loss at the end (the mean of ``eval_iters`` batches, as the training log's);
- parameters, total and active per token (they differ only for deepseek-v2's experts);
- KV-cache bytes per token (float32, all layers: decoder/model/mla.py's cache_floats_per_token)
  and bytes for a full context, where a sliding window caps a layer's cache at W tokens;
- training tokens/s (the training log's last interval) and generation tokens/s (greedy,
  with the KV cache, ``--gen_tokens`` from a one-token prompt: past block_size, a model
  with a position limit recomputes its context each step, while mistral's windows roll).

With more than one seed each column is the median, and the val loss also shows the spread
(max - min): a difference smaller than the spread is seed noise, not a win. Writes
``--out``.json (every run), ``--out``.md (the table) and ``--out``.png (training loss curves
and the val losses with their spread). Timings are wall clock on whatever else the machine is
doing: compare them within one run of this script, on one BLAS thread (below).

Usage: OPENBLAS_NUM_THREADS=1 python bench/architectures.py [--max_iters 2000]
       [--seeds 1337 1338 1339] [--presets gpt2 llama3 ...] [--out bench/results/architectures]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

COMPARISON = ("gpt2", "gpt2-pre", "gpt3", "llama3", "mistral", "deepseek-v2", "granite")
FLOAT32_BYTES = 4


def cache_bytes(model_cfg: Any) -> tuple[int, int]:
    """(bytes per token, bytes for a block_size context) of the whole model's KV caches.

    >>> from decoder.training.config import build_configs
    >>> cache_bytes(build_configs("mistral")[0])  # 4 layers, K and V of 2 heads x 32, 16 kept
    (2048, 32768)
    """
    from decoder.model.mla import cache_floats_per_token

    per_token = cache_floats_per_token(model_cfg) * FLOAT32_BYTES
    per_layer = per_token // model_cfg.n_layer
    cached = [  # the tokens each layer keeps once the context is full
        min(model_cfg.layer_window(i) or model_cfg.block_size, model_cfg.block_size)
        for i in range(model_cfg.n_layer)
    ]
    return per_token, per_layer * sum(cached)


def run_one(preset: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Train one preset with one seed in a temporary directory; its measurements."""
    from decoder.text.data import load_shakespeare
    from decoder.training.checkpoint import load_model
    from decoder.training.config import PRESETS, build_configs
    from decoder.training.loop import train

    steps = args.max_iters or PRESETS[preset].train["max_iters"]
    warmup = PRESETS[preset].train["warmup_iters"] * steps // PRESETS[preset].train["max_iters"]
    model_cfg, train_cfg = build_configs(
        preset,
        max_iters=steps,
        warmup_iters=max(warmup, 1),
        eval_interval=steps,  # one evaluation, at the end
        seed=seed,
        sample_tokens=0,
        **({} if args.eval_iters is None else {"eval_iters": args.eval_iters}),
    )
    with tempfile.TemporaryDirectory() as out:
        result = train(model_cfg, train_cfg, load_shakespeare(), out, progress=False)
        model, tokenizer, _ = load_model(out)
    start = time.perf_counter()
    n = len(list(model.generate(tokenizer.encode("\n"), args.gen_tokens, temperature=0)))
    gen_tokens_per_s = n / (time.perf_counter() - start)
    per_token, full_context = cache_bytes(model_cfg)
    return {
        "preset": preset,
        "seed": seed,
        "max_iters": steps,
        "val_loss": result["val_loss"],
        "losses": result["losses"],
        "params": model.num_parameters(),
        "active_params": model.num_active_parameters(),
        "kv_bytes_per_token": per_token,
        "kv_bytes_full_context": full_context,
        "train_tokens_per_s": result["tokens_per_s"],
        "gen_tokens_per_s": gen_tokens_per_s,
    }


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per preset, in the runs' order: medians over seeds, and the val loss's spread.

    >>> runs = [{"preset": "a", "val_loss": v, "seed": s} for s, v in enumerate([2, 1, 4])]
    >>> rows = summarise(runs)
    >>> rows[0]["val_loss"], rows[0]["val_spread"], rows[0]["seeds"]
    (2, 3, 3)
    """
    presets = list(dict.fromkeys(r["preset"] for r in runs))
    rows = []
    for preset in presets:
        mine = [r for r in runs if r["preset"] == preset]
        row = {"preset": preset, "seeds": len(mine)}
        for key in mine[0]:
            if key not in ("preset", "seed", "losses", "max_iters"):
                row[key] = statistics.median(r[key] for r in mine)
        losses = [r["val_loss"] for r in mine]
        row["val_spread"] = max(losses) - min(losses)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The summary as a Markdown table."""
    multi = rows[0]["seeds"] > 1
    head = (
        "| preset | val loss | params | active | KV B/token | KV B, full context "
        "| train tok/s | gen tok/s |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        loss = f"{r['val_loss']:.3f}" + (f" (spread {r['val_spread']:.3f})" if multi else "")
        lines.append(
            f"| {r['preset']} | {loss} | {r['params'] / 1e6:.3f}M "
            f"| {r['active_params'] / 1e6:.3f}M | {r['kv_bytes_per_token']:,.0f} "
            f"| {r['kv_bytes_full_context']:,.0f} | {r['train_tokens_per_s']:,.0f} "
            f"| {r['gen_tokens_per_s']:,.0f} |"
        )
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], rows: list[dict[str, Any]], path: Path) -> None:
    """Training loss curves (the first seed, smoothed over 50 steps) and the val losses."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (curves, bars) = plt.subplots(1, 2, figsize=(12, 4.5))
    for row in rows:
        first = next(r for r in runs if r["preset"] == row["preset"])
        k = min(50, len(first["losses"]))
        smooth = np.convolve(first["losses"], np.ones(k) / k, mode="valid")
        curves.plot(np.arange(k, len(first["losses"]) + 1), smooth, label=row["preset"])
    curves.set(xlabel="step", ylabel=f"training loss (mean of {k} steps)", title="training")
    curves.legend()
    names = [r["preset"] for r in rows]
    lows = [min(r["val_loss"] for r in runs if r["preset"] == n) for n in names]
    highs = [max(r["val_loss"] for r in runs if r["preset"] == n) for n in names]
    medians = [r["val_loss"] for r in rows]
    errors = [np.subtract(medians, lows), np.subtract(highs, medians)]
    bars.bar(names, medians, yerr=errors, capsize=4, color="tab:blue")
    bars.set_ylim(min(lows) - 0.05, max(highs) + 0.05)
    bars.set(ylabel="val loss (median, bars: min to max over seeds)", title="val loss")
    bars.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", nargs="+", default=list(COMPARISON))
    p.add_argument("--seeds", nargs="+", type=int, default=[1337])
    p.add_argument("--max_iters", type=int, default=None, help="default: the presets' 2000")
    p.add_argument("--eval_iters", type=int, default=None, help="default: the presets' 20")
    p.add_argument("--gen_tokens", type=int, default=200)
    p.add_argument("--out", type=Path, default=Path("bench/results/architectures"))
    args = p.parse_args(argv)
    runs = []
    for preset in args.presets:
        for seed in args.seeds:
            runs.append(run_one(preset, seed, args))
            r = runs[-1]
            print(f"{preset} seed {seed}: val loss {r['val_loss']:.4f}", flush=True)
    rows = summarise(runs)
    steps = runs[0]["max_iters"]
    text = f"{steps} steps, seeds {args.seeds}\n\n{table(rows)}\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps({"runs": runs, "rows": rows}, indent=1))
    plot(runs, rows, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
