"""What a training run shows and keeps besides its checkpoints: ``log.jsonl`` (one row per
evaluation, appended only after that step's checkpoint landed), ``loss.png`` redrawn from it,
and the progress bar's text.

The log is only ever appended to, so a torn last line is a write that a crash cut short
(``read_log`` drops it with a warning); the plot is drawn with matplotlib's object API on the
Agg canvas (no pyplot state, no display) and written atomically.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from decoder.model.model import Decoder
from minigrad.fileio import atomic_write

LOG, PLOT = "log.jsonl", "loss.png"


def append_log(out_dir: Path, row: dict) -> None:
    """Add one evaluation's row to ``log.jsonl``."""
    with open(out_dir / LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def read_log(out_dir: Path) -> list[dict]:
    """The rows of ``log.jsonl`` (none if it is missing).

    The log is only ever appended to, so a last line without its newline is a write that a
    crash or a full disk cut short: it is dropped with a warning. Any other damage is an
    error naming the file and the line.
    """
    path = out_dir / LOG
    if not path.is_file():
        return []
    lines = path.read_bytes().split(b"\n")  # the last item is b"" after a final newline
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("not an object with an integer 'step'")
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            if number == len(lines):
                warnings.warn(
                    f"{path}: dropped its last line, a row whose writing was cut short "
                    f"({len(line)} bytes, no newline)",
                    stacklevel=2,
                )
                break
            raise ValueError(
                f"{path}, line {number}: not a log row ({e}); delete that line (the log is "
                f"only read to draw the plot and to carry the rows over on a resume)"
            ) from None
        rows.append(row)
    return rows


def plot_losses(out_dir: Path, title: str = "", metrics: Sequence[str] = ()) -> None:
    """Redraw ``loss.png`` from ``log.jsonl``: train and val loss against the step, for a
    mixture of experts a panel with each expert's share of the routed tokens, and a panel
    with the ``metrics`` (names of other columns of the log, as decoder.post.dpo's)."""
    # matplotlib's object API with the Agg canvas: no pyplot global state, no display needed
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = read_log(out_dir)
    routed = [r for r in rows if "expert_share" in r]  # none before the first step
    n_panels = 1 + bool(routed) + bool(metrics)
    fig = Figure(figsize=(6, 1 + 3 * n_panels), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(n_panels, 1, 1)
    steps = [r["step"] for r in rows]
    ax.plot(steps, [r["train_loss"] for r in rows], "o-", label="train")
    ax.plot(steps, [r["val_loss"] for r in rows], "o-", label="val")
    ax.set(xlabel="step", ylabel="cross-entropy loss (nats/token)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    if routed:
        shares = np.array([r["expert_share"] for r in routed])  # (rows, n_experts)
        share_ax = fig.add_subplot(n_panels, 1, 2, sharex=ax)
        for e in range(shares.shape[1]):
            share_ax.plot([r["step"] for r in routed], shares[:, e], ".-", label=f"expert {e}")
        share_ax.axhline(1 / shares.shape[1], color="gray", ls="--", label="balanced")
        share_ax.set(xlabel="step", ylabel="share of routed tokens")
        share_ax.grid(alpha=0.3)
        share_ax.legend(fontsize="x-small", ncol=4)
    if metrics:
        metric_ax = fig.add_subplot(n_panels, 1, n_panels, sharex=ax)
        for name in metrics:
            shown = [r for r in rows if name in r]
            metric_ax.plot([r["step"] for r in shown], [r[name] for r in shown], "o-", label=name)
        metric_ax.set(xlabel="step")
        metric_ax.grid(alpha=0.3)
        metric_ax.legend()
    fig.tight_layout()
    with atomic_write(out_dir / PLOT) as f:  # a viewer never sees a half-drawn file
        fig.savefig(f, format="png")


def parameters_text(model: Decoder) -> str:
    """The model's size for the log and the plot: with experts, also the parameters one token
    uses."""
    total, active = model.num_parameters(), model.num_active_parameters()
    return f"{total:,} parameters" + (f" ({active:,} active per token)" if active < total else "")


def expert_postfix(stats: dict[str, Any] | None) -> dict[str, str]:
    """The progress bar's entries for routing ``stats`` (``Decoder.router_stats``): each
    expert's share of the routed tokens in percent, and the weighted aux loss; none for None.

    >>> expert_postfix({"aux_loss": 0.0101, "expert_share": [0.5, 0.25, 0.25, 0.0]})
    {'experts': '50/25/25/0%', 'aux': '0.0101'}
    """
    if stats is None:
        return {}
    shares = "/".join(f"{100 * share:.0f}" for share in stats["expert_share"])
    return {"experts": f"{shares}%", "aux": f"{stats['aux_loss']:.4f}"}


def progress_bar(enabled: bool, start: int, total: int) -> Any:
    """A tqdm bar on stderr (its ETA is the run's), or a stand-in that does nothing."""
    if not enabled:
        return NoBar()
    from tqdm import tqdm

    return tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, file=sys.stderr)


class NoBar:
    def set_postfix(self, **kwargs: Any) -> None: ...

    def update(self, n: int) -> None: ...

    def write(self, text: str) -> None: ...

    def close(self) -> None: ...
