"""What the runner asks when it plans a run: its compute ledger, its schedule, and n-gram tables
borrowed from another member (all typed values, :func:`bytelm.config.with_values`).

A budget is matched on the ledger's **total** (:mod:`bytelm.ledger`): a BLT pays for its entropy
model's training and forward passes out of the same budget as every other model's own training.
"""

from __future__ import annotations

import math
from pathlib import Path

from bytelm.config import Config
from bytelm.errors import UserError
from bytelm.ledger import Ledger
from bytelm.rundir import RunDir
from bytelm.training.restore import make_task

NGRAM_FIELDS = ("ngram_sizes", "hash_table_size")  # what ``ngram_from`` copies


def planned_ledger(cfg: Config, corpus, run_dir: Path) -> Ledger:
    """The ledger a run recorded when it started, else its task's (building a BLT task restores the
    entropy model and calibrates, so a re-run reads the record)."""
    info = RunDir(run_dir).info_or_empty()
    if info.get("ledger"):
        return Ledger.from_record(info["ledger"])
    return make_task(cfg, corpus, run_dir).ledger()


def schedule_values(cfg: Config, steps: int, eval_points: int) -> dict:
    """``train.steps``, a warmup of at most a tenth of them, and ``eval_points`` periodic evaluations."""
    warmup = min(cfg.train.warmup_steps, max(1, steps // 10))
    every = max(1, math.ceil(steps / max(1, eval_points)))
    return {"train.steps": steps, "train.warmup_steps": warmup, "eval.every": every}


def sweep_steps(steps: int, fraction: float) -> int:
    """A learning-rate search run's steps: ``fraction`` of the run it chooses the rate for."""
    return max(1, int(round(steps * fraction)))


def ngram_values(source: Config, target: Config, *, where: str) -> dict:
    """Values giving ``target``'s model the hashed n-gram tables of ``source``'s (the same n-gram sizes
    and rows per table), so that a byte LM can be compared with a BLT at equal lookup capacity.
    :class:`UserError` when either model has no such tables."""
    src, dst = source.model, target.model
    if src is None or not getattr(src, "ngram_sizes", ()):
        raise UserError(
            f"{where}: ngram_from names a model without hashed n-gram tables (model.ngram_sizes is empty)"
        )
    if dst is None or not all(hasattr(dst, f) for f in NGRAM_FIELDS):
        family = dst.family if dst is not None else "none"
        raise UserError(
            f"{where}: ngram_from needs a model with n-gram tables of its own (a byte or subword LM), not "
            f"family {family!r}"
        )
    return {f"model.{f}": getattr(src, f) for f in NGRAM_FIELDS}
