"""``bytelm ablate``: patch size vs subword vocabulary at several compute budgets.

A **grid** (``configs/ablations/NAME.toml``, docs/ablations.md) names the budgets, the learning
rates to sweep, the size rule and, per family, the cells to vary::

    [ablation]
    budgets = [2.5e11, 1e12]          # training FLOPs per run (bytelm ablate --scale S multiplies them)
    learning_rates = [1e-3, 3e-3, 1e-2]
    extra_seeds = 2                   # the best cell of each family at the smallest budget, seeds 1..2
    eval_points = 4                   # periodic evaluations per run (the curves of bpb_vs_flops.png)
    set = ["data.validation_fraction=0.05"]   # overrides for every run

    [size]                            # the size rule (SizeRule below)
    tokens_per_param = 20

    [entropy]                         # BLT's entropy model (an artefact, its own budget)
    config = "../tiny/entropy.toml"
    flop_budget = 5e11

    [[family]]
    name = "megabyte"                 # the series (and run directory) name
    config = "../tiny/megabyte.toml"  # relative to the grid file
    grid = { "model.patch_size" = [2, 4, 8] }   # cells: the product of these lists
    sweep = { "model.patch_size" = 4 }          # the cell whose learning-rate sweep the family uses

``tokenizer.vocab_size`` and ``tokenizer.pattern`` in a grid name the subword tokenizer of the
cell (trained by the grid, one per distinct tokenizer); ``tokenizer.kind`` (``bpe``, the default,
or ``unigram``) and ``tokenizer.encoder`` (the kind's own rule, or ``longest``) are optional.
``lr_from = "blt"`` reuses another family's chosen rate.

The grid becomes an :class:`~bytelm.experiments.spec.Experiment` and the one runner
(:mod:`bytelm.experiments.runner`) carries it out in its four stages: artefacts (tokenizers, the
entropy model), the learning-rate sweep at the smallest budget on the validation split (the rates
extended past an edge), every cell at every budget, and the extra seeds of each family's best cell.
Every run lives in ``OUT/runs/<family>/<cell>/C<budget>-lr<lr>-s<seed>``; a finished run is
skipped, an interrupted one resumes, a failing one is reported and the others go on.
``--print-commands`` prints the commands of the first unfinished stage (run them anywhere, then
ask again for the next stage); ``--collect`` trains nothing and builds the report from what is
on disk. Results: ``ablation.json``, ``ablation.md``, ``bpb_vs_bytes_per_step.png``,
``bpb_vs_flops.png`` and, when the held-out data has several top-level directories,
``bpb_per_group.png``; a finished grid's scaling fits (:mod:`bytelm.experiments.scaling`) in
``OUT/scaling/``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np

from bytelm.atomic import atomic_write_text
from bytelm.bpb import SegmentScores, breakdown
from bytelm.config import shipped_configs
from bytelm.errors import UserError
from bytelm.evaluation import stats
from bytelm.evaluation.plots import (
    plot_bpb_per_group,
    plot_bpb_vs_bytes_per_step,
    plot_probes,
    plot_training_curves,
)
from bytelm.evaluation.probe_tables import probe_lines
from bytelm.evaluation.probes import probe_runs
from bytelm.evaluation.report import (
    heldout_lines,
    human,
    interval_cell,
    pairs_table,
    seconds,
    statistics_lines,
    table,
    write_scores,
)
from bytelm.evaluation.results import EvalSet, ModelResult
from bytelm.experiments import spec
from bytelm.experiments.report import (
    failure_lines,
    ledger_lines,
    ranked_pairs,
    rates_lines,
    seed_lines,
    spread,
)
from bytelm.experiments.runner import STAGES, Note, Runner, StageProgress
from bytelm.experiments.spec import Experiment, cell_label
from bytelm.rundir import RunDir
from bytelm.training.distributed import is_primary

GRID_DIR = shipped_configs() / "ablations"


def find_grid(name_or_path: str) -> Path:
    """A grid file path, or the name of a file in ``configs/ablations/``."""
    return spec.find_toml(name_or_path, GRID_DIR, "ablation grid")


def load_grid(name_or_path: str) -> Experiment:
    return spec.load_grid(find_grid(name_or_path))


@dataclasses.dataclass
class AblationResult:
    out: Path
    report: dict
    stage: str  # the first unfinished stage ("done" when the grid is complete)
    commands: list[str]
    scaling: dict | None = None  # the fits of a finished grid (OUT/scaling/scaling.json)


class AblationRunner(Runner):
    """The runner with the grid's outputs: ``ablation.json``, ``ablation.md`` and the plots."""

    stopped_message = "run the same ablate again (same --out {out}) to resume"

    def shared_auxiliary(self) -> dict[str, dict]:
        """One-off auxiliary costs shared by several runs of the grid (its one entropy model's training):
        name -> ``{"flops", "runs"}``, ``runs`` the planned runs whose ledgers carry it."""
        shared: dict[str, dict] = {}
        for r in self.runs.values():
            if r.error is None and r.ledger is not None and not r.artefact:
                for name, flops in r.ledger.auxiliary_fixed.items():
                    if name == "entropy model training":
                        shared.setdefault(name, {"flops": flops, "runs": 0})["runs"] += 1
        return shared

    def probe(self, report: dict) -> dict:
        """The probes (bytelm/evaluation/probes.py) of each family's best cell at the largest budget,
        cached in ``OUT/probes``."""
        last = len(self.budgets) - 1
        best = _best_per_family([r for r in grid_rows(report, last) if r.get("bpb") is not None])
        runs = {f"{r['family']} ({r['cell']})": r["run_dir"] for r in best}
        single = jax.process_count() == 1  # (several processes: each scores everything, no cache)
        return probe_runs(
            self.eval_set, self.corpus, runs, out=self.out / "probes" if single else None, note=self.say
        )

    def build_report(self, stage: str) -> dict:
        size, validation = self.exp.size, self.validation_set
        if size is None or validation is None:
            raise RuntimeError("an ablation grid has a size rule and a validation split")
        rows = []
        shared = self.shared_auxiliary()
        order = {m.name: i for i, m in enumerate(self.exp.members)}
        # one order whatever order the runs were planned in (a re-run plans a sweep's extensions at once)
        planned = sorted(
            self.runs.values(),
            key=lambda r: (
                STAGES.index(r.stage),
                order.get(r.member, -1),
                r.budget_index,
                cell_label(r.cell),
                r.lr or 0.0,
                r.seed,
            ),
        )
        for r in planned:
            res = r.result
            row = {
                "id": r.id,
                "stage": r.stage,
                "family": r.member,
                "cell": cell_label(r.cell),
                "budget": r.budget,
                "budget_index": r.budget_index,
                "lr": r.lr,
                "seed": r.seed,
                "run_dir": str(r.run_dir),
                "steps": r.steps,
                "status": "failed"
                if r.error
                else ("done" if res is not None else ("not run" if not r.finished() else "trained")),
                "error": r.error,
                "validation_bpb": r.validation_bpb,
                "in_grid": r.in_grid,
            }
            if res is not None:
                info = RunDir(r.run_dir).info_or_empty()
                amortised = None
                if res.flops_total is not None:
                    parts = res.auxiliary or {}
                    amortised = res.flops_total - sum(
                        v["flops"] - v["flops"] / v["runs"] for k, v in shared.items() if k in parts
                    )
                row.update(
                    bpb=res.bpb,
                    mean_bytes_per_global_step=res.mean_bytes_per_global_step,
                    train_flops=res.flops,
                    flops_auxiliary=res.flops_auxiliary,
                    flops_total=res.flops_total,
                    flops_total_amortised=amortised,
                    auxiliary_flops=res.auxiliary,
                    inference_flops_per_byte=res.total_inference_flops_per_byte,
                    params=res.params,
                    entropy_inference_flops_per_byte=res.entropy_inference_flops_per_byte,
                    wall_s=info.get("train_s", info.get("wall_s")),
                    bytes_seen=res.bytes_seen,
                    nats=res.scores.nats.tolist(),
                    nbytes=res.scores.nbytes.tolist(),
                )
            rows.append(row)
        report = {
            "grid": self.exp.name,
            "grid_path": str(self.exp.path),
            "stage": stage,
            "fingerprint": self.eval_set.fingerprint,
            "eval_bytes": self.eval_set.n_bytes,
            "validation_fingerprint": validation.fingerprint,
            "validation_bytes": validation.n_bytes,
            "data": {**self.eval_set.describe(), "dirs": sorted(set(self.eval_set.dirs))},
            "budgets": self.budgets,
            "scale": self.scale,
            "size_rule": dataclasses.asdict(size),
            "trunks": {f"{b:.3g}": dict(zip(("d_model", "layers"), size.trunk(b))) for b in self.budgets},
            "learning_rates": list(self.exp.learning_rates),
            "sweep": self.searches,
            "matched": "total",
            "shared_auxiliary": shared,
            "failed_artefacts": self.failed_artefacts,
            "runs": rows,
        }
        report["seed_spread"] = seed_spread(rows)
        report["statistics"] = budget_statistics(rows, self.eval_set, len(self.budgets))
        report["sentences"] = budget_sentences(report)
        return report


def budget_statistics(rows: list[dict], eval_set: EvalSet, n_budgets: int) -> dict[str, dict]:
    """Per budget (index as a string): every scored grid cell's interval (``ci95``, by cell label
    ``family (cell)``) and the paired differences of each family's best cell, from the cluster
    bootstrap over held-out documents; a cell run with extra seeds folds them in (two levels)."""
    out: dict[str, dict] = {}
    for b in range(n_budgets):
        cells = [
            r for r in rows if r["budget_index"] == b and r["seed"] == 0 and r["in_grid"] and "nats" in r
        ]
        if not cells:
            continue
        results = []
        for r in cells:
            key = (r["family"], r["cell"], r["budget_index"], r["lr"])
            extra = [
                _scores(x)
                for x in sorted(rows, key=lambda x: x["seed"])
                if x["stage"] == "seeds"
                and "nats" in x
                and (x["family"], x["cell"], x["budget_index"], x["lr"]) == key
            ]
            results.append(
                ModelResult(
                    f"{r['family']} ({r['cell']})",
                    r["family"],
                    "run",
                    eval_set.fingerprint,
                    _scores(r),
                    seed_scores=extra or None,
                )
            )
        best = [f"{r['family']} ({r['cell']})" for r in _best_per_family(cells)]
        ds = stats.document_scores(eval_set, results)
        record = stats.statistics(ds, best)
        record["bpb"] = {n: float(v) for n, v in zip(ds.names, ds.bpb)}
        for r, res in zip(cells, results):
            r["bpb_ci95"] = record["ci95"][res.name]
        out[str(b)] = record
    return out


def seed_spread(rows: list[dict]) -> dict:
    """Per family: the BPBs of its seeded cell (seed 0 and the extra seeds), their mean, std and range
    (:func:`bytelm.experiments.report.spread`), and the cell."""
    out = {}
    seeded = {(r["family"], r["cell"], r["budget_index"], r["lr"]) for r in rows if r["stage"] == "seeds"}
    for fam, cell, b, lr in sorted(seeded, key=str):
        bpbs = [
            r["bpb"]
            for r in sorted(rows, key=lambda r: r["seed"])
            if (r["family"], r["cell"], r["budget_index"], r["lr"]) == (fam, cell, b, lr)
            and r.get("bpb") is not None
        ]
        if len(bpbs) >= 2:
            out[fam] = {"cell": cell, **spread(bpbs)}
    return out


def grid_rows(report: dict, budget_index: int) -> list[dict]:
    """The seed-0 cells of one budget (what the tables and plots show)."""
    return [
        r for r in report["runs"] if r["budget_index"] == budget_index and r["seed"] == 0 and r["in_grid"]
    ]


def budget_sentences(report: dict) -> list[str]:
    """Per budget: which cell wins, by how much over the best of every other family, and whether
    the gap exceeds the seed-to-seed spread of the two families."""
    out = []
    spread = report.get("seed_spread", {})
    for b, budget in enumerate(report["budgets"]):
        done = [r for r in grid_rows(report, b) if r.get("bpb") is not None]
        best: dict[str, dict] = {}
        for r in done:
            if r["family"] not in best or r["bpb"] < best[r["family"]]["bpb"]:
                best[r["family"]] = r
        if not best:
            out.append(f"At {budget:.3g} FLOPs no cell has finished.")
            continue
        ranked = sorted(best.values(), key=lambda r: r["bpb"])
        win = ranked[0]
        s = f"At {budget:.3g} FLOPs, {win['family']} ({win['cell']}) wins with {win['bpb']:.4f} BPB"
        if len(ranked) > 1:
            second = ranked[1]
            gap = second["bpb"] - win["bpb"]
            s += (
                f", {gap:.4f} BPB ahead of the best {second['family']} ({second['cell']}, "
                f"{second['bpb']:.4f})"
            )
            known = {f: spread[f] for f in (win["family"], second["family"]) if f in spread}
            if known:
                sp = max(v["spread"] for v in known.values())
                verdict = "larger" if gap > sp else "not larger"
                seeds = "/".join(str(len(v["bpb"])) for v in known.values())
                s += (
                    f"; the gap is {verdict} than the seed-to-seed spread of these families ({sp:.4f} BPB, "
                    f"max - min over {seeds} seeds of their best cell at the smallest budget)"
                )
            else:
                s += "; no seed spread measured for these families"
        out.append(s + ".")
    return out


# -- outputs ----------------------------------------------------------------------------------------
def write_outputs(out: Path, report: dict, eval_set: EvalSet) -> None:
    if not is_primary():  # (process 0 writes the job's outputs)
        return
    report = dict(report)
    plots = {"bpb_vs_bytes_per_step": "bpb_vs_bytes_per_step.png", "bpb_vs_flops": "bpb_vs_flops.png"}
    plot_bpb_vs_bytes_per_step(out / plots["bpb_vs_bytes_per_step"], report)
    plot_training_curves(out / plots["bpb_vs_flops"], report)
    dirs = eval_set.dirs
    if len(set(dirs)) > 1:
        groups = {}
        last = len(report["budgets"]) - 1
        for r in _best_per_family(grid_rows(report, last)):
            scores = _scores(r)
            groups[f"{r['family']} ({r['cell']})"] = {k: v["bpb"] for k, v in breakdown(scores, dirs).items()}
        if groups:
            plots["bpb_per_group"] = "bpb_per_group.png"
            plot_bpb_per_group(
                out / plots["bpb_per_group"],
                groups,
                title=f"held-out BPB per top-level directory, {report['budgets'][last]:.3g} FLOPs",
            )
    if (report.get("probes") or {}).get("models"):
        plots["probes"] = "probes.png"
        plot_probes(
            out / plots["probes"], report["probes"], subtitle=f"grid {report['grid']}, best cell per family"
        )
    report["plots"] = plots
    scored = [r for r in report["runs"] if "nats" in r]
    if scored:  # every scored run's bits per segment and document (docs/evaluation.md)
        write_scores(
            out / "scores.jsonl",
            eval_set,
            [ModelResult(r["id"], r["family"], "run", eval_set.fingerprint, _scores(r)) for r in scored],
        )
    slim = {
        **report,
        "runs": [{k: v for k, v in r.items() if k not in ("nats", "nbytes")} for r in report["runs"]],
    }
    atomic_write_text(out / "ablation.json", json.dumps(slim, indent=1, default=float))
    atomic_write_text(out / "ablation.md", markdown(slim))


def _scores(row: dict) -> SegmentScores:
    return SegmentScores(np.asarray(row["nats"], np.float64), np.asarray(row["nbytes"], np.int64))


def _best_per_family(rows: list[dict]) -> list[dict]:
    best: dict[str, dict] = {}
    for r in rows:
        if r.get("bpb") is not None and (r["family"] not in best or r["bpb"] < best[r["family"]]["bpb"]):
            best[r["family"]] = r
    return sorted(best.values(), key=lambda r: r["bpb"])


def _params(p: dict | None, key: str) -> str:
    return human(p.get(key)) if p and p.get(key) is not None else "-"


def markdown(report: dict) -> str:
    lines = [
        f"# bytelm ablate: grid `{report['grid']}`",
        "",
        f"- held-out fingerprint `{report['fingerprint']}` ({report['eval_bytes']:,} bytes of "
        f"{report['data']['spec']}); learning rates selected on {report['validation_bytes']:,} validation "
        "bytes carved from the train documents",
        f"- budgets (training FLOPs per run): {', '.join(f'{b:.3g}' for b in report['budgets'])} (scale "
        f"{report['scale']:g})",
        "- model sizes from the size rule (bytelm/experiments/spec.py SizeRule, docs/ablations.md): trunk "
        + "; ".join(
            f"{k} FLOPs: d_model {v['d_model']} x {v['layers']} layers" for k, v in report["trunks"].items()
        ),
        f"- stage: {report['stage']}"
        + ("" if report["stage"] == "done" else " (the grid is not complete: run bytelm ablate again)"),
        "",
        "## Verdict per budget",
        "",
        *[f"- {s}" for s in report["sentences"]],
        "",
        "## Learning rates (chosen at the smallest budget, on the validation split)",
        "",
    ]
    lines += rates_lines(report["sweep"], report["learning_rates"], fix="widen [ablation] learning_rates")
    lines += [
        *[f"**{line}**" for line in heldout_lines(report["data"])],
        *ledger_lines({}, report.get("shared_auxiliary")),
        "",
    ]
    for b, budget in enumerate(report["budgets"]):
        cells = sorted(grid_rows(report, b), key=lambda r: (r["family"], r["cell"]))
        st = (report.get("statistics") or {}).get(str(b)) or {}
        rows = []
        for r in cells:
            if r.get("bpb") is None:
                rows.append(
                    [
                        r["family"],
                        r["cell"],
                        r["status"] + (f": {r['error']}" if r.get("error") else ""),
                        *["-"] * 12,
                    ]
                )
                continue
            g = r.get("mean_bytes_per_global_step")
            amortised = r.get("flops_total_amortised")
            rows.append(
                [
                    r["family"],
                    r["cell"],
                    f"{r['bpb']:.4f}",
                    interval_cell((st.get("ci95") or {}).get(f"{r['family']} ({r['cell']})")),
                    "-" if g is None else f"{g:.2f}",
                    human(r["train_flops"]),
                    human(r.get("flops_auxiliary")) if r.get("flops_auxiliary") else "0",
                    human(r.get("flops_total")),
                    human(amortised) if amortised != r.get("flops_total") else "=",
                    human(r["inference_flops_per_byte"]),
                    _params(r["params"], "embedding"),
                    _params(r["params"], "ngram"),
                    _params(r["params"], "non_embedding"),
                    seconds(r.get("wall_s")),
                    f"{r['lr']:g}",
                    str(r["steps"]),
                ]
            )
        lines += [
            f"## Budget {budget:.3g} FLOPs",
            "",
            table(
                [
                    "family",
                    "cell",
                    "BPB",
                    "95% interval",
                    "bytes/global step",
                    "own FLOPs",
                    "aux FLOPs",
                    "total FLOPs",
                    "amortised total",
                    "inference FLOPs/B",
                    "params emb",
                    "n-gram params",
                    "params non-emb",
                    "wall",
                    "lr",
                    "steps",
                ],
                rows,
                "llrrrrrrrrrrrrrr",
            ),
            "",
        ]
        if st:
            view = {"statistics": st}
            lines += [f"- {line}" for line in statistics_lines(view)] + [""]
            pairs = pairs_table(view)
            if pairs:
                lines += [
                    "Paired differences of each family's best cell at this budget (the same resampled "
                    "documents):",
                    "",
                    pairs,
                    "",
                ]
    if report["seed_spread"]:
        seeds = {"models": report["seed_spread"], "pairs": ranked_pairs(report["seed_spread"])}
        lines += seed_lines(seeds, title="Seed-to-seed spread (smallest budget, best cell of each family)")
    failed = [r for r in report["runs"] if r["status"] == "failed"]
    unchosen = [f for f, sw in report["sweep"].items() if not sw.get("chosen")]
    if unchosen:
        lines += [
            "No learning rate could be chosen for "
            + ", ".join(unchosen)
            + " (their sweep runs failed or did not run), "
            "so their cells are missing from the tables.",
            "",
        ]
    lines += failure_lines(
        [(r["id"], r["error"]) for r in failed]
        + [(f"artefact {k}", v) for k, v in report["failed_artefacts"].items()]
    )
    lines += [
        f"![BPB vs bytes per global step]({report['plots']['bpb_vs_bytes_per_step']})",
        "",
        f"![training curves]({report['plots']['bpb_vs_flops']})",
        "",
    ]
    if "bpb_per_group" in report["plots"]:
        lines += [f"![BPB per group]({report['plots']['bpb_per_group']})", ""]
    if report.get("probes"):
        lines += [
            f"Probes of each family's best cell at {report['budgets'][-1]:.3g} FLOPs:",
            "",
            *probe_lines(report["probes"]),
        ]
        if "probes" in report["plots"]:
            lines += [f"![probes]({report['plots']['probes']})", ""]
    lines += [
        "BPB: held-out bits per byte over every segment (docs/evaluation.md). *bytes/global step*: held-out "
        "bytes per position of the outermost stack (the patch size, the mean entropy or space patch length, "
        "bytes per token). *inference FLOPs/B*: the forward cost per byte, entropy model included. *wall*: "
        "training time, compilation included. Training FLOPs are analytic (bytelm/models/flops.py).",
        "",
    ]
    return "\n".join(lines)


def ablate(
    grid: str | Experiment = "tiny",
    out: str | Path = "runs/ablate",
    *,
    data_spec: str | None = None,
    scale: float = 1.0,
    jobs: int = 1,
    print_commands: bool = False,
    collect: bool = False,
    progress: StageProgress | None = None,
    note: Note | None = None,
    seeds: int | None = None,
) -> AblationResult:
    """Run (or resume, print, collect) the grid into ``out``; see the module docstring. ``seeds``
    (>= 1) replaces the grid's ``extra_seeds + 1``: the seeds each family's best cell is trained with."""
    grid = grid if isinstance(grid, Experiment) else load_grid(grid)
    if seeds is not None:
        if seeds < 1:
            raise UserError(
                f"--seeds must be a whole number >= 1 (seeds of each family's best cell), got {seeds}"
            )
        grid = dataclasses.replace(grid, extra_seeds=seeds - 1)
    if not scale > 0:
        raise UserError(f"--scale must be > 0, got {scale}")
    if jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {jobs}")
    if print_commands and collect:
        raise UserError("--print-commands and --collect exclude each other")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mode = "print" if print_commands else "collect" if collect else "run"
    runner = AblationRunner(
        grid, out, data_spec=data_spec, scale=scale, mode=mode, jobs=jobs, progress=progress, note=note
    )
    stage, commands = runner.go()
    report = runner.build_report(stage)
    if collect and not any(r["status"] in ("done", "trained") for r in report["runs"]):
        raise UserError(
            f"nothing to collect in {out}: no run of the grid {grid.path} has finished there; run 'bytelm "
            f"ablate {grid.path} --out {out}' first (or give the --out it was run with)"
        )
    if stage == "done" and mode != "print":
        report["probes"] = runner.probe(report)
    write_outputs(out, report, runner.eval_set)
    fits = None
    if stage == "done" and mode != "print" and is_primary():
        fits = fit_grid(out, note)
    return AblationResult(out, report, stage, commands, fits)


def fit_grid(out: Path, note: Note | None = None) -> dict | None:
    """``bytelm scaling`` on the finished grid in ``out`` (into ``OUT/scaling``); None with a note
    when it has nothing to fit."""
    from bytelm.experiments.scaling import scaling  # noqa: PLC0415 (scipy, once per grid)

    try:
        return scaling([out], out / "scaling")
    except UserError as e:
        if note:
            note(f"scaling fits: {e}")
        return None
