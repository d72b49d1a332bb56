"""Scaling fits (bytelm/experiments/scaling.py) on planted power laws: parameters and crossovers
recovered, intervals that cover the planted values at about their level, curves that never meet
said not to, too few points refused; `bytelm scaling` end to end on a synthetic grid output."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bytelm import cli
from bytelm.errors import UserError
from bytelm.evaluation import stats
from bytelm.experiments import scaling
from bytelm.experiments.scaling import Point, PowerLaw, analyse, crossover, fit_power_law, fit_with_intervals

BUDGETS = np.geomspace(1e11, 1e13, 6)


def documents(rng, n_docs: int = 120):
    """Bytes per document and each document's difficulty (its own offset in BPB, mean 0 by bytes)."""
    nbytes = rng.integers(200, 2000, n_docs)
    shift = rng.normal(0.0, 0.15, n_docs)
    shift -= np.average(shift, weights=nbytes)
    return nbytes, shift


def planted_bits(law: PowerLaw, C, nbytes, shift, rng, noise: float = 0.05) -> list[np.ndarray]:
    """Bits per document of a run at each compute: the law's BPB plus the document's offset plus run
    noise per document, times its bytes (one seed each)."""
    return [
        ((law(c) + shift + rng.normal(0.0, noise, len(nbytes))) * nbytes)[None, :].astype(np.float64)
        for c in C
    ]


@pytest.mark.parametrize(
    "law", [PowerLaw(1.20, 0.80, 0.35, 1e12), PowerLaw(0.90, 1.00, 0.30, 1e12), PowerLaw(2.0, 0.5, 0.6, 1e12)]
)
def test_planted_power_laws_are_recovered(law):
    """Eight budgets over three decades, 0.2% noise on each point, five draws of the noise."""
    C = np.geomspace(1e10, 1e13, 8)
    for seed in range(5):
        rng = np.random.default_rng(seed)
        fit = fit_power_law(C, law(C) * (1 + 0.002 * rng.standard_normal(len(C))))
        assert abs(fit.alpha - law.alpha) <= 0.05, (seed, fit)
        assert abs(fit.E - law.E) <= 0.02 * law.E, (seed, fit)
        assert np.allclose(fit(C), law(C), rtol=0.01)


def test_a_planted_crossover_is_found_within_a_tenth_of_a_decade():
    rng = np.random.default_rng(2)
    f = PowerLaw(1.0, 1.2, 0.45, 1e12)  # steeper: worse at small compute, better at large
    g = PowerLaw(1.3, 0.6, 0.25, 1e12)
    true = crossover(f, g, BUDGETS[0], BUDGETS[-1])
    assert true is not None
    fits = [fit_power_law(BUDGETS, law(BUDGETS) * (1 + 0.002 * rng.standard_normal(6))) for law in (f, g)]
    found = crossover(*fits, BUDGETS[0], BUDGETS[-1])
    assert found is not None and abs(math.log10(found) - math.log10(true)) <= 0.1


@pytest.mark.slow
def test_intervals_cover_the_planted_parameters_at_about_their_level():
    """200 simulated grids (documents resampled: a new held-out set each time): the 95% bootstrap
    intervals of E, A and alpha cover the planted values in 85-99% of them."""
    law = PowerLaw(1.2, 0.8, 0.35, float(np.exp(np.log(BUDGETS).mean())))
    covered = np.zeros(3)
    sims = 200
    for k in range(sims):
        rng = np.random.default_rng(100 + k)
        nbytes, shift = documents(rng)
        bits = planted_bits(law, BUDGETS, nbytes, shift, rng)
        samples = stats.bootstrap(bits, nbytes, resamples=100, seed=k)
        bpb = np.array([b.sum() / nbytes.sum() for b in bits])
        fit = fit_with_intervals(BUDGETS, bpb, samples)
        for j, key in enumerate(("E", "A", "alpha")):
            _, lo, hi = fit[key]
            covered[j] += lo <= getattr(law, key) <= hi
    rate = covered / sims
    assert np.all((rate >= 0.85) & (rate <= 0.99)), rate


def grid_points(laws: dict[str, PowerLaw], rng, nbytes, shift):
    points, bits = [], []
    for fam, law in laws.items():
        for c, b in zip(BUDGETS, planted_bits(law, BUDGETS, nbytes, shift, rng, noise=0.02)):
            points.append(Point(fam, "base", float(c), float(c), [f"{fam}-{c:.3g}"]))
            bits.append(b)
    return points, bits


def test_curves_that_never_meet_are_said_not_to_and_crossings_are_found():
    rng = np.random.default_rng(3)
    nbytes, shift = documents(rng)
    laws = {
        "low": PowerLaw(1.0, 0.5, 0.3, 1e12),
        "high": PowerLaw(1.4, 0.5, 0.3, 1e12),  # the same shape 0.4 BPB higher: never meets "low"
        "steep": PowerLaw(0.7, 1.2, 0.5, 1e12),  # crosses "low" inside the range
    }
    points, bits = grid_points(laws, rng, nbytes, shift)
    result = analyse(points, nbytes, bits, resamples=60)
    pairs = {(c["a"], c["b"]): c for c in result["crossovers"]}
    never = pairs[("high", "low")]
    assert never["flops"] is None and "do not meet between" in never["statement"] and never["crossing"] < 0.05
    true = crossover(laws["low"], laws["steep"], BUDGETS[0], BUDGETS[-1])
    assert true is not None
    met = pairs[("low", "steep")]
    assert met["flops"] is not None and abs(math.log10(met["flops"]) - math.log10(true)) <= 0.1
    lo, hi = met["ci95"]
    assert lo <= met["flops"] <= hi and met["crossing"] > 0.9
    for fam, law in laws.items():
        rec = result["families"][fam]
        assert rec["alpha"][1] <= rec["alpha"][0] <= rec["alpha"][2]
        assert abs(rec["alpha"][0] - law.alpha) <= 0.05


def test_a_floor_the_points_do_not_reach_is_reported_as_not_determined():
    """Points of a pure power law (no floor): E goes to its bound 0 and the report says so."""
    rng = np.random.default_rng(6)
    nbytes, shift = documents(rng, 60)
    points, bits = grid_points({"fam": PowerLaw(0.0, 3.0, 0.15, 1e12)}, rng, nbytes, shift)
    result = analyse(points, nbytes, bits, resamples=40)
    rec = result["families"]["fam"]
    assert rec["E_at_bound"] and rec["E_at_bound_resamples"] > 0.5
    assert "not determined" in "\n".join(
        scaling.scaling_lines({**result, "figures": {"laws": "", "isoflop": ""}})
    )
    points, bits = grid_points({"fam": PowerLaw(1.5, 1.0, 0.5, 1e12)}, rng, nbytes, shift)
    assert not analyse(points, nbytes, bits, resamples=40)["families"]["fam"]["E_at_bound"]


def test_too_few_points_are_refused_in_a_line():
    with pytest.raises(UserError, match="needs at least 4 budgets .* this series has 3"):
        fit_power_law(BUDGETS[:3], [2.0, 1.9, 1.8])
    rng = np.random.default_rng(4)
    nbytes, shift = documents(rng, 30)
    points, bits = grid_points({"fam": PowerLaw(1.0, 0.5, 0.3, 1e12)}, rng, nbytes, shift)
    keep = [0, 2, 4]
    result = analyse([points[i] for i in keep], nbytes, [bits[i] for i in keep], resamples=40)
    rec = result["families"]["fam"]
    assert "refused" in rec and "E" not in rec and result["crossovers"] == []


def test_iso_flop_optimum_is_the_parabola_vertex_or_the_edge():
    v = np.array([2.0, 4.0, 8.0, 16.0])
    L = 1.0 + 0.1 * (np.log(v) - math.log(5.0)) ** 2
    opt, interior = scaling.iso_flop_optimum(v, L)
    assert interior and opt == pytest.approx(5.0, rel=1e-6)
    opt, interior = scaling.iso_flop_optimum(v, 2.0 - 0.01 * np.log(v))  # still falling at the edge
    assert not interior and opt == 16.0


def synthetic_grid(out, rng):
    """An ablation output (ablation.json + scores.jsonl) of planted laws: two families, MegaByte with a
    patch-size axis whose optimum grows with compute."""
    nbytes, shift = documents(rng, 40)
    runs, models, lines = [], [], []
    k = 0
    for fam, cells in {
        "byte": ["base"],
        "megabyte": ["patch_size=2", "patch_size=4", "patch_size=8"],
    }.items():
        for cell in cells:
            for b, c in enumerate(BUDGETS):
                P = float(cell.split("=")[1]) if "=" in cell else 1.0
                best = 2.0 * (c / 1e11) ** 0.15  # the optimal patch size at this compute
                base = 1.0 + 0.8 * (c / 1e12) ** -0.3 + (0.05 if fam == "byte" else 0.0)
                level = base + 0.05 * (math.log(P) - math.log(best)) ** 2 if fam == "megabyte" else base
                bits = (level + shift + rng.normal(0, 0.02, len(nbytes))) * nbytes
                rid = f"r{k}"
                k += 1
                runs.append({"id": rid, "family": fam, "cell": cell, "budget": float(c), "budget_index": b,
                             "lr": 0.01, "seed": 0, "stage": "grid", "in_grid": True,
                             "bpb": float(bits.sum() / nbytes.sum()), "flops_total": float(c)})  # fmt: skip
                models.append({"name": rid, "family": fam, "seeds": 1})
                lines += [
                    json.dumps(
                        {
                            "level": "document",
                            "model": rid,
                            "seed": 0,
                            "doc": j,
                            "name": f"d{j}",
                            "group": "<top>",
                            "bytes": int(n),
                            "bits": float(x),
                        }
                    )  # fmt: skip
                    for j, (n, x) in enumerate(zip(nbytes, bits))
                ]
    header = {"format": "bytelm-eval-scores", "version": 1, "fingerprint": "f" * 64, "protocol": 2,
              "models": models, "segments": len(nbytes), "documents": len(nbytes),
              "bytes": int(nbytes.sum())}  # fmt: skip
    out.mkdir(parents=True)
    (out / "scores.jsonl").write_text("\n".join([json.dumps(header), *lines]) + "\n")
    (out / "ablation.json").write_text(json.dumps({"fingerprint": "f" * 64, "runs": runs}))


def test_bytelm_scaling_end_to_end_on_a_grid_output(tmp_path, capsys):
    synthetic_grid(tmp_path / "grid", np.random.default_rng(5))
    out = tmp_path / "fits"
    assert cli.main(["scaling", str(tmp_path / "grid"), "--out", str(out), "--resamples", "60"]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "scaling.json").read_text())
    assert set(result["families"]) == {"byte", "megabyte"} and "megabyte (patch_size=4)" in result["cells"]
    per = result["families"]["megabyte"]["optima"]["series"]["base"]["per_budget"]
    assert len(per) == 6 and per[-1]["optimum"] > per[0]["optimum"] + 1.0  # planted: 2 -> 4 over the range
    assert result["families"]["megabyte"]["optima"]["series"]["base"]["law"]["exponent"][0] > 0
    assert (out / "scaling.png").read_bytes()[:4] == b"\x89PNG" and (
        out / "isoflop.png"
    ).stat().st_size > 5000
    assert "alpha" in (out / "scaling.md").read_text() and "megabyte" in printed
    assert cli.main(["scaling", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
