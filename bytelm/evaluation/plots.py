"""The comparison figure: held-out BPB against training FLOPs, one line per model (matplotlib's Agg
canvas: no pyplot, no display needed)."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bytelm.atomic import atomic_write_bytes


def eval_curve(run_dir: str | Path) -> list[tuple[float, float]]:
    """``(training FLOPs, BPB)`` of the periodic evaluations in a run's ``metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    points = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("kind") == "eval" and rec.get("flops") and rec.get("bpb") is not None:
            points.append((float(rec["flops"]), float(rec["bpb"])))
    return points


def plot_bpb_vs_flops(
    path: str | Path,
    curves: dict[str, Sequence[tuple[float, float]]],
    *,
    finals: dict[str, tuple[float, float]] | None = None,
    baselines: dict[str, float] | None = None,
    title: str = "held-out bits per byte vs training FLOPs",
    subtitle: str = "",
) -> None:
    """Draw ``curves`` (name -> [(flops, bpb), ...]) on a log-FLOPs axis; ``finals`` (name ->
    (flops, bpb)) are the full evaluation-set scores, drawn as markers; ``baselines`` (name -> bpb)
    as horizontal dashed lines. Written atomically as PNG."""
    fig = Figure(figsize=(7.5, 4.8), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors = {}
    for name, pts in curves.items():
        pts = sorted(p for p in pts if p[0] > 0)
        if not pts:
            continue
        (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=name)
        colors[name] = line.get_color()
    for name, (flops, bpb) in (finals or {}).items():
        if flops and flops > 0 and bpb is not None:
            ax.plot([flops], [bpb], marker="*", markersize=11, color=colors.get(name, "k"), linestyle="none")
    for name, bpb in (baselines or {}).items():
        ax.axhline(bpb, linestyle="--", linewidth=1, color="0.5")
        ax.annotate(f"{name} {bpb:.2f}", xy=(0.01, bpb), xycoords=("axes fraction", "data"), va="bottom", fontsize=8, color="0.35")
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs (analytic)")
    ax.set_ylabel("bits per byte (held-out)")
    ax.set_title(title + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if curves:
        ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(path, buf.getvalue())
