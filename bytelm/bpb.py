"""The evaluation protocol: every model scores the same segments, each independently from BOS.

BPB = total NLL in nats / (segment bytes x ln 2). Models report, per segment, the nats of its
scored positions and the bytes those positions cover; the protocol checks that the covered bytes
equal the segment's own byte count (so a masking or padding bug cannot change the denominator).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

LN2 = math.log(2.0)


def bits_per_byte(nats: float, n_bytes: float) -> float:
    """``nats / (n_bytes * ln 2)``."""
    if n_bytes <= 0:
        raise ValueError(f"cannot compute bits per byte over {n_bytes} bytes")
    return float(nats) / (float(n_bytes) * LN2)


@dataclasses.dataclass
class SegmentScores:
    """Per-segment nats and bytes, in segment order."""

    nats: np.ndarray  # float64 (n_segments,)
    nbytes: np.ndarray  # int64 (n_segments,)
    # float64 (n_segments,): the positions of the model's main network for each segment, where the
    # model decides them (H-Net's chunks); None: the family's task counts them from its batches
    global_steps: np.ndarray | None = None

    @property
    def total_nats(self) -> float:
        return float(self.nats.sum())

    @property
    def total_bytes(self) -> int:
        return int(self.nbytes.sum())

    @property
    def bpb(self) -> float:
        return bits_per_byte(self.total_nats, self.total_bytes)

    def by_group(self, groups: Sequence[str]) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for g in dict.fromkeys(groups):
            sel = np.asarray([x == g for x in groups])
            nats, nb = float(self.nats[sel].sum()), int(self.nbytes[sel].sum())
            out[g] = {"nats": nats, "bytes": nb, "bpb": bits_per_byte(nats, nb) if nb else float("nan")}
        return out


def score_segments(
    score_rows: Callable[[dict], tuple],
    batches: Iterable[tuple[dict, int]],
    segment_lengths: Sequence[int],
) -> SegmentScores:
    """Run ``score_rows(batch) -> (nats_B, bytes_B[, global_steps_B])`` over ``batches`` of
    ``(batch, n_real_rows)`` (the third, where a model counts its main network's positions itself).

    Rows beyond ``n_real_rows`` are padding and dropped. Raises ``RuntimeError`` if the bytes a
    model scored for a segment differ from the segment's length.
    """
    nats, nbytes, steps = [], [], []
    for batch, n_real in batches:
        row = tuple(score_rows(batch))
        row_nats, row_bytes, row_steps = row[0], row[1], row[2:]
        nats.append(np.asarray(row_nats, np.float64)[:n_real])
        nbytes.append(np.rint(np.asarray(row_bytes, np.float64)[:n_real]).astype(np.int64))
        if row_steps and row_steps[0] is not None:
            steps.append(np.asarray(row_steps[0], np.float64)[:n_real])
    scores = SegmentScores(
        np.concatenate(nats) if nats else np.zeros(0),
        np.concatenate(nbytes) if nbytes else np.zeros(0, np.int64),
        np.concatenate(steps) if steps and len(steps) == len(nats) else None,
    )
    expected = np.asarray(segment_lengths, np.int64)
    if scores.nbytes.shape != expected.shape or not np.array_equal(scores.nbytes, expected):
        bad = (
            list(np.flatnonzero(scores.nbytes != expected)[:5])
            if scores.nbytes.shape == expected.shape
            else []
        )
        raise RuntimeError(
            f"scored bytes differ from segment lengths (protocol violation): {len(scores.nbytes)} scored "
            f"segments vs {len(expected)} expected; first mismatches at {list(bad)}"
        )
    return scores


# -- breakdowns -----------------------------------------------------------------------------
def top_directory(name: str) -> str:
    """The first directory of a document name (``"de/doc1.txt" -> "de"``; ``"<top>"`` for none).

    The same grouping as ``bytelm tokenizer stats --group-by dir``: one group per language
    directory in a multilingual corpus, one per top-level package for ``stdlib``.
    """
    return name.split("/", 1)[0] if "/" in name else "<top>"


def breakdown(
    scores: SegmentScores, labels: Sequence[str], global_steps: np.ndarray | None = None
) -> dict[str, dict]:
    """Per label (in first-seen order): ``segments``, ``nats``, ``bytes``, ``bpb`` and, when the
    per-segment ``global_steps`` are given, ``global_steps`` and ``mean_bytes_per_global_step``.

    >>> s = SegmentScores(np.array([8 * LN2, 4 * LN2, 2 * LN2]), np.array([1, 2, 2]))
    >>> {k: v["bpb"] for k, v in breakdown(s, ["a", "b", "a"]).items()}
    {'a': 3.3333333333333335, 'b': 2.0}
    """
    if len(labels) != len(scores.nats):
        raise ValueError(f"{len(labels)} labels for {len(scores.nats)} scored segments")
    label_of = np.asarray(list(labels), dtype=object)  # per segment
    out: dict[str, dict] = {}
    for label in dict.fromkeys(labels):
        sel = label_of == label
        nats, nbytes = float(scores.nats[sel].sum()), int(scores.nbytes[sel].sum())
        row = {
            "segments": int(sel.sum()),
            "nats": nats,
            "bytes": nbytes,
            "bpb": bits_per_byte(nats, nbytes) if nbytes else float("nan"),
        }
        if global_steps is not None:
            steps = float(np.asarray(global_steps, np.float64)[sel].sum())
            row["global_steps"] = steps
            row["mean_bytes_per_global_step"] = nbytes / steps if steps else float("nan")
        out[label] = row
    return out


# -- reference models -------------------------------------------------------------------------
def byte_counts(chunks: Iterable[bytes | np.ndarray]) -> np.ndarray:
    """``int64[256]`` byte histogram of ``chunks``."""
    counts = np.zeros(256, np.int64)
    for c in chunks:
        a = np.frombuffer(c, np.uint8) if isinstance(c, bytes | bytearray) else np.asarray(c, np.uint8)
        counts += np.bincount(a, minlength=256)
    return counts


@dataclasses.dataclass(frozen=True)
class UnigramByteModel:
    """A context-free byte model: ``log p(b) = log_softmax(logits)[b]`` for every position.

    The reference rows of a report: :meth:`fit` on the eval bytes themselves gives their unigram
    entropy (the best any context-free model can do there), :meth:`fit` on the train split with
    add-``alpha`` smoothing a genuine held-out unigram model, :meth:`uniform` exactly 8 BPB. It
    scores through :func:`score_segments`, like every trained model.
    """

    logits: np.ndarray  # float64 (256,)

    @classmethod
    def uniform(cls) -> UnigramByteModel:
        return cls(np.zeros(256))

    @classmethod
    def fit(cls, counts: np.ndarray, *, alpha: float = 0.0) -> UnigramByteModel:
        """Maximum-likelihood (``alpha = 0``) or add-``alpha`` probabilities from byte ``counts``;
        unseen bytes get ``-inf`` logits when ``alpha = 0``."""
        c = np.asarray(counts, np.float64) + alpha
        if c.shape != (256,) or c.sum() <= 0:
            raise ValueError(f"need 256 non-negative byte counts with a positive sum, got shape {c.shape}")
        with np.errstate(divide="ignore"):
            return cls(np.log(c))

    @property
    def log_probs(self) -> np.ndarray:
        finite = self.logits[np.isfinite(self.logits)]
        lse = finite.max() + np.log(np.exp(finite - finite.max()).sum())
        return self.logits - lse

    def score(self, segments: Sequence[bytes], batch_size: int = 64) -> SegmentScores:
        nll_256 = -self.log_probs

        def batches():
            for lo in range(0, len(segments), batch_size):
                chunk = list(segments[lo : lo + batch_size])
                yield chunk, len(chunk)

        def rows(chunk):
            nats = [float(nll_256[np.frombuffer(s, np.uint8)].sum()) for s in chunk]
            return np.asarray(nats), np.asarray([len(s) for s in chunk])

        return score_segments(rows, batches(), [len(s) for s in segments])
