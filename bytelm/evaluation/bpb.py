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
    score_rows: Callable[[dict], tuple[np.ndarray, np.ndarray]],
    batches: Iterable[tuple[dict, int]],
    segment_lengths: Sequence[int],
) -> SegmentScores:
    """Run ``score_rows(batch) -> (nats_B, bytes_B)`` over ``batches`` of ``(batch, n_real_rows)``.

    Rows beyond ``n_real_rows`` are padding and dropped. Raises ``RuntimeError`` if the bytes a
    model scored for a segment differ from the segment's length.
    """
    nats, nbytes = [], []
    for batch, n_real in batches:
        row_nats, row_bytes = score_rows(batch)
        nats.append(np.asarray(row_nats, np.float64)[:n_real])
        nbytes.append(np.rint(np.asarray(row_bytes, np.float64)[:n_real]).astype(np.int64))
    scores = SegmentScores(np.concatenate(nats) if nats else np.zeros(0), np.concatenate(nbytes) if nbytes else np.zeros(0, np.int64))
    expected = np.asarray(segment_lengths, np.int64)
    if scores.nbytes.shape != expected.shape or not np.array_equal(scores.nbytes, expected):
        bad = np.flatnonzero(scores.nbytes != expected)[:5] if scores.nbytes.shape == expected.shape else []
        raise RuntimeError(
            f"scored bytes differ from segment lengths (protocol violation): {len(scores.nbytes)} scored segments "
            f"vs {len(expected)} expected; first mismatches at {list(bad)}"
        )
    return scores
