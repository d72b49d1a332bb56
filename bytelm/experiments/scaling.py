"""Scaling fits over ablation grids (``bytelm scaling``): power laws per family and per cell series,
compute-optimal patch sizes and vocabularies per budget, and crossover compute between families.

Inputs: one or more ``bytelm ablate`` outputs (``ablation.json`` and ``scores.jsonl``: every run's
bits per held-out document), on one evaluation set (the fingerprints must agree). A point is a
grid cell at a budget: its BPB on the held-out bytes (the mean over its seeds when it has several)
against its **total training FLOPs** from the ledger (``flops_total``: its own training plus what it
needs, as the grid matches them).

Fits (docs/ablations.md, "Scaling fits", says why this form and this loss):

- **Power law** ``L(C) = E + A (C / C0)^-alpha`` (``C0``: the geometric mean of the fitted compute,
  which only conditions the fit), by :func:`scipy.optimize.least_squares` on the relative residuals
  ``L_fit / L - 1`` with ``E`` in ``[0, min L)``, ``alpha`` in ``[0, 4]``, from several starts
  (``E_at_bound``: the fit put ``E`` at 0, i.e. the points, far from any floor, do not determine it,
  and the law is a pure power law over them; ``E_at_bound_resamples``: how often the resamples did); per
  cell series (one cell across budgets) and per family (its best cell at each budget: the family's
  compute-optimal frontier). At least :data:`MIN_POINTS` budgets, else the fit is refused with a
  line saying how many it has.
- **Iso-FLOP optimum** per budget, for a family whose cells vary one numeric axis (MegaByte's patch
  size, BLT's target patch length, H-Net's target chunk length, the subword vocabulary size): a
  parabola in ``log(axis)`` through the cells' BPB (at least 3 values), its vertex when it is a
  minimum inside the measured range, else the best measured value, flagged ``interior: false``.
  The optimum's law against compute: ``log(opt) = a + b log(C)`` over the budgets (at least 3).
- **Crossover**: for every pair of families, the compute where their frontier laws meet inside the
  range both were fitted on (the first sign change of their difference), or the statement that they
  do not meet there; where they meet only beyond it (up to :data:`EXTRAPOLATE` times the largest
  budget), that compute is given apart, as an extrapolation.

**Intervals** (95%) come from the cluster bootstrap over held-out documents, two-level for a point
with several seeds (:func:`bytelm.evaluation.stats.bootstrap`: one document resample shared by every
point, so a family's points move together as they do in reality): every resample's BPBs are refitted
(starting from the point fit) and the 2.5/97.5 percentiles of each figure taken. A crossover's
interval is over the resamples in which the laws meet; ``crossing`` is that fraction.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import brentq, least_squares

from bytelm.atomic import atomic_write_text
from bytelm.errors import UserError
from bytelm.evaluation import stats

SCALING_VERSION = 1
MIN_POINTS = 4  # three parameters and one to spare
MIN_AXIS = 3  # cells on an axis for an iso-FLOP parabola; budgets for the optimum's law
EXTRAPOLATE = 100.0  # how far past the largest budget a crossover is looked for (labelled extrapolated)
RESAMPLES = 400
ALPHA_STARTS = (0.05, 0.2, 0.5, 1.0, 2.0)
#: the cell keys that are an iso-FLOP axis (the label's key, ``cell_label`` drops the prefix)
AXES = ("patch_size", "target_patch_len", "target_chunk_len", "vocab_size")


# -- the power law ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PowerLaw:
    """``L(C) = E + A (C / c0)^-alpha``."""

    E: float
    A: float
    alpha: float
    c0: float

    def __call__(self, C) -> np.ndarray:
        return self.E + self.A * np.power(np.asarray(C, np.float64) / self.c0, -self.alpha)


def _residuals(theta: np.ndarray, logx: np.ndarray, L: np.ndarray) -> np.ndarray:
    E, log_a, alpha = theta
    return (E + np.exp(log_a - alpha * logx)) / L - 1.0


def fit_power_law(C, L, *, start: PowerLaw | None = None) -> PowerLaw:
    """The least-squares ``E + A (C/c0)^-alpha`` through ``(C, L)`` (module docstring); ``start``: one
    start (a bootstrap refit), else :data:`ALPHA_STARTS`. Needs :data:`MIN_POINTS` distinct ``C``."""
    C = np.asarray(C, np.float64)
    L = np.asarray(L, np.float64)
    if len(np.unique(C)) < MIN_POINTS:
        raise UserError(
            f"fitting E + A * C^-alpha needs at least {MIN_POINTS} budgets (3 parameters and one to spare); "
            f"this series has {len(np.unique(C))}"
        )
    if not (np.all(C > 0) and np.all(L > 0) and np.all(np.isfinite(L))):
        raise UserError("a power law needs positive compute and positive, finite BPB at every point")
    c0 = float(np.exp(np.log(C).mean()))
    logx = np.log(C / c0)
    top = float(L.min()) * (1 - 1e-9)
    lower, upper = [0.0, -50.0, 0.0], [top, 50.0, 4.0]
    if start is not None:
        starts: list[tuple[float, float, float]] = [
            (min(start.E, top * 0.999), math.log(max(start.A, 1e-12)), start.alpha)
        ]
    else:
        starts = []
        for alpha in ALPHA_STARTS:
            E = 0.5 * top
            A = max(float(np.mean((L - E) * np.exp(alpha * logx))), 1e-9)
            starts.append((E, math.log(A), alpha))
    best = None
    for s in starts:
        x0 = np.clip(np.asarray(s, np.float64), np.asarray(lower) + 1e-12, np.asarray(upper) - 1e-12)
        res = least_squares(
            _residuals, x0, bounds=(lower, upper), args=(logx, L), method="trf", x_scale="jac"
        )
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    E, log_a, alpha = best.x
    return PowerLaw(float(E), float(math.exp(log_a)), float(alpha), c0)


def crossover(f: PowerLaw, g: PowerLaw, lo: float, hi: float, points: int = 256) -> float | None:
    """The smallest compute in ``[lo, hi]`` where ``f`` and ``g`` meet (a sign change of ``f - g``),
    or None."""
    grid = np.geomspace(lo, hi, points)
    d = f(grid) - g(grid)
    if np.any(d == 0):
        return float(grid[np.flatnonzero(d == 0)[0]])
    change = np.flatnonzero(np.sign(d[:-1]) != np.sign(d[1:]))
    if not len(change):
        return None
    i = int(change[0])

    def h(t: float) -> float:
        return float(f(math.exp(t)) - g(math.exp(t)))

    return float(math.exp(brentq(h, math.log(grid[i]), math.log(grid[i + 1]))))


def iso_flop_optimum(axis, L) -> tuple[float, bool]:
    """``(optimum, interior)``: the vertex of the parabola in ``log(axis)`` through ``L`` when it is a
    minimum inside the measured range, else the best measured value (``interior`` False)."""
    values = np.asarray(axis, np.float64)
    t = np.log(values)
    L = np.asarray(L, np.float64)
    if len(np.unique(t)) < MIN_AXIS:
        raise UserError(
            f"an iso-FLOP optimum needs at least {MIN_AXIS} values on the axis, got {len(np.unique(t))}"
        )
    c2, c1, _ = np.polyfit(t, L, 2)
    if c2 > 0:
        vertex = -c1 / (2 * c2)
        if t.min() <= vertex <= t.max():
            return float(math.exp(vertex)), True
    return float(values[np.argmin(L)]), False


def _interval(samples: np.ndarray) -> list[float | None]:
    samples = np.asarray(samples, np.float64)
    samples = samples[np.isfinite(samples)]
    if not len(samples):
        return [None, None]
    lo, hi = np.percentile(samples, [2.5, 97.5])
    return [float(lo), float(hi)]


# -- reading ablation outputs ---------------------------------------------------------------------
@dataclasses.dataclass
class Point:
    """A grid cell at a budget: its runs' ids (seed 0 first), compute, and where its bits are."""

    family: str
    cell: str
    budget: float
    flops: float
    ids: list[str]


def _axis_of(cell: str) -> tuple[str | None, float | None, str]:
    """``(axis key, axis value, the rest of the label)`` of a cell label (no axis: ``(None, None, cell)``)."""
    parts = [p.split("=", 1) for p in cell.split(",") if "=" in p]
    for key, value in parts:
        if key in AXES:
            try:
                v = float(value)
            except ValueError:
                continue
            rest = ",".join(f"{k}={w}" for k, w in parts if k != key) or "base"
            return key, v, rest
    return None, None, cell


def read_grids(
    dirs: Sequence[str | Path],
) -> tuple[list[Point], np.ndarray, list[np.ndarray], str]:
    """The points of the ablation outputs ``dirs``, and their bits per document: ``(points, bytes per
    document, bits (K, D) per point, fingerprint)``."""
    points: dict[tuple, Point] = {}
    bits_of: dict[str, np.ndarray] = {}
    nbytes = None
    fingerprint = None
    for d in dirs:
        d = Path(d)
        report_path, scores_path = d / "ablation.json", d / "scores.jsonl"
        for p in (report_path, scores_path):
            if not p.is_file():
                raise UserError(f"{p} does not exist: give the --out directory of a finished 'bytelm ablate'")
        try:
            report = json.loads(report_path.read_text())
            header, ds = stats.read_scores(scores_path)
        except (ValueError, KeyError) as e:
            raise UserError(
                f"{d}: cannot read its ablation.json / scores.jsonl ({e}); run 'bytelm ablate "
                f"--collect --out {d}' to write them again"
            ) from None
        if fingerprint is not None and report.get("fingerprint") != fingerprint:
            raise UserError(
                f"{d} was evaluated on other held-out bytes (fingerprint "
                f"{str(report.get('fingerprint'))[:16]}, not {fingerprint[:16]}): scaling fits combine "
                "grids of one evaluation set only"
            )
        fingerprint = report.get("fingerprint")
        if nbytes is not None and not np.array_equal(nbytes, ds.nbytes):
            raise UserError(f"{d}: its held-out documents differ from the other grids'")
        nbytes = ds.nbytes
        for name, b in zip(ds.names, ds.bits):
            bits_of[name] = b
        for r in report.get("runs", []):
            if r.get("bpb") is None or r["id"] not in bits_of or not r.get("flops_total"):
                continue
            key = (r["family"], r["cell"], float(r["budget"]), r.get("lr"))
            if r["seed"] == 0 and r.get("in_grid"):
                pt = points.setdefault(key, Point(r["family"], r["cell"], float(r["budget"]), 0.0, []))
                pt.ids.insert(0, r["id"])
                pt.flops = float(r["flops_total"])
            elif r.get("stage") == "seeds":
                points.setdefault(key, Point(r["family"], r["cell"], float(r["budget"]), 0.0, [])).ids.append(
                    r["id"]
                )
    done = [p for p in points.values() if p.flops > 0]
    if not done or nbytes is None or fingerprint is None:
        raise UserError(f"no finished grid cell with scores in {', '.join(map(str, dirs))}")
    bits = [np.concatenate([bits_of[i] for i in p.ids], axis=0) for p in done]
    return done, nbytes, bits, fingerprint


# -- the analysis ----------------------------------------------------------------------------------
def fit_with_intervals(C: np.ndarray, L: np.ndarray, samples: np.ndarray) -> dict:
    """A power law with intervals: the point fit, and ``samples`` (R, n) refitted."""
    try:
        law = fit_power_law(C, L)
    except UserError as e:
        return {"refused": str(e)}
    fits = np.array([dataclasses.astuple(fit_power_law(C, s, start=law))[:3] for s in samples])
    curves = {}
    for name, (lo, hi) in (
        ("curve", (C.min(), C.max())),
        ("extrapolation", (C.max(), C.max() * EXTRAPOLATE)),
    ):
        grid = np.geomspace(lo, hi, 48)
        band = np.array([_law(row, law.c0)(grid) for row in fits])
        low, high = np.percentile(band, [2.5, 97.5], axis=0)
        curves[name] = {
            "flops": grid.tolist(),
            "bpb": law(grid).tolist(),
            "lo": low.tolist(),
            "hi": high.tolist(),
        }
    bound = 1e-6 * float(np.min(L))  # E this small is E at its lower bound, 0: the points do not determine it
    return {
        "E_at_bound": bool(law.E <= bound),
        "E_at_bound_resamples": float(np.mean(fits[:, 0] <= bound)),
        "E": [law.E, *_interval(fits[:, 0])],
        "A": [law.A, *_interval(fits[:, 1])],
        "alpha": [law.alpha, *_interval(fits[:, 2])],
        "c0": law.c0,
        "range": [float(C.min()), float(C.max())],
        **curves,
        "_law": law,
        "_fits": fits,
    }


def analyse(
    points: list[Point],
    nbytes: np.ndarray,
    bits: list[np.ndarray],
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict:
    """Every fit of the module docstring over ``points`` (their bits per document: ``bits``)."""
    total = float(nbytes.sum())
    bpb = np.array([b.sum(axis=1).mean() / total for b in bits])
    samples = stats.bootstrap(bits, nbytes, resamples=resamples, seed=seed)  # (R, points)
    out: dict = {
        "version": SCALING_VERSION,
        "resamples": resamples,
        "seed": seed,
        "families": {},
        "cells": {},
    }
    families = sorted({p.family for p in points})
    frontier: dict[str, dict] = {}
    for fam in families:
        idx = [i for i, p in enumerate(points) if p.family == fam]
        for cell in sorted({points[i].cell for i in idx}):
            series = sorted((i for i in idx if points[i].cell == cell), key=lambda i: points[i].flops)
            C = np.array([points[i].flops for i in series])
            fit = fit_with_intervals(C, bpb[series], samples[:, series])
            out["cells"][f"{fam} ({cell})"] = {
                "family": fam,
                "cell": cell,
                "points": [
                    {
                        "flops": points[i].flops,
                        "budget": points[i].budget,
                        "bpb": float(bpb[i]),
                        "seeds": int(bits[i].shape[0]),
                    }
                    for i in series
                ],
                **{k: v for k, v in fit.items() if not k.startswith("_")},
            }
        # the frontier: the best cell at each budget (in each resample too)
        budgets = sorted({points[i].budget for i in idx})
        at = [[i for i in idx if points[i].budget == b] for b in budgets]
        best = [members[int(np.argmin(bpb[members]))] for members in at]
        C = np.array([points[i].flops for i in best])
        L = np.array([bpb[i] for i in best])
        L_samples = np.stack([samples[:, members].min(axis=1) for members in at], axis=1)
        fit = fit_with_intervals(C, L, L_samples)
        frontier[fam] = fit
        out["families"][fam] = {
            "points": [
                {
                    "flops": points[i].flops,
                    "budget": points[i].budget,
                    "bpb": float(bpb[i]),
                    "cell": points[i].cell,
                }
                for i in best
            ],
            **{k: v for k, v in fit.items() if not k.startswith("_")},
        }
        optima = _optima(points, idx, bpb, samples)
        if optima:
            out["families"][fam]["optima"] = optima
    out["crossovers"] = _crossovers(frontier)
    return out


def _optima(points: list[Point], idx: list[int], bpb: np.ndarray, samples: np.ndarray) -> dict | None:
    """Per budget the iso-FLOP optimum on the family's axis (module docstring), and its law."""
    axes = {_axis_of(points[i].cell)[0] for i in idx}
    if len(axes) != 1 or None in axes:
        return None
    (key,) = axes
    groups = sorted({_axis_of(points[i].cell)[2] for i in idx})
    out: dict = {"axis": key, "series": {}}
    for rest in groups:
        rows: list[dict] = []
        for b in sorted({points[i].budget for i in idx}):
            members = [i for i in idx if points[i].budget == b and _axis_of(points[i].cell)[2] == rest]
            values = np.array([_axis_of(points[i].cell)[1] for i in members], np.float64)
            if len(np.unique(values)) < MIN_AXIS:
                continue
            opt, interior = iso_flop_optimum(values, bpb[members])
            boot = np.array([iso_flop_optimum(values, s[members])[0] for s in samples])
            rows.append(
                {
                    "budget": b,
                    "flops": float(np.exp(np.mean([math.log(points[i].flops) for i in members]))),
                    "optimum": opt,
                    "ci95": _interval(boot),
                    "interior": interior,
                    "measured": {f"{v:g}": float(bpb[i]) for v, i in zip(values, members)},
                    "_boot": boot,
                }
            )
        if not rows:
            continue
        series: dict = {"per_budget": [{k: v for k, v in r.items() if k != "_boot"} for r in rows]}
        if len(rows) >= MIN_AXIS:
            logC = np.log(np.array([float(r["flops"]) for r in rows]))
            opts = np.log(np.array([float(r["optimum"]) for r in rows]))
            slope, icpt = np.polyfit(logC, opts, 1)
            boot = np.stack([np.asarray(r["_boot"]) for r in rows], axis=1)
            slopes = [np.polyfit(logC, np.log(b), 1)[0] for b in boot]
            series["law"] = {
                "exponent": [float(slope), *_interval(np.asarray(slopes))],
                "log_prefactor": float(icpt),
            }
        else:
            series["law"] = {
                "refused": f"the optimum's law against compute needs {MIN_AXIS} budgets with an "
                f"iso-FLOP optimum; {len(rows)} here"
            }
        out["series"][rest] = series
    return out if out["series"] else None


def _crossovers(frontier: dict[str, dict]) -> list[dict]:
    out = []
    fams = [f for f in sorted(frontier) if "_law" in frontier[f]]
    for i, a in enumerate(fams):
        for b in fams[i + 1 :]:
            fa, fb = frontier[a], frontier[b]
            lo = max(fa["range"][0], fb["range"][0])
            hi = min(fa["range"][1], fb["range"][1])
            rec: dict = {"a": a, "b": b, "range": [lo, hi]}
            if lo >= hi:
                rec["statement"] = f"{a} and {b} were fitted on ranges of compute that do not overlap"
                out.append(rec)
                continue
            at = crossover(fa["_law"], fb["_law"], lo, hi)
            boot = [
                crossover(_law(x, fa["c0"]), _law(y, fb["c0"]), lo, hi)
                for x, y in zip(fa["_fits"], fb["_fits"])
            ]
            met = np.array([c for c in boot if c is not None])
            rec["crossing"] = len(met) / max(len(boot), 1)
            rec["flops"] = at
            rec["ci95"] = _interval(met) if len(met) else [None, None]
            if at is None:
                rec["statement"] = (
                    f"{a} and {b} do not meet between {lo:.3g} and {hi:.3g} FLOPs (the fitted range)"
                )
                beyond = crossover(fa["_law"], fb["_law"], hi, hi * EXTRAPOLATE)
                if beyond is not None:
                    rec["extrapolated_flops"] = beyond
                    rec["statement"] += f"; extrapolated, their laws meet at {beyond:.3g} FLOPs"
            else:
                rec["statement"] = (
                    f"{a} and {b} meet at {at:.3g} FLOPs (95% interval {_fmt(rec['ci95'])}; the laws meet in "
                    f"{rec['crossing']:.0%} of the resamples)"
                )
            out.append(rec)
    return out


def _law(row: np.ndarray, c0: float) -> PowerLaw:
    return PowerLaw(float(row[0]), float(row[1]), float(row[2]), c0)


def _fmt(ci: list) -> str:
    return "-" if ci[0] is None else f"{ci[0]:.3g} to {ci[1]:.3g}"


# -- the command -----------------------------------------------------------------------------------
def scaling(
    dirs: Sequence[str | Path], out: str | Path, *, resamples: int = RESAMPLES, seed: int = 0
) -> dict:
    """``bytelm scaling DIR... --out OUT``: the fits of ``dirs`` into ``OUT/scaling.json``,
    ``OUT/scaling.md`` and the figures ``OUT/scaling.png`` and ``OUT/isoflop.png``."""
    from bytelm.experiments.scaling_plots import plot_isoflop, plot_scaling  # noqa: PLC0415 (matplotlib)

    if resamples < 20:
        raise UserError(f"--resamples must be >= 20 for a 95% interval, got {resamples}")
    points, nbytes, bits, fingerprint = read_grids(dirs)
    result = analyse(points, nbytes, bits, resamples=resamples, seed=seed)
    result["sources"] = [str(Path(d).resolve()) for d in dirs]
    result["fingerprint"] = fingerprint
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result["figures"] = {"laws": "scaling.png", "isoflop": "isoflop.png"}
    plot_scaling(out / "scaling.png", result, EXTRAPOLATE)
    plot_isoflop(out / "isoflop.png", result)
    atomic_write_text(out / "scaling.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(out / "scaling.md", "\n".join(scaling_lines(result)) + "\n")
    return result


def _ci(v: list) -> str:
    return f"{v[0]:.4g} [{_fmt(v[1:])}]"


def scaling_lines(result: dict) -> list[str]:
    """The fits as Markdown tables and sentences."""
    lines = [
        "# Scaling fits",
        "",
        f"L(C) = E + A (C / C0)^-alpha per family (its best cell at each budget), "
        f"95% intervals from {result['resamples']} bootstrap resamples over held-out documents and seeds.",
        "",
        "| family | points | E | A | alpha | C0 |",
        "|---|---:|---|---|---|---:|",
    ]
    for fam, rec in result["families"].items():
        if "refused" in rec:
            lines.append(f"| {fam} | {len(rec['points'])} | refused: {rec['refused']} | | | |")
            continue
        E = _ci(rec["E"])
        if rec.get("E_at_bound"):
            E = f"0 (at its bound in {rec['E_at_bound_resamples']:.0%} of resamples: not determined)"
        lines.append(
            f"| {fam} | {len(rec['points'])} | {E} | {_ci(rec['A'])} | {_ci(rec['alpha'])} | "
            f"{rec['c0']:.3g} |"
        )
    lines += ["", "## Crossovers", ""]
    lines += [f"- {c['statement']}" for c in result["crossovers"]] or ["- (fewer than two fitted families)"]
    lines += ["", "## Compute-optimal patch size and vocabulary", ""]
    for fam, rec in result["families"].items():
        for rest, series in (rec.get("optima") or {}).get("series", {}).items():
            axis = rec["optima"]["axis"]
            per = "; ".join(
                f"{r['budget']:.3g}: {r['optimum']:.4g} [{_fmt(r['ci95'])}]"
                + ("" if r["interior"] else " (edge)")
                for r in series["per_budget"]
            )
            law = series["law"]
            tail = (
                f"; optimum ~ C^{law['exponent'][0]:.3f} [{_fmt(law['exponent'][1:])}]"
                if "exponent" in law
                else f"; {law['refused']}"
            )
            lines.append(f"- {fam} ({rest}), {axis}: {per}{tail}")
    lines += ["", f"![laws]({result['figures']['laws']})", "", f"![iso-FLOP]({result['figures']['isoflop']})"]
    return lines
