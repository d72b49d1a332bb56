"""Score trained runs (any family), outside models and reference models on one evaluation set.

DESIGN.md section 5. An :class:`EvalSet` is the corpus's held-out segments with their fingerprint;
every :class:`ModelResult` carries per-segment nats, bytes and *global steps* (the positions of
the model's outermost, most expensive stack: bytes for the byte LM, ``bytes / P`` for MegaByte,
patches for BLT, tokens for the BPE LM), so reports can break BPB and bytes per global step down
per document group. Results on different fingerprints are never put in one table.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from bytelm.constants import BYTE_OFFSET
from bytelm.errors import UserError
from bytelm.evaluation.bpb import SegmentScores, UnigramByteModel, breakdown, byte_counts, top_directory

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


@dataclasses.dataclass
class EvalSet:
    """The scored held-out bytes of a corpus: segments in canonical order and their fingerprint."""

    corpus: object  # bytelm.data.Corpus
    segments: list  # list[bytelm.data.Segment]
    data: list[bytes]
    fingerprint: str

    @classmethod
    def from_corpus(cls, corpus) -> EvalSet:
        return cls(corpus, list(corpus.segments), corpus.segment_data(), corpus.fingerprint)

    @property
    def ids(self) -> list[str]:
        return [s.id for s in self.segments]

    @property
    def groups(self) -> list[str]:
        return [s.group for s in self.segments]

    @property
    def dirs(self) -> list[str]:
        return [top_directory(s.name) for s in self.segments]

    @property
    def n_bytes(self) -> int:
        return sum(len(d) for d in self.data)

    def describe(self) -> dict:
        s = self.corpus.summary()
        return {
            "spec": s["spec"],
            "source": s["source"],
            "python": sys.version.split()[0],
            "eval_segments": len(self.segments),
            "eval_bytes": self.n_bytes,
            "segment_bytes": s["segment_bytes"],
            "max_eval_bytes": s["max_eval_bytes"],
            "heldout_documents": s["heldout_documents"],
            "train_bytes": s["train_bytes"],
        }


@dataclasses.dataclass
class ModelResult:
    """One row of a report. ``kind`` is ``"run"`` (a run directory), ``"external"`` (scores
    computed elsewhere, :mod:`bytelm.evaluation.external`) or ``"baseline"`` (a reference model)."""

    name: str
    family: str
    kind: str
    fingerprint: str
    scores: SegmentScores
    global_steps: np.ndarray | None = None  # float64 per segment
    run_dir: str | None = None
    step: int | None = None
    params: dict | None = None
    flops: float | None = None
    train_flops_per_byte: float | None = None
    bytes_seen: float | None = None
    wall_s: float | None = None
    note: str = ""

    @property
    def bpb(self) -> float:
        return self.scores.bpb

    @property
    def mean_bytes_per_global_step(self) -> float | None:
        if self.global_steps is None:
            return None
        steps = float(np.sum(self.global_steps))
        return self.scores.total_bytes / steps if steps else None

    def to_dict(self, eval_set: EvalSet) -> dict:
        return {
            "name": self.name,
            "family": self.family,
            "kind": self.kind,
            "run_dir": self.run_dir,
            "step": self.step,
            "bpb": self.bpb,
            "nats": self.scores.total_nats,
            "bytes": self.scores.total_bytes,
            "segments": len(self.scores.nats),
            "params": self.params,
            "flops": self.flops,
            "train_flops_per_byte": self.train_flops_per_byte,
            "bytes_seen": self.bytes_seen,
            "mean_bytes_per_global_step": self.mean_bytes_per_global_step,
            "wall_s": self.wall_s,
            "fingerprint": self.fingerprint,
            "note": self.note,
            "groups": breakdown(self.scores, eval_set.groups, self.global_steps),
            "dirs": breakdown(self.scores, eval_set.dirs, self.global_steps),
        }


# -- corpora ---------------------------------------------------------------------------------
def read_run_json(run_dir: str | Path) -> dict:
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise UserError(
            f"{run_dir} is not a trained run directory (no run.json); train one with 'bytelm train CONFIG --out {run_dir}'"
        )
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read {path}: {e}; the run directory is damaged, retrain it") from None


def run_config(run_dir: str | Path, data_spec: str | None = None):
    """The resolved config of a run, with ``data.source`` replaced by ``data_spec`` if given."""
    from bytelm.config import load_config  # noqa: PLC0415

    path = Path(run_dir) / "config.toml"
    if not path.is_file():
        raise UserError(f"{run_dir} is not a run directory (no config.toml); train one with 'bytelm train CONFIG --out {run_dir}'")
    return load_config(path, [f"data.source={data_spec}"] if data_spec else [])


class CorpusCache:
    """Loads each distinct ``[data]`` config once (runs of one comparison share their corpus)."""

    def __init__(self, progress: Progress | None = None):
        self._by_data: dict = {}
        self.progress = progress

    def get(self, cfg):
        from bytelm.training.trainer import load_corpus_for  # noqa: PLC0415

        key = dataclasses.astuple(cfg.data)
        if key not in self._by_data:
            self._by_data[key] = load_corpus_for(cfg, progress=self.progress)
        return self._by_data[key]

    def add(self, corpus, cfg) -> None:
        self._by_data[dataclasses.astuple(cfg.data)] = corpus


def eval_sets_for_runs(
    run_dirs: Sequence[str | Path], *, data_spec: str | None = None, corpora: CorpusCache | None = None
) -> tuple[EvalSet, dict[str, object]]:
    """The one evaluation set of ``run_dirs`` and each run's corpus.

    Without ``data_spec`` each run is scored on the held-out bytes of its own config, which must
    still have the fingerprint recorded at training time (else the corpus changed under the run).
    With ``data_spec`` every run is scored on that corpus (with its own segment settings). Raises
    :class:`UserError` listing every run's fingerprint when they differ.
    """
    corpora = corpora or CorpusCache()
    per_run: dict[str, object] = {}
    for run_dir in run_dirs:
        info = read_run_json(run_dir)
        cfg = run_config(run_dir, data_spec)
        corpus = corpora.get(cfg)
        if data_spec is None and info.get("fingerprint") and info["fingerprint"] != corpus.fingerprint:
            raise UserError(
                f"the held-out bytes of {run_dir} changed since it was trained: its corpus "
                f"{cfg.data.source!r} now has fingerprint {corpus.fingerprint[:16]}..., the run recorded "
                f"{info['fingerprint'][:16]}... (a changed file or Python version?); restore the data, retrain, "
                "or score it on purpose on another corpus with --data SPEC"
            )
        per_run[str(run_dir)] = corpus
    check_same_fingerprint({name: c.fingerprint for name, c in per_run.items()}, per_run)
    first = next(iter(per_run.values()))
    return EvalSet.from_corpus(first), per_run


def check_same_fingerprint(fingerprints: dict[str, str], corpora: dict[str, object] | None = None) -> None:
    """Raise :class:`UserError` listing ``name: fingerprint`` when the fingerprints differ."""
    if len(set(fingerprints.values())) <= 1:
        return
    lines = []
    for name, fp in fingerprints.items():
        c = (corpora or {}).get(name)
        where = f" ({c.spec}, segment_bytes {c.segment_bytes}, max_eval_bytes {c.max_eval_bytes})" if c is not None else ""
        lines.append(f"{name}: {fp}{where}")
    raise UserError(
        "refusing to compare results on different held-out bytes; fingerprints: "
        + "; ".join(lines)
        + ". Score every model on the same data (same --data and data.segment_bytes / data.max_eval_bytes / "
        "data.split_seed / data.heldout_fraction)"
    )


# -- scoring a run ---------------------------------------------------------------------------
def _global_steps_of_batch(family: str, task, batch: dict, n_real: int) -> np.ndarray:
    """Positions of the outermost stack per real row of an eval batch (see the module docstring)."""
    ids = np.asarray(batch["ids"])[:n_real]
    scored = (ids[:, 1:] >= BYTE_OFFSET).sum(axis=1).astype(np.float64)  # bytes, or tokens for BPE
    if family == "megabyte":
        nbytes = scored
        return nbytes / float(task.cfg.model.patch_size)
    if family == "blt":
        lengths = np.asarray(batch["patch_lengths"])[:n_real]
        # the first patch holds the BOS alone; the others cover the segment's bytes
        return ((lengths > 0).sum(axis=1) - 1).astype(np.float64)
    return scored


def evaluate_trainer(trainer, eval_set: EvalSet, *, progress: Progress | None = None) -> tuple[SegmentScores, np.ndarray]:
    """Score every segment of ``eval_set`` with a restored trainer; returns scores and global steps."""
    family = trainer.cfg.model.family
    steps: list[np.ndarray] = []
    done = [0]

    def on_batch(batch, n_real):
        steps.append(_global_steps_of_batch(family, trainer.task, batch, n_real))
        done[0] += n_real
        if progress:
            progress(done[0], len(eval_set.data))

    scores = trainer.evaluate(eval_set.data, on_batch=on_batch)
    return scores, np.concatenate(steps) if steps else np.zeros(0)


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
    steps (the family's analytic formula, :mod:`bytelm.training.flops`), bytes seen = steps x
    positions per step x bytes per position. A BPE run whose tokenizer (or a BLT run whose entropy
    model) changed since training is refused with :class:`UserError`.
    """
    from bytelm.training.trainer import restore_trainer  # noqa: PLC0415

    run_dir = Path(run_dir)
    info = read_run_json(run_dir)
    trainer = restore_trainer(run_dir, corpus=corpus if corpus is not None else eval_set.corpus)
    scores, global_steps = evaluate_trainer(trainer, eval_set, progress=progress)
    step = trainer.step
    positions = float(info.get("positions_per_step") or trainer.task.positions_per_step())
    per_position = info.get("train_flops_per_position")
    bytes_per_position = info.get("bytes_per_position")
    note = ""
    if trainer.cfg.model.family == "blt":
        achieved = (info.get("patching") or {}).get("achieved_mean_patch_len")
        if achieved:
            note = f"train mean patch {achieved:.2f} (BOS patches counted)"
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
        flops=per_position * positions * step if per_position is not None else None,
        train_flops_per_byte=info.get("train_flops_per_byte"),
        bytes_seen=step * positions * bytes_per_position if bytes_per_position is not None else None,
        wall_s=info.get("wall_s"),
        note=note,
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
        ("unigram (eval entropy)", eval_model, "byte frequencies of the eval set itself: the best context-free model"),
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
    from bytelm.evaluation.external import parse_external_arg, read_external_scores  # noqa: PLC0415
    from bytelm.evaluation.report import build_report, write_report_json  # noqa: PLC0415

    if not run_dirs and not externals:
        raise UserError("nothing to evaluate: give one or more RUN_DIRs and/or --external NAME=SCORES.jsonl")
    names = [Path(r).name or str(r) for r in run_dirs]
    parsed = [parse_external_arg(e) for e in externals]
    all_names = names + [n for n, _ in parsed]
    if len(set(all_names)) != len(all_names):
        dup = sorted({n for n in all_names if all_names.count(n) > 1})
        raise UserError(f"two models would be called {dup[0]!r} in one table; give externals distinct names (and run directories distinct names)")

    def bar(stage):
        return (lambda done, total=None, suffix="": progress(stage, done, total, suffix)) if progress else None

    corpora = CorpusCache(progress=bar("corpus"))
    if run_dirs:
        eval_set, per_run = eval_sets_for_runs(run_dirs, data_spec=data_spec, corpora=corpora)
    else:
        from bytelm.config import load_config  # noqa: PLC0415

        eval_set = EvalSet.from_corpus(corpora.get(load_config(None, [f"data.source={data_spec}"] if data_spec else [])))
        per_run = {}
    external_results = [read_external_scores(path, eval_set, name=name) for name, path in parsed]
    results = []
    for run_dir, name in zip(run_dirs, names):
        results.append(evaluate_run(run_dir, eval_set, name=name, corpus=per_run[str(run_dir)], progress=bar(f"eval {name}")))
    report = build_report(eval_set, results + external_results, unigram_baselines(eval_set))
    if json_path:
        write_report_json(report, json_path)
    return report
