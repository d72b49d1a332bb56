"""``bytelm compare``, the main job: every family at a matched training-FLOP budget, scored on
the identical held-out bytes, with a report (``report.md``, ``report.json``, ``bpb.png``).

A compare preset is a grid with one budget (:mod:`bytelm.experiments.spec`): one cell per model, each
at its own config's sizes, every model trained with the same seeds. The one runner
(:mod:`bytelm.experiments.runner`) carries it out; each stage's output lives under ``--out`` and a
finished stage is skipped when the same command runs again (an interrupted training resumes from
its last checkpoint):

1. the corpus (split, segments, fingerprint; cached by :mod:`bytelm.data`);
2. the artefacts: the subword tokenizer (``OUT/tokenizer``, on the train split, unless ``[tokenizer]
   dir`` names one made elsewhere) and, when a BLT
   model needs it, the entropy model (``OUT/runs/<name>``, its own small budget);
3. with ``[compare] learning_rates``, each compared model's rate: short runs (``sweep_fraction`` of
   its steps, ``OUT/sweeps/<name>/lr<rate>``) scored on the validation split, the rates extended
   past an edge (:mod:`bytelm.experiments.rates`);
4. each compared model (``OUT/runs/<name>``) with the steps that spend the budget on its total
   FLOPs (:mod:`bytelm.ledger`: a BLT pays for its entropy model), and with ``seeds`` > 1 its
   other seeds (``OUT/seeds/<name>/s<k>``);
5. evaluation of every run on every held-out segment (``OUT/evals/``);
6. the report.

A **preset** (``configs/compare/NAME.toml``) names the budget, the model configs and overrides::

    [compare]
    flop_budget = 3e12          # total training FLOPs per compared model
    eval_points = 8             # periodic evaluations per run (the curves of bpb.png)
    time_budget_s = 0           # optional, > 0: match training time instead (bytelm compare --minutes)
    learning_rates = [3e-3, 1e-2, 3e-2]   # optional: chosen per model on the validation split
    sweep_fraction = 0.25       # a rate's run: this share of the model's steps
    seeds = 1                   # optional: seeds per compared model (bytelm compare --seeds N)
    set = ["data.segment_bytes=256"]   # overrides for every model (data settings, batch...)

    [tokenizer]
    vocab_size = 4096
    pattern = "cl100k"
    kind = "bpe"                # or "unigram", "wordpiece"
    encoder = ""                # the kind's own rule (ranks / viterbi / wordpiece), or "longest"
    # or, instead of the four keys: dir = "my-tokenizer"  (trained or imported elsewhere, e.g. with
    # bytelm tokenizer import; relative to the preset file; used as it is)

    [[model]]
    name = "entropy"            # the run directory name and the report's row name
    config = "../tiny/entropy.toml"   # relative to the preset file
    role = "entropy"            # the BLT models' entropy model, trained first (default role: "compared")
    flop_budget = 5e11          # optional: this model's own budget
    set = ["model.d_model=96"]  # optional: overrides for this model
    ngram_from = "blt"          # optional: another model's hashed n-gram tables (a byte LM with BLT's)

With a time budget (``[compare] time_budget_s`` or ``bytelm compare --minutes M``) every compared
model trains for the same training time (``train.time_budget_s``: compilation included,
evaluations not) instead of the same FLOPs; the entropy model keeps its FLOP budget. The report says
which budget was matched and shows every model's FLOPs and time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import jax

from bytelm.atomic import atomic_write_text
from bytelm.baselines import OWN_ENCODER, load_tokenizer
from bytelm.baselines.bpe.pretokenize import pattern_name
from bytelm.config import shipped_configs
from bytelm.errors import UserError
from bytelm.evaluation.evaluator import unigram_baselines
from bytelm.evaluation.plots import eval_curve, plot_bpb_vs_flops, plot_pair_differences, plot_probes
from bytelm.evaluation.probe_tables import probe_lines
from bytelm.evaluation.probes import probe_runs
from bytelm.evaluation.report import (
    breakdown_table,
    build_report,
    header_lines,
    heldout_lines,
    human,
    pairs_table,
    partial_lines,
    pipeline_lines,
    results_table,
    seconds,
    statistics_lines,
    table,
    write_report_json,
    write_scores,
)
from bytelm.evaluation.results import ModelResult
from bytelm.experiments import spec
from bytelm.experiments.rates import rate_label
from bytelm.experiments.report import ledger_lines, ranked_pairs, rates_lines, seed_lines, spread
from bytelm.experiments.runner import Note, Run, Runner, StageProgress, StageStopped
from bytelm.experiments.spec import TOKENIZER_DIR, Experiment
from bytelm.families import ARTEFACT_KINDS, task_class
from bytelm.rundir import RunDir
from bytelm.training.distributed import is_primary

log = logging.getLogger(__name__)

PRESET_DIR = shipped_configs() / "compare"

__all__ = ["CompareResult", "StageStopped", "compare", "find_preset", "load_preset"]


def find_preset(name_or_path: str) -> Path:
    """A preset file path, or the name of a file in ``configs/compare/``."""
    return spec.find_toml(name_or_path, PRESET_DIR, "compare preset")


def load_preset(
    name_or_path: str, *, seeds: int | None = None, time_budget_s: float | None = None
) -> Experiment:
    """A compare preset as an experiment (``seeds`` and ``time_budget_s`` replace the preset's)."""
    return spec.load_preset(find_preset(name_or_path), seeds=seeds, time_budget_s=time_budget_s)


@dataclasses.dataclass
class CompareResult:
    out: Path
    report: dict
    report_md: Path
    report_json: Path
    plot: Path


class _Stages:
    """Wall time per stage, kept in ``OUT/stages.json`` across resumed invocations."""

    def __init__(self, out: Path):
        self.path = out / "stages.json"
        self.times: dict[str, float] = {}
        if self.path.is_file():
            try:
                self.times = {k: float(v) for k, v in json.loads(self.path.read_text()).items()}
            except (ValueError, AttributeError, UnicodeDecodeError):  # (a damaged record of earlier timings)
                log.warning("%s is damaged; the stage times of earlier invocations are left out", self.path)

    def record(self, times: dict[str, float]) -> None:
        for name, seconds_ in times.items():
            self.times[name] = self.times.get(name, 0.0) + seconds_
        if is_primary():
            atomic_write_text(self.path, json.dumps(self.times, indent=1))


class CompareRunner(Runner):
    """The runner with compare's layout (``OUT/runs/<name>``, ``OUT/seeds/<name>/s<k>``,
    ``OUT/sweeps/<name>/lr<rate>``, ``OUT/tokenizer``) and its report."""

    stopped_message = "run the same compare again (same --out {out}) to resume"

    def layout(self, run: Run) -> tuple[str, Path]:
        if run.artefact:
            return run.member, self.out / "runs" / run.member
        if run.stage == "sweep" and run.lr is not None:
            rate = rate_label(run.lr)
            return f"{run.member}.lr{rate}", self.out / "sweeps" / run.member / f"lr{rate}"
        if run.seed:
            return f"{run.member}.s{run.seed}", self.out / "seeds" / run.member / f"s{run.seed}"
        return run.member, self.out / "runs" / run.member

    def tokenizer_dir(self, cell: dict) -> Path:
        if TOKENIZER_DIR in cell:  # [tokenizer] dir = DIR: made elsewhere (trained or imported)
            return Path(cell[TOKENIZER_DIR])
        return self.out / "tokenizer"

    def splits(self, run: Run) -> tuple[str, ...]:
        if run.artefact:  # the entropy model is listed (below the compared models)
            return ("heldout",)
        return super().splits(run)

    def check(self) -> None:
        """A compare needs every model: a failed run (or an unchosen rate) stops it with what failed."""
        failed = [(r.id, r.error) for r in self.runs.values() if r.error and r.stage != "sweep"]
        failed += list(self.failed_artefacts.items())
        failed += [
            (m.name, "no learning rate could be chosen: every rate failed")
            for m in self.exp.members
            if self.lr_member(m) not in self.chosen
        ]
        if failed:
            raise UserError(
                "compare cannot report, these failed: "
                + "; ".join(f"{what}: {error}" for what, error in failed)
            )

    def member_runs(self, name: str) -> list[Run]:
        """A compared model's runs, seed 0 first."""
        return sorted(
            (r for r in self.runs.values() if r.member == name and r.stage in ("grid", "seeds")),
            key=lambda r: r.seed,
        )

    def plan_record(self, run: Run, seeds: list[Run]) -> dict:
        member = self.exp.member(run.member)
        info = RunDir(run.run_dir).info_or_empty()
        timed = bool(self.exp.time_budget_s) and not run.artefact
        lr_member = member.lr_from or member.name
        cfg, ledger = run.planned
        # a family that measures what its steps spend (H-Net): the budget it was charged over the
        # measured total it spent (1 up to half a step: it trains until the measured total reaches it)
        measured = info.get("flops_measured")
        spent = None if measured is None else measured + ledger.auxiliary(int(info.get("step") or 0))
        return {
            "family": cfg.require_model().family,
            "role": member.role,
            "config": str(member.config),
            "overrides": list(member.overrides),
            "ngram_from": member.ngram_from,
            "flop_budget": None if timed else run.budget,
            "time_budget_s": self.exp.time_budget_s if timed else None,
            "flops_per_step": ledger.own_per_step,
            "auxiliary_flops_per_step": ledger.auxiliary_per_step,
            "auxiliary_flops_fixed": dict(ledger.auxiliary_fixed),
            "steps": info.get("step"),
            "train_s": info.get("train_s"),
            "flops_measured": measured,
            "flops_planned": info.get("flops_planned") if measured is not None else None,
            "charged_over_measured": run.budget / spent if spent and not timed else None,
            "run_dir": str(run.run_dir),
            "learning_rate": cfg.train.learning_rate,
            "lr_sweep": self.searches.get(lr_member),
            "seeds": [
                {
                    "seed": r.seed,
                    "run_dir": str(r.run_dir),
                    "steps": RunDir(r.run_dir).info_or_empty().get("step"),
                    "train_s": RunDir(r.run_dir).info_or_empty().get("train_s"),
                }
                for r in seeds
            ],
        }

    def report(self, stages: _Stages) -> CompareResult:
        """``report.json``, ``report.md`` and ``bpb.png``: the compared models first, then the entropy
        model."""
        self.check()
        plan: dict[str, dict] = {}
        results: list[ModelResult] = []
        seeds: dict[str, dict] = {}
        for m in self.exp.members:
            runs = self.member_runs(m.name)
            main = runs[0]
            result = main.heldout
            if len(runs) > 1:
                seeds[m.name] = spread([r.heldout.bpb for r in runs])
                result = dataclasses.replace(result, seed_scores=[r.heldout.scores for r in runs[1:]])
            results.append(result)
            plan[m.name] = self.plan_record(main, runs)
        ent = self.runs.get(self.exp.entropy.name) if self.exp.entropy is not None else None
        if ent is not None:
            self.evaluate(ent, "heldout")
            made = ent.heldout
            made.note = (made.note + "; " if made.note else "") + (
                f"the {ARTEFACT_KINDS['entropy_model'].noun} of the other runs (own budget {ent.budget:.3g} "
                "FLOPs)"
            )
            results.append(made)
            plan[ent.member] = self.plan_record(ent, [ent])
        probes = self.probe() if self.exp.probes else None
        stages.record(self.stage_s)
        self.stage_s = {}
        exp = self.exp
        baselines = unigram_baselines(self.eval_set)
        info = {
            "preset": exp.name,
            "preset_path": str(exp.path),
            "flop_budget": exp.budgets[0],
            "time_budget_s": exp.time_budget_s or None,
            "matched": "training time" if exp.time_budget_s else "total training FLOPs (own + auxiliary)",
            "learning_rates": list(exp.learning_rates) or None,
            "tokenizer": self.tokenizer_info(),
            "models": plan,
            "seeds": {"n": exp.extra_seeds + 1, "models": seeds, "pairs": ranked_pairs(seeds)}
            if seeds
            else None,
        }
        compared_names = [m.name for m in self.exp.members]
        report = build_report(self.eval_set, results, baselines, compare=info)
        report["probes"] = probes
        # pairs among the compared models only (the entropy model is listed, not compared)
        report["statistics"]["pairs"] = [
            p for p in report["statistics"]["pairs"] if p["a"] in compared_names and p["b"] in compared_names
        ]
        report["statistics"]["ranking"] = [n for n in report["statistics"]["ranking"] if n in compared_names]
        plot = self.out / "bpb.png"
        report["compare"]["stages_s"] = dict(stages.times)
        report["compare"]["wall_s"] = sum(stages.times.values())
        report_json, report_md = self.out / "report.json", self.out / "report.md"
        if not is_primary():  # (process 0 writes the job's report)
            return CompareResult(self.out, report, report_md, report_json, plot)
        compared = [r for r in results if plan[r.name]["role"] == "compared"]
        plot_bpb_vs_flops(
            plot,
            {r.name: eval_curve(r.run_dir) for r in compared if r.run_dir is not None},
            finals={
                r.name: (r.flops_total if r.flops_total is not None else r.flops, r.bpb) for r in compared
            },
            baselines={baselines[0].name: baselines[0].bpb},
            subtitle=f"preset {exp.name}, fingerprint {self.eval_set.fingerprint[:16]}\nx: total FLOPs (own "
            f"+ auxiliary); lines: periodic evals (first {self.plain(exp.members[0]).eval.eval_bytes:,} "
            f"held-out bytes); stars: all {self.eval_set.n_bytes:,} bytes",
        )
        plot_pair_differences(
            self.out / "pairs.png",
            report["statistics"],
            subtitle=f"preset {exp.name}, {report['statistics']['documents']:,} documents, "
            f"{report['statistics']['resamples']:,} resamples",
        )
        write_scores(self.out / "scores.jsonl", self.eval_set, [*results, *baselines])
        if probes:
            plot_probes(
                self.out / "probes.png",
                probes,
                subtitle=f"preset {exp.name}, probe set {probes['fingerprint'][:16]}",
            )
        write_report_json(report, report_json)
        atomic_write_text(report_md, markdown_report(report))
        return CompareResult(self.out, report, report_md, report_json, plot)

    def probe(self) -> dict:
        """The probes of every compared model's seed-0 run (``OUT/probes``: the probe set and a cache
        per model); timed as the stage ``probes``."""
        t0 = time.perf_counter()
        runs = {m.name: self.member_runs(m.name)[0].run_dir for m in self.exp.members}
        # (a job of several processes scores everything in every process: no process skips a
        # collective another one runs)
        single = jax.process_count() == 1
        record = probe_runs(
            self.eval_set, self.corpus, runs, out=self.out / "probes" if single else None, note=self.say
        )
        if record.get("skipped"):
            self.say(f"probes: none ({record['skipped']})")
        self.stage_s["probes"] = self.stage_s.get("probes", 0.0) + time.perf_counter() - t0
        return record

    def tokenizer_info(self) -> dict:
        """The subword tokenizer as the report records it: kind, encoder rule, size, pattern, directory."""
        tok = self.exp.tokenizer
        if TOKENIZER_DIR in tok:
            given = load_tokenizer(tok[TOKENIZER_DIR])
            return {
                "kind": given.kind,
                "encoder": given.encoder,
                "vocab_size": given.n_vocab,
                "pattern": pattern_name(given.pattern) or given.pattern,
                "dir": tok[TOKENIZER_DIR],
            }
        kind = tok.get("tokenizer.kind", "bpe")
        encoder = tok.get("tokenizer.encoder") or OWN_ENCODER[kind]
        return {
            "kind": kind,
            "encoder": encoder,
            "vocab_size": tok.get("tokenizer.vocab_size"),
            "pattern": tok.get("tokenizer.pattern"),
            "dir": str(self.tokenizer_dir(tok)),
        }


def compare(
    preset: str | Experiment = "tiny",
    out: str | Path = "compare",
    *,
    data_spec: str | None = None,
    progress: StageProgress | None = None,
    note: Note | None = None,
    time_budget_s: float | None = None,
    seeds: int | None = None,
) -> CompareResult:
    """Run (or resume) the comparison described by ``preset`` into ``out``; see the module docstring.
    ``time_budget_s`` (> 0) replaces the preset's: every compared model trains for that long.
    ``seeds`` (>= 1) replaces the preset's: every compared model trains with that many seeds."""
    if isinstance(preset, Experiment):
        if seeds is not None and seeds < 1:
            raise UserError(f"--seeds must be a whole number >= 1 (seeds per compared model), got {seeds}")
        if time_budget_s is not None and not time_budget_s > 0:
            raise UserError(f"the time budget must be > 0 seconds, got {time_budget_s}")
        exp = dataclasses.replace(
            preset,
            extra_seeds=preset.extra_seeds if seeds is None else seeds - 1,
            time_budget_s=preset.time_budget_s if time_budget_s is None else float(time_budget_s),
        )
    else:
        exp = load_preset(preset, seeds=seeds, time_budget_s=time_budget_s)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runner = CompareRunner(exp, out, data_spec=data_spec, progress=progress, note=note)
    stage, _ = runner.go()
    return runner.report(_Stages(out))


def global_steps_sentence(report: dict) -> str:
    """What a global step is for each family in the report (from its task)."""
    families = dict.fromkeys(m["family"] for m in report["models"] if m["kind"] == "run")
    return "; ".join(f"bytes per {task_class(f).global_step} for {f}" for f in families)


def artefact_lines(report: dict) -> list[str]:
    """A line per artefact-making run (the entropy model): its own FLOPs, and the models whose
    ledgers carry them."""
    rows = {m["name"]: m for m in report["models"]}
    users = [m["name"] for m in report["models"] if m.get("auxiliary_flops")]
    return [
        f"the {ARTEFACT_KINDS['entropy_model'].noun} `{name}` was trained with {human(rows[name]['flops'])} "
        "FLOPs of its own, counted in the auxiliary FLOPs of "
        f"{', '.join(f'`{u}`' for u in users) or 'no compared model'} (with its forward over their training "
        "bytes); it is listed below the compared models, not compared with them"
        for name, plan in report["compare"]["models"].items()
        if plan["role"] == "entropy" and name in rows
    ]


def matched_sentence(c: dict) -> str:
    if c.get("time_budget_s"):
        return (
            f"{seconds(c['time_budget_s'])} of training time per compared model (compilation included, "
            "evaluations not; each model's FLOPs follow from its speed)"
        )
    return (
        f"{c['flop_budget']:.3g} total FLOPs per compared model (analytic training FLOPs, forward + "
        "backward: the model's own plus the auxiliary models it needs, bytelm/ledger.py)"
    )


def schedule_sentence(c: dict) -> str:
    if c.get("time_budget_s"):
        return (
            f"each compared model trained until {seconds(c['time_budget_s'])} of training time were spent "
            "(its learning-rate horizon planned from its first steps' time); the entropy model at its own "
            "FLOP budget."
        )
    return (
        f"each compared model's steps = ({human(c['flop_budget'])} FLOPs - its one-off auxiliary FLOPs) / "
        "(own + auxiliary FLOPs per step)."
    )


def _lr_cell(plan: dict) -> str:
    lr = plan.get("learning_rate")
    sweep = plan.get("lr_sweep")
    if lr is None:
        return "-"
    if not sweep:
        return f"{lr:g}"
    edge = " STILL AT AN EDGE" if sweep.get("at_edge") else ""
    scores = ", ".join(
        f"{k}: " + ("failed" if v is None else f"{v:.3f}") for k, v in sweep["validation_bpb"].items()
    )
    return f"{lr:g}{edge} ({scores})"


def _budget_cell(plan: dict) -> str:
    return seconds(plan["time_budget_s"]) if plan.get("time_budget_s") else f"{plan['flop_budget']:.3g} FLOPs"


def _edge_lines(c: dict) -> list[str]:
    """A loud line per model whose learning rate the extended grid still could not bracket."""
    return [
        f"**WARNING: the learning rate of `{name}` is still at an edge of the rates tried ("
        f"{', '.join(m['lr_sweep']['validation_bpb'])}) after {m['lr_sweep']['extensions']} extensions: its "
        "row may not be its best.**"
        for name, m in c["models"].items()
        if (m.get("lr_sweep") or {}).get("at_edge")
    ]


def markdown_report(report: dict) -> str:
    """``report.md`` of a comparison: the BPB table, the reference rows, per-directory tables,
    the schedule of every run and the stage wall times."""
    c = report["compare"]
    lines = [
        f"# bytelm compare: preset `{c['preset']}`",
        "",
        *[f"- {h}" for h in header_lines(report)],
        f"- matched training budget: {matched_sentence(c)}",
        f"- total wall time: {seconds(c['wall_s'])}",
        "",
        *[f"**{line}**" for line in partial_lines(report)],
        *[f"- {line}" for line in heldout_lines(report["data"]) if not line.startswith("WARNING")],
        *[f"**{line}**" for line in heldout_lines(report["data"]) if line.startswith("WARNING")],
        *[line for line in _edge_lines(c)],
        "",
        "## Bits per byte on the identical held-out bytes",
        "",
        results_table(report),
        "",
        *[f"- {line}" for line in statistics_lines(report)],
        "",
        *(
            [
                "## Paired differences",
                "",
                "Each pair of compared models, better minus worse, on the same resampled documents (and "
                "seeds); *order flips*: the share of resamples in which the worse model comes out ahead. "
                "Rows marked NO cannot be told apart at this size: the per-document scores are in "
                "`scores.jsonl`.",
                "",
                pairs_table(report) or "",
                "",
                "![paired differences](pairs.png)",
                "",
            ]
            if pairs_table(report)
            else []
        ),
        "Every model scores every segment on its own from BOS; BPB = total NLL in nats / (held-out bytes x "
        "ln 2). The unigram rows are context-free references: the eval bytes' own byte entropy, and a byte "
        "distribution fit on the train split. *bytes/global step* is measured on the eval set: "
        f"{global_steps_sentence(report)}. *own*, *auxiliary* and *total FLOPs* are the compute ledger: the "
        "model's training, what it needs besides (BLT: its entropy model's training and its forward over the "
        "training bytes), and their sum, which the budget matches. *n-gram params* are the hashed n-gram "
        "lookup tables among the embedding parameters (lookups cost no FLOPs). *entropy FLOPs/B* is the "
        "forward cost per byte of an entropy model run in the input pipeline (BLT's), *inference FLOPs/B* "
        "the total forward cost per byte, model and entropy model (bytelm/models/flops.py).",
        "",
        *[f"- {line}" for line in artefact_lines(report)],
        *ledger_lines({m["name"]: m.get("auxiliary_flops") or {} for m in report["models"]}),
        *[f"- {line}" for line in pipeline_lines(report)],
        "",
        "![BPB vs total training FLOPs](bpb.png)",
        "",
        *seed_lines(c.get("seeds"), title=f"{(c.get('seeds') or {}).get('n')} seeds per compared model"),
    ]
    lines += probe_lines(report.get("probes"))
    if (report.get("probes") or {}).get("models"):
        lines += ["![probes](probes.png)", ""]
    for key, title in (("dirs", "BPB per top-level directory"),):
        t = breakdown_table(report, key)
        if t:
            lines += [f"## {title}", "", t, ""]
            g = breakdown_table(report, key, metric="mean_bytes_per_global_step")
            if g:
                lines += [
                    "Bytes per global step per top-level directory (the token tax shows here):",
                    "",
                    g,
                    "",
                ]
    trained = {m["name"]: m for m in report["models"] if m["kind"] == "run"}
    rows = [
        [
            name,
            m["family"],
            m["role"],
            _budget_cell(m),
            f"{m['flops_per_step']:.3g}",
            human(m.get("auxiliary_flops_per_step")) if m.get("auxiliary_flops_per_step") else "-",
            str(m["steps"]),
            human(trained[name]["flops_total"]) if name in trained else "-",
            seconds(m.get("train_s")),
            _lr_cell(m),
        ]
        for name, m in c["models"].items()
    ]
    sweeps = [m["lr_sweep"] for m in c["models"].values() if m.get("lr_sweep")]
    lines += [
        "## Schedule",
        "",
        table(
            [
                "run",
                "family",
                "role",
                "budget",
                "own FLOPs/step",
                "aux FLOPs/step",
                "steps",
                "total FLOPs",
                "train time",
                "learning rate",
            ],
            rows,
            "lllrrrrrrl",
        ),
        "",
        *(
            [
                "## Learning rates",
                "",
                *rates_lines(
                    {n: m["lr_sweep"] for n, m in c["models"].items() if m.get("lr_sweep")},
                    c.get("learning_rates") or [],
                    fix="widen [compare] learning_rates",
                ),
            ]
            if sweeps
            else []
        ),
        "## Stage wall times",
        "",
        table(["stage", "wall"], [[k, seconds(v)] for k, v in c["stages_s"].items()], "lr"),
        "",
        f"Tokenizer: {c['tokenizer'].get('kind', 'bpe')}, {c['tokenizer']['vocab_size']} ids, pattern "
        f"{c['tokenizer']['pattern']}, encoder {c['tokenizer'].get('encoder') or 'ranks'}. Training FLOPs "
        f"are analytic (bytelm/models/flops.py); {schedule_sentence(c)} *train time* counts compilation, not "
        "evaluations.",
        "",
    ]
    return "\n".join(lines)
