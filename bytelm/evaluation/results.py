"""What the evaluator produces: the evaluation set and one result row per model.

A leaf module of :mod:`bytelm.evaluation` (it imports only the arithmetic of :mod:`~bytelm.bpb` and the
segment fingerprint of :mod:`bytelm.data.split`), shared by the evaluator, outside scores
(:mod:`bytelm.evaluation.external`) and reports (:mod:`bytelm.evaluation.report`). The protocol behind the
numbers is docs/evaluation.md.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from bytelm.bpb import SegmentScores, breakdown, top_directory
from bytelm.data.corpus import Corpus
from bytelm.data.split import EVAL_PROTOCOL, Segment, fingerprint_segments
from bytelm.errors import UserError


@dataclasses.dataclass
class EvalSet:
    """The scored held-out bytes of a corpus: segments in canonical order and their fingerprint."""

    corpus: Corpus
    segments: list[Segment]
    data: list[bytes]
    fingerprint: str

    @classmethod
    def from_corpus(cls, corpus, split: str = "heldout") -> EvalSet:
        """The held-out segments (what reports score), or ``split="validation"``: the validation
        documents cut the same way (what hyperparameters are selected on)."""
        if split == "heldout":
            return cls(corpus, list(corpus.segments), corpus.segment_data(), corpus.fingerprint)
        if split != "validation":
            raise ValueError(f"split must be 'heldout' or 'validation', got {split!r}")
        segments = list(corpus.validation_segments)
        if not segments:
            raise UserError(
                f"the corpus {corpus.spec} has no validation split: set data.validation_fraction > 0 (e.g. "
                "0.05)"
            )
        data = corpus.segment_data(segments)
        return cls(corpus, segments, data, fingerprint_segments(data))

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
            "protocol": EVAL_PROTOCOL,
            "eval_segments": len(self.segments),
            "eval_bytes": self.n_bytes,
            "segment_bytes": s["segment_bytes"],
            "max_eval_bytes": s["max_eval_bytes"],
            "heldout_documents": s["heldout_documents"],
            "scored_documents": len(
                {seg.doc for seg in self.segments}
            ),  # those the segments reach (max_eval_bytes)
            "heldout_groups": len(set(self.groups)),
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
    inference_flops_per_byte: float | None = None  # the model's own forward FLOPs per byte
    entropy_inference_flops_per_byte: float | None = None  # an entropy model run in its input pipeline (BLT)
    pipeline_stats: dict | None = (
        None  # rates from its input pipeline on the eval set (BLT: patch-slot overflow)
    )
    # the compute ledger (bytelm/ledger.py): ``flops`` is the model's own training; auxiliary
    # is what it needs besides (BLT: its entropy model's training and forward passes), named in
    # ``auxiliary``; None when unknown (an outside model, a converted checkpoint)
    flops_auxiliary: float | None = None
    auxiliary: dict | None = None
    # the scores of the model's other seeds on the same segments (bytelm compare --seeds K): the
    # report's BPB is the mean over all seeds and its interval folds seed variance in
    seed_scores: list[SegmentScores] | None = None
    # a run scored before it finished: "step 211 of 4000, stopped" (None: finished, or not a run)
    partial: str | None = None
    # a family that measures what its steps spend (H-Net): ``flops`` is the measured figure, this the
    # planned one (at its target rates); None for every other row
    flops_planned: float | None = None

    @property
    def flops_total(self) -> float | None:
        if self.flops is None or self.flops_auxiliary is None:
            return None
        return self.flops + self.flops_auxiliary

    @property
    def total_inference_flops_per_byte(self) -> float | None:
        if self.inference_flops_per_byte is None:
            return None
        return self.inference_flops_per_byte + (self.entropy_inference_flops_per_byte or 0.0)

    @property
    def all_scores(self) -> list[SegmentScores]:
        return [self.scores, *(self.seed_scores or [])]

    @property
    def mean_scores(self) -> SegmentScores:
        """Per segment the mean nats over the model's seeds (its own scores with one seed)."""
        if not self.seed_scores:
            return self.scores
        nats = np.mean([s.nats for s in self.all_scores], axis=0)
        return SegmentScores(nats, self.scores.nbytes, self.scores.global_steps)

    @property
    def bpb(self) -> float:
        """BPB on the held-out bytes, the mean over the model's seeds when it has several."""
        return self.mean_scores.bpb

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
            "nats": self.mean_scores.total_nats,
            "bytes": self.scores.total_bytes,
            "segments": len(self.scores.nats),
            "params": self.params,
            "flops": self.flops,
            "flops_own": self.flops,
            "flops_planned": self.flops_planned,
            "flops_auxiliary": self.flops_auxiliary,
            "flops_total": self.flops_total,
            "auxiliary_flops": self.auxiliary,
            "train_flops_per_byte": self.train_flops_per_byte,
            "bytes_seen": self.bytes_seen,
            "inference_flops_per_byte": self.inference_flops_per_byte,
            "entropy_inference_flops_per_byte": self.entropy_inference_flops_per_byte,
            "total_inference_flops_per_byte": self.total_inference_flops_per_byte,
            "pipeline_stats": self.pipeline_stats,
            "mean_bytes_per_global_step": self.mean_bytes_per_global_step,
            "wall_s": self.wall_s,
            "fingerprint": self.fingerprint,
            "note": self.note,
            "seeds": len(self.all_scores),
            "complete": None if self.kind != "run" else self.partial is None,
            "partial": self.partial,
            "groups": breakdown(self.mean_scores, eval_set.groups, self.global_steps),
            "dirs": breakdown(self.mean_scores, eval_set.dirs, self.global_steps),
        }
