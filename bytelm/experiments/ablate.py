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
or ``unigram``) and ``tokenizer.encoder`` (the kind's own rule, or ``longest``) are optional. ``lr_from = "blt"`` reuses another family's chosen rate.

The runs, in four stages (each a list of independent ``bytelm train`` commands):

1. **artefacts**: the tokenizers and the entropy model;
2. **sweep**: each family's sweep cell at the smallest budget, once per learning rate; the rate
   with the lowest BPB on the **validation split** (``data.validation_fraction``, carved from the
   training documents, never the held-out segments) is chosen and reused at every budget;
3. **grid**: every cell at every budget with its family's rate (a sweep run is reused);
4. **seeds**: the best cell of each family at the smallest budget again with ``extra_seeds`` more
   seeds, for the seed-to-seed spread the report compares every gap with.

Every run lives in ``OUT/runs/<family>/<cell>/<budget>-lr<lr>-s<seed>``; a finished run is
skipped, an interrupted one resumes, a failing one is reported and the others go on.
``--print-commands`` prints the commands of the first unfinished stage (run them anywhere, then
ask again for the next stage); ``--collect`` trains nothing and builds the report from what is
on disk. Results: ``ablation.json``, ``ablation.md``, ``bpb_vs_bytes_per_step.png``,
``bpb_vs_flops.png`` and, when the held-out data has several top-level directories,
``bpb_per_group.png``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import logging
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bytelm.atomic import atomic_directory, atomic_write_text
from bytelm.baselines import KINDS, is_saved, train_tokenizer
from bytelm.config import Config, load_config, section_overrides, shipped_configs, typed_fields
from bytelm.errors import UserError
from bytelm.bpb import breakdown
from bytelm.evaluation.evaluator import CorpusCache, evaluate_run, evaluate_trained
from bytelm.evaluation.report import heldout_lines, human, seconds, table
from bytelm.evaluation.results import EvalSet, ModelResult
from bytelm.experiments.compare import (
    _number,
    _result_from_json,
    _result_to_json,
    _strings,
    StageStopped,
    find_toml,
    read_sections,
)
from bytelm.experiments.plan import derived_schedule, ngram_overrides, planned_ledger
from bytelm.experiments.rates import RateSearch, rate_label
from bytelm.rundir import RunDir
from bytelm.training import trainer
from bytelm.ledger import Ledger
from bytelm.families import Trunk, task_class
from bytelm.models.configs import StackConfig

log = logging.getLogger(__name__)

GRID_DIR = shipped_configs() / "ablations"
STAGES = ("artefacts", "sweep", "grid", "seeds")
TOKENIZER_KEYS = ("tokenizer.vocab_size", "tokenizer.pattern")  # required of a subword cell
TOKENIZER_OPTIONS = ("tokenizer.kind", "tokenizer.encoder")
StageProgress = Callable[[str, int, "int | None", str], None]
Note = Callable[[str], None]


# -- the size rule ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SizeRule:
    """Model size from the compute budget, the same trunk for every family at one budget.

    Compute-optimal scaling (Hoffmann et al. 2022): training FLOPs C = 6 N D and D = tokens_per_param
    x N give the trunk's non-embedding parameters N = sqrt(C / (6 tokens_per_param)). A transformer
    of L layers and width d has about 12 L d^2 of them; with d = width_per_layer x L (a fixed aspect
    ratio), L = (N / (12 width_per_layer^2))^(1/3), at least ``min_layers``, and then
    d = sqrt(N / (12 L)) rounded to ``width_multiple``. Heads are ``head_dim`` wide, MLPs
    ``mlp_ratio`` x d. The trunk is the byte and BPE LMs' stack and MegaByte's and BLT's global
    stack; their local stacks are half as wide (MegaByte's local stack half as deep too). The
    family's FLOPs then decide how many bytes it sees at that budget."""

    tokens_per_param: float = 20.0
    width_per_layer: float = 32.0
    min_layers: int = 2
    width_multiple: int = 16
    head_dim: int = 16
    mlp_ratio: float = 2.75

    def __post_init__(self) -> None:
        if self.width_multiple % self.head_dim:
            raise UserError(f"size.width_multiple {self.width_multiple} must be a multiple of size.head_dim {self.head_dim} (whole heads)")
        if self.min_layers < 1 or not self.tokens_per_param > 0 or not self.width_per_layer > 0 or not self.mlp_ratio > 0:
            raise UserError("size.min_layers must be >= 1 and size.tokens_per_param, width_per_layer, mlp_ratio > 0")

    def trunk(self, budget: float) -> tuple[int, int]:
        """``(d_model, n_layers)`` for ``budget`` training FLOPs."""
        n = math.sqrt(budget / (6.0 * self.tokens_per_param))
        layers = max(self.min_layers, round((n / (12.0 * self.width_per_layer**2)) ** (1 / 3)))
        width = max(self.width_multiple, self.width_multiple * round(math.sqrt(n / (12.0 * layers)) / self.width_multiple))
        return width, layers

    def _mlp(self, d: int) -> int:
        return 16 * max(1, round(self.mlp_ratio * d / 16))

    def sizes(self, budget: float) -> Trunk:
        """The trunk at ``budget`` and its half-width local stacks (half as deep, at least one layer)."""
        d, L = self.trunk(budget)
        local = max(self.width_multiple, self.width_multiple * round(d / 2 / self.width_multiple))
        return Trunk(StackConfig(d, L, max(1, d // self.head_dim), self._mlp(d)),
                     StackConfig(local, max(1, -(-L // 2)), max(1, local // self.head_dim), self._mlp(local)))

    def sized(self, model_cfg, budget: float, changes: dict):
        """``model_cfg`` with ``changes`` at the trunk of ``budget`` (its family's :meth:`~Task.sized`)."""
        return task_class(model_cfg.family).sized(model_cfg, self.sizes(budget), changes)


# -- the grid file --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    config: Path
    overrides: tuple[str, ...] = ()
    grid: tuple[tuple[str, tuple], ...] = ()  # (key, values) in file order
    sweep: tuple[tuple[str, object], ...] = ()
    lr_from: str | None = None
    ngram_from: str | None = None  # another family: its hashed n-gram tables (sizes, rows), e.g. a byte LM with BLT's

    def cells(self) -> list[dict]:
        """Every combination of the grid's values, as ``{key: value}`` (one empty cell without a grid)."""
        keys = [k for k, _ in self.grid]
        return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in self.grid))]

    def sweep_cell(self) -> dict:
        """The sweep cell: the grid's ``sweep`` values, the middle value of every other key."""
        chosen = dict(self.sweep)
        return {k: chosen.get(k, values[(len(values) - 1) // 2]) for k, values in self.grid}


@dataclasses.dataclass(frozen=True)
class Grid:
    name: str
    path: Path
    budgets: tuple[float, ...]
    learning_rates: tuple[float, ...]
    families: tuple[Family, ...]
    size: SizeRule
    overrides: tuple[str, ...] = ()
    extra_seeds: int = 2
    eval_points: int = 4
    entropy: Family | None = None
    entropy_budget: float = 0.0


def cell_label(cell: dict) -> str:
    """``{"model.patch_size": 4}`` -> ``"patch_size=4"`` (the table's and the run directory's name)."""
    return ",".join(f"{k.split('.', 1)[-1]}={v}" for k, v in cell.items()) or "base"


def cell_overrides(cell: dict) -> list[str]:
    """The cell's keys other than its model's (sized with the model) and its tokenizer's (an artefact)."""
    return [f"{k}={v}" for k, v in cell.items() if k not in TOKENIZER_KEYS + TOKENIZER_OPTIONS and not k.startswith("model.")]


def find_grid(name_or_path: str) -> Path:
    """A grid file path, or the name of a file in ``configs/ablations/``."""
    return find_toml(name_or_path, GRID_DIR, "ablation grid")


def _family(raw: dict, path: Path, where: str, *, entropy: bool = False) -> Family:
    valid = {"config", "set", "flop_budget"} if entropy else {"name", "config", "set", "grid", "sweep", "lr_from", "ngram_from"}
    bad = set(raw) - valid
    if bad:
        raise UserError(f"{where}: unknown key(s) {sorted(bad)}; valid: {', '.join(sorted(valid))}")
    name = "entropy" if entropy else raw.get("name")
    if not isinstance(name, str) or not name or "/" in name:
        raise UserError(f"{where}: name must be a non-empty string without '/', got {name!r}")
    if not isinstance(raw.get("config"), str):
        raise UserError(f"{where}: config must name a config file (relative to the grid file), got {raw.get('config')!r}")
    config = (path.parent / raw["config"]).resolve()
    if not config.is_file():
        raise UserError(f"{where}: config file {config} not found")
    grid = raw.get("grid", {})
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise UserError(f"{where}: grid must map config keys to non-empty lists of values, got {grid!r}")
    sweep = raw.get("sweep", {})
    if not isinstance(sweep, dict) or any(k not in grid or v not in grid[k] for k, v in sweep.items()):
        raise UserError(f"{where}: sweep must pick one listed value of some grid keys, got {sweep!r} for grid {grid!r}")
    lr_from, ngram_from = raw.get("lr_from"), raw.get("ngram_from")
    for key, value in (("lr_from", lr_from), ("ngram_from", ngram_from)):
        if value is not None and not isinstance(value, str):
            raise UserError(f"{where}: {key} must name another family, got {value!r}")
    return Family(name, config, _strings(raw.get("set", []), f"{where} set"), tuple((k, tuple(v)) for k, v in grid.items()),
                  tuple(sweep.items()), lr_from, ngram_from)


def load_grid(name_or_path: str) -> Grid:
    path = find_grid(name_or_path)
    raw = read_sections(path, "grid", ("ablation", "size", "entropy", "family"))
    ab = raw.get("ablation", {})
    valid = {"budgets", "learning_rates", "extra_seeds", "eval_points", "set"}
    if set(ab) - valid:
        raise UserError(f"grid {path}: unknown key(s) {sorted(set(ab) - valid)} in [ablation]; valid: {', '.join(sorted(valid))}")
    for key in ("budgets", "learning_rates"):
        if not isinstance(ab.get(key), list) or not ab[key]:
            raise UserError(f"grid {path}: [ablation] {key} must be a non-empty list of positive numbers")
    budgets = tuple(sorted(_number(b, f"grid {path} budgets") for b in ab["budgets"]))
    lrs = tuple(_number(x, f"grid {path} learning_rates") for x in ab["learning_rates"])
    size_raw = raw.get("size", {})
    fields = {f.name: f.type for f in dataclasses.fields(SizeRule)}
    if set(size_raw) - set(fields):
        raise UserError(f"grid {path}: unknown key(s) {sorted(set(size_raw) - set(fields))} in [size]; valid: {', '.join(fields)}")
    size = SizeRule(**{k: (int if fields[k] == "int" else float)(_number(v, f"grid {path} size.{k}")) for k, v in size_raw.items()})
    families = tuple(_family(f, path, f"grid {path} [[family]] #{i + 1}") for i, f in enumerate(raw.get("family", [])))
    names = [f.name for f in families]
    if not families or len(set(names)) != len(names) or "entropy" in names:
        raise UserError(f"grid {path}: needs [[family]] tables with distinct names (not 'entropy'), got {names}")
    for f in families:
        if f.lr_from is not None and (f.lr_from not in names or dict((g.name, g.lr_from) for g in families)[f.lr_from]):
            raise UserError(f"grid {path}: family {f.name!r}: lr_from {f.lr_from!r} must name a family that sweeps its own rate")
        if f.ngram_from is not None and (f.ngram_from not in names or f.ngram_from == f.name):
            raise UserError(f"grid {path}: family {f.name!r}: ngram_from {f.ngram_from!r} must name another family of {names}")
    entropy = None
    if "entropy" in raw:
        entropy = _family(raw["entropy"], path, f"grid {path} [entropy]", entropy=True)
        if "flop_budget" not in raw["entropy"]:
            raise UserError(f"grid {path}: [entropy] needs flop_budget (the entropy model's own training FLOPs)")
    return Grid(
        name=path.stem, path=path, budgets=budgets, learning_rates=lrs, families=families, size=size,
        overrides=_strings(ab.get("set", []), f"grid {path} [ablation] set"),
        extra_seeds=int(_number(ab.get("extra_seeds", 2), f"grid {path} extra_seeds", positive=False)),
        eval_points=int(_number(ab.get("eval_points", 4), f"grid {path} eval_points")),
        entropy=entropy,
        entropy_budget=_number(raw["entropy"]["flop_budget"], f"grid {path} [entropy] flop_budget") if entropy else 0.0,
    )


# -- runs -------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
    """One ``bytelm train`` of the grid; ``error`` set when it cannot be planned or it failed."""

    stage: str
    family: str
    cell: dict
    budget_index: int
    budget: float
    lr: float | None
    seed: int
    run_dir: Path
    config: Path | None = None
    overrides: list[str] = dataclasses.field(default_factory=list)
    steps: int | None = None
    ledger: Ledger | None = None  # own and auxiliary FLOPs (bytelm/ledger.py): the budget matches its total
    error: str | None = None
    result: ModelResult | None = None
    validation_bpb: float | None = None
    in_grid: bool = False  # a grid cell (a sweep run at the chosen rate is one too)

    @property
    def id(self) -> str:
        if self.lr is None:  # an artefact run
            return self.family
        return f"{self.family}/{cell_label(self.cell)}/C{self.budget:.3g}-lr{self.lr:g}-s{self.seed}"

    def command(self) -> str:
        sets = " ".join(f"--set {shlex.quote(o)}" for o in self.overrides)
        return f"bytelm train {shlex.quote(str(self.config))} --out {shlex.quote(str(self.run_dir))} {sets}"

    @property
    def failure_file(self) -> Path:
        return self.run_dir / "failed.txt"

    def finished(self) -> bool:
        return RunDir(self.run_dir).finished(self.steps)


class AblationStopped(StageStopped):
    """A training stopped by SIGINT/SIGTERM; its checkpoint is saved and the same ablate resumes it."""


@dataclasses.dataclass
class AblationResult:
    out: Path
    report: dict
    stage: str  # the first unfinished stage ("done" when the grid is complete)
    commands: list[str]


class _Ablation:
    def __init__(self, grid: Grid, out: Path, *, data_spec: str | None, scale: float, mode: str, jobs: int,
                 progress: StageProgress | None, note: Note | None):
        self.grid, self.out, self.scale, self.mode, self.jobs = grid, out, scale, mode, jobs
        self.data_overrides = [*([f"data.source={data_spec}"] if data_spec else [])]
        self.progress = progress
        self.say = note or (lambda msg: log.info("%s", msg))
        self.budgets = [b * scale for b in grid.budgets]
        self.runs: dict[str, Run] = {}
        self.failed_artefacts: dict[str, str] = {}
        self.chosen: dict[str, float] = {}
        self.sweep_table: dict[str, dict] = {}

    def bar(self, stage: str):
        progress = self.progress
        return (lambda done, total=None, suffix="": progress(stage, done, total, suffix)) if progress else None

    # -- configs
    def base_overrides(self, fam: Family) -> list[str]:
        """The grid's, the family's and the data overrides, and the n-gram tables its ``ngram_from`` names."""
        base = [*self.grid.overrides, *fam.overrides, *self.data_overrides]
        if fam.ngram_from is None:
            return base
        source = next(f for f in self.grid.families if f.name == fam.ngram_from)
        return [*base, *ngram_overrides(load_config(source.config, self.base_overrides(source)), load_config(fam.config, base),
                                        where=f"grid {self.grid.path} family {fam.name!r}")]

    def tokenizer_dir(self, cell: dict) -> Path:
        kind, encoder = self.tokenizer_kind(cell)
        rule = "" if encoder in ("", "ranks", "viterbi") else f"-{encoder}"
        return self.out / "tokenizers" / f"{kind}-{cell['tokenizer.vocab_size']}-{cell['tokenizer.pattern']}{rule}"

    @staticmethod
    def tokenizer_kind(cell: dict) -> tuple[str, str]:
        kind, encoder = str(cell.get("tokenizer.kind", "bpe")), str(cell.get("tokenizer.encoder", ""))
        if kind not in KINDS:
            raise UserError(f"tokenizer.kind = {kind!r} in a grid cell; use one of {list(KINDS)}")
        return kind, encoder

    def artefact_overrides(self, family: str, cell: dict, model_cfg) -> list[str]:
        out = []
        for field, kind in task_class(family).artefacts_of(model_cfg).items():
            if kind == "tokenizer":
                if not all(k in cell for k in TOKENIZER_KEYS):
                    raise UserError(f"a {family} cell needs tokenizer.vocab_size and tokenizer.pattern in its grid")
                out.append(f"model.{field}={self.tokenizer_dir(cell).absolute()}")
            elif kind == "entropy_model":
                if self.grid.entropy is None:
                    raise UserError(f"a {family} cell with entropy patching needs the grid's [entropy] model")
                out.append(f"model.{field}={(self.out / 'runs' / 'entropy').absolute()}")
        return out

    def plan(self, stage: str, fam: Family, cell: dict, budget_index: int, lr: float, seed: int) -> Run:
        """The run's config and steps; planning errors (a bad cell) are kept in ``Run.error``. A run
        planned again by a later stage is the same run (the sweep run at the chosen rate is a grid cell)."""
        budget = self.budgets[budget_index]
        run_dir = self.out / "runs" / fam.name / cell_label(cell).replace("/", "_") / f"C{budget:.3g}-lr{lr:g}-s{seed}"
        run = Run(stage, fam.name, cell, budget_index, budget, lr, seed, run_dir)
        if run.id in self.runs:
            run = self.runs[run.id]
            run.in_grid |= stage == "grid"
            return run
        run.in_grid = stage == "grid"
        self.runs[run.id] = run
        try:
            base = self.base_overrides(fam)
            plain = load_config(fam.config, base)
            if plain.model is None:
                raise UserError(f"config {fam.config} has no [model] section")
            family = plain.model.family
            # the cell's model settings decide some sizes (MegaByte's embed_dim = width / P): the family
            # sizes its config with them, as one config
            changes = typed_fields(type(plain.model), {k.split(".", 1)[1]: v for k, v in cell.items() if k.startswith("model.")})
            sized = self.grid.size.sized(plain.model, budget, changes)
            overrides = [*base, *section_overrides("model", sized, plain.model), *cell_overrides(cell)]
            cfg = load_config(fam.config, overrides)
            overrides += self.artefact_overrides(family, cell, cfg.model)
            overrides += [f"train.learning_rate={lr:g}", f"train.seed={seed}"]
            run.config, run.overrides = fam.config, overrides
            self._schedule(run, load_config(fam.config, overrides))
        except (UserError, ValueError) as e:
            run.error = str(e)
        if run.error is None and run.failure_file.is_file():  # a failed training would fail again: not retried
            run.error = f"{run.failure_file.read_text().strip()} (recorded in {run.failure_file}; delete {run.run_dir} to retry)"
        return run

    def _schedule(self, run: Run, cfg: Config) -> None:
        corpus = self.corpora.get(cfg)
        if corpus.path != self.corpus.path or corpus.fingerprint != self.eval_set.fingerprint:
            raise UserError(
                f"its data settings give another corpus or held-out set (fingerprint {corpus.fingerprint[:16]}... vs "
                f"{self.eval_set.fingerprint[:16]}...): set data.* in [ablation] set, not per family"
            )
        run.ledger = planned_ledger(cfg, corpus, run.run_dir)
        extra, run.steps = derived_schedule(cfg, run.ledger, run.budget, self.grid.eval_points, what=f"the run {run.id}")
        run.overrides = [*run.overrides, *extra]
        trainer.check_run_config(run.run_dir, load_config(run.config, run.overrides))

    # -- stage 0: the corpus
    def prepare(self) -> None:
        self.corpora = CorpusCache(progress=self.bar("corpus"))
        fam = self.grid.families[0]
        cfg = load_config(fam.config, self.base_overrides(fam))
        if not cfg.data.validation_fraction > 0:
            raise UserError(
                f"grid {self.grid.path}: the learning-rate sweep selects on the validation split, but "
                "data.validation_fraction is 0: add \"data.validation_fraction=0.05\" to [ablation] set"
            )
        self.corpus = self.corpora.get(cfg)
        self.eval_set = EvalSet.from_corpus(self.corpus)
        self.validation_set = EvalSet.from_corpus(self.corpus, "validation")
        self.say(
            f"corpus {self.corpus.spec}: {self.eval_set.n_bytes:,} held-out bytes (fingerprint {self.eval_set.fingerprint[:16]}...), "
            f"{self.validation_set.n_bytes:,} validation bytes from {int(self.corpus.validation.sum())} train documents"
        )

    # -- stage 1: artefacts
    def tokenizer_cells(self) -> list[dict]:
        seen = {}
        for fam in self.grid.families:
            for cell in fam.cells():
                if all(k in cell for k in TOKENIZER_KEYS):
                    seen[self.tokenizer_dir(cell)] = cell
        return list(seen.values())

    def needs_entropy_model(self) -> bool:
        for fam in self.grid.families:
            for cell in fam.cells():
                model = None
                for overrides in ([*self.base_overrides(fam), *cell_overrides(cell)], self.base_overrides(fam)):
                    try:  # the cell's model settings unsized (enough to tell its patching), else the family's
                        model = load_config(fam.config, overrides).model
                        break
                    except (UserError, ValueError):
                        continue  # a bad family is reported with its cells
                if model is not None and "entropy_model" in task_class(model.family).artefacts_of(model).values():
                    return True
        return False

    def entropy_run(self) -> Run | None:
        if self.grid.entropy is None or not self.needs_entropy_model():
            return None
        fam = self.grid.entropy
        run = Run("artefacts", "entropy", {}, 0, self.grid.entropy_budget * self.scale, None, 0, self.out / "runs" / "entropy")
        try:
            overrides = self.base_overrides(fam)
            cfg = load_config(fam.config, overrides)
            run.config, run.overrides = fam.config, overrides
            self._schedule(run, cfg)
        except (UserError, ValueError) as e:
            run.error = str(e)
        return run

    def artefacts(self) -> list[str]:
        """Train what is missing (or return its commands in print mode)."""
        commands = []
        data = " ".join(f"--set {shlex.quote(o)}" for o in [*self.grid.overrides, *self.data_overrides] if o.startswith("data."))
        for cell in self.tokenizer_cells():
            tdir = self.tokenizer_dir(cell)
            if is_saved(tdir):
                continue
            vocab, pattern = int(cell["tokenizer.vocab_size"]), str(cell["tokenizer.pattern"])
            kind, encoder = self.tokenizer_kind(cell)
            if self.mode == "print":
                rule = f" --encoder {shlex.quote(encoder)}" if encoder else ""
                commands.append(
                    f"bytelm tokenizer train {data} --kind {kind}{rule} --vocab-size {vocab} --pattern {shlex.quote(pattern)} --out {shlex.quote(str(tdir))}"
                )
            elif self.mode == "run":
                t0 = time.perf_counter()
                try:
                    tok = train_tokenizer(kind, self.corpus, vocab_size=vocab, pattern=pattern, progress=self.bar(f"tokenizer {tdir.name}"))
                    if encoder:
                        tok = tok.with_encoder(encoder)
                    with atomic_directory(tdir) as tmp:
                        tok.save(tmp)
                    self.say(f"tokenizer {tdir.name}: {tok.n_vocab} ids in {time.perf_counter() - t0:.1f}s")
                except (UserError, ValueError) as e:
                    self.failed_artefacts[str(tdir)] = str(e)
                    self.say(f"tokenizer {tdir.name}: FAILED: {e}")
        ent = self.entropy_run()
        if ent is not None:
            if ent.error:
                self.failed_artefacts["entropy"] = ent.error
            elif not ent.finished():
                if self.mode == "print":
                    commands.append(ent.command())
                elif self.mode == "run":
                    self.execute([ent], "entropy model")
                    if ent.error:
                        self.failed_artefacts["entropy"] = ent.error
        return commands

    def _artefacts_missing(self) -> bool:
        ent = self.entropy_run()
        return any(not is_saved(self.tokenizer_dir(c)) for c in self.tokenizer_cells()) or (
            ent is not None and ent.error is None and not ent.finished())

    # -- training
    def execute(self, runs: list[Run], stage: str) -> None:
        """Train every unfinished run without an error; failures are recorded, never raised."""
        for r in runs:
            if r.error is not None and r.failure_file.is_file():
                self.say(f"{stage}: {r.id} failed earlier: {r.error}")
            elif r.error is None and r.finished():
                self.say(f"{stage}: {r.id} finished earlier, skipped")
        todo = [r for r in runs if r.error is None and not r.finished()]
        if not todo:
            return
        if self.jobs > 1:
            with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
                for i, (run, rc, err) in enumerate(pool.map(self._subprocess, todo)):
                    self.say(f"{stage} [{i + 1}/{len(todo)}] {run.id}: " + ("done" if rc == 0 else f"FAILED: {err}"))
            return
        for i, run in enumerate(todo):
            self.say(f"{stage} [{i + 1}/{len(todo)}] {run.id}: {run.steps} steps x {run.ledger.own_per_step:.3g} FLOPs, "
                     f"{run.ledger.total(run.steps):.3g} FLOPs in total")
            try:
                result = trainer.train(load_config(run.config, run.overrides), run.run_dir, progress=self.bar(f"train {run.id}"))
            except Exception as e:  # one broken cell never stops the grid
                log.debug("run %s failed", run.id, exc_info=True)
                run.error = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
                self.say(f"{stage} {run.id}: FAILED: {run.error}")
                atomic_write_text(run.failure_file, run.error + "\n")
                continue
            if run.lr is not None and result.trainer is not None and not result.stopped_by_signal:  # score it now, without a restore
                for split in ("heldout", "validation") if run.stage == "sweep" else ("heldout",):
                    self.evaluate(run, split, trainer=result.trainer)
            if result.stopped_by_signal or not run.finished():
                raise AblationStopped(f"training {run.id} stopped at step {result.step} (checkpoint saved in {run.run_dir}); "
                                      f"run the same ablate again (same --out {self.out}) to resume")

    def _subprocess(self, run: Run) -> tuple[Run, int, str]:
        argv = [sys.executable, "-m", "bytelm", *shlex.split(run.command())[1:]]
        proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ))
        err = ""
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            err = lines[-1] if lines else f"exit status {proc.returncode}"
            run.error = err
            atomic_write_text(run.failure_file, err + "\n")
        return run, proc.returncode, err

    # -- evaluation
    def evaluate(self, run: Run, split: str = "heldout", *, trainer=None) -> None:
        """Score a finished run on the held-out (or validation) segments, cached in ``OUT/evals``;
        ``trainer``: the run's trainer still in memory (else its checkpoint is restored)."""
        if run.error is not None or not run.finished():
            return
        eval_set = self.eval_set if split == "heldout" else self.validation_set
        cache = self.out / "evals" / f"{run.id.replace('/', '__')}.{split}.json"
        if cache.is_file():
            cached = json.loads(cache.read_text())
            if cached.get("fingerprint") == eval_set.fingerprint and cached.get("step") == run.steps:
                result = _result_from_json(cached)
                self._keep(run, result, split)
                return
        try:
            bar = self.bar(f"eval {split} {run.id}")
            if trainer is not None:
                result = evaluate_trained(trainer, run.run_dir, eval_set, name=run.id, progress=bar)
            else:
                result = evaluate_run(run.run_dir, eval_set, name=run.id, corpus=self.corpus, progress=bar)
        except (UserError, ValueError) as e:
            run.error = f"evaluation failed: {e}"
            return
        atomic_write_text(cache, json.dumps(_result_to_json(result)))
        self._keep(run, result, split)

    @staticmethod
    def _keep(run: Run, result: ModelResult, split: str) -> None:
        if split == "heldout":
            run.result = result
        else:
            run.validation_bpb = result.bpb

    # -- the stages
    def stage_runs(self, stage: str) -> list[Run]:
        g = self.grid
        if stage == "sweep":
            return [run for f in g.families if f.lr_from is None for run in self.sweep_runs(f)]
        if stage == "grid":
            return [self.plan("grid", f, cell, b, self.chosen[self.lr_family(f)], 0)
                    for f in g.families if self.lr_family(f) in self.chosen for b in range(len(self.budgets)) for cell in f.cells()]
        if stage == "seeds":
            runs = []
            for f, best in self.best_cells().items():
                runs += [self.plan("seeds", f, best.cell, 0, best.lr, s) for s in range(1, g.extra_seeds + 1)]
            return runs
        raise ValueError(stage)

    def lr_family(self, f: Family) -> str:
        return f.lr_from or f.name

    def sweep_runs(self, f: Family) -> list[Run]:
        """The family's sweep runs so far (:mod:`bytelm.experiments.rates`): its sweep cell at the
        smallest budget at every rate of the grid, then one more rate past an end wherever the best
        rate sits there, once the scores that call for it are in (up to two)."""
        search = RateSearch(self.grid.learning_rates)
        runs: dict[float, Run] = {}
        while rates := search.next_rates(self.sweep_scores(runs.values())):
            for lr in rates:
                run = runs[lr] = self.plan("sweep", f, f.sweep_cell(), 0, lr, 0)
                if run.error is None and run.finished() and run.validation_bpb is None:
                    self.evaluate(run, "validation")
            if any(r.error is None and r.validation_bpb is None for r in runs.values()):
                break  # results pending: the search goes on when they are in
        return list(runs.values())

    @staticmethod
    def sweep_scores(runs) -> dict[float, float | None]:
        """Validation BPB per rate of the sweep runs scored so far (None: the run failed, a loss)."""
        return {r.lr: None if r.error is not None else r.validation_bpb for r in runs if r.error is not None or r.validation_bpb is not None}

    def choose_rates(self) -> None:
        """Each family's rate, once its search is over: every rate trained (or failed) and no extension due."""
        for f in self.grid.families:
            if f.lr_from is not None:
                continue
            runs = self.sweep_runs(f)
            search, scores = RateSearch(self.grid.learning_rates), self.sweep_scores(runs)
            done = len(scores) == len(runs) and not search.next_rates(scores)
            choice = search.choose(scores)
            self.sweep_table[f.name] = {"cell": cell_label(f.sweep_cell()), **choice.record(), "chosen": None,
                                        "errors": {rate_label(r.lr): r.error for r in runs if r.error}}
            if done and choice.chosen is not None:
                self.chosen[f.name] = choice.chosen
                self.sweep_table[f.name]["chosen"] = choice.chosen
                edge = " (STILL AT AN EDGE after the extensions)" if choice.at_edge else ""
                self.say(f"learning rate of {f.name}: {choice.chosen:g}{edge} (validation BPB " +
                         ", ".join(f"{rate_label(lr)}: " + ("failed" if b is None else f"{b:.4f}") for lr, b in sorted(scores.items())) + ")")

    def best_cells(self) -> dict[Family, Run]:
        best = {}
        for f in self.grid.families:
            runs = [r for r in self.runs.values() if r.in_grid and r.family == f.name and r.budget_index == 0 and r.seed == 0
                    and r.result is not None]
            if runs:
                best[f] = min(runs, key=lambda r: r.result.bpb)
        return best

    def go(self) -> AblationResult:
        self.prepare()
        commands = self.artefacts()
        if commands or (self.mode == "collect" and self._artefacts_missing()):
            return self.finish("artefacts", commands)
        for stage in STAGES[1:]:
            while True:  # the sweep grows while its rates' scores call for extensions
                runs = self.stage_runs(stage)
                if self.mode == "run":
                    self.execute(runs, stage)
                pending = [r for r in runs if r.error is None and not r.finished()]
                if pending and self.mode == "print":
                    return self.finish(stage, [r.command() for r in pending])
                for r in runs:
                    self.evaluate(r)
                if pending or len(self.stage_runs(stage)) == len(runs):
                    break
            if stage == "sweep":
                self.choose_rates()
            if pending:  # collect mode: later stages depend on this one
                return self.finish(stage, [])
        return self.finish("done", [])

    def finish(self, stage: str, commands: list[str]) -> AblationResult:
        report = self.build_report(stage)
        write_outputs(self.out, report, self.runs, self.eval_set)
        return AblationResult(self.out, report, stage, commands)

    # -- the report
    def shared_auxiliary(self) -> dict[str, dict]:
        """One-off auxiliary costs shared by several runs of the grid (its one entropy model's training):
        name -> ``{"flops", "runs"}``, ``runs`` the planned runs whose ledgers carry it."""
        shared: dict[str, dict] = {}
        for r in self.runs.values():
            if r.error is None and r.ledger is not None and r.lr is not None:
                for name, flops in r.ledger.auxiliary_fixed.items():
                    if name == "entropy model training":
                        shared.setdefault(name, {"flops": flops, "runs": 0})["runs"] += 1
        return shared

    def build_report(self, stage: str) -> dict:
        rows = []
        shared = self.shared_auxiliary()
        order = {f.name: i for i, f in enumerate(self.grid.families)}
        # one order whatever order the runs were planned in (a re-run plans a sweep's extensions at once)
        planned = sorted(self.runs.values(), key=lambda r: (STAGES.index(r.stage), order.get(r.family, -1), r.budget_index,
                                                            cell_label(r.cell), r.lr or 0.0, r.seed))
        for r in planned:
            res = r.result
            row = {
                "id": r.id, "stage": r.stage, "family": r.family, "cell": cell_label(r.cell), "budget": r.budget,
                "budget_index": r.budget_index, "lr": r.lr, "seed": r.seed, "run_dir": str(r.run_dir), "steps": r.steps,
                "status": "failed" if r.error else ("done" if res is not None else ("not run" if not r.finished() else "trained")),
                "error": r.error, "validation_bpb": r.validation_bpb, "in_grid": r.in_grid,
            }
            if res is not None:
                info = RunDir(r.run_dir).info_or_empty()
                amortised = None
                if res.flops_total is not None:
                    parts = res.auxiliary or {}
                    amortised = res.flops_total - sum(v["flops"] - v["flops"] / v["runs"] for k, v in shared.items() if k in parts)
                row.update(
                    bpb=res.bpb, mean_bytes_per_global_step=res.mean_bytes_per_global_step, train_flops=res.flops,
                    flops_auxiliary=res.flops_auxiliary, flops_total=res.flops_total, flops_total_amortised=amortised,
                    auxiliary_flops=res.auxiliary,
                    inference_flops_per_byte=res.total_inference_flops_per_byte, params=res.params,
                    entropy_inference_flops_per_byte=res.entropy_inference_flops_per_byte,
                    wall_s=info.get("train_s", info.get("wall_s")), bytes_seen=res.bytes_seen,
                    nats=res.scores.nats.tolist(), nbytes=res.scores.nbytes.tolist(),
                )
            rows.append(row)
        report = {
            "grid": self.grid.name, "grid_path": str(self.grid.path), "stage": stage,
            "fingerprint": self.eval_set.fingerprint, "eval_bytes": self.eval_set.n_bytes,
            "validation_fingerprint": self.validation_set.fingerprint, "validation_bytes": self.validation_set.n_bytes,
            "data": {**self.eval_set.describe(), "dirs": sorted(set(self.eval_set.dirs))}, "budgets": self.budgets, "scale": self.scale,
            "size_rule": dataclasses.asdict(self.grid.size),
            "trunks": {f"{b:.3g}": dict(zip(("d_model", "layers"), self.grid.size.trunk(b))) for b in self.budgets},
            "learning_rates": list(self.grid.learning_rates), "sweep": self.sweep_table,
            "matched": "total", "shared_auxiliary": shared,
            "failed_artefacts": self.failed_artefacts, "runs": rows,
        }
        report["seed_spread"] = seed_spread(rows)
        report["sentences"] = budget_sentences(report)
        return report


def seed_spread(rows: list[dict]) -> dict:
    """Per family: the BPBs of the seeded cell (seed 0 and the extra seeds) and their range."""
    out = {}
    seeded = {(r["family"], r["cell"], r["budget_index"], r["lr"]) for r in rows if r["stage"] == "seeds"}
    for fam, cell, b, lr in sorted(seeded, key=str):
        bpbs = [r["bpb"] for r in sorted(rows, key=lambda r: r["seed"]) if (r["family"], r["cell"], r["budget_index"], r["lr"]) == (fam, cell, b, lr)
                and r.get("bpb") is not None]
        if len(bpbs) >= 2:
            out[fam] = {"cell": cell, "bpb": bpbs, "spread": max(bpbs) - min(bpbs), "std": float(np.std(bpbs, ddof=1))}
    return out


def grid_rows(report: dict, budget_index: int) -> list[dict]:
    """The seed-0 cells of one budget (what the tables and plots show)."""
    return [r for r in report["runs"] if r["budget_index"] == budget_index and r["seed"] == 0 and r["in_grid"]]


def budget_sentences(report: dict) -> list[str]:
    """Per budget: which cell wins, by how much over the best of every other family, and whether
    the gap exceeds the seed-to-seed spread of the two families."""
    out = []
    spread = report.get("seed_spread", {})
    for b, budget in enumerate(report["budgets"]):
        done = [r for r in grid_rows(report, b) if r.get("bpb") is not None]
        best = {}
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
            s += f", {gap:.4f} BPB ahead of the best {second['family']} ({second['cell']}, {second['bpb']:.4f})"
            known = {f: spread[f] for f in (win["family"], second["family"]) if f in spread}
            if known:
                sp = max(v["spread"] for v in known.values())
                verdict = "larger" if gap > sp else "not larger"
                seeds = "/".join(str(len(v["bpb"])) for v in known.values())
                s += (f"; the gap is {verdict} than the seed-to-seed spread of these families ({sp:.4f} BPB, max - min over "
                      f"{seeds} seeds of their best cell at the smallest budget)")
            else:
                s += "; no seed spread measured for these families"
        out.append(s + ".")
    return out


# -- outputs ----------------------------------------------------------------------------------------
def write_outputs(out: Path, report: dict, runs: dict[str, Run], eval_set: EvalSet) -> None:
    from bytelm.evaluation.plots import plot_bpb_per_group, plot_bpb_vs_bytes_per_step, plot_training_curves

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
            plot_bpb_per_group(out / plots["bpb_per_group"], groups, title=f"held-out BPB per top-level directory, {report['budgets'][last]:.3g} FLOPs")
    report["plots"] = plots
    slim = {**report, "runs": [{k: v for k, v in r.items() if k not in ("nats", "nbytes")} for r in report["runs"]]}
    atomic_write_text(out / "ablation.json", json.dumps(slim, indent=1, default=float))
    atomic_write_text(out / "ablation.md", markdown(slim))


def _scores(row: dict):
    from bytelm.bpb import SegmentScores

    return SegmentScores(np.asarray(row["nats"], np.float64), np.asarray(row["nbytes"], np.int64))


def _best_per_family(rows: list[dict]) -> list[dict]:
    best = {}
    for r in rows:
        if r.get("bpb") is not None and (r["family"] not in best or r["bpb"] < best[r["family"]]["bpb"]):
            best[r["family"]] = r
    return sorted(best.values(), key=lambda r: r["bpb"])


def _params(p: dict | None, key: str) -> str:
    return human(p.get(key)) if p and p.get(key) is not None else "-"


def ledger_sentences(report: dict) -> list[str]:
    """Which total the grid matched, and what sharing the one-off auxiliary costs would change."""
    out = ["Every run's budget is matched on its total FLOPs: its own training plus what it needs (BLT: its entropy model's "
           "training, and its forward over the run's training bytes; bytelm/ledger.py). Tokenizer training is not neural "
           "compute and is on no ledger."]
    for name, v in (report.get("shared_auxiliary") or {}).items():
        out.append(f"The grid matched the UNAMORTISED totals: each run that needs it pays the whole {name} ({human(v['flops'])} FLOPs) "
                   f"as if it were made for that run alone. It is shared by {v['runs']} runs of this grid; amortised, each would pay "
                   f"{human(v['flops'] / v['runs'])} (the *amortised total* column).")
    return [f"- {line}" for line in out]


def markdown(report: dict) -> str:
    lines = [
        f"# bytelm ablate: grid `{report['grid']}`",
        "",
        f"- held-out fingerprint `{report['fingerprint']}` ({report['eval_bytes']:,} bytes of {report['data']['spec']}); "
        f"learning rates selected on {report['validation_bytes']:,} validation bytes carved from the train documents",
        f"- budgets (training FLOPs per run): {', '.join(f'{b:.3g}' for b in report['budgets'])} (scale {report['scale']:g})",
        "- model sizes from the size rule (bytelm/experiments/ablate.py SizeRule, docs/ablations.md): trunk " +
        "; ".join(f"{k} FLOPs: d_model {v['d_model']} x {v['layers']} layers" for k, v in report["trunks"].items()),
        f"- stage: {report['stage']}" + ("" if report["stage"] == "done" else " (the grid is not complete: run bytelm ablate again)"),
        "",
        "## Verdict per budget",
        "",
        *[f"- {s}" for s in report["sentences"]],
        "",
        "## Learning rates (sweep at the smallest budget, BPB on the validation split)",
        "",
    ]
    rows = [[fam, s["cell"], ", ".join(f"{lr}: " + ("failed" if v is None else f"{v:.4f}") for lr, v in s["validation_bpb"].items()),
             str(s.get("extensions", 0)), (f"{s['chosen']:g}" + (" STILL AT AN EDGE" if s.get("at_edge") else "")) if s.get("chosen") else "-"]
            for fam, s in report["sweep"].items()]
    lines += [table(["family", "sweep cell", "validation BPB per rate", "extensions", "chosen"], rows, "lllrl"), "",
              f"Rates from {', '.join(f'{x:g}' for x in report['learning_rates'])}; where the best was at an end of the rates tried, "
              "one more rate beyond it, the grid's own ratio away, up to two (bytelm/experiments/rates.py).", ""]
    edge = [f for f, sw in report["sweep"].items() if sw.get("at_edge") and sw.get("chosen")]
    if edge:
        lines += [f"**WARNING: the chosen rate of {', '.join(edge)} is still at an end of the rates tried after the extensions: the best "
                  "rate may lie beyond it (widen [ablation] learning_rates).**", ""]
    lines += [*[f"**{line}**" for line in heldout_lines(report["data"])], *ledger_sentences(report), ""]
    for b, budget in enumerate(report["budgets"]):
        cells = sorted(grid_rows(report, b), key=lambda r: (r["family"], r["cell"]))
        rows = []
        for r in cells:
            if r.get("bpb") is None:
                rows.append([r["family"], r["cell"], r["status"] + (f": {r['error']}" if r.get("error") else ""), *["-"] * 11])
                continue
            g = r.get("mean_bytes_per_global_step")
            amortised = r.get("flops_total_amortised")
            rows.append([
                r["family"], r["cell"], f"{r['bpb']:.4f}", "-" if g is None else f"{g:.2f}", human(r["train_flops"]),
                human(r.get("flops_auxiliary")) if r.get("flops_auxiliary") else "0", human(r.get("flops_total")),
                human(amortised) if amortised != r.get("flops_total") else "=",
                human(r["inference_flops_per_byte"]), _params(r["params"], "embedding"), _params(r["params"], "ngram"),
                _params(r["params"], "non_embedding"), seconds(r.get("wall_s")), f"{r['lr']:g}", str(r["steps"]),
            ])
        lines += [
            f"## Budget {budget:.3g} FLOPs",
            "",
            table(["family", "cell", "BPB", "bytes/global step", "own FLOPs", "aux FLOPs", "total FLOPs", "amortised total",
                   "inference FLOPs/B", "params emb", "n-gram params", "params non-emb", "wall", "lr", "steps"], rows, "llrrrrrrrrrrrrr"),
            "",
        ]
    if report["seed_spread"]:
        rows = [[f, s["cell"], ", ".join(f"{x:.4f}" for x in s["bpb"]), f"{s['spread']:.4f}", f"{s['std']:.4f}"] for f, s in report["seed_spread"].items()]
        lines += ["## Seed-to-seed spread (smallest budget, best cell of each family)", "",
                  table(["family", "cell", "BPB per seed", "max - min", "std"], rows, "llrrr"), ""]
    failed = [r for r in report["runs"] if r["status"] == "failed"]
    unchosen = [f for f, sw in report["sweep"].items() if not sw.get("chosen")]
    if unchosen:
        lines += ["No learning rate could be chosen for " + ", ".join(unchosen) + " (their sweep runs failed or did not run), "
                  "so their cells are missing from the tables.", ""]
    if failed or report["failed_artefacts"]:
        lines += ["## Failures", "", *[f"- `{r['id']}`: {r['error']}" for r in failed],
                  *[f"- artefact `{k}`: {v}" for k, v in report["failed_artefacts"].items()], ""]
    lines += [f"![BPB vs bytes per global step]({report['plots']['bpb_vs_bytes_per_step']})", "",
              f"![training curves]({report['plots']['bpb_vs_flops']})", ""]
    if "bpb_per_group" in report["plots"]:
        lines += [f"![BPB per group]({report['plots']['bpb_per_group']})", ""]
    lines += [
        "BPB: held-out bits per byte over every segment (docs/evaluation.md). *bytes/global step*: held-out bytes per position of "
        "the outermost stack (the patch size, the mean entropy or space patch length, bytes per token). *inference FLOPs/B*: "
        "the forward cost per byte, entropy model included. *wall*: training time, compilation included. Training FLOPs are "
        "analytic (bytelm/models/flops.py).",
        "",
    ]
    return "\n".join(lines)


def ablate(
    grid: str | Grid = "tiny",
    out: str | Path = "runs/ablate",
    *,
    data_spec: str | None = None,
    scale: float = 1.0,
    jobs: int = 1,
    print_commands: bool = False,
    collect: bool = False,
    progress: StageProgress | None = None,
    note: Note | None = None,
) -> AblationResult:
    """Run (or resume, print, collect) the grid into ``out``; see the module docstring."""
    grid = grid if isinstance(grid, Grid) else load_grid(grid)
    if not scale > 0:
        raise UserError(f"--scale must be > 0, got {scale}")
    if jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {jobs}")
    if print_commands and collect:
        raise UserError("--print-commands and --collect exclude each other")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mode = "print" if print_commands else "collect" if collect else "run"
    return _Ablation(grid, out, data_spec=data_spec, scale=scale, mode=mode, jobs=jobs, progress=progress, note=note).go()
