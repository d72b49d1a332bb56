"""``bytelm compare``, the main job: every family at a matched training-FLOP budget, scored on
the identical held-out bytes, with a report (``report.md``, ``report.json``, ``bpb.png``).

Stages, in order (each one's output lives under ``--out`` and a finished stage is skipped when
the same command runs again; an interrupted training resumes from its last checkpoint):

1. the corpus (split, segments, fingerprint; cached by :mod:`bytelm.data`);
2. the BPE tokenizer of the subword baseline (``OUT/tokenizer``), trained on the train split;
3. the entropy model of BLT (``OUT/runs/<name>``, its own small budget);
4. each compared model (``OUT/runs/<name>``) with ``train.steps = budget / train FLOPs per step``,
   where FLOPs per step is the family's analytic training FLOPs per position x positions per
   step (:mod:`bytelm.models.flops` and each family's formula), so every family spends the same compute;
5. evaluation of every run on every held-out segment (``OUT/evals/<name>.json``);
6. the report.

A **preset** (``configs/compare/NAME.toml``) names the budget, the model configs and overrides::

    [compare]
    flop_budget = 3e12          # training FLOPs per compared model
    eval_points = 8             # periodic evaluations per run (the curves of bpb.png)
    time_budget_s = 0           # optional, > 0: match training time instead (bytelm compare --minutes)
    set = ["data.segment_bytes=256"]   # overrides for every model (data settings, batch...)

    [tokenizer]
    vocab_size = 4096
    pattern = "cl100k"
    kind = "bpe"                # or "unigram"
    encoder = ""                # the kind's own rule (ranks / viterbi), or "longest"

    [[model]]
    name = "entropy"            # the run directory name and the report's row name
    config = "../tiny/entropy.toml"   # relative to the preset file
    role = "entropy"            # trained first; BLT models use it (default role: "compared")
    flop_budget = 5e11          # optional: this model's own budget
    set = ["model.d_model=96"]  # optional: overrides for this model

With ``[compare] learning_rates = [...]`` every compared model's rate is chosen first: a short run
per rate (``sweep_fraction`` of its budget, in ``OUT/sweeps/<name>/lr<rate>``), each scored on the
validation split (``data.validation_fraction`` of the training documents, never the held-out
segments the report scores); the rate with the lowest validation BPB trains the model's run. The
report's schedule shows every rate's validation BPB and the chosen one (docs/ablations.md).

With a time budget (``[compare] time_budget_s`` or ``bytelm compare --minutes M``) every compared
model trains for the same training time (``train.time_budget_s``: compilation included,
evaluations not) instead of the same FLOPs; the artefact makers (the entropy model) keep their
FLOP budget. The report says which budget was matched and shows every model's FLOPs and time.

The compare stage fills in every artefact a family's task names (:attr:`Task.artefacts`: the
tokenizer directory of a subword model, the entropy-model run of BLT) itself.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bytelm.atomic import atomic_directory, atomic_write_text
from bytelm.baselines import KINDS, load_tokenizer, train_tokenizer
from bytelm.config import Config, load_config, shipped_configs
from bytelm.errors import UserError
from bytelm.bpb import SegmentScores
from bytelm.evaluation.evaluator import CorpusCache, check_same_fingerprint, evaluate_run, evaluate_trained, unigram_baselines
from bytelm.evaluation.plots import eval_curve, plot_bpb_vs_flops
from bytelm.evaluation.report import (
    breakdown_table, build_report, header_lines, heldout_lines, human, pipeline_lines, results_table, seconds, table, write_report_json,
)
from bytelm.evaluation.results import EvalSet, ModelResult
from bytelm.experiments.plan import ngram_overrides, planned_ledger, schedule_overrides, sweep_steps
from bytelm.experiments.rates import RateSearch, rate_label
from bytelm.rundir import RunDir
from bytelm.training import trainer
from bytelm.families import ARTEFACT_KINDS, task_class

log = logging.getLogger(__name__)

PRESET_DIR = shipped_configs() / "compare"
# role -> the artefact kind its run becomes for the other models ("compared" runs are compared)
ROLES = {"compared": None, **{kind.preset_role: name for name, kind in ARTEFACT_KINDS.items() if kind.preset_role}}

# progress(stage, done, total, suffix) and note(message): the CLI turns them into bars and lines
StageProgress = Callable[[str, int, "int | None", str], None]
Note = Callable[[str], None]


class StageStopped(RuntimeError):
    """A training stopped before its last step (SIGINT/SIGTERM) inside a multi-run job; its checkpoint
    is saved and the same command resumes it (the CLI exits with status 130)."""


class CompareStopped(StageStopped):
    """A training stage stopped before its last step (SIGINT/SIGTERM); its checkpoint is saved and
    running the same compare again resumes it."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    config: Path
    role: str = "compared"
    flop_budget: float | None = None
    overrides: tuple[str, ...] = ()
    ngram_from: str | None = None  # another model's name: take its hashed n-gram tables (sizes and rows)


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    path: Path
    flop_budget: float
    models: tuple[ModelSpec, ...]
    overrides: tuple[str, ...] = ()
    eval_points: int = 8
    time_budget_s: float = 0.0  # > 0: every compared model trains for this long instead of flop_budget
    learning_rates: tuple[float, ...] = ()  # a sweep per compared model, chosen on the validation split
    sweep_fraction: float = 0.25  # each sweep run's share of the model's budget
    vocab_size: int = 4096
    pattern: str = "cl100k"
    tokenizer_kind: str = "bpe"
    tokenizer_encoder: str = ""  # "": the kind's own rule
    seeds: int = 1  # every compared model trained with seeds 0 .. seeds - 1 (bytelm compare --seeds N)

    @property
    def entropy_model(self) -> ModelSpec | None:
        return next((m for m in self.models if m.role == "entropy"), None)


def _kind(value, where: str) -> str:
    if value not in KINDS:
        raise UserError(f"{where} is {value!r}; use one of {list(KINDS)}")
    return value


def _strings(value, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where} must be a list of 'key=value' strings, got {value!r}")
    return tuple(value)


def _number(value, where: str, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or (positive and not value > 0):
        raise UserError(f"{where} must be a positive number, got {value!r}")
    return float(value)


def _rates(value, where: str) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise UserError(f"{where} must be a list of positive learning rates, got {value!r}")
    return tuple(_number(v, where) for v in value)


def _seeds(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{where} must be a whole number >= 1 (seeds per compared model), got {value!r}")
    return value


def _fraction(value, where: str) -> float:
    x = _number(value, where)
    if x > 1:
        raise UserError(f"{where} must be in (0, 1], got {value!r}")
    return x


def find_toml(name_or_path: str, directory: Path, what: str) -> Path:
    """A TOML file path, or the name of a file in ``directory`` (shipped presets and grids)."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.is_file():
        if not p.is_file():
            raise UserError(f"{what} file {p} not found; give a TOML file or a name from {directory}")
        return p
    path = directory / f"{name_or_path}.toml"
    if not path.is_file():
        known = sorted(q.stem for q in directory.glob("*.toml")) if directory.is_dir() else []
        raise UserError(f"no {what} {name_or_path!r} (known: {', '.join(known) or 'none'}); or give a TOML file path")
    return path


def find_preset(name_or_path: str) -> Path:
    """A preset file path, or the name of a file in ``configs/compare/``."""
    return find_toml(name_or_path, PRESET_DIR, "compare preset")


def read_sections(path: Path, what: str, sections: tuple[str, ...]) -> dict:
    """A preset or grid file's tables, refusing a file that does not parse or has unknown sections."""
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"cannot parse {what} {path}: {e}") from None
    unknown = set(raw) - set(sections)
    if unknown:
        raise UserError(f"{what} {path}: unknown section(s) {sorted(unknown)}; valid: {', '.join(sections)}")
    return raw


def load_preset(name_or_path: str) -> Preset:
    path = find_preset(name_or_path)
    raw = read_sections(path, "preset", ("compare", "tokenizer", "model"))
    comp, tok = raw.get("compare", {}), raw.get("tokenizer", {})
    compare_keys = {"flop_budget", "eval_points", "time_budget_s", "learning_rates", "sweep_fraction", "set", "seeds"}
    for table, valid, label in ((comp, compare_keys, "compare"), (tok, {"vocab_size", "pattern", "kind", "encoder"}, "tokenizer")):
        bad = set(table) - valid
        if bad:
            raise UserError(f"preset {path}: unknown key(s) {sorted(bad)} in [{label}]; valid: {', '.join(sorted(valid))}")
    kind = _kind(tok.get("kind", "bpe"), f"preset {path} [tokenizer] kind")
    encoder = str(tok.get("encoder", ""))
    if encoder not in ("", "longest", "ranks" if kind == "bpe" else "viterbi"):
        raise UserError(f"preset {path} [tokenizer] encoder is {encoder!r}: a {kind} tokenizer's rule is its own ('' or "
                        f"{'ranks' if kind == 'bpe' else 'viterbi'}) or 'longest'")
    if "flop_budget" not in comp:
        raise UserError(f"preset {path}: [compare] needs flop_budget (training FLOPs per compared model)")
    models = []
    for i, m in enumerate(raw.get("model", [])):
        where = f"preset {path} [[model]] #{i + 1}"
        bad = set(m) - {"name", "config", "role", "flop_budget", "set", "ngram_from"}
        if bad:
            raise UserError(f"{where}: unknown key(s) {sorted(bad)}; valid: name, config, role, flop_budget, set, ngram_from")
        if not isinstance(m.get("name"), str) or not m["name"] or "/" in m["name"]:
            raise UserError(f"{where}: name must be a non-empty string without '/', got {m.get('name')!r}")
        if not isinstance(m.get("config"), str):
            raise UserError(f"{where}: config must name a config file (relative to the preset), got {m.get('config')!r}")
        role = m.get("role", "compared")
        if role not in ROLES:
            raise UserError(f"{where}: role must be one of {ROLES}, got {role!r}")
        config = (path.parent / m["config"]).resolve()
        if not config.is_file():
            raise UserError(f"{where}: config file {config} not found")
        budget = _number(m["flop_budget"], f"{where} flop_budget") if "flop_budget" in m else None
        ngram_from = m.get("ngram_from")
        if ngram_from is not None and not isinstance(ngram_from, str):
            raise UserError(f"{where}: ngram_from must name another [[model]], got {ngram_from!r}")
        models.append(ModelSpec(m["name"], config, role, budget, _strings(m.get("set", []), f"{where} set"), ngram_from))
    names = [m.name for m in models]
    if not models or len(set(names)) != len(names):
        raise UserError(f"preset {path}: needs [[model]] tables with distinct names, got {names}")
    for m in models:
        if m.ngram_from is not None and (m.ngram_from not in names or m.ngram_from == m.name):
            raise UserError(f"preset {path}: model {m.name!r}: ngram_from {m.ngram_from!r} must name another model of {names}")
    if sum(m.role == "entropy" for m in models) > 1:
        raise UserError(f"preset {path}: at most one model may have role = 'entropy'")
    return Preset(
        name=path.stem,
        path=path,
        flop_budget=_number(comp["flop_budget"], f"preset {path} flop_budget"),
        models=tuple(models),
        overrides=_strings(comp.get("set", []), f"preset {path} [compare] set"),
        eval_points=int(_number(comp.get("eval_points", 8), f"preset {path} eval_points")),
        time_budget_s=_number(comp.get("time_budget_s", 0), f"preset {path} time_budget_s", positive=False),
        learning_rates=_rates(comp.get("learning_rates", []), f"preset {path} [compare] learning_rates"),
        sweep_fraction=_fraction(comp.get("sweep_fraction", 0.25), f"preset {path} [compare] sweep_fraction"),
        seeds=_seeds(comp.get("seeds", 1), f"preset {path} [compare] seeds"),
        vocab_size=int(_number(tok.get("vocab_size", 4096), f"preset {path} vocab_size")),
        pattern=str(tok.get("pattern", "cl100k")),
        tokenizer_kind=kind,
        tokenizer_encoder=encoder,
    )


# -- result cache (the evaluation stage's output) ----------------------------------------------
def _result_to_json(r) -> dict:
    d = {k: v for k, v in dataclasses.asdict(r).items() if k not in ("scores", "global_steps")}
    d["nats"] = r.scores.nats.tolist()
    d["nbytes"] = r.scores.nbytes.tolist()
    d["global_steps"] = None if r.global_steps is None else r.global_steps.tolist()
    return d


def _result_from_json(d: dict) -> ModelResult:
    d = dict(d)
    scores = SegmentScores(np.asarray(d.pop("nats"), np.float64), np.asarray(d.pop("nbytes"), np.int64))
    gs = d.pop("global_steps")
    return ModelResult(scores=scores, global_steps=None if gs is None else np.asarray(gs, np.float64), **d)


# -- the job -----------------------------------------------------------------------------------
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
        self.times: dict[str, float] = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def record(self, name: str, seconds: float) -> None:
        self.times[name] = self.times.get(name, 0.0) + seconds
        atomic_write_text(self.path, json.dumps(self.times, indent=1))


def model_config(spec: ModelSpec, preset: Preset, *, data_spec: str | None, artefacts: dict[str, Path], extra=()) -> Config:
    """The config of one preset model: its file, the preset's and its own overrides, the data spec,
    the n-gram tables of the model its ``ngram_from`` names, and every artefact its family names
    (``artefacts``: kind -> path) set in its config field."""
    data = [f"data.source={data_spec}"] if data_spec else []
    overrides = [*preset.overrides, *spec.overrides, *data]
    if spec.ngram_from is not None:
        source = next(m for m in preset.models if m.name == spec.ngram_from)
        where = f"preset {preset.path}: model {spec.name!r}"
        overrides += ngram_overrides(load_config(source.config, [*preset.overrides, *source.overrides, *data]),
                                     load_config(spec.config, overrides), where=where)
    cfg = load_config(spec.config, overrides)
    if cfg.model is None:
        raise UserError(f"preset {preset.path}: model {spec.name!r}: its config {spec.config} has no [model] section")
    for field, kind in task_class(cfg.model.family).artefacts_of(cfg.model).items():
        if artefacts.get(kind) is None:
            makers = [role for role, made in ROLES.items() if made == kind]
            how = f"no [[model]] has role = {makers[0]!r}" if makers else "a preset cannot make one"
            raise UserError(
                f"preset {preset.path}: model {spec.name!r} ({cfg.model.family}) needs {ARTEFACT_KINDS[kind].noun}, but {how}"
            )
        overrides.append(f"model.{field}={artefacts[kind].absolute()}")
    return load_config(spec.config, [*overrides, *extra])


def _run_info(run_dir: Path) -> dict:
    return RunDir(run_dir).info_or_empty()


def _run_finished(run_dir: Path, steps: int | None) -> bool:
    """Finished at ``steps`` (None: a time-budgeted run, whose config check already matched the budget)."""
    return RunDir(run_dir).finished(steps)


@dataclasses.dataclass(frozen=True)
class _Seeded:
    """One training of a model: seed 0 is the model's run (``OUT/runs/<name>``), seed ``k`` its
    ``k``-th repetition (``OUT/seeds/<name>/s<k>``, ``train.seed`` + k)."""

    seed: int
    run_dir: Path
    eval_cache: Path


class _Job:
    """One ``bytelm compare`` invocation: the stages of the module docstring, one method each."""

    def __init__(self, preset: Preset, out: Path, data_spec: str | None, progress: StageProgress | None, note: Note | None):
        self.preset, self.out, self.data_spec, self.progress = preset, out, data_spec, progress
        self.say = note or (lambda msg: log.info("%s", msg))
        self.stages = _Stages(out)
        self.ordered = sorted(preset.models, key=lambda m: ROLES[m.role] is None)  # artefact makers first
        self.artefacts: dict[str, Path] = {"tokenizer": out / "tokenizer"}
        for m in preset.models:
            if ROLES[m.role] is not None:
                self.artefacts[ROLES[m.role]] = out / "runs" / m.name
        self.configs = {m.name: self.config_of(m) for m in self.ordered}
        self.plan: dict[str, dict] = {}
        self.seed_bpb: dict[str, dict[int, float]] = {}

    def config_of(self, spec: ModelSpec, extra=()) -> Config:
        return model_config(spec, self.preset, data_spec=self.data_spec, artefacts=self.artefacts, extra=extra)

    def seeded(self, spec: ModelSpec) -> list[_Seeded]:
        """The trainings of a model: one per seed for a compared model, one for an artefact maker."""
        n = self.preset.seeds if ROLES[spec.role] is None else 1
        runs = [_Seeded(0, self.out / "runs" / spec.name, self.out / "evals" / f"{spec.name}.json")]
        runs += [_Seeded(k, self.out / "seeds" / spec.name / f"s{k}", self.out / "evals" / "seeds" / f"{spec.name}.s{k}.json")
                 for k in range(1, n)]
        return runs

    def bar(self, stage: str):
        progress = self.progress
        return (lambda done, total=None, suffix="": progress(stage, done, total, suffix)) if progress else None

    def timed(self, stage: str, t0: float) -> float:
        dt = time.perf_counter() - t0
        self.stages.record(stage, dt)
        return dt

    # 1.
    def prepare_corpus(self) -> None:
        """One ``[data]`` section for every model, checked through the fingerprints."""
        t0 = time.perf_counter()
        corpora = CorpusCache(progress=self.bar("corpus"))
        self.corpus = {name: corpora.get(cfg) for name, cfg in self.configs.items()}
        check_same_fingerprint({name: c.fingerprint for name, c in self.corpus.items()}, self.corpus)
        self.main_corpus = self.corpus[self.ordered[0].name]
        self.eval_set = EvalSet.from_corpus(self.main_corpus)
        e = self.eval_set
        self.say(f"corpus {self.main_corpus.spec}: {e.n_bytes:,} held-out bytes in {len(e.data):,} segments, fingerprint {e.fingerprint[:16]}...")
        for line in heldout_lines(e.describe()):
            self.say(line)
        self.timed("corpus", t0)

    # 2.
    def train_tokenizer(self) -> None:
        """The subword tokenizer, when some model's family needs one, on the train split."""
        if not any("tokenizer" in task_class(cfg.model.family).artefacts_of(cfg.model).values() for cfg in self.configs.values()):
            return
        tokenizer_dir, p = self.artefacts["tokenizer"], self.preset
        if tokenizer_dir.is_dir():
            tok = load_tokenizer(tokenizer_dir)
            wanted = (p.tokenizer_kind, p.tokenizer_encoder or tok.encoders[0])
            # (a corpus can run out of merges or pieces: fewer ids than asked for are the same tokenizer)
            if (tok.kind, tok.encoder) != wanted or tok.n_vocab > p.vocab_size:
                raise UserError(
                    f"{tokenizer_dir} holds a {tok.kind} tokenizer (encoder {tok.encoder}, {tok.n_vocab} ids), but the preset "
                    f"asks for {wanted[0]} (encoder {wanted[1]}, up to {p.vocab_size} ids): compare into another --out, or delete it"
                )
            self.say(f"tokenizer: {tokenizer_dir} exists, skipped")
            return
        t0 = time.perf_counter()
        tok = train_tokenizer(p.tokenizer_kind, self.main_corpus, vocab_size=p.vocab_size, pattern=p.pattern, progress=self.bar(f"tokenizer ({p.tokenizer_kind})"))
        if p.tokenizer_encoder:
            tok = tok.with_encoder(p.tokenizer_encoder)
        with atomic_directory(tokenizer_dir) as tmp:
            tok.save(tmp)
        dt = self.timed("tokenizer", t0)
        self.say(f"tokenizer: {tok.kind}, {tok.n_vocab} ids ({p.pattern}, encoder {tok.encoder}) in {dt:.1f}s -> {tokenizer_dir}")

    def tokenizer_info(self) -> dict:
        """The subword tokenizer as the report records it: kind, encoder rule, size, pattern, directory."""
        p, d = self.preset, self.artefacts["tokenizer"]
        encoder = p.tokenizer_encoder or ("ranks" if p.tokenizer_kind == "bpe" else "viterbi")
        return {"kind": p.tokenizer_kind, "encoder": encoder, "vocab_size": p.vocab_size, "pattern": p.pattern, "dir": str(d)}

    def sweep_rate(self, spec: ModelSpec, steps: int, seconds_budget: float) -> dict:
        """The learning rate of a compared model (:mod:`bytelm.experiments.rates`): short runs
        (``sweep_fraction`` of its steps, or of its time), each scored on the validation split, the
        grid extended past an end where the best rate sits; returns the search's record."""
        p = self.preset
        if not self.configs[spec.name].data.validation_fraction > 0:
            raise UserError(
                f"preset {p.path}: learning_rates are chosen on the validation split, but data.validation_fraction "
                "is 0: add \"data.validation_fraction=0.05\" to [compare] set"
            )
        validation = EvalSet.from_corpus(self.corpus[spec.name], "validation")
        search = RateSearch(p.learning_rates)
        scores: dict[float, float | None] = {}
        errors: dict[str, str] = {}
        while rates := search.next_rates(scores):
            if len(scores) >= len(search.grid):
                self.say(f"learning rate of {spec.name}: the best so far is at an end of the rates tried; trying {rate_label(rates[0])}")
            for lr in rates:
                scores[lr], error = self.sweep_run(spec, lr, sweep_steps(steps, p.sweep_fraction), seconds_budget, validation)
                if error:
                    errors[rate_label(lr)] = error
        choice = search.choose(scores)
        tried = ", ".join(f"{rate_label(lr)}: " + ("failed" if scores[lr] is None else f"{scores[lr]:.4f}") for lr in sorted(scores))
        if choice.chosen is None:
            raise UserError(f"every learning rate tried for {spec.name} failed ({tried}): {'; '.join(errors.values())}")
        edge = " (STILL AT AN EDGE after the extensions)" if choice.at_edge else ""
        self.say(f"learning rate of {spec.name}: {rate_label(choice.chosen)}{edge} (validation BPB {tried})")
        return {**choice.record(), "grid": list(search.grid), "fraction": p.sweep_fraction, "errors": errors}

    def sweep_run(self, spec: ModelSpec, lr: float, steps: int, seconds_budget: float, validation: EvalSet) -> tuple[float | None, str]:
        """One sweep run (``OUT/sweeps/<name>/lr<rate>``): its validation BPB, or None and why it failed."""
        run_dir = self.out / "sweeps" / spec.name / f"lr{rate_label(lr)}"
        extra = [f"train.learning_rate={lr:g}", *schedule_overrides(self.configs[spec.name], steps, self.preset.eval_points)]
        if seconds_budget:
            extra.append(f"train.time_budget_s={seconds_budget * self.preset.sweep_fraction}")
            steps = None
        sweep_cfg = self.config_of(spec, extra)
        trainer.check_run_config(run_dir, sweep_cfg)
        cache = run_dir / "validation.json"
        if cache.is_file():
            done = json.loads(cache.read_text())
            if done.get("error"):
                return None, done["error"]
            if _run_finished(run_dir, steps):
                return done["bpb"], ""
        label = f"sweep {spec.name} lr {rate_label(lr)}"
        t0 = time.perf_counter()
        try:
            result = trainer.train(sweep_cfg, run_dir, corpus=self.corpus[spec.name], progress=self.bar(label))
        except trainer.TrainingDiverged as e:  # a rate too high: it loses the selection
            atomic_write_text(cache, json.dumps({"bpb": None, "error": str(e), "fingerprint": validation.fingerprint}))
            self.timed(label, t0)
            self.say(f"{label}: diverged ({e})")
            return None, str(e)
        if result.stopped_by_signal:
            raise CompareStopped(f"the sweep run {run_dir} stopped (checkpoint saved); run the same compare again to resume")
        tr = result.trainer or trainer.restore_trainer(run_dir, corpus=self.corpus[spec.name])
        bpb = evaluate_trained(tr, run_dir, validation, name=label).bpb
        atomic_write_text(cache, json.dumps({"bpb": bpb, "fingerprint": validation.fingerprint}))
        self.timed(label, t0)
        self.say(f"{label}: validation BPB {bpb:.4f}")
        return bpb, ""

    # 3-4.
    def train_models(self) -> None:
        """Every model at its budget, the artefact makers (the entropy model) first; a compared model
        once per seed. A FLOP budget is matched on the ledger's total (:mod:`bytelm.ledger`)."""
        for spec in self.ordered:
            cfg = self.configs[spec.name]
            budget = spec.flop_budget or self.preset.flop_budget
            seconds_budget = self.preset.time_budget_s if ROLES[spec.role] is None else 0.0
            what = f"model {spec.name!r}"
            main = self.seeded(spec)[0]
            ledger = planned_ledger(cfg, self.corpus[spec.name], main.run_dir)
            steps = ledger.steps_for(budget, what=what)
            sweep = {}
            if self.preset.learning_rates and ROLES[spec.role] is None:
                sweep = self.sweep_rate(spec, steps, seconds_budget)
            rate = [f"train.learning_rate={sweep['chosen']:g}"] if sweep else []
            plan = self.plan[spec.name] = {
                "family": cfg.model.family, "role": spec.role, "config": str(spec.config), "overrides": list(spec.overrides),
                "ngram_from": spec.ngram_from, "flop_budget": None if seconds_budget else budget, "time_budget_s": seconds_budget or None,
                "flops_per_step": ledger.own_per_step, "auxiliary_flops_per_step": ledger.auxiliary_per_step,
                "auxiliary_flops_fixed": dict(ledger.auxiliary_fixed), "steps": None if seconds_budget else steps,
                "run_dir": str(main.run_dir), "learning_rate": self.config_of(spec, rate).train.learning_rate, "lr_sweep": sweep or None,
                "seeds": [],
            }
            for run in self.seeded(spec):
                seed_cfg = self.config_of(spec, rate) if run.seed == 0 else self.config_of(spec, [*rate, f"train.seed={cfg.train.seed + run.seed}"])
                if run.seed:  # a seed calibrates its own patches (BLT): its own ledger
                    ledger = planned_ledger(seed_cfg, self.corpus[spec.name], run.run_dir)
                    steps = ledger.steps_for(budget, what=what)
                extra = [*rate, *([f"train.seed={cfg.train.seed + run.seed}"] if run.seed else []),
                         *schedule_overrides(cfg, steps, self.preset.eval_points)]
                if seconds_budget:  # the FLOP plan's warmup and eval spacing stay; the time decides the steps
                    extra.append(f"train.time_budget_s={seconds_budget}")
                record = self.train_one(spec, run, self.config_of(spec, extra), None if seconds_budget else steps, ledger)
                plan["seeds"].append(record)
            plan["steps"], plan["train_s"] = plan["seeds"][0]["steps"], plan["seeds"][0]["train_s"]

    def train_one(self, spec: ModelSpec, run: _Seeded, cfg: Config, steps: int | None, ledger) -> dict:
        """Train (or resume, or skip) one seed of a model; its record for the report's schedule."""
        name = spec.name if run.seed == 0 else f"{spec.name} seed {run.seed}"
        trainer.check_run_config(run.run_dir, cfg)
        if _run_finished(run.run_dir, steps):
            info = _run_info(run.run_dir)
            self.say(f"train {name}: finished earlier ({info['step']} steps), skipped")
            return {"seed": run.seed, "run_dir": str(run.run_dir), "steps": info["step"], "train_s": info.get("train_s")}
        if steps is None:
            self.say(f"train {name} ({cfg.model.family}): {seconds(cfg.train.time_budget_s)} of training at {ledger.own_per_step:.3g} FLOPs per step")
        else:
            aux = f" + auxiliary {ledger.auxiliary(steps):.3g} = {ledger.total(steps):.3g}" if ledger.auxiliary(steps) else ""
            self.say(f"train {name} ({cfg.model.family}): {steps} steps x {ledger.own_per_step:.3g} FLOPs = {ledger.own(steps):.3g}{aux} FLOPs")
        t0 = time.perf_counter()
        label = f"train {name}"
        result = trainer.train(cfg, run.run_dir, corpus=self.corpus[spec.name], progress=self.bar(label))
        self.timed(label, t0)
        if result.stopped_by_signal or not _run_finished(run.run_dir, steps):
            raise CompareStopped(
                f"training {name} stopped at step {result.step} (checkpoint saved in {run.run_dir}); "
                f"run the same compare again (same --out {self.out}) to resume"
            )
        return {"seed": run.seed, "run_dir": str(run.run_dir), "steps": result.step, "train_s": result.train_s}

    # 5.
    def evaluate_models(self) -> list[ModelResult]:
        """Every run on every held-out segment, each result cached in ``OUT/evals/<name>.json``
        (seeds: ``OUT/evals/seeds/<name>.s<k>.json``); returns the seed-0 results, and keeps every
        seed's BPB for the report."""
        results = []
        for spec in self.ordered:
            for run, record in zip(self.seeded(spec), self.plan[spec.name]["seeds"]):
                name = spec.name if run.seed == 0 else f"{spec.name}.s{run.seed}"
                r = self.evaluate_one(spec, run, name, record["steps"])
                self.seed_bpb.setdefault(spec.name, {})[run.seed] = r.bpb
                if run.seed == 0:
                    results.append(r)
        return results

    def evaluate_one(self, spec: ModelSpec, run: _Seeded, name: str, steps: int) -> ModelResult:
        cache = run.eval_cache
        if cache.is_file():
            cached = json.loads(cache.read_text())
            if cached.get("fingerprint") == self.eval_set.fingerprint and cached.get("step") == steps:
                r = _result_from_json(cached)
                self.say(f"eval {name}: done earlier, BPB {r.bpb:.4f}")
                return r
        t0 = time.perf_counter()
        label = f"eval {name}"
        r = evaluate_run(run.run_dir, self.eval_set, name=spec.name, corpus=self.corpus[spec.name], progress=self.bar(label))
        if ROLES[spec.role] is not None:
            made = ARTEFACT_KINDS[ROLES[spec.role]].noun
            r.note = (r.note + "; " if r.note else "") + f"the {made} of the other runs (own budget {self.plan[spec.name]['flop_budget']:.3g} FLOPs)"
        atomic_write_text(cache, json.dumps(_result_to_json(r)))
        dt = self.timed(label, t0)
        self.say(f"eval {name}: BPB {r.bpb:.4f} in {dt:.1f}s")
        return r

    def seed_summary(self, compared: list[ModelResult]) -> dict | None:
        """With ``seeds > 1``: every compared model's BPB per seed, mean, standard deviation and
        range, and for each adjacent pair of the ranking by mean whether the gap exceeds the range."""
        if self.preset.seeds < 2:
            return None
        models = {}
        for r in compared:
            if ROLES[self.plan[r.name]["role"]] is not None:
                continue
            bpbs = [self.seed_bpb[r.name][k] for k in sorted(self.seed_bpb[r.name])]
            models[r.name] = {"bpb": bpbs, "mean": float(np.mean(bpbs)), "std": float(np.std(bpbs, ddof=1)),
                              "spread": float(max(bpbs) - min(bpbs))}
        return {"n": self.preset.seeds, "models": models, "pairs": ranked_pairs(models)}

    # 6.
    def write_report(self, results: list[ModelResult]) -> CompareResult:
        """``report.json``, ``report.md`` and ``bpb.png``: the compared models first, then the artefact makers."""
        t0 = time.perf_counter()
        compared = [r for r in results if ROLES[self.plan[r.name]["role"]] is None]
        compared += [r for r in results if ROLES[self.plan[r.name]["role"]] is not None]
        baselines = unigram_baselines(self.eval_set)
        p = self.preset
        info = {
            "preset": p.name,
            "preset_path": str(p.path),
            "flop_budget": p.flop_budget,
            "time_budget_s": p.time_budget_s or None,
            "matched": "training time" if p.time_budget_s else "total training FLOPs (own + auxiliary)",
            "learning_rates": list(p.learning_rates) or None,
            "tokenizer": self.tokenizer_info(),
            "models": self.plan,
            "seeds": self.seed_summary(compared),
        }
        report = build_report(self.eval_set, compared, baselines, compare=info)
        plot = self.out / "bpb.png"
        plot_bpb_vs_flops(
            plot,
            {r.name: eval_curve(r.run_dir) for r in compared},
            finals={r.name: (r.flops_total if r.flops_total is not None else r.flops, r.bpb) for r in compared},
            baselines={baselines[0].name: baselines[0].bpb},
            subtitle=f"preset {p.name}, fingerprint {self.eval_set.fingerprint[:16]}\nx: total FLOPs (own + auxiliary); lines: periodic "
            f"evals (first {self.configs[self.ordered[0].name].eval.eval_bytes:,} held-out bytes); stars: all {self.eval_set.n_bytes:,} bytes",
        )
        self.timed("report", t0)
        report["compare"]["stages_s"] = dict(self.stages.times)
        report["compare"]["wall_s"] = sum(self.stages.times.values())
        report_json, report_md = self.out / "report.json", self.out / "report.md"
        write_report_json(report, report_json)
        atomic_write_text(report_md, markdown_report(report))
        return CompareResult(self.out, report, report_md, report_json, plot)


def ranked_pairs(models: dict[str, dict]) -> list[dict]:
    """Adjacent pairs of the ranking by mean BPB (``models``: name -> ``{"mean", "spread", ...}``):
    the gap between their means and whether it exceeds the larger of their seed-to-seed ranges."""
    ranked = sorted(models, key=lambda n: models[n]["mean"])
    pairs = []
    for better, worse in zip(ranked, ranked[1:]):
        gap = models[worse]["mean"] - models[better]["mean"]
        spread = max(models[better]["spread"], models[worse]["spread"])
        pairs.append({"better": better, "worse": worse, "gap": gap, "spread": spread, "exceeds": gap > spread})
    return pairs


def compare(
    preset: str | Preset = "tiny",
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
    preset = preset if isinstance(preset, Preset) else load_preset(preset)
    if time_budget_s is not None:
        if not time_budget_s > 0:
            raise UserError(f"the time budget must be > 0 seconds, got {time_budget_s}")
        preset = dataclasses.replace(preset, time_budget_s=float(time_budget_s))
    if seeds is not None:
        preset = dataclasses.replace(preset, seeds=_seeds(seeds, "--seeds"))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    job = _Job(preset, out, data_spec, progress, note)
    job.prepare_corpus()
    job.train_tokenizer()
    job.train_models()
    return job.write_report(job.evaluate_models())


def global_steps_sentence(report: dict) -> str:
    """What a global step is for each family in the report (from its task)."""
    families = dict.fromkeys(m["family"] for m in report["models"] if m["kind"] == "run")
    return "; ".join(f"bytes per {task_class(f).global_step} for {f}" for f in families)


def artefact_lines(report: dict) -> list[str]:
    """A line per artefact-making run (the entropy model): its own FLOPs, and the models whose
    ledgers carry them."""
    rows = {m["name"]: m for m in report["models"]}
    users = [m["name"] for m in report["models"] if m.get("auxiliary_flops")]
    lines = []
    for name, plan in report["compare"]["models"].items():
        kind = ROLES.get(plan["role"])
        if kind is not None and name in rows:
            lines.append(
                f"the {ARTEFACT_KINDS[kind].noun} `{name}` was trained with {human(rows[name]['flops'])} FLOPs of its own, counted in "
                f"the auxiliary FLOPs of {', '.join(f'`{u}`' for u in users) or 'no compared model'} (with its forward over their "
                "training bytes); it is listed below the compared models, not compared with them"
            )
    return lines


def ledger_lines(report: dict) -> list[str]:
    """What each model's auxiliary FLOPs are, and what is not on any ledger."""
    lines = []
    for m in report["models"]:
        parts = m.get("auxiliary_flops") or {}
        if parts:
            lines.append(f"`{m['name']}` auxiliary FLOPs: " + "; ".join(f"{what} {human(v)}" for what, v in parts.items()))
    lines.append("training the subword tokenizer is not neural compute and is on no ledger; the learning-rate sweep runs (the "
                 "schedule below) are on no ledger either: every compared model has one")
    return lines


def seed_lines(seeds: dict | None) -> list[str]:
    """The seed section of report.md: per model BPB per seed, mean, spread; per adjacent pair a verdict."""
    if not seeds:
        return []
    rows = [[name, ", ".join(f"{x:.4f}" for x in s["bpb"]), f"{s['mean']:.4f}", f"{s['std']:.4f}", f"{s['spread']:.4f}"]
            for name, s in sorted(seeds["models"].items(), key=lambda kv: kv[1]["mean"])]
    lines = [f"## {seeds['n']} seeds per compared model", "",
             table(["model", "BPB per seed", "mean", "std", "max - min"], rows, "lrrrr"), ""]
    for pair in seeds["pairs"]:
        verdict = "exceeds" if pair["exceeds"] else "does NOT exceed"
        lines.append(f"- {pair['better']} < {pair['worse']}: the gap of the means, {pair['gap']:.4f} BPB, {verdict} the larger "
                     f"seed-to-seed range of the two ({pair['spread']:.4f})")
    return [*lines, ""]


def matched_sentence(c: dict) -> str:
    if c.get("time_budget_s"):
        return (f"{seconds(c['time_budget_s'])} of training time per compared model (compilation included, evaluations "
                "not; each model's FLOPs follow from its speed)")
    return (f"{c['flop_budget']:.3g} total FLOPs per compared model (analytic training FLOPs, forward + backward: the model's own "
            "plus the auxiliary models it needs, bytelm/ledger.py)")


def schedule_sentence(c: dict) -> str:
    if c.get("time_budget_s"):
        return (f"each compared model trained until {seconds(c['time_budget_s'])} of training time were spent (its learning-rate "
                "horizon planned from its first steps' time); the entropy model at its own FLOP budget.")
    return (f"each compared model's steps = ({human(c['flop_budget'])} FLOPs - its one-off auxiliary FLOPs) / (own + auxiliary "
            "FLOPs per step).")


def _lr_cell(plan: dict) -> str:
    lr = plan.get("learning_rate")
    sweep = plan.get("lr_sweep")
    if lr is None:
        return "-"
    if not sweep:
        return f"{lr:g}"
    edge = " STILL AT AN EDGE" if sweep.get("at_edge") else ""
    scores = ", ".join(f"{k}: " + ("failed" if v is None else f"{v:.3f}") for k, v in sweep["validation_bpb"].items())
    return f"{lr:g}{edge} ({scores})"


def _budget_cell(plan: dict) -> str:
    return seconds(plan["time_budget_s"]) if plan.get("time_budget_s") else f"{plan['flop_budget']:.3g} FLOPs"


def _edge_lines(c: dict) -> list[str]:
    """A loud line per model whose learning rate the extended grid still could not bracket."""
    return [f"**WARNING: the learning rate of `{name}` is still at an edge of the rates tried ("
            f"{', '.join(m['lr_sweep']['validation_bpb'])}) after {m['lr_sweep']['extensions']} extensions: its row may not be its "
            "best.**" for name, m in c["models"].items() if (m.get("lr_sweep") or {}).get("at_edge")]


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
        *[f"**{line}**" for line in heldout_lines(report["data"])],
        *[line for line in _edge_lines(c)],
        "",
        "## Bits per byte on the identical held-out bytes",
        "",
        results_table(report),
        "",
        "Every model scores every segment on its own from BOS; BPB = total NLL in nats / (held-out bytes x ln 2). "
        "The unigram rows are context-free references: the eval bytes' own byte entropy, and a byte "
        f"distribution fit on the train split. *bytes/global step* is measured on the eval set: {global_steps_sentence(report)}. "
        "*own*, *auxiliary* and *total FLOPs* are the compute ledger: the model's training, what it needs besides (BLT: its entropy "
        "model's training and its forward over the training bytes), and their sum, which the budget matches. *n-gram params* are "
        "the hashed n-gram lookup tables among the embedding parameters (lookups cost no FLOPs). "
        "*entropy FLOPs/B* is the forward cost per byte of an entropy model run in the input pipeline (BLT's), "
        "*inference FLOPs/B* the total forward cost per byte, model and entropy model (bytelm/models/flops.py).",
        "",
        *[f"- {line}" for line in artefact_lines(report)],
        *[f"- {line}" for line in ledger_lines(report)],
        *[f"- {line}" for line in pipeline_lines(report)],
        "",
        "![BPB vs total training FLOPs](bpb.png)",
        "",
        *seed_lines(c.get("seeds")),
    ]
    for key, title in (("dirs", "BPB per top-level directory"),):
        t = breakdown_table(report, key)
        if t:
            lines += [f"## {title}", "", t, ""]
            g = breakdown_table(report, key, metric="mean_bytes_per_global_step")
            if g:
                lines += ["Bytes per global step per top-level directory (the token tax shows here):", "", g, ""]
    trained = {m["name"]: m for m in report["models"] if m["kind"] == "run"}
    rows = [
        [
            name, m["family"], m["role"], _budget_cell(m), f"{m['flops_per_step']:.3g}",
            human(m.get("auxiliary_flops_per_step")) if m.get("auxiliary_flops_per_step") else "-", str(m["steps"]),
            human(trained[name]["flops_total"]) if name in trained else "-", seconds(m.get("train_s")),
            _lr_cell(m),
        ]
        for name, m in c["models"].items()
    ]
    sweeps = [m["lr_sweep"] for m in c["models"].values() if m.get("lr_sweep")]
    lines += [
        "## Schedule",
        "",
        table(["run", "family", "role", "budget", "own FLOPs/step", "aux FLOPs/step", "steps", "total FLOPs", "train time",
               "learning rate"], rows, "lllrrrrrrl"),
        "",
        *([f"Learning rates: each compared model's chosen from {', '.join(f'{x:g}' for x in c['learning_rates'])} by a run at "
           f"{sweeps[0]['fraction']} of its steps per rate, scored on the validation split (train documents held out of training; "
           "never the held-out segments above); when the best rate was at an end of the rates tried, one more rate beyond it, "
           "the grid's own ratio away, up to two (bytelm/experiments/rates.py); in brackets, each rate's validation BPB.", ""]
          if sweeps else []),
        "## Stage wall times",
        "",
        table(["stage", "wall"], [[k, seconds(v)] for k, v in c["stages_s"].items()], "lr"),
        "",
        f"Tokenizer: {c['tokenizer'].get('kind', 'bpe')}, {c['tokenizer']['vocab_size']} ids, pattern {c['tokenizer']['pattern']}, "
        f"encoder {c['tokenizer'].get('encoder') or 'ranks'}. Training FLOPs are "
        f"analytic (bytelm/models/flops.py); {schedule_sentence(c)} *train time* counts compilation, not evaluations.",
        "",
    ]
    return "\n".join(lines)
