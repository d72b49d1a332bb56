"""Patch boundaries as boolean ``starts`` arrays: static, space-like and entropy patchers.

Every patcher takes model ids (``byte + 4``, control ids below 4; :mod:`bytelm.constants`) as a
row ``ids_L`` or a batch ``ids_BxL`` and returns a boolean array of the same shape:
``starts[i]`` is True when a patch starts at position ``i``.

Conventions (the interface the BLT model, trainer and evaluator rely on):

- **Real prefix.** Trailing PAD ids are padding: a row's real length ``n`` is the index of its last
  non-PAD id plus one (:func:`real_lengths`). Positions ``>= n`` belong to no patch and their
  ``starts`` are False. A PAD followed by a non-PAD id is a real position.
- ``starts[0]`` and ``starts[1]`` are True whenever the row is that long: the first position is
  a patch of its own (an all-PAD row has no patch at all).
- **BOS rule** ("the first patch is BOS alone"): where ``ids[i] == BOS``, ``starts[i]`` and
  ``starts[i + 1]`` are True (inside the real prefix).
- **Causality.** ``starts[i]`` depends only on ``ids[:i]`` and ``entropies[:i]`` (plus
  ``ids[i] == BOS``), so the boundaries of a prefix ``x[:k]`` are exactly the boundaries of ``x``
  inside ``x[:k]``: every patcher here is prefix-stable.
"""

from __future__ import annotations

import numpy as np

from bytelm.constants import BOS_ID, BYTE_OFFSET, PAD_ID

# A byte is "space-like" when it is not an ASCII letter or digit and not a UTF-8 continuation
# byte (0x80-0xBF); every control id (PAD, BOS, EOS, SEP) is space-like too.
_SPACE_LIKE_BYTE = np.ones(256, dtype=bool)
for _lo, _hi in ((ord("0"), ord("9")), (ord("A"), ord("Z")), (ord("a"), ord("z")), (0x80, 0xBF)):
    _SPACE_LIKE_BYTE[_lo : _hi + 1] = False


def _as_batch(a) -> tuple[np.ndarray, bool]:
    a = np.asarray(a)
    if a.ndim == 1:
        return a[None], True
    if a.ndim != 2:
        raise ValueError(f"expected a row (L,) or a batch (B, L), got an array of shape {a.shape}")
    return a, False


def _unbatch(a: np.ndarray, squeeze: bool) -> np.ndarray:
    return a[0] if squeeze else a


def real_lengths(ids) -> np.ndarray:
    """Real (non-padding) length of each row: index of the last non-PAD id + 1.

    >>> real_lengths(np.array([[1, 72, 73, 0, 0], [1, 72, 0, 73, 0]]))
    array([3, 4])
    """
    ids_BxL, squeeze = _as_batch(ids)
    L = ids_BxL.shape[1]
    nonpad_BxL = ids_BxL != PAD_ID
    last_from_end_B = np.argmax(nonpad_BxL[:, ::-1], axis=1)
    n_B = np.where(nonpad_BxL.any(axis=1), L - last_from_end_B, 0)
    return _unbatch(n_B.astype(np.int64), squeeze)


def valid_mask(ids) -> np.ndarray:
    """``True`` on the real prefix of each row (see :func:`real_lengths`)."""
    ids_BxL, squeeze = _as_batch(ids)
    n_B = real_lengths(ids_BxL)
    return _unbatch(np.arange(ids_BxL.shape[1])[None, :] < n_B[:, None], squeeze)


def _finish(starts_BxL: np.ndarray, ids_BxL: np.ndarray) -> np.ndarray:
    """Add the BOS rule and the forced starts at 0 and 1, and clear the padding tail.

    Position 0 is a patch of its own in every row, as in the BLT reference (which always starts
    patches at positions 0 and 1): in an evaluation row it is the BOS; in a training window cut
    from the middle of a document it is an arbitrary byte, and forcing it alone means every later
    target has a whole earlier patch to read from the global model (docs/architecture.md)."""
    bos_BxL = ids_BxL == BOS_ID
    starts_BxL = starts_BxL | bos_BxL
    starts_BxL[:, 1:] |= bos_BxL[:, :-1]
    starts_BxL[:, : min(2, starts_BxL.shape[1])] = True
    return starts_BxL & valid_mask(ids_BxL)


def static_starts(ids, patch_size: int) -> np.ndarray:
    """A patch starts every ``patch_size`` positions from 0, plus the BOS rule.

    >>> static_starts(np.array([1, 72, 105, 33, 36]), 3).astype(int)
    array([1, 1, 0, 1, 0])
    """
    if int(patch_size) < 1:
        raise ValueError(f"patch_size must be >= 1, got {patch_size}")
    ids_BxL, squeeze = _as_batch(ids)
    starts_BxL = np.zeros(ids_BxL.shape, dtype=bool)
    starts_BxL[:, :: int(patch_size)] = True
    return _unbatch(_finish(starts_BxL, ids_BxL), squeeze)


def space_like(ids) -> np.ndarray:
    """Boolean mask of space-like ids: control ids, and bytes that are neither ASCII
    alphanumeric nor UTF-8 continuation bytes (0x80-0xBF). UTF-8 lead bytes (0xC0-0xFF) are
    space-like under this rule (as in SpaceByte), so a patch may start inside a character."""
    ids = np.asarray(ids)
    byte = np.clip(ids - BYTE_OFFSET, 0, 255)
    return (ids < BYTE_OFFSET) | _SPACE_LIKE_BYTE[byte]


def space_starts(ids) -> np.ndarray:
    """A patch starts after every space-like id (:func:`space_like`), plus the BOS rule.

    >>> ids = np.array([1] + [b + 4 for b in b"ab cd"])
    >>> space_starts(ids).astype(int)  # BOS | a b ' ' | c d
    array([1, 1, 0, 0, 1, 0])
    """
    ids_BxL, squeeze = _as_batch(ids)
    starts_BxL = np.zeros(ids_BxL.shape, dtype=bool)
    starts_BxL[:, 1:] = space_like(ids_BxL[:, :-1])
    return _unbatch(_finish(starts_BxL, ids_BxL), squeeze)


def apply_max_len(starts, max_patch_len: int | None, *, valid=None) -> np.ndarray:
    """Split patches longer than ``max_patch_len``: scanning left to right, a patch that reaches
    that length forces a start at the next position. ``valid`` (a boolean mask of the real
    prefix, default: everything) keeps the padding tail free of starts.

    >>> apply_max_len(np.array([1, 0, 0, 0, 0, 1, 0], bool), 2).astype(int)
    array([1, 0, 1, 0, 1, 1, 0])
    """
    starts_BxL, squeeze = _as_batch(np.asarray(starts, dtype=bool))
    if max_patch_len is None:
        return _unbatch(starts_BxL.copy(), squeeze)
    m = int(max_patch_len)
    if m < 1:
        raise ValueError(f"max_patch_len must be >= 1 (or None for no limit), got {max_patch_len}")
    L = starts_BxL.shape[1]
    pos_L = np.arange(L)
    # Offset of each position from the last original start at or before it; the forced starts
    # are at offsets m, 2m, ... (identical to the left-to-right scan).
    last_start_BxL = np.maximum.accumulate(np.where(starts_BxL, pos_L[None, :], 0), axis=1)
    offset_BxL = pos_L[None, :] - last_start_BxL
    out_BxL = starts_BxL | ((offset_BxL > 0) & (offset_BxL % m == 0))
    if valid is not None:
        valid_BxL, _ = _as_batch(np.asarray(valid, dtype=bool))
        out_BxL &= valid_BxL
    return _unbatch(out_BxL, squeeze)


def entropy_starts(
    ids,
    entropies,
    *,
    threshold: float | None = None,
    monotonic_threshold: float | None = None,
    max_patch_len: int | None = None,
) -> np.ndarray:
    """Entropy patching (BLT). ``entropies[i]`` is the entropy (nats) of the entropy model's
    next-id distribution after position ``i``. A patch starts at ``i + 1`` when

    - global rule: ``H[i] > threshold``, or
    - monotonic rule: ``H[i] - H[i - 1] > monotonic_threshold`` (``i >= 1``),

    (either rule, or both OR-ed), plus the BOS rule; then :func:`apply_max_len`.
    Comparisons happen in the entropies' dtype (float32 from :class:`EntropyModel`).

    >>> H = np.array([0.5, 3.0, 1.0, 1.2, 2.9, 0.1], np.float32)
    >>> entropy_starts(np.array([1, 5, 6, 7, 8, 9]), H, threshold=2.0).astype(int)
    array([1, 1, 1, 0, 0, 1])
    """
    if threshold is None and monotonic_threshold is None:
        raise ValueError("entropy_starts needs threshold, monotonic_threshold, or both")
    ids_BxL, squeeze = _as_batch(ids)
    h_BxL, _ = _as_batch(entropies)
    if h_BxL.shape != ids_BxL.shape:
        raise ValueError(f"entropies shape {np.shape(entropies)} does not match ids shape {np.shape(ids)}")
    if not np.issubdtype(h_BxL.dtype, np.floating):
        h_BxL = h_BxL.astype(np.float32)
    valid_BxL = valid_mask(ids_BxL)
    if not np.isfinite(h_BxL[valid_BxL]).all():
        raise ValueError("entropies must be finite on the real (non-padding) positions")
    boundary_BxL = np.zeros(ids_BxL.shape, dtype=bool)  # boundary_BxL[:, i]: a start at i + 1
    if threshold is not None:
        boundary_BxL |= h_BxL > h_BxL.dtype.type(threshold)
    if monotonic_threshold is not None:
        boundary_BxL[:, 1:] |= (h_BxL[:, 1:] - h_BxL[:, :-1]) > h_BxL.dtype.type(monotonic_threshold)
    starts_BxL = np.zeros(ids_BxL.shape, dtype=bool)
    starts_BxL[:, 1:] = boundary_BxL[:, :-1]
    starts_BxL = apply_max_len(_finish(starts_BxL, ids_BxL), max_patch_len, valid=valid_BxL)
    return _unbatch(starts_BxL, squeeze)
