"""Static-shape patch layouts for the BLT model: patch lengths per row and patch ids per position.

``lengths_BxP`` (int32) holds each row's patch lengths in order, followed by zeros up to the
fixed number of patches ``P = max_patches``; the nonzero lengths sum to the row's real length,
so every real position lies in exactly one patch and no byte is ever dropped.
"""

from __future__ import annotations

import numpy as np

from bytelm.errors import UserError


class PatchOverflowError(UserError):
    """A row needs more patches than the model's fixed maximum (``model.max_patches``)."""

    def __init__(self, row: int, needed: int, max_patches: int, n_rows_over: int = 1):
        self.row, self.needed, self.max_patches = row, needed, max_patches
        others = f" ({n_rows_over} rows of this batch overflow)" if n_rows_over > 1 else ""
        super().__init__(
            f"row {row} needs {needed} patches but the model has at most max_patches = "
            f"{max_patches}{others}; bytes are never dropped, so raise model.max_patches (to at least "
            f"{needed}), or make patches longer: a larger target mean patch length (a higher entropy "
            "threshold) or a larger patch size"
        )


def _n_real(n_real, shape: tuple[int, int]) -> np.ndarray:
    B, L = shape
    a = np.asarray(n_real)
    if a.ndim == 2:  # a boolean mask of the real prefix
        if a.shape != shape:
            raise ValueError(f"valid mask shape {a.shape} does not match starts shape {shape}")
        n_B = a.astype(bool).sum(axis=1)
        if not np.array_equal(a.astype(bool), np.arange(L)[None, :] < n_B[:, None]):
            raise ValueError("the valid mask must be a prefix of each row (real positions, then padding)")
        return n_B.astype(np.int64)
    n_B = np.broadcast_to(a.astype(np.int64), (B,))
    if (n_B < 0).any() or (n_B > L).any():
        raise ValueError(f"real lengths must lie in [0, {L}], got {n_B.tolist()}")
    return n_B


def starts_to_lengths(starts_BxL, n_real, max_patches: int) -> np.ndarray:
    """Patch lengths ``int32[B, max_patches]`` from boolean starts.

    ``n_real`` is each row's real length (``int[B]``, or a boolean ``[B, L]`` prefix mask); only
    starts inside the real prefix count, and ``starts[b, 0]`` must be True when ``n_real[b] > 0``.
    Raises :class:`PatchOverflowError` when a row needs more than ``max_patches`` patches.

    >>> starts_to_lengths(np.array([[1, 1, 0, 0, 1, 0]], bool), [5], 4)
    array([[1, 3, 1, 0]], dtype=int32)
    """
    starts_BxL = np.asarray(starts_BxL, dtype=bool)
    if starts_BxL.ndim != 2:
        raise ValueError(f"starts must be (B, L), got shape {starts_BxL.shape}")
    B, L = starts_BxL.shape
    P = int(max_patches)
    if P < 1:
        raise ValueError(f"max_patches must be >= 1, got {max_patches}")
    n_B = _n_real(n_real, (B, L))
    valid_BxL = np.arange(L)[None, :] < n_B[:, None]
    bad = np.flatnonzero((n_B > 0) & ~starts_BxL[:, 0])
    if bad.size:
        raise ValueError(f"row {bad[0]} has real positions but no patch start at position 0")
    starts_BxL = starts_BxL & valid_BxL
    needed_B = starts_BxL.sum(axis=1)
    over = np.flatnonzero(needed_B > P)
    if over.size:
        worst = over[np.argmax(needed_B[over])]
        raise PatchOverflowError(int(worst), int(needed_B[worst]), P, int(over.size))
    pid_BxL = np.cumsum(starts_BxL, axis=1) - 1
    flat = (np.arange(B)[:, None] * P + pid_BxL)[valid_BxL]
    return np.bincount(flat, minlength=B * P).reshape(B, P).astype(np.int32)


def cap_starts(starts_BxL, n_real, max_patches: int) -> tuple[np.ndarray, np.ndarray]:
    """The causal slot rule: once a row has used ``max_patches`` patches, no new patch starts;
    the rest of the row joins the last patch. ``n_real`` is each row's real length (as for
    :func:`starts_to_lengths`). Returns ``(capped starts, overflow_B)``, where ``overflow_B`` counts
    the real positions of each row from its first dropped start on (0 for a row that fits). The
    decision at position ``i`` looks only at the starts before it, so the patches of a prefix never
    depend on what follows it.

    >>> capped, over = cap_starts(np.array([[1, 1, 0, 1, 1, 0, 0]], bool), [6], 3)
    >>> capped.astype(int), over
    (array([[1, 1, 0, 1, 0, 0, 0]]), array([2]))
    """
    starts_BxL = np.asarray(starts_BxL, dtype=bool)
    if starts_BxL.ndim != 2:
        raise ValueError(f"starts must be (B, L), got shape {starts_BxL.shape}")
    if max_patches < 1:
        raise ValueError(f"max_patches must be >= 1, got {max_patches}")
    B, L = starts_BxL.shape
    n_B = _n_real(n_real, (B, L))
    kept_BxL = starts_BxL & (np.cumsum(starts_BxL, axis=1) <= max_patches)
    dropped_BxL = starts_BxL & ~kept_BxL & (np.arange(L)[None, :] < n_B[:, None])
    first_B = np.where(dropped_BxL.any(axis=1), np.argmax(dropped_BxL, axis=1), n_B)
    return kept_BxL, np.maximum(n_B - first_B, 0).astype(np.int64)


def patch_counts(lengths_BxP) -> np.ndarray:
    """Number of real (nonzero) patches per row."""
    return (np.asarray(lengths_BxP) > 0).sum(axis=-1)


def lengths_to_patch_ids(lengths_BxP, L: int, *, fill: int | None = None) -> np.ndarray:
    """Patch index of every position, ``int32[B, L]``.

    Positions past a row's covered length ``sum(lengths[b])`` (the padding tail) get ``fill``;
    by default ``fill`` is the row's number of real patches (one past its last patch, which is a
    zero-length patch whenever the row uses fewer than ``P`` patches). Lengths must be
    non-negative, zero-padded at the end, and sum to at most ``L``.

    >>> lengths_to_patch_ids(np.array([[1, 3, 1, 0]]), 7)
    array([[0, 1, 1, 1, 2, 3, 3]], dtype=int32)
    """
    lengths_BxP = np.asarray(lengths_BxP)
    if lengths_BxP.ndim != 2:
        raise ValueError(f"lengths must be (B, P), got shape {lengths_BxP.shape}")
    if (lengths_BxP < 0).any():
        raise ValueError("patch lengths must be >= 0")
    positive_BxP = lengths_BxP > 0
    if (positive_BxP[:, 1:] & ~positive_BxP[:, :-1]).any():
        raise ValueError("patch lengths must be zero-padded at the end (no nonzero length after a zero)")
    B, P = lengths_BxP.shape
    cum_BxP = np.cumsum(lengths_BxP, axis=1, dtype=np.int64)
    total_B = cum_BxP[:, -1] if P else np.zeros(B, np.int64)
    if (total_B > L).any():
        raise ValueError(f"patch lengths cover {int(total_B.max())} positions, more than L = {L}")
    marks = np.zeros((B, L + 1), dtype=np.int32)  # a 1 where a patch starts (one spare column)
    rows, cols = np.nonzero(positive_BxP)
    marks[rows, (cum_BxP - lengths_BxP)[rows, cols]] = 1
    pid_BxL = np.cumsum(marks[:, :L], axis=1) - 1
    tail_BxL = np.arange(L)[None, :] >= total_B[:, None]
    fill_B = patch_counts(lengths_BxP) if fill is None else np.full(B, fill)
    return np.where(tail_BxL, fill_B[:, None], pid_BxL).astype(np.int32)
