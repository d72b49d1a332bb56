"""The runs of an experiment (:mod:`bytelm.experiments.runner`): one ``bytelm train`` each, as
planned, trained and scored, and the signal that stops a stage."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import numpy as np

from bytelm.bpb import SegmentScores
from bytelm.config import Config, load_config, section_overrides
from bytelm.console import Stopped
from bytelm.evaluation.results import ModelResult
from bytelm.ledger import Ledger
from bytelm.rundir import RunDir


class StageStopped(Stopped):
    """A training stopped before its last step (SIGINT/SIGTERM) inside a multi-run job; its checkpoint
    is saved and the same command resumes it (the CLI's signal contract, :mod:`bytelm.console`: exit 0
    after SIGTERM, 130 after SIGINT; ``signum``: the signal)."""


@dataclasses.dataclass
class Run:
    """One ``bytelm train`` of an experiment; ``error`` set when it cannot be planned or it failed."""

    stage: str
    member: str
    cell: dict
    budget_index: int
    budget: float
    lr: float | None  # None: the config's own rate (or an artefact)
    seed: int  # added to the config's train.seed
    fraction: float = 1.0  # its share of the cell's steps (a short rate-search run: < 1)
    id: str = ""
    run_dir: Path = Path()
    config: Path | None = None  # the member's config file (the printed command's)
    cfg: Config | None = None  # the run's config, typed
    steps: int | None = None  # None: a time-budgeted run (its time decides)
    ledger: Ledger | None = None
    error: str | None = None
    result: ModelResult | None = None  # on the held-out segments
    validation_bpb: float | None = None
    in_grid: bool = False  # a grid cell (a sweep run at the whole budget and the chosen rate is one too)
    train_s: float | None = None

    @property
    def artefact(self) -> bool:
        return self.stage == "artefacts"

    @property
    def planned(self) -> tuple[Config, Ledger]:
        """The run's config and ledger (a run that could not be planned has none: its ``error`` says why)."""
        if self.cfg is None or self.ledger is None:
            raise RuntimeError(f"the run {self.id} was not planned: {self.error}")
        return self.cfg, self.ledger

    @property
    def heldout(self) -> ModelResult:
        """The run's held-out result (once evaluated)."""
        if self.result is None:
            raise RuntimeError(f"the run {self.id} has no held-out result: {self.error or 'not evaluated'}")
        return self.result

    def command(self) -> str:
        """The ``bytelm train`` command that trains this run: the member's config file and the ``--set``
        strings that turn it into this run's config."""
        base = load_config(self.config)
        sets = [
            o
            for name in ("data", "model", "train", "eval")
            for o in section_overrides(name, getattr(self.cfg, name), getattr(base, name))
        ]
        quoted = " ".join(f"--set {shlex.quote(o)}" for o in sets)
        return (
            f"bytelm train {shlex.quote(str(self.config))} --out {shlex.quote(str(self.run_dir))} {quoted}"
        ).rstrip()

    @property
    def failure_file(self) -> Path:
        return self.run_dir / "failed.txt"

    def finished(self) -> bool:
        return RunDir(self.run_dir).finished(self.steps)


def result_to_json(r: ModelResult) -> dict:
    d = {k: v for k, v in dataclasses.asdict(r).items() if k not in ("scores", "global_steps", "seed_scores")}
    d["nats"] = r.scores.nats.tolist()
    d["nbytes"] = r.scores.nbytes.tolist()
    d["global_steps"] = None if r.global_steps is None else r.global_steps.tolist()
    return d


def result_from_json(d: dict) -> ModelResult:
    d = dict(d)
    scores = SegmentScores(np.asarray(d.pop("nats"), np.float64), np.asarray(d.pop("nbytes"), np.int64))
    gs = d.pop("global_steps")
    return ModelResult(scores=scores, global_steps=None if gs is None else np.asarray(gs, np.float64), **d)
