"""The BLT-paper figure: per-byte entropy, the threshold line and the patch boundaries.

Bar ``j`` is the entropy of the model's prediction *of* text byte ``j`` (``H`` after the position
before it), so a bar above the threshold line is exactly a byte that starts a new patch under the
global rule. Drawn with matplotlib's Agg canvas (no pyplot, no display needed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bytelm.errors import UserError


def byte_label(b: int) -> str:
    """A short x-tick label: the printable ASCII character, '␣' for a space, else ``\\xNN``."""
    if b == 0x20:
        return "␣"
    if 0x21 <= b <= 0x7E:
        return chr(b)
    return f"\\x{b:02x}"


def plot_entropies(
    path: str | Path,
    data: bytes,
    entropies,
    starts,
    *,
    threshold: float | None = None,
    monotonic_threshold: float | None = None,
    title: str | None = None,
    quantity: str = "entropy H (nats)",
    unit: str = "patch",
    units: str = "patches",
) -> Path:
    """Write a PNG of ``entropies[j]`` (nats) per byte ``j`` of ``data`` with vertical lines where
    ``starts[j]`` (``j >= 1``) begins a patch and the global threshold as a horizontal line.
    ``quantity``, ``unit`` and ``units`` name what is plotted and what the lines start (``bytelm chunks``: an
    H-Net router's boundary probability, and chunks)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise UserError(f"cannot write {path}: the directory {path.parent} does not exist; create it first")
    h = np.asarray(entropies, dtype=np.float64)
    starts = np.asarray(starts, dtype=bool)
    n = len(data)
    if h.shape != (n,) or starts.shape != (n,):
        raise ValueError(
            f"entropies {h.shape} and starts {starts.shape} must both have one value per byte ({n})"
        )
    fig = Figure(figsize=(min(max(6.0, 0.16 * n + 1.5), 80.0), 3.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(n)
    ax.plot(x, h, color="tab:blue", marker="o", markersize=3, linewidth=1, label=quantity)
    for j in np.flatnonzero(starts[1:]) + 1:
        ax.axvline(j - 0.5, color="tab:gray", linewidth=0.8, linestyle="--")
    if threshold is not None:
        ax.axhline(threshold, color="tab:red", linewidth=1, label=f"threshold {threshold:.3g}")
    ax.set_xticks(x)
    ax.set_xticklabels([byte_label(b) for b in data], fontsize=7, family="monospace")
    ax.set_xlim(-0.5, n - 0.5)
    top = max(float(h.max()) if n else 0.0, threshold if threshold is not None else 0.0)
    ax.set_ylim(0, 1.1 * top if top > 0 else 1.0)
    ax.set_ylabel(quantity)
    ax.set_xlabel(f"bytes (dashed lines: {unit} boundaries)")
    subtitle = f"{int(starts.sum())} {units}, mean {n / max(int(starts.sum()), 1):.2f} bytes"
    if monotonic_threshold is not None:
        subtitle += f", monotonic threshold {monotonic_threshold:.3g}"
    ax.set_title(f"{title} ({subtitle})" if title else subtitle, fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path
