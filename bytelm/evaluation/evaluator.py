"""Score trained runs (any family), outside models and reference models on one evaluation set.

The protocol is docs/evaluation.md. An :class:`~bytelm.evaluation.results.EvalSet` is the
corpus's held-out segments with their fingerprint; every
:class:`~bytelm.evaluation.results.ModelResult` carries per-segment nats, bytes and *global steps*
(the positions of the model's outermost, most expensive stack, counted by the family's task:
:meth:`bytelm.families.Task.global_steps`), so reports can break BPB and bytes per global
step down per document group. Results on different fingerprints are never put in one table.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from bytelm.bpb import SegmentScores, UnigramByteModel, byte_counts
from bytelm.config import load_config, load_run_config, with_values
from bytelm.data import EVAL_PROTOCOL, Corpus
from bytelm.errors import UserError
from bytelm.evaluation.external import parse_external_arg, read_external_scores
from bytelm.evaluation.report import build_report, scores_path, write_report_json, write_scores
from bytelm.evaluation.results import EvalSet, ModelResult
from bytelm.families import STATS_KEY
from bytelm.ledger import Ledger
from bytelm.rundir import RunDir, run_path
from bytelm.training.check import metrics_line
from bytelm.training.distributed import load_job_corpus
from bytelm.training.restore import ensure_run_record, restore_scorer

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


# -- corpora ---------------------------------------------------------------------------------
def read_run_json(run_dir: str | Path) -> dict:
    """A run's record (:class:`~bytelm.rundir.RunDir`), rebuilt first when it is damaged
    (:func:`~bytelm.training.restore.ensure_run_record`); :class:`UserError` when missing."""
    ensure_run_record(run_dir)
    return RunDir(run_dir).info()


def run_config(run_dir: str | Path, data_spec: str | None = None):
    """The resolved config of a run, with ``data.source`` replaced by ``data_spec`` if given."""
    cfg = load_run_config(run_dir)
    return with_values(cfg, {"data.source": data_spec}) if data_spec else cfg


class CorpusCache:
    """Loads each distinct ``[data]`` config once (runs of one comparison share their corpus)."""

    def __init__(self, progress: Progress | None = None):
        self._by_data: dict = {}
        self.progress = progress

    def get(self, cfg):
        key = dataclasses.astuple(cfg.data)
        if key not in self._by_data:
            # (in a job of several processes, process 0 prepares it and the others wait)
            self._by_data[key] = load_job_corpus(cfg.data, progress=self.progress)
        return self._by_data[key]

    def add(self, corpus, cfg) -> None:
        self._by_data[dataclasses.astuple(cfg.data)] = corpus


def eval_sets_for_runs(
    run_dirs: Sequence[str | Path], *, data_spec: str | None = None, corpora: CorpusCache | None = None
) -> tuple[EvalSet, dict[str, Corpus]]:
    """The one evaluation set of ``run_dirs`` and each run's corpus.

    Without ``data_spec`` each run is scored on the held-out bytes of its own config, which must
    still have the fingerprint recorded at training time (else the corpus changed under the run).
    With ``data_spec`` every run is scored on that corpus (with its own segment settings). Raises
    :class:`UserError` listing every run's fingerprint when they differ.
    """
    corpora = corpora or CorpusCache()
    per_run: dict[str, Corpus] = {}
    for run_dir in run_dirs:
        info = read_run_json(run_dir)
        cfg = run_config(run_dir, data_spec)
        corpus = corpora.get(cfg)
        if data_spec is None and info.get("fingerprint") and info["fingerprint"] != corpus.fingerprint:
            protocol = (info.get("data") or {}).get("protocol", 1)
            if protocol != EVAL_PROTOCOL:
                raise UserError(
                    f"{run_dir} was trained when bytelm used evaluation protocol v{protocol}; it now uses "
                    f"v{EVAL_PROTOCOL} (segments from every held-out document, docs/evaluation.md), so its "
                    "recorded fingerprint cannot match: score it on the new segments of its corpus with "
                    f"--data {cfg.data.source!r}"
                )
            raise UserError(
                f"the held-out bytes of {run_dir} changed since it was trained: its corpus "
                f"{cfg.data.source!r} now has fingerprint {corpus.fingerprint[:16]}..., the run recorded "
                f"{info['fingerprint'][:16]}... (a changed file or Python version?); restore the data, "
                "retrain, or score it on purpose on another corpus with --data SPEC"
            )
        per_run[str(run_dir)] = corpus
    check_same_fingerprint({name: c.fingerprint for name, c in per_run.items()}, per_run)
    first = next(iter(per_run.values()))
    return EvalSet.from_corpus(first), per_run


def check_same_fingerprint(fingerprints: dict[str, str], corpora: Mapping[str, Corpus] | None = None) -> None:
    """Raise :class:`UserError` listing ``name: fingerprint`` when the fingerprints differ."""
    if len(set(fingerprints.values())) <= 1:
        return
    lines = []
    for name, fp in fingerprints.items():
        c = (corpora or {}).get(name)
        where = (
            f" ({c.spec}, segment_bytes {c.segment_bytes}, max_eval_bytes {c.max_eval_bytes})"
            if c is not None
            else ""
        )
        lines.append(f"{name}: {fp}{where}")
    raise UserError(
        "refusing to compare results on different held-out bytes; fingerprints: "
        + "; ".join(lines)
        + ". Score every model on the same data (same --data and data.segment_bytes / data.max_eval_bytes / "
        "data.split_seed / data.heldout_fraction)"
    )


# -- scoring a run ---------------------------------------------------------------------------
def evaluate_trainer(
    trainer, eval_set: EvalSet, *, progress: Progress | None = None
) -> tuple[SegmentScores, np.ndarray, dict]:
    """Score every segment of ``eval_set`` with a restored trainer; returns scores, the global
    steps of each segment and the input pipeline's rates (both from the family's task)."""
    steps: list[np.ndarray] = []
    stats: dict[str, int] = {}
    done = [0]

    def on_batch(batch, n_real):
        steps.append(trainer.task.global_steps(batch, n_real))
        for key, n in batch.get(STATS_KEY, {}).items():
            stats[key] = stats.get(key, 0) + n
        done[0] += n_real
        if progress:
            progress(done[0], len(eval_set.data))

    scores = trainer.evaluate(eval_set.data, on_batch=on_batch)
    if scores.global_steps is not None:  # (the model counted them: H-Net's chunks)
        return scores, scores.global_steps, trainer.task.stats_record(stats)
    return scores, np.concatenate(steps) if steps else np.zeros(0), trainer.task.stats_record(stats)


def evaluate_run(
    run_dir: str | Path,
    eval_set: EvalSet,
    *,
    name: str | None = None,
    corpus=None,
    progress: Progress | None = None,
) -> ModelResult:
    """Restore the latest checkpoint of ``run_dir`` and score it on ``eval_set``.

    Training facts come from the run: FLOPs = train FLOPs per position x positions per step x
    steps (the family's analytic formula, :mod:`bytelm.models.flops` and each family's formula), bytes seen =
    steps x positions per step x bytes per position. A BPE run whose tokenizer (or a BLT run whose entropy
    model) changed since training is refused with :class:`UserError`.
    """
    run_dir = run_path(run_dir)
    trainer = restore_scorer(run_dir, corpus=corpus if corpus is not None else eval_set.corpus)
    return evaluate_trained(trainer, run_dir, eval_set, name=name, progress=progress)


def evaluate_trained(
    trainer,
    run_dir: str | Path,
    eval_set: EvalSet,
    *,
    name: str | None = None,
    progress: Progress | None = None,
) -> ModelResult:
    """:func:`evaluate_run` with the run's trainer already in memory (the one training just
    returned, :attr:`TrainResult.trainer`, whose state is the run's last checkpoint)."""
    run_dir = run_path(run_dir)
    info = read_run_json(run_dir)
    scores, global_steps, pipeline_stats = evaluate_trainer(trainer, eval_set, progress=progress)
    step = trainer.step
    lost = metrics_line(run_dir, trainer.cfg.train.log_every, int(info.get("step") or step))
    if lost:
        log.warning("%s", lost)
    positions = float(info.get("positions_per_step") or trainer.task.positions_per_step())
    per_position = info.get("train_flops_per_position")
    bytes_per_position = info.get("bytes_per_position")
    ledger = Ledger.of_run(info)
    books = ledger.summary(step) if ledger is not None and not ledger.unknown else None
    planned = per_position * positions * step if per_position is not None else None
    # a family that measures what its steps spend (H-Net) is charged the measured figure of its steps
    measured = info.get("flops_measured") if info.get("step") == step else None
    return ModelResult(
        name=name or run_dir.name,
        family=trainer.cfg.model.family,
        kind="run",
        fingerprint=eval_set.fingerprint,
        scores=scores,
        global_steps=global_steps,
        run_dir=str(run_dir),
        step=step,
        params=dict(trainer.param_counts),
        flops=measured if measured is not None else planned,
        train_flops_per_byte=info.get("train_flops_per_byte"),
        bytes_seen=step * positions * bytes_per_position if bytes_per_position is not None else None,
        wall_s=info.get("wall_s"),
        note=trainer.task.report_note(info),
        inference_flops_per_byte=info.get("inference_flops_per_byte"),
        entropy_inference_flops_per_byte=info.get("entropy_inference_flops_per_byte"),
        pipeline_stats=pipeline_stats or None,
        flops_auxiliary=books["flops_auxiliary"] if books else None,
        auxiliary=books["auxiliary"] if books else None,
        partial=RunDir(run_dir).progress_note(step),
        flops_planned=planned if measured is not None else None,
    )


# -- reference rows --------------------------------------------------------------------------
def unigram_baselines(eval_set: EvalSet) -> list[ModelResult]:
    """The context-free reference rows: the eval bytes' own unigram entropy, and a unigram model
    fit on the train split (add-one smoothing) scored like every other model."""
    corpus = eval_set.corpus
    eval_model = UnigramByteModel.fit(byte_counts(eval_set.data))
    train_counts = np.zeros(256, np.int64)
    for i in corpus.document_indices("train"):
        train_counts += np.bincount(corpus.document(i), minlength=256)
    train_model = UnigramByteModel.fit(train_counts, alpha=1.0)
    rows = []
    for name, model, note in (
        (
            "unigram (eval entropy)",
            eval_model,
            "byte frequencies of the eval set itself: the best context-free model",
        ),
        ("unigram (train)", train_model, "byte frequencies of the train split, add-one smoothed"),
    ):
        rows.append(
            ModelResult(
                name=name,
                family="unigram",
                kind="baseline",
                fingerprint=eval_set.fingerprint,
                scores=model.score(eval_set.data),
                global_steps=np.asarray([len(d) for d in eval_set.data], np.float64),
                note=note,
            )
        )
    return rows


def check_finite(results: Sequence[ModelResult]) -> list[str]:
    """Names of results whose BPB is not finite (diverged or broken models)."""
    return [r.name for r in results if not math.isfinite(r.bpb)]


def evaluate_runs(
    run_dirs: Sequence[str | Path],
    *,
    data_spec: str | None = None,
    externals: Sequence[str] = (),
    json_path: str | Path | None = None,
    progress: Callable[[str, int, int | None, str], None] | None = None,
) -> dict:
    """``bytelm eval``: score ``run_dirs`` and the ``NAME=SCORES.jsonl`` ``externals`` on one
    evaluation set, add the unigram reference rows, write ``json_path``; returns the report.

    Every fingerprint is checked before anything is scored. Without runs, the evaluation set is
    the held-out part of ``data_spec`` (default config otherwise)."""
    if not run_dirs and not externals:
        raise UserError("nothing to evaluate: give one or more RUN_DIRs and/or --external NAME=SCORES.jsonl")
    names = [Path(r).name or str(r) for r in run_dirs]
    parsed = [parse_external_arg(e) for e in externals]
    all_names = names + [n for n, _ in parsed]
    if len(set(all_names)) != len(all_names):
        dup = sorted({n for n in all_names if all_names.count(n) > 1})
        raise UserError(
            f"two models would be called {dup[0]!r} in one table; give externals distinct names (and run "
            "directories distinct names)"
        )

    def bar(stage):
        return (
            (lambda done, total=None, suffix="": progress(stage, done, total, suffix)) if progress else None
        )

    corpora = CorpusCache(progress=bar("corpus"))
    if run_dirs:
        eval_set, per_run = eval_sets_for_runs(run_dirs, data_spec=data_spec, corpora=corpora)
    else:
        cfg = load_config(None)
        eval_set = EvalSet.from_corpus(
            corpora.get(with_values(cfg, {"data.source": data_spec}) if data_spec else cfg)
        )
        per_run = {}
    external_results = [read_external_scores(path, eval_set, name=name) for name, path in parsed]
    results = []
    for run_dir, name in zip(run_dirs, names):
        results.append(
            evaluate_run(
                run_dir, eval_set, name=name, corpus=per_run[str(run_dir)], progress=bar(f"eval {name}")
            )
        )
    baselines = unigram_baselines(eval_set)
    report = build_report(eval_set, results + external_results, baselines)
    if json_path:
        write_scores(scores_path(json_path), eval_set, [*results, *external_results, *baselines])
        write_report_json(report, json_path)
    return report
