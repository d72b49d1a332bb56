"""The split of a corpus's documents and its evaluation set (docs/evaluation.md).

A document's side of the split (train, validation, held out) is a hash of the split seed and its
name (:func:`is_heldout`, :func:`is_validation`): adding or removing other documents never moves it.
The evaluation set is pieces of the held-out documents, chosen by evaluation protocol v2
(:func:`stratified_order`, :func:`plan_segments`), and identified by its fingerprint
(:func:`fingerprint_segments`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import numpy as np


def is_heldout(name: str, split_seed: int, heldout_fraction: float) -> bool:
    """The stable split: a document is held out iff a hash of (seed, name) falls below the fraction.

    Depends only on the document's own identity, so adding or removing other documents never moves
    it between train and held-out.
    """
    digest = hashlib.blake2b(f"{split_seed}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64 < heldout_fraction


def is_validation(name: str, split_seed: int, validation_fraction: float) -> bool:
    """Of the documents not held out, the validation ones: a second hash of (seed, name), salted so
    that it is independent of the held-out draw. Validation documents leave the training stream;
    they are what hyperparameters are selected on (never the held-out segments that reports score)."""
    if validation_fraction <= 0:
        return False
    digest = hashlib.blake2b(f"{split_seed}\0validation\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64 < validation_fraction


# fingerprint, so scores made under another protocol are never tabulated with these.
# 1: held-out documents in canonical order cut into segments until max_eval_bytes was spent.
# 2: segments from every held-out document the cap allows, stratified by group, spread over each
#    document's length (plan_segments).
EVAL_PROTOCOL = 2


def _unit_hash(text: str) -> float:
    """A stable number in [0, 1) from ``text`` (blake2b)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") / 2.0**64


def stratified_order(names: Sequence[str], groups: Sequence[str], seed: int) -> np.ndarray:
    """The order in which documents receive evaluation segments: positions into ``names``.

    Stratified by group, in proportion to each group's documents: a group of ``n`` documents
    places its ``j``-th (by a hash of the split seed and the document's name) at ``(j + v) / n``,
    ``v`` a hash of the seed and the group in [0, 1); documents are taken in increasing key. Any
    prefix of the order therefore holds each group's share of documents to within one. Depends
    only on names and the seed: no position in the source, so adding documents never reorders
    the others within their group.
    """
    n = len(names)
    if n == 0:
        return np.zeros(0, np.int64)
    doc_key = np.fromiter((_unit_hash(f"{seed}\0eval-doc\0{x}") for x in names), np.float64, n)
    table: dict[str, int] = {}
    gid = np.fromiter((table.setdefault(g, len(table)) for g in groups), np.int64, n)
    group_key = np.asarray([_unit_hash(f"{seed}\0eval-group\0{g}") for g in table], np.float64)
    by_group = np.lexsort((doc_key, gid))  # each group's documents, in hash order
    counts = np.bincount(gid, minlength=len(table))
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(n, np.int64)
    rank[by_group] = np.arange(n) - first[gid[by_group]]
    key = (rank + group_key[gid]) / counts[gid]
    return np.lexsort((doc_key, key)).astype(np.int64)


def plan_segments(
    lengths: np.ndarray, order: np.ndarray, segment_bytes: int, max_eval_bytes: int
) -> list[tuple[int, int, int]]:
    """Evaluation protocol v2: which pieces of which documents are scored.

    Document ``d`` (``lengths[d]`` bytes, > 0) is a row of ``n_d = ceil(L_d / S)`` slots of
    ``S = segment_bytes`` bytes (the last one shorter). The cap is shared as by water-filling: every
    document receives one segment per round, in ``order``, while it has slots left and the cap
    allows (a segment is charged ``S``, a document's last ``L_d - (n_d - 1) S``); the round the cap
    runs out in goes as far along ``order`` as it can. A document given ``k`` of its ``n`` slots
    contributes slots ``floor(i n / k)``, ``i < k``: its start and then evenly over its length.
    When not even the first document of ``order`` fits, its first ``max_eval_bytes`` bytes are the
    one segment. Returns ``(document, start, length)`` in canonical order (document, start).
    """
    lengths = np.asarray(lengths, np.int64)
    order = np.asarray(order, np.int64)
    S = int(segment_bytes)
    if len(lengths) == 0 or max_eval_bytes <= 0:
        return []
    slots = -(-lengths // S)

    def cost(k: np.ndarray, d=slice(None)) -> np.ndarray:  # bytes charged for k segments of documents d
        return np.where(k >= slots[d], lengths[d], k * S)

    def spent(r: int) -> int:
        return int(cost(np.minimum(slots, r)).sum())

    lo, hi = 0, int(slots.max())  # the most whole rounds the cap allows: spent(lo) <= cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if spent(mid) <= max_eval_bytes else (lo, mid - 1)
    k = np.minimum(slots, lo)
    left = max_eval_bytes - spent(lo)
    if lo < int(slots.max()):  # the partial round: a prefix of the order that fits
        more = order[slots[order] > lo]
        extra = cost(k[more] + 1, more) - cost(k[more], more)
        take = int(np.searchsorted(np.cumsum(extra), left, side="right"))
        k[more[:take]] += 1
    if not k.any():
        first = int(order[0])
        return [(first, 0, int(min(lengths[first], max_eval_bytes)))]
    out = []
    for d in np.flatnonzero(k):
        n, kd, length = int(slots[d]), int(k[d]), int(lengths[d])
        for i in range(kd):
            start = (i * n // kd) * S
            out.append((int(d), start, min(S, length - start)))
    return out


@dataclasses.dataclass(frozen=True)
class Segment:
    """One scored piece of held-out text: ``length`` bytes of document ``doc`` from ``start``."""

    index: int
    doc: int
    start: int
    length: int
    name: str
    group: str

    @property
    def id(self) -> str:
        return f"{self.index}:{self.name}@{self.start}"


def fingerprint_segments(segments: list[bytes], protocol: int = EVAL_PROTOCOL) -> str:
    """The evaluation fingerprint: sha256 of ``b"bytelm-eval-protocol <v>"`` (from protocol 2 on;
    protocol 1 fingerprints had no prefix), each segment prefixed by its length as 8 little-endian
    bytes, then ``b"total"`` and the total length."""
    h = hashlib.sha256()
    if protocol >= 2:
        h.update(f"bytelm-eval-protocol {protocol}\0".encode())
    total = 0
    for s in segments:
        h.update(len(s).to_bytes(8, "little"))
        h.update(s)
        total += len(s)
    h.update(b"total")
    h.update(total.to_bytes(8, "little"))
    return h.hexdigest()
