"""``bytelm compare``, the main job: every family at a matched training-FLOP budget, scored on
the identical held-out bytes, with a report (``report.md``, ``report.json``, ``bpb.png``).

Stages, in order (each one's output lives under ``--out`` and a finished stage is skipped when
the same command runs again; an interrupted training resumes from its last checkpoint):

1. the corpus (split, segments, fingerprint; cached by :mod:`bytelm.data`);
2. the BPE tokenizer of the subword baseline (``OUT/tokenizer``), trained on the train split;
3. the entropy model of BLT (``OUT/runs/<name>``, its own small budget);
4. each compared model (``OUT/runs/<name>``) with ``train.steps = budget / train FLOPs per step``,
   where FLOPs per step is the family's analytic training FLOPs per position x positions per
   step (:mod:`bytelm.training.flops`), so every family spends the same compute;
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
import math
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bytelm.atomic import atomic_directory, atomic_write_text
from bytelm.baselines import KINDS, load_tokenizer, train_tokenizer
from bytelm.config import Config, load_config, shipped_configs
from bytelm.errors import UserError
from bytelm.evaluation.bpb import SegmentScores
from bytelm.evaluation.evaluator import CorpusCache, check_same_fingerprint, evaluate_run, evaluate_trained, unigram_baselines
from bytelm.evaluation.plots import eval_curve, plot_bpb_vs_flops
from bytelm.evaluation.report import breakdown_table, build_report, header_lines, human, pipeline_lines, results_table, seconds, table, write_report_json
from bytelm.evaluation.results import EvalSet, ModelResult
from bytelm.training import trainer
from bytelm.training.tasks import ARTEFACT_KINDS, task_class

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
    compare_keys = {"flop_budget", "eval_points", "time_budget_s", "learning_rates", "sweep_fraction", "set"}
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
        bad = set(m) - {"name", "config", "role", "flop_budget", "set"}
        if bad:
            raise UserError(f"{where}: unknown key(s) {sorted(bad)}; valid: name, config, role, flop_budget, set")
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
        models.append(ModelSpec(m["name"], config, role, budget, _strings(m.get("set", []), f"{where} set")))
    names = [m.name for m in models]
    if not models or len(set(names)) != len(names):
        raise UserError(f"preset {path}: needs [[model]] tables with distinct names, got {names}")
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
    and every artefact its family names (``artefacts``: kind -> path) set in its config field."""
    overrides = [*preset.overrides, *spec.overrides, *([f"data.source={data_spec}"] if data_spec else [])]
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


def derived_schedule(cfg, task, budget: float, eval_points: int) -> tuple[list[str], int, float]:
    """Overrides giving ``budget`` training FLOPs: ``(overrides, steps, flops_per_step)``."""
    flops_per_step = task.train_flops_per_position() * task.positions_per_step()
    steps = max(1, int(round(budget / flops_per_step)))
    warmup = min(cfg.train.warmup_steps, max(1, steps // 10))
    every = max(1, math.ceil(steps / max(1, eval_points)))
    return [f"train.steps={steps}", f"train.warmup_steps={warmup}", f"eval.every={every}"], steps, flops_per_step


class _PlannedTask:
    """The FLOP accounting of a run: recorded in its ``run.json`` when it started, else from its task
    (building a BLT task restores the entropy model and calibrates, so a re-run reads the record)."""

    def __init__(self, per_position: float, positions: int):
        self.per_position, self.positions = per_position, positions

    def train_flops_per_position(self) -> float:
        return self.per_position

    def positions_per_step(self) -> int:
        return self.positions

    @classmethod
    def of(cls, cfg, corpus, run_dir: Path):
        path = run_dir / "run.json"
        if path.is_file():
            info = json.loads(path.read_text())
            if info.get("train_flops_per_position") and info.get("positions_per_step"):
                return cls(float(info["train_flops_per_position"]), int(info["positions_per_step"]))
        return trainer.make_task(cfg, corpus, run_dir)


def _run_info(run_dir: Path) -> dict:
    path = run_dir / "run.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _run_finished(run_dir: Path, steps: int | None) -> bool:
    """Finished at ``steps`` (None: a time-budgeted run, whose config check already matched the budget)."""
    info = _run_info(run_dir)
    return info.get("status") == "finished" and (steps is None or info.get("step") == steps)


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

    def config_of(self, spec: ModelSpec, extra=()) -> Config:
        return model_config(spec, self.preset, data_spec=self.data_spec, artefacts=self.artefacts, extra=extra)

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

    def sweep_rate(self, spec: ModelSpec, cfg, planned, budget: float, seconds_budget: float) -> dict:
        """One short run per learning rate (``sweep_fraction`` of the budget), each scored on the
        validation split; returns ``{"validation_bpb": {rate: bpb}, "chosen": rate}``."""
        p = self.preset
        if not cfg.data.validation_fraction > 0:
            raise UserError(
                f"preset {p.path}: learning_rates are chosen on the validation split, but data.validation_fraction "
                "is 0: add \"data.validation_fraction=0.05\" to [compare] set"
            )
        validation = EvalSet.from_corpus(self.corpus[spec.name], "validation")
        scores = {}
        for lr in p.learning_rates:
            run_dir = self.out / "sweeps" / spec.name / f"lr{lr:g}"
            extra, steps, _ = derived_schedule(cfg, planned, budget * p.sweep_fraction, p.eval_points)
            extra = [f"train.learning_rate={lr:g}", *extra]
            if seconds_budget:
                extra.append(f"train.time_budget_s={seconds_budget * p.sweep_fraction}")
                steps = None
            sweep_cfg = self.config_of(spec, extra)
            trainer.check_run_config(run_dir, sweep_cfg)
            cache = run_dir / "validation.json"
            if _run_finished(run_dir, steps) and cache.is_file():
                scores[lr] = json.loads(cache.read_text())["bpb"]
                continue
            label = f"sweep {spec.name} lr {lr:g}"
            t0 = time.perf_counter()
            result = trainer.train(sweep_cfg, run_dir, corpus=self.corpus[spec.name], progress=self.bar(label))
            if result.stopped_by_signal:
                raise CompareStopped(f"the sweep run {run_dir} stopped (checkpoint saved); run the same compare again to resume")
            tr = result.trainer or trainer.restore_trainer(run_dir, corpus=self.corpus[spec.name])
            scores[lr] = evaluate_trained(tr, run_dir, validation, name=label).bpb
            atomic_write_text(cache, json.dumps({"bpb": scores[lr], "fingerprint": validation.fingerprint}))
            self.timed(label, t0)
            self.say(f"{label}: validation BPB {scores[lr]:.4f}")
        chosen = min(scores, key=lambda lr: (scores[lr], lr))
        self.say(f"learning rate of {spec.name}: {chosen:g} (validation BPB " + ", ".join(f"{lr:g}: {b:.4f}" for lr, b in scores.items()) + ")")
        at_edge = len(p.learning_rates) > 1 and chosen in (min(p.learning_rates), max(p.learning_rates))
        return {"validation_bpb": {f"{lr:g}": b for lr, b in scores.items()}, "chosen": chosen, "fraction": p.sweep_fraction,
                "at_edge": at_edge}

    # 3-4.
    def train_models(self) -> None:
        """Every model at its budget, the artefact makers (the entropy model) first."""
        for spec in self.ordered:
            run_dir = self.out / "runs" / spec.name
            cfg = self.configs[spec.name]
            budget = spec.flop_budget or self.preset.flop_budget
            seconds_budget = self.preset.time_budget_s if ROLES[spec.role] is None else 0.0
            planned = _PlannedTask.of(cfg, self.corpus[spec.name], run_dir)
            sweep = {}
            if self.preset.learning_rates and ROLES[spec.role] is None:
                sweep = self.sweep_rate(spec, cfg, planned, budget, seconds_budget)
                cfg = self.config_of(spec, [f"train.learning_rate={sweep['chosen']:g}"])
            extra, steps, per_step = derived_schedule(cfg, planned, budget, self.preset.eval_points)
            if seconds_budget:  # the FLOP plan's warmup and eval spacing stay; the time decides the steps
                extra = [*extra, f"train.time_budget_s={seconds_budget}"]
            if sweep:
                extra = [f"train.learning_rate={sweep['chosen']:g}", *extra]
            cfg = self.config_of(spec, extra)
            self.plan[spec.name] = {
                "family": cfg.model.family, "role": spec.role, "config": str(spec.config), "overrides": list(spec.overrides),
                "flop_budget": None if seconds_budget else budget, "time_budget_s": seconds_budget or None,
                "flops_per_step": per_step, "steps": None if seconds_budget else steps, "run_dir": str(run_dir),
                "learning_rate": cfg.train.learning_rate, "lr_sweep": sweep or None,
            }
            trainer.check_run_config(run_dir, cfg)
            plan = self.plan[spec.name]
            if _run_finished(run_dir, plan["steps"]):
                plan["steps"], plan["train_s"] = _run_info(run_dir)["step"], _run_info(run_dir).get("train_s")
                self.say(f"train {spec.name}: finished earlier ({plan['steps']} steps), skipped")
                continue
            if seconds_budget:
                self.say(f"train {spec.name} ({cfg.model.family}): {seconds(seconds_budget)} of training at {per_step:.3g} FLOPs per step")
            else:
                self.say(f"train {spec.name} ({cfg.model.family}): {steps} steps x {per_step:.3g} FLOPs = {steps * per_step:.3g} FLOPs")
            t0 = time.perf_counter()
            label = f"train {spec.name}"
            result = trainer.train(cfg, run_dir, corpus=self.corpus[spec.name], progress=self.bar(label))
            self.timed(label, t0)
            if result.stopped_by_signal or not _run_finished(run_dir, plan["steps"]):
                raise CompareStopped(
                    f"training {spec.name} stopped at step {result.step} (checkpoint saved in {run_dir}); "
                    f"run the same compare again (same --out {self.out}) to resume"
                )
            plan["steps"], plan["train_s"] = result.step, result.train_s

    # 5.
    def evaluate_models(self) -> list[ModelResult]:
        """Every run on every held-out segment, each result cached in ``OUT/evals/<name>.json``."""
        results = []
        for spec in self.ordered:
            cache = self.out / "evals" / f"{spec.name}.json"
            plan = self.plan[spec.name]
            if cache.is_file():
                cached = json.loads(cache.read_text())
                if cached.get("fingerprint") == self.eval_set.fingerprint and cached.get("step") == plan["steps"]:
                    results.append(_result_from_json(cached))
                    self.say(f"eval {spec.name}: done earlier, BPB {results[-1].bpb:.4f}")
                    continue
            t0 = time.perf_counter()
            label = f"eval {spec.name}"
            r = evaluate_run(self.out / "runs" / spec.name, self.eval_set, name=spec.name, corpus=self.corpus[spec.name], progress=self.bar(label))
            if ROLES[spec.role] is not None:
                made = ARTEFACT_KINDS[ROLES[spec.role]].noun
                r.note = (r.note + "; " if r.note else "") + f"the {made} of the other runs (own budget {plan['flop_budget']:.3g} FLOPs)"
            atomic_write_text(cache, json.dumps(_result_to_json(r)))
            dt = self.timed(label, t0)
            self.say(f"eval {spec.name}: BPB {r.bpb:.4f} in {dt:.1f}s")
            results.append(r)
        return results

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
            "matched": "training time" if p.time_budget_s else "training FLOPs",
            "learning_rates": list(p.learning_rates) or None,
            "tokenizer": self.tokenizer_info(),
            "models": self.plan,
        }
        report = build_report(self.eval_set, compared, baselines, compare=info)
        plot = self.out / "bpb.png"
        plot_bpb_vs_flops(
            plot,
            {r.name: eval_curve(r.run_dir) for r in compared},
            finals={r.name: (r.flops, r.bpb) for r in compared},
            baselines={baselines[0].name: baselines[0].bpb},
            subtitle=f"preset {p.name}, fingerprint {self.eval_set.fingerprint[:16]}\nlines: periodic evals (first "
            f"{self.configs[self.ordered[0].name].eval.eval_bytes:,} held-out bytes); stars: all {self.eval_set.n_bytes:,} bytes",
        )
        self.timed("report", t0)
        report["compare"]["stages_s"] = dict(self.stages.times)
        report["compare"]["wall_s"] = sum(self.stages.times.values())
        report_json, report_md = self.out / "report.json", self.out / "report.md"
        write_report_json(report, report_json)
        atomic_write_text(report_md, markdown_report(report))
        return CompareResult(self.out, report, report_md, report_json, plot)


def compare(
    preset: str | Preset = "tiny",
    out: str | Path = "compare",
    *,
    data_spec: str | None = None,
    progress: StageProgress | None = None,
    note: Note | None = None,
    time_budget_s: float | None = None,
) -> CompareResult:
    """Run (or resume) the comparison described by ``preset`` into ``out``; see the module docstring.
    ``time_budget_s`` (> 0) replaces the preset's: every compared model trains for that long."""
    preset = preset if isinstance(preset, Preset) else load_preset(preset)
    if time_budget_s is not None:
        if not time_budget_s > 0:
            raise UserError(f"the time budget must be > 0 seconds, got {time_budget_s}")
        preset = dataclasses.replace(preset, time_budget_s=float(time_budget_s))
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
    """A line per artefact-making run (the entropy model): its own training FLOPs, outside the budget."""
    rows = {m["name"]: m for m in report["models"]}
    lines = []
    for name, plan in report["compare"]["models"].items():
        kind = ROLES.get(plan["role"])
        if kind is not None and name in rows:
            lines.append(
                f"the {ARTEFACT_KINDS[kind].noun} `{name}` was trained with {human(rows[name]['flops'])} FLOPs of its own, "
                "not counted in the budget of the models that use it"
            )
    return lines


def matched_sentence(c: dict) -> str:
    if c.get("time_budget_s"):
        return (f"{seconds(c['time_budget_s'])} of training time per compared model (compilation included, evaluations "
                "not; each model's FLOPs follow from its speed)")
    return f"{c['flop_budget']:.3g} FLOPs per compared model (analytic training FLOPs, forward + backward)"


def schedule_sentence(c: dict) -> str:
    if c.get("time_budget_s"):
        return (f"each compared model trained until {seconds(c['time_budget_s'])} of training time were spent (its learning-rate "
                "horizon planned from its first steps' time); the entropy model at its own FLOP budget.")
    return f"each compared model's steps = {human(c['flop_budget'])} FLOPs / FLOPs per step."


def _lr_cell(plan: dict) -> str:
    lr = plan.get("learning_rate")
    sweep = plan.get("lr_sweep")
    if lr is None:
        return "-"
    if not sweep:
        return f"{lr:g}"
    edge = " (at an end of the swept range)" if sweep.get("at_edge") else ""
    return f"{lr:g}{edge} (" + ", ".join(f"{k}: {v:.3f}" for k, v in sweep["validation_bpb"].items()) + ")"


def _budget_cell(plan: dict) -> str:
    return seconds(plan["time_budget_s"]) if plan.get("time_budget_s") else f"{plan['flop_budget']:.3g} FLOPs"


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
        "## Bits per byte on the identical held-out bytes",
        "",
        results_table(report),
        "",
        "Every model scores every segment on its own from BOS; BPB = total NLL in nats / (held-out bytes x ln 2). "
        "The unigram rows are context-free references: the eval bytes' own byte entropy, and a byte "
        f"distribution fit on the train split. *bytes/global step* is measured on the eval set: {global_steps_sentence(report)}. "
        "*entropy FLOPs/B* is the forward cost per byte of an entropy model run in the input pipeline (BLT's), "
        "*inference FLOPs/B* the total forward cost per byte, model and entropy model (bytelm/training/flops.py).",
        "",
        *[f"- {line}" for line in artefact_lines(report)],
        *[f"- {line}" for line in pipeline_lines(report)],
        "",
        "![BPB vs training FLOPs](bpb.png)",
        "",
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
            name, m["family"], m["role"], _budget_cell(m), f"{m['flops_per_step']:.3g}", str(m["steps"]),
            human(trained[name]["flops"]) if name in trained else "-", seconds(m.get("train_s")),
            _lr_cell(m),
        ]
        for name, m in c["models"].items()
    ]
    lines += [
        "## Schedule",
        "",
        table(["run", "family", "role", "budget", "FLOPs/step", "steps", "train FLOPs", "train time", "learning rate"], rows, "lllrrrrrl"),
        "",
        *([f"Learning rates: each compared model's chosen from {', '.join(f'{x:g}' for x in c['learning_rates'])} by a "
           f"run at {next(iter(m['lr_sweep']['fraction'] for m in c['models'].values() if m.get('lr_sweep')))} of its "
           "budget per rate, scored on the validation split (train documents held out of training; never the "
           "held-out segments above); in brackets, each rate's validation BPB.", ""] if c.get("learning_rates") else []),
        "## Stage wall times",
        "",
        table(["stage", "wall"], [[k, seconds(v)] for k, v in c["stages_s"].items()], "lr"),
        "",
        f"Tokenizer: {c['tokenizer'].get('kind', 'bpe')}, {c['tokenizer']['vocab_size']} ids, pattern {c['tokenizer']['pattern']}, "
        f"encoder {c['tokenizer'].get('encoder') or 'ranks'}. Training FLOPs are "
        f"analytic (bytelm/training/flops.py); {schedule_sentence(c)} *train time* counts compilation, not evaluations.",
        "",
    ]
    return "\n".join(lines)
