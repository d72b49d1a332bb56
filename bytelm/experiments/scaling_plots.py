"""The figures of ``bytelm scaling`` (:mod:`bytelm.experiments.scaling`): the fitted laws with their
bands, measured points and crossovers; the iso-FLOP curves with their optima."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def plot_scaling(path: str | Path, result: dict, extrapolate: float) -> Path:
    """BPB against total training FLOPs per family: measured frontier points, the fitted law over the
    fitted range (solid, 95% band) and beyond it (dashed, labelled extrapolated), crossovers marked."""
    fig = Figure(figsize=(9, 5.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colors = {}
    for k, (fam, rec) in enumerate(result["families"].items()):
        color = f"C{k % 10}"
        colors[fam] = color
        pts = rec["points"]
        if pts:
            ax.plot(
                [p["flops"] for p in pts],
                [p["bpb"] for p in pts],
                "o",
                color=color,
                label=f"{fam} (measured)",
            )
        if "curve" in rec:
            c, x = rec["curve"], rec["extrapolation"]
            ax.plot(c["flops"], c["bpb"], "-", color=color, label=f"{fam}: alpha {rec['alpha'][0]:.2f}")
            ax.fill_between(c["flops"], c["lo"], c["hi"], color=color, alpha=0.15, linewidth=0)
            ax.plot(x["flops"], x["bpb"], "--", color=color, alpha=0.7)
            ax.fill_between(x["flops"], x["lo"], x["hi"], color=color, alpha=0.06, linewidth=0)
    top = max((r["range"][1] for r in result["families"].values() if "range" in r), default=None)
    if top is not None:
        ax.axvspan(top, top * extrapolate, color="0.9", zorder=0)
        ax.text(top * 1.1, ax.get_ylim()[1], "extrapolated", va="top", fontsize=8, color="0.35")
    for c in result["crossovers"]:
        if c.get("flops"):
            ax.axvline(c["flops"], color="0.3", linestyle=":", linewidth=1)
            ax.text(c["flops"], ax.get_ylim()[0], f" {c['a']}={c['b']}", rotation=90, va="bottom", fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("total training FLOPs (ledger)")
    ax.set_ylabel("held-out BPB (best cell per budget)")
    ax.set_title("scaling laws L(C) = E + A (C/C0)^-alpha, 95% bands; dashed: extrapolation")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(str(path))
    return Path(path)


def plot_isoflop(path: str | Path, result: dict) -> Path:
    """Per family with an axis: BPB against the axis at each budget, the optimum marked (a star, its
    95% interval as a bar; hollow when it is the edge of the measured range)."""
    panels = [
        (fam, rest, rec["optima"]["axis"], series)
        for fam, rec in result["families"].items()
        for rest, series in (rec.get("optima") or {}).get("series", {}).items()
    ]
    n = max(len(panels), 1)
    fig = Figure(figsize=(4.2 * min(n, 3), 3.6 * ((n + 2) // 3)), dpi=110)
    FigureCanvasAgg(fig)
    for k, (fam, rest, axis, series) in enumerate(panels):
        ax = fig.add_subplot((n + 2) // 3, min(n, 3), k + 1)
        for j, row in enumerate(series["per_budget"]):
            color = f"C{j % 10}"
            xs = np.array([float(v) for v in row["measured"]])
            ys = np.array(list(row["measured"].values()))
            order = np.argsort(xs)
            ax.plot(xs[order], ys[order], "o-", color=color, label=f"{row['budget']:.2g}")
            lo, hi = row["ci95"]
            y = ys.min()
            if lo is not None:
                ax.plot([lo, hi], [y, y], "-", color=color, linewidth=3, alpha=0.4)
            ax.plot(
                [row["optimum"]],
                [y],
                "*",
                color=color,
                markersize=12,
                markerfacecolor=color if row["interior"] else "none",
            )
        ax.set_xscale("log")
        ax.set_xlabel(axis)
        ax.set_ylabel("BPB")
        ax.set_title(f"{fam} ({rest})", fontsize=9)
        ax.legend(title="budget", fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    if not panels:
        ax = fig.add_subplot(1, 1, 1)
        ax.text(0.5, 0.5, "no family varies a patch size or vocabulary over 3+ values", ha="center")
        ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(str(path))
    return Path(path)
