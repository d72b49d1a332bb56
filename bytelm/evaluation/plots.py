"""The figures: the comparison's held-out BPB against training FLOPs, one line per model, and the
ablation's BPB against bytes per global step, training curves and per-group BPB (matplotlib's Agg
canvas: no pyplot, no display needed)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bytelm.atomic import atomic_write_bytes
from bytelm.rundir import RunDir


def eval_curve(run_dir: str | Path) -> list[tuple[float, float]]:
    """``(total training FLOPs, BPB)`` of the periodic evaluations in a run's ``metrics.jsonl``: the
    compute ledger's total (own + auxiliary, bytelm/ledger.py), or a run's own FLOPs when
    its metrics predate the ledger."""
    points = []
    for rec in RunDir(run_dir).metrics():
        flops = rec.get("flops_total", rec.get("flops"))
        if rec.get("kind") == "eval" and flops and rec.get("bpb") is not None:
            points.append((float(flops), float(rec["bpb"])))
    return points


def plot_bpb_vs_flops(
    path: str | Path,
    curves: dict[str, Sequence[tuple[float, float]]],
    *,
    finals: dict[str, tuple[float | None, float]] | None = None,
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
        ax.annotate(
            f"{name} {bpb:.2f}",
            xy=(0.01, bpb),
            xycoords=("axes fraction", "data"),
            va="bottom",
            fontsize=8,
            color="0.35",
        )
    ax.set_xscale("log")
    ax.set_xlabel("total training FLOPs (analytic: own + auxiliary)")
    ax.set_ylabel("bits per byte (held-out)")
    ax.set_title(title + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if curves:
        ax.legend(fontsize=8)
    _save(fig, path)


def plot_pair_differences(path: str | Path, statistics: dict, *, subtitle: str = "") -> bool:
    """The paired BPB differences of a report's ``statistics`` (better minus worse, so negative)
    with their intervals, one row per pair, a line at zero; pairs whose interval crosses zero in
    grey. Written atomically as PNG; False (nothing written) when there is no pair."""
    pairs = [p for p in statistics.get("pairs", []) if p["diff"] is not None and p["ci95"][0] is not None]
    if not pairs:
        return False
    fig = Figure(figsize=(7.5, 1.2 + 0.28 * len(pairs)), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for y, p in enumerate(reversed(pairs)):
        lo, hi = p["ci95"]
        color = "tab:blue" if p["separable"] else "0.6"
        ax.errorbar(
            [p["diff"]],
            [y],
            xerr=[[p["diff"] - lo], [hi - p["diff"]]],
            fmt="o",
            color=color,
            capsize=3,
            markersize=4,
        )
    ax.axvline(0.0, color="k", linewidth=1)
    ax.set_yticks(range(len(pairs)), [f"{p['a']} - {p['b']}" for p in reversed(pairs)], fontsize=8)
    ax.set_xlabel(f"BPB difference, {statistics['confidence']:.0%} interval (grey: not separable from 0)")
    ax.set_title(
        "paired differences on the same resampled held-out documents" + (f"\n{subtitle}" if subtitle else ""),
        fontsize=10,
    )
    ax.grid(True, axis="x", alpha=0.3)
    _save(fig, path)
    return True


def plot_probes(path: str | Path, probes: dict, *, subtitle: str = "") -> bool:
    """One panel per probe kind, one bar per model with its 95% interval: continuation choice
    (clean and each noise), R per noise, spelling per edit kind; chance as a dashed line. False
    (nothing written) when the record has no model."""
    models = probes.get("models") or {}
    if not models or probes.get("skipped"):
        return False
    from bytelm.evaluation.noise import NOISES  # noqa: PLC0415
    from bytelm.evaluation.probes import EDITS  # noqa: PLC0415

    fig = Figure(figsize=(11, 3.8), dpi=110)
    FigureCanvasAgg(fig)
    panels = [
        ("continuation choice accuracy", ["clean", *NOISES], 0.25),
        ("R per noise (100: the noise costs nothing)", list(NOISES), None),
        ("spelling accuracy per edit", list(EDITS), 0.5),
    ]
    width = 0.8 / len(models)
    for p_i, (title, keys, chance) in enumerate(panels):
        ax = fig.add_subplot(1, 3, p_i + 1)
        for m_i, (name, f) in enumerate(models.items()):
            vals: list[float] = []
            errs: list[list[float]] = [[], []]
            for k in keys:
                if p_i == 0:
                    c = f.get("choice", {})
                    row = (
                        {"v": c.get("accuracy"), "ci": c.get("accuracy_ci95")}
                        if k == "clean"
                        else {
                            "v": c.get("noise", {}).get(k, {}).get("accuracy"),
                            "ci": c.get("noise", {}).get(k, {}).get("accuracy_ci95"),
                        }
                    )
                elif p_i == 1:
                    n = f.get("choice", {}).get("noise", {}).get(k, {})
                    row = {"v": n.get("R"), "ci": n.get("R_ci95")}
                else:
                    e = f.get("spelling", {}).get("by_edit", {}).get(k, {})
                    row = {"v": e.get("accuracy"), "ci": e.get("accuracy_ci95")}
                v = row["v"] if row["v"] is not None else float("nan")
                ci = row["ci"] if row["ci"] and row["ci"][0] is not None else [v, v]
                vals.append(v)
                errs[0].append(max(v - ci[0], 0.0) if v == v else 0.0)
                errs[1].append(max(ci[1] - v, 0.0) if v == v else 0.0)
            xs = [i + (m_i - (len(models) - 1) / 2) * width for i in range(len(keys))]
            ax.bar(xs, vals, width, yerr=errs, capsize=2, label=name)
        if chance is not None:
            ax.axhline(chance, linestyle="--", color="0.5", linewidth=1)
        ax.set_xticks(range(len(keys)), keys, rotation=30, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        if p_i == 0:
            ax.legend(fontsize=7)
    if subtitle:
        fig.suptitle(subtitle, fontsize=9)
    _save(fig, path)
    return True


def _save(fig: Figure, path: str | Path) -> None:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(path, buf.getvalue())


def _grid_cells(report: dict, budget_index: int | None = None) -> list[dict]:
    """The ablation's seed-0 grid cells (of one budget) that have a held-out score."""
    return [
        r
        for r in report["runs"]
        if r.get("in_grid")
        and r["seed"] == 0
        and r.get("bpb") is not None
        and (budget_index is None or r["budget_index"] == budget_index)
    ]


def _series(row: dict) -> str:
    """One series per family; a BPE family's pre-tokenizer patterns are series of their own."""
    pattern = next((p.split("=", 1)[1] for p in row["cell"].split(",") if p.startswith("pattern=")), None)
    return f"{row['family']} ({pattern})" if pattern else row["family"]


def plot_bpb_vs_bytes_per_step(path: str | Path, report: dict) -> None:
    """One panel per budget: held-out BPB against mean bytes per global step (log2 axis), one
    series per family (the patch size, mean patch length or bytes per token is the knob)."""
    budgets = report["budgets"]
    fig = Figure(figsize=(5.0 * max(1, len(budgets)), 4.4), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(1, len(budgets)), sharey=True, squeeze=False)[0]
    colors: dict[str, str] = {}
    for b, (ax, budget) in enumerate(zip(axes, budgets)):
        groups: dict[str, list[tuple[float, float, str]]] = {}
        for r in _grid_cells(report, b):
            if r.get("mean_bytes_per_global_step"):
                groups.setdefault(_series(r), []).append(
                    (r["mean_bytes_per_global_step"], r["bpb"], r["cell"])
                )
        for name, pts in sorted(groups.items()):
            pts.sort()
            (line,) = ax.plot(
                [p[0] for p in pts], [p[1] for p in pts], marker="o", label=name, color=colors.get(name)
            )
            colors.setdefault(name, line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_xlabel("mean bytes per global step (held-out)")
        ax.set_title(f"{budget:.3g} training FLOPs", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if groups:
            ax.legend(fontsize=7)
    axes[0].set_ylabel("bits per byte (held-out)")
    fig.suptitle(f"ablation {report['grid']}: BPB vs bytes per global step", fontsize=11)
    _save(fig, path)


def plot_training_curves(path: str | Path, report: dict) -> None:
    """The periodic held-out evaluations of every grid cell against total training FLOPs: one colour per
    family, one line style per budget; stars are the final full-set scores."""
    fig = Figure(figsize=(8.0, 5.0), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors: dict[str, Any] = {}  # family -> its line's colour
    styles = ["-", "--", ":", "-."]
    for r in sorted(_grid_cells(report), key=lambda r: (r["family"], r["budget_index"], r["cell"])):
        pts = sorted(p for p in eval_curve(r["run_dir"]) if p[0] > 0)
        color = colors.get(r["family"])
        label = None if color else r["family"]
        if pts:
            (line,) = ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                styles[r["budget_index"] % 4],
                color=color,
                linewidth=1,
                alpha=0.8,
                label=label,
            )
            color = colors.setdefault(r["family"], line.get_color())
        total = r.get("flops_total") or r.get("train_flops")
        if total:
            ax.plot([total], [r["bpb"]], marker="*", markersize=8, color=color or "k", linestyle="none")
    ax.set_xscale("log")
    ax.set_xlabel("total training FLOPs (analytic: own + auxiliary)")
    ax.set_ylabel("bits per byte (held-out)")
    ax.set_title(f"ablation {report['grid']}: training curves (line style = budget)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if colors:
        ax.legend(fontsize=8)
    _save(fig, path)


def plot_bpb_per_group(path: str | Path, groups: dict[str, dict[str, float]], *, title: str) -> None:
    """Grouped bars: ``groups`` maps a series (a family's best cell) to BPB per group (directory)."""
    names = list(groups)
    labels = list(dict.fromkeys(k for g in groups.values() for k in g))
    fig = Figure(figsize=(max(6.0, 0.9 * len(labels) * max(1, len(names)) / 2 + 3), 4.4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs = [j + i * width for j in range(len(labels))]
        ax.bar(xs, [groups[name].get(k, float("nan")) for k in labels], width, label=name)
    ax.set_xticks(
        [j + 0.4 - width / 2 for j in range(len(labels))], labels, rotation=30, ha="right", fontsize=8
    )
    ax.set_ylabel("bits per byte (held-out)")
    ax.set_title(title, fontsize=10)
    ax.legend(
        fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2
    )  # below the bars, never over them
    ax.grid(True, axis="y", alpha=0.3)
    _save(fig, path)
