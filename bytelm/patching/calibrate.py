"""Choose the global entropy threshold that gives a target mean patch length.

The mean patch length of a sample is ``real positions / patches`` (BOS positions and their
one-position patches included, as the BLT model sees them). It is a non-decreasing step function
of the threshold theta that only changes where theta crosses an entropy value of the sample, so
:func:`calibrate_threshold` bisects over the sorted distinct entropies (exact, about
``log2(#values)`` evaluations) and returns a threshold half-way between two neighbouring values,
rounded to float32 so that float32 and float64 comparisons agree.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from bytelm.constants import PAD_ID
from bytelm.errors import UserError
from bytelm.patching.patchers import entropy_starts, real_lengths

log = logging.getLogger(__name__)


def mean_patch_length(starts, n_real) -> float:
    """Real positions divided by patches over a whole sample (rows pooled)."""
    starts_BxL = np.atleast_2d(np.asarray(starts, dtype=bool))
    n_B = np.atleast_1d(np.asarray(n_real))
    L = starts_BxL.shape[1]
    patches = int((starts_BxL & (np.arange(L)[None, :] < n_B[:, None])).sum())
    return float(n_B.sum()) / max(patches, 1)


def _stack_rows(rows, fill, dtype) -> np.ndarray:
    if isinstance(rows, np.ndarray):
        return np.atleast_2d(rows)
    rows = [np.asarray(r) for r in rows]
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), fill, dtype=dtype)
    for b, r in enumerate(rows):
        out[b, : len(r)] = r
    return out


def calibrate_threshold(
    entropy_rows: np.ndarray | Sequence[np.ndarray],
    ids_rows: np.ndarray | Sequence[np.ndarray],
    target_mean_patch_len: float,
    *,
    max_patch_len: int | None = None,
    monotonic_threshold: float | None = None,
    tol: float = 0.02,
    strict: bool = True,
) -> tuple[float, float]:
    """Find theta so that :func:`entropy_starts` with ``threshold=theta`` (and the given
    ``monotonic_threshold`` and ``max_patch_len``) gives a mean patch length within ``tol``
    (relative) of the target on the sample. Returns ``(theta, achieved_mean_patch_len)``.

    Rows are ``(B, L)`` arrays or lists of 1-D rows of any lengths (trailing PAD ids are padding).
    Raises :class:`UserError` for a target below 1, for a target outside the reachable range
    (1 up to the mean with the global rule switched off), and when the sample is too small to
    land within ``tol`` (the mean jumps over the target between two neighbouring entropies);
    with ``strict=False`` that last case logs a warning and returns the closest mean instead.
    """
    target = float(target_mean_patch_len)
    if not np.isfinite(target) or target < 1.0:
        raise UserError(
            f"target mean patch length {target_mean_patch_len} is below 1: a patch holds at least one byte; "
            f"use a target >= 1 (BLT uses 4 to 8)"
        )
    if not 0 < tol < 1:
        raise ValueError(f"tol is a relative tolerance in (0, 1), got {tol}")
    ids_BxL = _stack_rows(ids_rows, PAD_ID, np.int32)
    h_BxL = _stack_rows(entropy_rows, 0.0, np.float32)
    if h_BxL.shape != ids_BxL.shape:
        raise ValueError(f"entropy rows {h_BxL.shape} and id rows {ids_BxL.shape} differ in shape")
    if not np.issubdtype(h_BxL.dtype, np.floating):
        h_BxL = h_BxL.astype(np.float32)
    n_B = real_lengths(ids_BxL)
    if n_B.sum() == 0:
        raise UserError("the calibration sample is empty (all rows are padding); give it some text")
    # Only H[i] with i + 1 a real position can create a boundary.
    matters_BxL = np.arange(ids_BxL.shape[1])[None, :] < (n_B - 1)[:, None]
    values = np.unique(h_BxL[matters_BxL])
    if not np.isfinite(values).all():
        raise ValueError("entropies must be finite on the real positions of the calibration sample")

    def threshold(k: int) -> float:
        """k = -1: below every value (all boundaries); k = m - 1: above every value (global rule off)."""
        dt = h_BxL.dtype.type
        if values.size == 0:
            return 0.0
        if k < 0:
            return float(dt(values[0] - 1.0))
        if k >= values.size - 1:
            return float(dt(values[-1] + 1.0))
        lo, hi = float(values[k]), float(values[k + 1])
        mid = dt((lo + hi) / 2)
        return float(mid if lo <= float(mid) < hi else dt(lo))

    def mean_at(k: int) -> float:
        starts = entropy_starts(
            ids_BxL,
            h_BxL,
            threshold=threshold(k),
            monotonic_threshold=monotonic_threshold,
            max_patch_len=max_patch_len,
        )
        return mean_patch_length(starts, n_B)

    def close(m: float) -> bool:
        return abs(m - target) <= tol * target

    k_lo, k_hi = -1, values.size - 1
    m_lo, m_hi = mean_at(k_lo), mean_at(k_hi)
    if target > m_hi and not close(m_hi) or target < m_lo and not close(m_lo):
        limits = []
        if max_patch_len is not None:
            limits.append(f"max_patch_len {max_patch_len}")
        if monotonic_threshold is not None:
            limits.append(f"monotonic_threshold {monotonic_threshold}")
        limits.append("the BOS patches")
        raise UserError(
            f"target mean patch length {target} cannot be reached on this sample: the reachable range is "
            f"[{m_lo:.3f}, {m_hi:.3f}] (the upper end is set by {' and '.join(limits)}, with the global "
            "threshold switched off); choose a target inside it, or raise max_patch_len / the monotonic "
            "threshold, or calibrate on longer rows"
        )
    # Bisection: the smallest k with mean_at(k) >= target (mean_at is non-decreasing in k).
    while k_hi - k_lo > 1:
        k_mid = (k_lo + k_hi) // 2
        m_mid = mean_at(k_mid)
        if m_mid >= target:
            k_hi, m_hi = k_mid, m_mid
        else:
            k_lo, m_lo = k_mid, m_mid
    if m_lo >= target:  # only when the lowest threshold already reaches it (target ~ 1)
        k_hi, m_hi = k_lo, m_lo
    k, achieved = (k_hi, m_hi) if abs(m_hi - target) <= abs(m_lo - target) else (k_lo, m_lo)
    if not close(achieved) and not strict:
        log.warning(
            "target mean patch length %.4g is not reachable within %.0f%% on this sample (the mean jumps "
            "from %.3f to %.3f); using the closest, %.4f",
            target,
            100 * tol,
            m_lo,
            m_hi,
            achieved,
        )
    elif not close(achieved):
        raise UserError(
            f"target mean patch length {target} cannot be met within {tol:.0%} on this sample: the mean "
            f"jumps from {m_lo:.3f} to {m_hi:.3f} between two neighbouring entropy values; calibrate on a "
            "larger sample (more or longer rows) or accept a target near one of those values"
        )
    theta = threshold(k)
    log.info(
        "calibrated entropy threshold %.6g: mean patch length %.4f (target %.4g)", theta, achieved, target
    )
    return theta, achieved
