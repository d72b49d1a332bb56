"""The one experiment runner: an :class:`~bytelm.experiments.spec.Experiment` planned into runs,
trained, evaluated and reported, for ``bytelm compare`` and ``bytelm ablate`` alike.

The runs, in stages (each a list of independent ``bytelm train`` runs):

1. **artefacts**: the subword tokenizers the members need and the BLT members' entropy model;
2. **sweep**: each member's sweep cell at the smallest budget, once per learning rate, scored on
   the **validation split** (never the held-out segments); the search extends the rates past an
   end where the best sits (:mod:`bytelm.experiments.rates`); a sweep run at the whole budget
   (``sweep_fraction`` 1) is also its cell's run;
3. **grid**: every cell of every member at every budget, with its member's rate;
4. **seeds**: each member's best cell at the smallest budget again with seeds 1..``extra_seeds``.

Every run's steps spend its budget on the run's **total** FLOPs (:mod:`bytelm.ledger`). A finished
run is skipped, an interrupted one resumes, a failing one is recorded (``failed.txt``) and not
retried. Three modes: ``run`` (train here, in this process or ``jobs`` subprocesses), ``print``
(print the commands of the first unfinished stage, for a scheduler), ``collect`` (train nothing).
Inside, configs are typed (:func:`bytelm.config.with_values`, the family's
:meth:`~bytelm.families.Task.sized`); ``--set`` strings appear only in the commands printed for a
person or a scheduler, and those load back to the very same config.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax

from bytelm.atomic import atomic_write_text
from bytelm.config import Config, load_config, typed_fields, with_values
from bytelm.errors import UserError
from bytelm.evaluation.evaluator import CorpusCache, evaluate_run, evaluate_trained
from bytelm.evaluation.results import EvalSet, ModelResult
from bytelm.experiments.artefacts import ArtefactStage
from bytelm.experiments.plan import ngram_values, planned_ledger, schedule_values, sweep_steps
from bytelm.experiments.rates import RateChoice, RateSearch, rate_label
from bytelm.experiments.runs import Run, StageStopped, result_from_json, result_to_json
from bytelm.experiments.spec import (
    TOKENIZER_KEYS,
    TOKENIZER_OPTIONS,
    Experiment,
    Member,
    cell_label,
)
from bytelm.families import task_class
from bytelm.rundir import RunDir
from bytelm.training import loop, trainer
from bytelm.training.distributed import barrier, is_primary

log = logging.getLogger(__name__)

STAGES = ("artefacts", "sweep", "grid", "seeds")
# progress(stage, done, total, suffix) and note(message): the CLI turns them into bars and lines
StageProgress = Callable[[str, int, "int | None", str], None]
Note = Callable[[str], None]


class Runner(ArtefactStage):
    """Carries out one experiment into ``out`` (see the module docstring). Subclasses name the run
    directories (:meth:`layout`) and write the outputs (:meth:`outputs`)."""

    stopped_message = "run the same command again (same --out {out}) to resume"

    def __init__(
        self,
        exp: Experiment,
        out: Path,
        *,
        data_spec: str | None = None,
        scale: float = 1.0,
        mode: str = "run",
        jobs: int = 1,
        progress: StageProgress | None = None,
        note: Note | None = None,
    ):
        self.exp, self.out, self.scale, self.mode, self.jobs = exp, out, scale, mode, jobs
        self.data_spec = data_spec
        self.progress = progress
        self.say = note or (lambda msg: log.info("%s", msg))
        self.budgets = [b * scale for b in exp.budgets]
        self.runs: dict[str, Run] = {}
        self.failed_artefacts: dict[str, str] = {}
        self.chosen: dict[str, float | None] = {}
        self.searches: dict[str, dict] = {}  # member -> its rate search's record
        self.stage_s: dict[str, float] = {}
        self._plain: dict[str, Config] = {}

    def bar(self, stage: str):
        progress = self.progress
        return (
            (lambda done, total=None, suffix="": progress(stage, done, total, suffix)) if progress else None
        )

    def timed(self, stage: str, t0: float) -> float:
        dt = time.perf_counter() - t0
        self.stage_s[stage] = self.stage_s.get(stage, 0.0) + dt
        return dt

    # -- layout (subclasses name their runs and directories)
    def layout(self, run: Run) -> tuple[str, Path]:
        """``(id, run directory)`` of a run: ``<member>/<cell>/C<budget>-lr<rate>-s<seed>`` under
        ``OUT/runs``."""
        if run.artefact:
            return run.member, self.out / "runs" / run.member
        lr = "" if run.lr is None else f"-lr{rate_label(run.lr)}"
        short = "" if run.fraction == 1 else f"-f{run.fraction:g}"
        leaf = f"C{run.budget:.3g}{lr}-s{run.seed}{short}"
        return f"{run.member}/{cell_label(run.cell)}/{leaf}", self.out / "runs" / run.member / cell_label(
            run.cell
        ).replace("/", "_") / leaf

    # -- configs
    def plain(self, member: Member) -> Config:
        """A member's config before sizing: its file with the experiment's and its own ``--set`` strings (a
        person's, from the file), the data spec, and the n-gram tables its ``ngram_from`` names."""
        if member.name not in self._plain:
            cfg = load_config(member.config, [*self.exp.overrides, *member.overrides])
            if self.data_spec:
                cfg = with_values(cfg, {"data.source": self.data_spec})
            if cfg.model is None:
                raise UserError(
                    f"{self.exp.kind} {self.exp.path}: {member.name!r}: its config {member.config} has no "
                    "[model] section"
                )
            if member.ngram_from is not None:
                source = self.plain(self.exp.member(member.ngram_from))
                cfg = with_values(cfg, ngram_values(source, cfg, where=f"{self.exp.path}: {member.name!r}"))
            self._plain[member.name] = cfg
        return self._plain[member.name]

    def cell_changes(self, member: Member, cell: dict) -> dict:
        """The cell's ``model.*`` values, typed like the member's model config fields."""
        model = self.plain(member).require_model()
        return typed_fields(
            type(model), {k.split(".", 1)[1]: v for k, v in cell.items() if k.startswith("model.")}
        )

    def sized(self, member: Member, cell: dict, budget: float) -> Config:
        """The member's config for one cell at ``budget``: the cell's model values given to the family's
        size rule (or to the config's own sizes), its other values set."""
        plain = self.plain(member)
        plain_model, changes = plain.require_model(), self.cell_changes(member, cell)
        if self.exp.size is None:
            model = dataclasses.replace(plain_model, **changes)
        else:
            model = task_class(plain_model.family).sized(plain_model, self.exp.size.sizes(budget), changes)
        rest = {
            k: v
            for k, v in cell.items()
            if not k.startswith("model.") and k not in TOKENIZER_KEYS + TOKENIZER_OPTIONS
        }
        return with_values(dataclasses.replace(plain, model=model), rest)

    # -- planning
    def plan(
        self,
        stage: str,
        member: Member,
        cell: dict,
        budget_index: int,
        lr: float | None,
        seed: int,
        fraction: float = 1.0,
    ) -> Run:
        """The run's config and steps; planning errors (a bad cell) are kept in ``Run.error``. A run
        planned again by a later stage is the same run (a sweep run at the chosen rate is a grid cell)."""
        budget = self.budgets[budget_index]
        run = Run(stage, member.name, cell, budget_index, budget, lr, seed, fraction)
        run.id, run.run_dir = self.layout(run)
        if run.id in self.runs:
            known = self.runs[run.id]
            known.in_grid |= stage == "grid"
            return known
        run.in_grid = stage == "grid"
        self.runs[run.id] = run
        try:
            cfg = self.sized(member, cell, budget)
            values = {**self.artefact_values(member, cell, cfg), "train.seed": cfg.train.seed + seed}
            if lr is not None:
                values["train.learning_rate"] = lr
            cfg = with_values(cfg, values)
            self.schedule(run, member, cfg, timed=self.exp.time_budget_s > 0)
        except (UserError, ValueError) as e:
            run.error = str(e)
        if (
            run.error is None and run.failure_file.is_file()
        ):  # a failed training would fail again: not retried
            run.error = (
                f"{run.failure_file.read_text().strip()} (recorded in {run.failure_file}; delete "
                f"{run.run_dir} to retry)"
            )
        return run

    def schedule(self, run: Run, member: Member, cfg: Config, *, timed: bool) -> None:
        """Steps from the budget on the ledger's total (a short search run: its fraction of them), the
        warmup and evaluation spacing, and with a time budget the run's training time."""
        corpus = self.corpora.get(cfg)
        if corpus.path != self.corpus.path or corpus.fingerprint != self.eval_set.fingerprint:
            raise UserError(
                "its data settings give another corpus or held-out set (fingerprint "
                f"{corpus.fingerprint[:16]}... vs {self.eval_set.fingerprint[:16]}...): set data.* for the "
                f"whole {self.exp.kind}, not per member"
            )
        run.config = member.config
        run.ledger = planned_ledger(cfg, corpus, run.run_dir)
        steps = run.ledger.steps_for(run.budget, what=f"the run {run.id}")
        if run.fraction < 1:
            steps = sweep_steps(steps, run.fraction)
        values = schedule_values(cfg, steps, self.exp.eval_points)
        if (
            timed and not run.artefact
        ):  # the FLOP plan's warmup and eval spacing stay; the time decides the steps
            values["train.time_budget_s"] = self.exp.time_budget_s * run.fraction
        elif task_class(cfg.require_model().family).measures_flops():
            # a family that measures what its steps spend (H-Net) trains until that reaches its budget
            # (its share of it); the steps are the first plan (bytelm/training/flop_budget.py)
            values["train.flop_budget"] = run.budget * run.fraction
        run.cfg = with_values(cfg, values)
        run.steps = None if (timed and not run.artefact) or run.cfg.train.flop_budget else steps
        extended_from = trainer.check_run_config(run.run_dir, run.cfg)
        if extended_from is not None:  # (an experiment's run is its budget's schedule, never an extension)
            raise UserError(
                f"the run directory {run.run_dir} holds a run of {extended_from} steps, this plan makes "
                f"{steps}: its budget or settings changed; use a new --out directory"
            )

    # -- stage 0: the corpus
    def prepare(self) -> None:
        t0 = time.perf_counter()
        self.corpora = CorpusCache(progress=self.bar("corpus"))
        member = self.exp.members[0]
        cfg = self.plain(member)
        self.corpus = self.corpora.get(cfg)
        self.eval_set = EvalSet.from_corpus(self.corpus)
        self.validation_set = None
        if self.exp.kind == "ablate" or len(self.exp.learning_rates) > 1:
            if not cfg.data.validation_fraction > 0:
                where = "[ablation] set" if self.exp.kind == "ablate" else "[compare] set"
                raise UserError(
                    f"{self.exp.kind} {self.exp.path}: learning rates are chosen on the validation split, "
                    f'but data.validation_fraction is 0: add "data.validation_fraction=0.05" to {where}'
                )
            self.validation_set = EvalSet.from_corpus(self.corpus, "validation")
        e = self.eval_set
        self.say(
            f"corpus {self.corpus.spec}: {e.n_bytes:,} held-out bytes in {len(e.data):,} segments, "
            f"fingerprint {e.fingerprint[:16]}..."
        )
        self.check_data_of_out()
        self.timed("corpus", t0)

    def check_data_of_out(self) -> None:
        """``OUT/data.json`` names the data an output directory was made with; another corpus (whose
        tokenizer and runs would be reused by mistake) is refused in one line."""
        marker = self.out / "data.json"
        mine = {"spec": self.corpus.spec, "fingerprint": self.eval_set.fingerprint}
        if marker.is_file():
            try:
                theirs = json.loads(marker.read_text())
            except (ValueError, UnicodeDecodeError):
                theirs = {}
            if isinstance(theirs, dict) and theirs.get("fingerprint") not in (None, mine["fingerprint"]):
                raise UserError(
                    f"{self.out} holds a {self.exp.kind} of the data {theirs.get('spec')!r} (held-out "
                    f"fingerprint {str(theirs.get('fingerprint'))[:16]}...), not of {mine['spec']!r} "
                    f"({mine['fingerprint'][:16]}...): its tokenizer and runs belong to that data; use "
                    "another --out, or the data it was made with"
                )
        elif is_primary():
            atomic_write_text(marker, json.dumps(mine) + "\n")

    # -- stage 1: artefacts (bytelm.experiments.artefacts)
    # -- training
    def execute(self, runs: list[Run], stage: str) -> None:
        """Train every unfinished run without an error; failures are recorded, never raised."""
        for r in runs:
            if r.error is not None and r.failure_file.is_file():
                self.say(f"{stage}: {r.id} failed earlier: {r.error}")
            elif r.error is None and r.finished():
                self.say(
                    f"train {r.id}: finished earlier ({RunDir(r.run_dir).info_or_empty().get('step')} "
                    "steps), skipped"
                )
        todo = [r for r in runs if r.error is None and not r.finished()]
        if not todo:
            return
        if self.jobs > 1 and jax.process_count() > 1:
            raise UserError(
                "--jobs runs trainings in subprocesses of this host; a job of several processes trains each "
                "run on all of them: leave --jobs at 1"
            )
        if self.jobs > 1:
            with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
                for i, (run, rc, err) in enumerate(pool.map(self._subprocess, todo)):
                    self.say(
                        f"{stage} [{i + 1}/{len(todo)}] {run.id}: "
                        + ("done" if rc == 0 else f"FAILED: {err}")
                    )
            return
        for run in todo:
            cfg, ledger = run.planned
            steps = cfg.train.steps
            if cfg.train.flop_budget:
                self.say(
                    f"train {run.id} ({cfg.require_model().family}): until its measured FLOPs reach "
                    f"{cfg.train.flop_budget:.3g} (planned: {steps} steps x {ledger.own_per_step:.3g} FLOPs)"
                )
            elif run.steps is None:
                self.say(
                    f"train {run.id} ({cfg.require_model().family}): {cfg.train.time_budget_s:g}s of "
                    f"training at {ledger.own_per_step:.3g} FLOPs per step"
                )
            else:
                aux = (
                    f" + auxiliary {ledger.auxiliary(steps):.3g} = {ledger.total(steps):.3g}"
                    if ledger.auxiliary(steps)
                    else ""
                )
                self.say(
                    f"train {run.id} ({cfg.require_model().family}): {steps} steps x "
                    f"{ledger.own_per_step:.3g} FLOPs = {ledger.own(steps):.3g}{aux} FLOPs"
                )
            t0 = time.perf_counter()
            try:
                result = loop.train(
                    cfg, run.run_dir, corpus=self.corpus, progress=self.bar(f"train {run.id}")
                )
            except Exception as e:  # one broken run never stops the others
                log.debug("run %s failed", run.id, exc_info=True)
                run.error = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
                self.say(f"{stage} {run.id}: FAILED: {run.error}")
                if is_primary():
                    atomic_write_text(run.failure_file, run.error + "\n")
                continue
            finally:
                self.timed(f"train {run.id}", t0)
            run.train_s = result.train_s
            if result.stopped_by_signal or not run.finished():
                raise StageStopped(
                    f"training {run.id} stopped at step {result.step} (checkpoint saved in {run.run_dir}); "
                    + self.stopped_message.format(out=self.out),
                    signum=result.signum,
                )
            if result.trainer is not None:  # score it now, without a restore
                for split in self.splits(run):
                    self.evaluate(run, split, trainer=result.trainer)

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
    def splits(self, run: Run) -> tuple[str, ...]:
        """What a run is scored on: an artefact on nothing; a search run on the validation split (and, at
        the whole budget, on the held-out segments too: it is a cell's run); every other run on the
        held-out segments."""
        if run.artefact:
            return ()
        if run.stage == "sweep":
            return ("heldout", "validation") if run.fraction == 1 else ("validation",)
        return ("heldout",)

    def evaluate(self, run: Run, split: str = "heldout", *, trainer=None) -> None:
        """Score a finished run on the held-out (or validation) segments, cached in ``OUT/evals``;
        ``trainer``: the run's trainer still in memory (else its checkpoint is restored)."""
        if run.error is not None or not run.finished():
            return
        eval_set = self.eval_set if split == "heldout" else self.validation_set
        if eval_set is None:
            raise RuntimeError(f"{split} scores asked for, but the {self.exp.kind} has no {split} split")
        cache = self.out / "evals" / f"{run.id.replace('/', '__')}.{split}.json"
        step = RunDir(run.run_dir).info_or_empty().get("step")
        if cache.is_file():
            try:
                cached = json.loads(cache.read_text())
                if not isinstance(cached, dict):
                    raise ValueError("not a JSON object")
            except (ValueError, UnicodeDecodeError):  # (a damaged cache: scored again)
                log.warning("%s is damaged; scoring %s again", cache, run.id)
                cached = {}
            if cached.get("fingerprint") == eval_set.fingerprint and cached.get("step") == step:
                result = result_from_json(cached)
                self._keep(run, result, split)
                self.say(f"eval {split} {run.id}: done earlier, BPB {result.bpb:.4f}")
                return
        t0 = time.perf_counter()
        try:
            bar = self.bar(f"eval {split} {run.id}")
            if trainer is not None:
                result = evaluate_trained(trainer, run.run_dir, eval_set, name=run.member, progress=bar)
            else:
                result = evaluate_run(
                    run.run_dir, eval_set, name=run.member, corpus=self.corpus, progress=bar
                )
        except (UserError, ValueError) as e:
            run.error = f"evaluation failed: {e}"
            return
        if is_primary():
            atomic_write_text(cache, json.dumps(result_to_json(result)))
        barrier("bytelm: evaluation cached")  # (every process then reads the same cache)
        self._keep(run, result, split)
        dt = self.timed(f"eval {run.id}", t0)
        self.say(f"eval {split} {run.id}: BPB {result.bpb:.4f} in {dt:.1f}s")

    @staticmethod
    def _keep(run: Run, result: ModelResult, split: str) -> None:
        if split == "heldout":
            run.result = result
        else:
            run.validation_bpb = result.bpb

    # -- the stages
    def stage_runs(self, stage: str) -> list[Run]:
        exp = self.exp
        if stage == "sweep":
            return [run for m in exp.members if self.searches_rate(m) for run in self.sweep_runs(m)]
        if stage == "grid":
            return [
                self.plan("grid", m, cell, b, self.chosen[self.lr_member(m)], 0)
                for m in exp.members
                if self.lr_member(m) in self.chosen
                for b in range(len(self.budgets))
                for cell in m.cells()
            ]
        if stage == "seeds":
            runs = []
            for m, best in self.best_cells().items():
                runs += [
                    self.plan("seeds", m, best.cell, 0, best.lr, s) for s in range(1, exp.extra_seeds + 1)
                ]
            return runs
        raise ValueError(stage)

    def searches_rate(self, m: Member) -> bool:
        return m.lr_from is None and len(self.exp.learning_rates) > 1

    def lr_member(self, m: Member) -> str:
        return m.lr_from or m.name

    def sweep_runs(self, m: Member) -> list[Run]:
        """The member's rate-search runs so far: its sweep cell at the smallest budget at every rate of
        the experiment, then one more rate past an end wherever the best rate sits there, once the
        scores that call for it are in (up to two)."""
        search = RateSearch(self.exp.learning_rates)
        runs: dict[float, Run] = {}
        while rates := search.next_rates(self.sweep_scores(runs.values())):
            if len(runs) >= len(search.grid):
                self.say(
                    f"learning rate of {m.name}: the best so far is at an end of the rates tried; trying "
                    f"{rate_label(rates[0])}"
                )
            for lr in rates:
                run = runs[lr] = self.plan("sweep", m, m.sweep_cell(), 0, lr, 0, self.exp.sweep_fraction)
                if run.error is None and run.finished() and run.validation_bpb is None:
                    self.evaluate(run, "validation")
            if any(r.error is None and r.validation_bpb is None for r in runs.values()):
                break  # results pending: the search goes on when they are in
        return list(runs.values())

    @staticmethod
    def sweep_scores(runs) -> dict[float, float | None]:
        """Validation BPB per rate of the search runs scored so far (None: the run failed, a loss)."""
        return {
            r.lr: None if r.error is not None else r.validation_bpb
            for r in runs
            if r.error is not None or r.validation_bpb is not None
        }

    def choose_rates(self) -> None:
        """Each member's rate once its search is over (every rate trained or failed, no extension due);
        a member without a search keeps its config's rate (or its single listed rate)."""
        for m in self.exp.members:
            if m.lr_from is not None:
                continue
            if not self.searches_rate(m):
                self.chosen[m.name] = self.exp.learning_rates[0] if self.exp.learning_rates else None
                continue
            runs = self.sweep_runs(m)
            search, scores = RateSearch(self.exp.learning_rates), self.sweep_scores(runs)
            done = len(scores) == len(runs) and not search.next_rates(scores)
            choice: RateChoice = search.choose(scores)
            self.searches[m.name] = {
                "cell": cell_label(m.sweep_cell()),
                **choice.record(),
                "chosen": None,
                "grid": list(search.grid),
                "fraction": self.exp.sweep_fraction,
                "errors": {rate_label(r.lr): r.error for r in runs if r.error and r.lr is not None},
            }
            if done and choice.chosen is not None:
                self.chosen[m.name] = choice.chosen
                self.searches[m.name]["chosen"] = choice.chosen
                edge = " (STILL AT AN EDGE after the extensions)" if choice.at_edge else ""
                self.say(
                    f"learning rate of {m.name}: {rate_label(choice.chosen)}{edge} (validation BPB "
                    + ", ".join(
                        f"{rate_label(lr)}: " + ("failed" if b is None else f"{b:.4f}")
                        for lr, b in sorted(scores.items())
                    )
                    + ")"
                )

    def best_cells(self) -> dict[Member, Run]:
        best: dict[Member, Run] = {}
        for m in self.exp.members:
            runs = [
                r
                for r in self.runs.values()
                if r.in_grid
                and r.member == m.name
                and r.budget_index == 0
                and r.seed == 0
                and r.result is not None
            ]
            if runs:
                best[m] = min(runs, key=lambda r: r.heldout.bpb)
        return best

    def go(self) -> tuple[str, list[str]]:
        """Carry the experiment as far as the mode allows:
        ``(the first unfinished stage or "done", its commands)``."""
        self.prepare()
        commands = self.artefacts()
        if commands or (self.mode == "collect" and self.artefacts_missing()):
            return "artefacts", commands
        for stage in STAGES[1:]:
            while True:  # the sweep grows while its rates' scores call for extensions
                runs = self.stage_runs(stage)
                if self.mode == "run":
                    self.execute(runs, stage)
                pending = [r for r in runs if r.error is None and not r.finished()]
                if pending and self.mode == "print":
                    return stage, [r.command() for r in pending]
                for r in runs:
                    for split in self.splits(r):
                        self.evaluate(r, split)
                if pending or len(self.stage_runs(stage)) == len(runs):
                    break
            if stage == "sweep":
                self.choose_rates()
            if pending:  # collect mode: later stages depend on this one
                return stage, []
        return "done", []
