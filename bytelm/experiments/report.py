"""What ``bytelm compare``'s and ``bytelm ablate``'s reports share: the learning-rate searches, the
seed-to-seed spread and the verdicts on the gaps, the compute ledger's sentences, the failures.
Each report (compare: ``report.md``; ablate: ``ablation.md``) is these sections around its own tables."""

from __future__ import annotations

import numpy as np

from bytelm.evaluation.report import human, table


def rates_lines(searches: dict[str, dict], learning_rates, *, fix: str) -> list[str]:
    """The learning-rate searches (member -> its record, :meth:`~bytelm.experiments.rates.RateChoice.record`):
    a table of every rate tried with its validation BPB, how they were chosen, and a loud line for a
    choice still at an edge after the extensions (``fix``: where to widen the rates)."""
    if not searches:
        return []
    rows = [
        [
            name,
            s.get("cell") or "-",
            ", ".join(
                f"{lr}: " + ("failed" if v is None else f"{v:.4f}") for lr, v in s["validation_bpb"].items()
            ),
            str(s.get("extensions", 0)),
            (f"{s['chosen']:g}" + (" STILL AT AN EDGE" if s.get("at_edge") else ""))
            if s.get("chosen")
            else "-",
        ]
        for name, s in searches.items()
    ]
    fraction = next(iter(searches.values())).get("fraction", 1.0)
    runs = (
        "a run at the smallest budget per rate"
        if fraction == 1
        else f"a run at {fraction:g} of its steps per rate"
    )
    lines = [
        table(["model", "search cell", "validation BPB per rate", "extensions", "chosen"], rows, "lllrl"),
        "",
        f"Rates from {', '.join(f'{x:g}' for x in learning_rates)}, {runs}, scored on the validation split "
        "(train documents held out of training; never the held-out segments); where the best was at an end "
        "of the rates tried, one more rate beyond it, the grid's own ratio away, up to two "
        "(bytelm/experiments/rates.py).",
        "",
    ]
    edge = [name for name, s in searches.items() if s.get("at_edge") and s.get("chosen")]
    if edge:
        lines += [
            f"**WARNING: the chosen rate of {', '.join(edge)} is still at an end of the rates tried after "
            f"the extensions: the best rate may lie beyond it ({fix}).**",
            "",
        ]
    return lines


def spread(bpbs: list[float]) -> dict:
    """BPBs over seeds: the values, mean, standard deviation and range (max - min)."""
    return {
        "bpb": list(bpbs),
        "mean": float(np.mean(bpbs)),
        "std": float(np.std(bpbs, ddof=1)) if len(bpbs) > 1 else 0.0,
        "spread": float(max(bpbs) - min(bpbs)),
    }


def ranked_pairs(models: dict[str, dict]) -> list[dict]:
    """Adjacent pairs of the ranking by mean BPB (``models``: name -> :func:`spread`): the gap between
    their means and whether it exceeds the larger of their seed-to-seed ranges."""
    ranked = sorted(models, key=lambda n: models[n]["mean"])
    pairs = []
    for better, worse in zip(ranked, ranked[1:]):
        gap = models[worse]["mean"] - models[better]["mean"]
        widest = max(models[better]["spread"], models[worse]["spread"])
        pairs.append(
            {"better": better, "worse": worse, "gap": gap, "spread": widest, "exceeds": gap > widest}
        )
    return pairs


def seed_lines(seeds: dict | None, *, title: str) -> list[str]:
    """Per model its BPB per seed, mean, std and range, then a verdict per adjacent pair of the ranking."""
    if not seeds:
        return []
    rows = [
        [
            name,
            s.get("cell", "-"),
            ", ".join(f"{x:.4f}" for x in s["bpb"]),
            f"{s['mean']:.4f}",
            f"{s['std']:.4f}",
            f"{s['spread']:.4f}",
        ]
        for name, s in sorted(seeds["models"].items(), key=lambda kv: kv[1]["mean"])
    ]
    lines = [
        f"## {title}",
        "",
        table(["model", "cell", "BPB per seed", "mean", "std", "max - min"], rows, "llrrrr"),
        "",
    ]
    for pair in seeds["pairs"]:
        verdict = "exceeds" if pair["exceeds"] else "does NOT exceed"
        lines.append(
            f"- {pair['better']} < {pair['worse']}: the gap of the means, {pair['gap']:.4f} BPB, {verdict} "
            f"the larger seed-to-seed range of the two ({pair['spread']:.4f})"
        )
    return [*lines, ""]


def ledger_lines(auxiliary: dict[str, dict], shared: dict[str, dict] | None = None) -> list[str]:
    """What each model's auxiliary FLOPs are (``auxiliary``: name -> {what: FLOPs}), which total a budget
    matched, and, with ``shared`` one-off costs several runs carry, what sharing them would change."""
    lines = [
        f"`{name}` auxiliary FLOPs: " + "; ".join(f"{what} {human(v)}" for what, v in parts.items())
        for name, parts in auxiliary.items()
        if parts
    ]
    lines.append(
        "every budget is matched on each run's total FLOPs: its own training plus what it needs "
        "(bytelm/ledger.py); training a subword tokenizer is not neural compute and is on no ledger, nor are "
        "the learning-rate search runs (every model has one)"
    )
    for name, v in (shared or {}).items():
        lines.append(
            f"the UNAMORTISED totals were matched: each run that needs it pays the whole {name} "
            f"({human(v['flops'])} FLOPs) as if it were made for that run alone; it is shared by {v['runs']} "
            f"runs here, and amortised each would pay {human(v['flops'] / v['runs'])} (the *amortised total* "
            "column)"
        )
    return [f"- {line}" for line in lines]


def failure_lines(failed: list[tuple[str, str]]) -> list[str]:
    """A section listing ``(what, error)`` pairs, or nothing."""
    if not failed:
        return []
    return ["## Failures", "", *[f"- `{what}`: {error}" for what, error in failed], ""]
