"""Corpus: documents as bytes, a stable train/held-out split, evaluation segments, fingerprint.

docs/evaluation.md describes the split and the fingerprint. A corpus is prepared once into a
cache directory (one per source signature and split), streamed: memory stays bounded by a read
chunk and the longest document piece, whatever the corpus's size. The directory holds

- ``shard-NNNNN.u8``: the documents' bytes, concatenated in source order, in shards of about
  :data:`SHARD_BYTES` (a document never spans two shards);
- ``offsets.i64``: ``n_docs + 1`` byte offsets, global across the shards;
- ``flags.u8``: per document, 1 = held out, 2 = validation (else it trains);
- ``group.u32`` and ``groups.json``: per document an index into the list of group names;
  ``runs.i64``: where each run of documents of one group starts (a file's pieces);
- ``names.jsonl``: the documents' names, only when they cannot be derived from the groups
  (a name is its group, or ``GROUP#k`` / ``GROUP/k`` for the ``k``-th document of its run);
- ``train.i64`` and ``vstart.i64``: the train documents, and where each starts in the training id
  stream ``[BOS, b+4, ..., EOS, BOS, ...]``, which is derived from the bytes on the fly
  (:class:`TrainStream`): no second copy of the corpus;
- ``index.json``: the counts, shard sizes and how names are kept (a few hundred bytes).

The directory is written atomically (temporary sibling + rename): a second run reuses it, a
crashed run leaves nothing that a later run could mistake for a finished cache.
"""

from __future__ import annotations

import array
import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from bytelm.atomic import atomic_directory
from bytelm.constants import BOS_ID, BYTE_OFFSET, EOS_ID
from bytelm.data.sources import Progress, parse_source
from bytelm.errors import UserError

CACHE_VERSION = 2
SHARD_BYTES = 256 << 20  # (below 2 GiB: a position inside a shard fits int32)
_HELD, _VALID = 1, 2


def default_cache_dir() -> Path:
    """``$BYTELM_CACHE_DIR``, else ``$XDG_CACHE_HOME/bytelm``, else ``~/.cache/bytelm``."""
    if os.environ.get("BYTELM_CACHE_DIR"):
        return Path(os.environ["BYTELM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bytelm"


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


# The evaluation protocol's version (docs/evaluation.md, "The evaluation set"): it enters the
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


def _memmap(path: Path, dtype, n: int) -> np.ndarray:
    """``n`` values of ``path``, mapped; a file that is missing or not the size its index records
    (truncated, replaced) stops with the fix."""
    want = n * np.dtype(dtype).itemsize
    try:
        size = path.stat().st_size
    except OSError as e:
        size, why = -1, e.strerror or str(e)
    else:
        why = f"{size:,} bytes where its index.json records {want:,}"
    if size != want:
        raise UserError(
            f"the prepared corpus file {path} is damaged ({why}): delete {path.parent} and the corpus "
            "is prepared again from its source (bytelm data prepare, or the next run)"
        )
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)


class _Lookup(Sequence[str]):
    """A read-only sequence of strings computed per index; equal to a list of the same strings."""

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} names)"


class _Groups(_Lookup):
    """The documents' group names, looked up per document (no list of one string per document)."""

    def __init__(self, path: Path, ids: np.ndarray):
        self.path, self.ids = path, ids

    @functools.cached_property
    def table(self) -> list[str]:
        """The group names (read on first use: a corpus of many files has as many groups)."""
        return json.loads(self.path.read_text(encoding="utf-8"))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.table[g] for g in self.ids[i]]
        return self.table[int(self.ids[i])]


class _Names(_Lookup):
    """The documents' names: stored, or derived from the groups (see the module docstring)."""

    def __init__(self, rule: str, groups: _Groups, runs: np.ndarray, stored: list[str] | None):
        self.rule, self.groups, self.runs, self.stored = rule, groups, runs, stored

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if self.stored is not None:
            return self.stored[i]
        group = self.groups[i]
        if self.rule == "group":
            return group
        k = i - int(self.runs[np.searchsorted(self.runs, i, side="right") - 1])
        return f"{group}{'#' if self.rule == 'group#k' else '/'}{k}"


class _Shards(Sequence[np.ndarray]):
    """The byte shards, each memory-mapped on first use: a process opens only the shards that the
    rows it reads lie in (:attr:`opened`)."""

    def __init__(self, path: Path, sizes: list[int]):
        self.path, self.sizes = path, list(sizes)
        self._maps: list[np.ndarray | None] = [None] * len(self.sizes)
        self._views: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, s):
        if isinstance(s, slice):
            return [self[k] for k in range(*s.indices(len(self)))]
        m = self._maps[s]
        if m is None:
            m = self._maps[s] = _memmap(self.path / f"shard-{s:05d}.u8", np.uint8, self.sizes[s])
        return m

    def view(self, s: int) -> np.ndarray:
        """Shard ``s`` as a plain ``ndarray`` view of its memory map (faster ``np.take``)."""
        v = self._views.get(s)
        if v is None:
            v = self._views[s] = np.asarray(self[s]).view(np.ndarray)
        return v

    @property
    def opened(self) -> list[int]:
        return [s for s, m in enumerate(self._maps) if m is not None]


class TrainStream:
    """The training id stream ``[BOS, b+4, ..., EOS, BOS, ...]`` over the train documents, in
    source order, derived from the corpus's bytes when asked (no copy is stored). Behaves as a
    read-only 1-D ``uint16`` array for ``len``, slices and ``np.asarray``; :meth:`windows` gathers
    many rows at once (the training batches)."""

    dtype = np.dtype(np.uint16)
    ndim = 1

    def __init__(self, corpus: Corpus):
        self.corpus = corpus
        n = int(corpus.index["train_documents"])
        self.docs = _memmap(corpus.path / "train.i64", np.int64, n)
        self.vstart = _memmap(corpus.path / "vstart.i64", np.int64, n + 1) if n else np.zeros(1, np.int64)
        self.length = int(self.vstart[-1])

    def __len__(self) -> int:
        return self.length

    @property
    def shape(self) -> tuple[int]:
        return (self.length,)

    def windows(self, starts: np.ndarray, width: int) -> np.ndarray:
        """``int32`` rows ``stream[s : s + width]`` for each start ``s`` (all within the stream).

        A row is cut into segments, one per train document it touches; in document ``j`` the id at
        stream position ``p`` is BOS, EOS, or the byte at ``p + base[j]`` of the document's shard plus
        the offset. Few segments per row (long documents): a slice copy each; many (short
        documents): one gather over the whole batch."""
        starts = np.asarray(starts, np.int64)
        rows = len(starts)
        out = np.empty((rows, width), np.int32)
        if rows == 0 or width == 0:
            return out
        vstart, corpus = self.vstart, self.corpus
        first = np.searchsorted(vstart, starts, side="right") - 1
        last = np.searchsorted(vstart, starts + width - 1, side="right") - 1
        counts = last - first + 1  # segments per row
        reads = corpus.reads
        reads["rows"] += rows
        reads["ids"] += rows * width
        reads["documents"] += int(counts.sum())
        row = np.repeat(np.arange(rows), counts)
        j = first[row] + np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)
        row_start = starts[row]
        lo = np.maximum(vstart[j], row_start) - row_start  # the segment's columns [lo, hi)
        hi = np.minimum(vstart[j + 1], row_start + width) - row_start
        begin = corpus.offsets[self.docs[j]]
        shard = np.searchsorted(corpus.shard_start, begin, side="right") - 1
        shard = np.minimum(shard, len(corpus.shards) - 1)
        base = begin - corpus.shard_start[shard] - vstart[j] - 1
        bos = vstart[j] - row_start  # the BOS column (in the row when >= 0)
        eos = vstart[j + 1] - 1 - row_start  # the EOS column (in the row when < width)
        if len(row) <= 4 * rows:
            for k in range(len(row)):
                r, c0, c1 = int(row[k]), int(lo[k]), int(hi[k])
                if bos[k] >= 0:
                    out[r, c0] = BOS_ID
                    c0 += 1
                if eos[k] < width:
                    out[r, c1 - 1] = EOS_ID
                    c1 -= 1
                if c1 > c0:
                    a = int(row_start[k]) + c0 + int(base[k])
                    dst = out[r, c0:c1]
                    dst[...] = corpus.shards[int(shard[k])][a : a + c1 - c0]
                    dst += BYTE_OFFSET
            return out
        lengths = hi - lo
        # the byte's index in its shard, for every position: one offset per segment (shards are
        # smaller than 2 GiB, so int32 holds it)
        seg_flat = row * width + lo
        seg_offset = (row_start + lo + base - seg_flat).astype(np.int32)
        at = self._positions(rows * width) + np.repeat(seg_offset, lengths)
        has_bos, has_eos = bos >= 0, eos < width
        bos_at = row[has_bos] * width + bos[has_bos]
        eos_at = row[has_eos] * width + eos[has_eos]
        at[bos_at] = 0  # (their ids are set below; index 0 keeps the gather inside the shard)
        at[eos_at] = 0
        flat = out.reshape(-1)
        # (a shard of empty documents only has no bytes: its positions are BOS and EOS, set below)
        if len(corpus.shards) == 1:
            view = corpus.shards.view(0)
            flat[:] = np.take(view, at) if view.size else 0
        else:
            seg_shard = np.repeat(shard, lengths)
            for s in np.unique(shard):
                take = seg_shard == s
                view = corpus.shards.view(int(s))
                flat[take] = np.take(view, at[take]) if view.size else 0
        flat += BYTE_OFFSET
        flat[bos_at] = BOS_ID
        flat[eos_at] = EOS_ID
        return out

    @functools.lru_cache(maxsize=4)  # (one per batch shape; a stream lives as long as its corpus)
    def _positions(self, n: int) -> np.ndarray:
        return np.arange(n, dtype=np.int32)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(self.length)
            if step != 1:
                return self[start:stop][::step]
            return self.windows(np.array([start]), max(0, stop - start))[0].astype(np.uint16)
        i = int(key) + (self.length if int(key) < 0 else 0)
        if not 0 <= i < self.length:
            raise IndexError(f"index {key} out of range for a stream of {self.length}")
        return np.uint16(self.windows(np.array([i]), 1)[0, 0])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.empty(self.length, np.uint16)
        step = 1 << 22
        for lo in range(0, self.length, step):
            out[lo : lo + step] = self[lo : lo + step]
        return out if dtype is None else out.astype(dtype)

    def tolist(self) -> list[int]:
        return np.asarray(self).tolist()


class Corpus:
    """A prepared corpus (see the module docstring). Build one with :func:`load_corpus`."""

    def __init__(
        self,
        path: Path,
        *,
        segment_bytes: int = 1024,
        max_eval_bytes: int = 1 << 20,
    ) -> None:
        self.path = Path(path)
        self.index = json.loads((self.path / "index.json").read_text())
        self.manifest = self.index  # (its older name)
        self.spec: str = self.index["spec"]
        n = int(self.index["documents"])
        self.offsets = _memmap(self.path / "offsets.i64", np.int64, n + 1) if n else np.zeros(1, np.int64)
        flags = _memmap(self.path / "flags.u8", np.uint8, n)
        self.heldout = (flags & _HELD) > 0
        self.validation = (flags & _VALID) > 0
        self.groups = _Groups(self.path / "groups.json", _memmap(self.path / "group.u32", np.uint32, n))
        runs = _memmap(self.path / "runs.i64", np.int64, int(self.index["runs"]))
        stored = None
        if self.index["names"] == "stored":
            with open(self.path / "names.jsonl", encoding="utf-8") as f:
                stored = [json.loads(line) for line in f]
        self.names = _Names(self.index["names"], self.groups, runs, stored)
        # the shards: byte i of the corpus is byte i - shard_start[s] of shard s
        sizes = self.index["shards"]
        self.shard_start = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.shards = _Shards(self.path, sizes)
        # what this process has read of the training stream (the loader's counters): rows and ids
        # delivered, and the document pieces they were cut from
        self.reads = {"rows": 0, "ids": 0, "documents": 0}
        self.segment_bytes = segment_bytes
        self.max_eval_bytes = max_eval_bytes

    # -- documents -------------------------------------------------------------------------
    @property
    def n_documents(self) -> int:
        return len(self.heldout)

    @property
    def n_bytes(self) -> int:
        return int(self.offsets[-1])

    def gather(self, positions: np.ndarray) -> np.ndarray:
        """The bytes at global ``positions`` (``uint8``, the shape of ``positions``)."""
        if len(self.shards) == 1:
            return self.shards[0][positions]
        shard = np.searchsorted(self.shard_start, positions, side="right") - 1
        out = np.empty(positions.shape, np.uint8)
        for s in np.unique(shard):
            at = shard == s
            out[at] = self.shards[s][positions[at] - self.shard_start[s]]
        return out

    def document(self, i: int) -> np.ndarray:
        """Document ``i`` as a read-only ``uint8`` view."""
        begin, end = int(self.offsets[i]), int(self.offsets[i + 1])
        s = min(max(int(np.searchsorted(self.shard_start, begin, side="right")) - 1, 0), len(self.shards) - 1)
        base = int(self.shard_start[s])
        return self.shards[s][begin - base : end - base]

    def document_indices(self, split: str = "all") -> np.ndarray:
        if split == "all":
            return np.arange(self.n_documents)
        if split == "train":
            return np.flatnonzero(~self.heldout & ~self.validation)
        if split == "validation":
            return np.flatnonzero(self.validation)
        if split == "heldout":
            return np.flatnonzero(self.heldout)
        raise ValueError(f"split must be 'train', 'validation', 'heldout' or 'all', got {split!r}")

    def documents(self, split: str = "all") -> Iterator[bytes]:
        """The documents of ``split`` as ``bytes``, in canonical (source) order."""
        for i in self.document_indices(split):
            yield self.document(i).tobytes()

    def sample(self, split: str, max_bytes: int) -> tuple[np.ndarray, int]:
        """A deterministic sample of ``split``'s documents of about ``max_bytes`` bytes (all of them
        when the split is no larger): every ``k``-th document in source order, ``k`` the split's
        bytes over ``max_bytes`` rounded up, so the sample spans the whole corpus. Returns the
        documents' indices and their bytes."""
        idx = self.document_indices(split)
        total = self.split_bytes(split)
        if max_bytes <= 0 or total <= max_bytes:
            return idx, total
        k = -(-total // max_bytes)
        chosen = idx[::k]
        return chosen, int((self.offsets[chosen + 1] - self.offsets[chosen]).sum())

    def split_bytes(self, split: str) -> int:
        idx = self.document_indices(split)
        return int((self.offsets[idx + 1] - self.offsets[idx]).sum())

    # -- training stream -----------------------------------------------------------------
    @functools.cached_property
    def train_stream(self) -> TrainStream:
        """The ids of the train documents, each as ``[BOS, b+4, ..., EOS]``, concatenated (derived)."""
        return TrainStream(self)

    # -- evaluation -------------------------------------------------------------------------
    @functools.cached_property
    def segments(self) -> list[Segment]:
        """The held-out segments (protocol v2, :func:`plan_segments`): pieces of at most
        ``segment_bytes`` from every held-out document the cap allows, ``max_eval_bytes`` in total
        at most."""
        return self.segments_of("heldout")

    @functools.cached_property
    def validation_segments(self) -> list[Segment]:
        """The validation documents cut like the held-out ones (empty without a validation split)."""
        return self.segments_of("validation")

    def segments_of(self, split: str) -> list[Segment]:
        """The scored segments of ``split`` by evaluation protocol v2 (:func:`plan_segments`), in
        canonical order (document, then position)."""
        idx = self.document_indices(split)
        lengths = (self.offsets[idx + 1] - self.offsets[idx]).astype(np.int64)
        keep = lengths > 0
        idx, lengths = idx[keep], lengths[keep]
        seed = int(self.index.get("split_seed", 0))
        names = [self.names[int(d)] for d in idx]
        groups = [self.groups[int(d)] for d in idx]
        order = stratified_order(names, groups, seed)
        plan = plan_segments(lengths, order, self.segment_bytes, self.max_eval_bytes)
        return [
            Segment(i, int(idx[k]), start, n, names[k], groups[k]) for i, (k, start, n) in enumerate(plan)
        ]

    def segment_bytes_of(self, seg: Segment) -> bytes:
        return self.document(seg.doc)[seg.start : seg.start + seg.length].tobytes()

    def segment_data(self, segments: list[Segment] | None = None) -> list[bytes]:
        return [self.segment_bytes_of(s) for s in (self.segments if segments is None else segments)]

    @property
    def eval_bytes(self) -> int:
        return sum(s.length for s in self.segments)

    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 over the protocol version, the evaluation segments (each prefixed by its 8-byte
        length) and their total (:func:`fingerprint_segments`)."""
        return fingerprint_segments(self.segment_data())

    def summary(self) -> dict:
        return {
            "spec": self.spec,
            "source": self.manifest.get("source", self.spec),
            "documents": self.n_documents,
            "bytes": self.n_bytes,
            "train_documents": len(self.document_indices("train")),
            "train_bytes": self.split_bytes("train"),
            "validation_documents": int(self.validation.sum()),
            "validation_bytes": self.split_bytes("validation"),
            "heldout_documents": int(self.heldout.sum()),
            "heldout_bytes": self.split_bytes("heldout"),
            "eval_segments": len(self.segments),
            "eval_bytes": self.eval_bytes,
            "segment_bytes": self.segment_bytes,
            "max_eval_bytes": self.max_eval_bytes,
            "protocol": EVAL_PROTOCOL,
            "fingerprint": self.fingerprint,
            "cache": str(self.path),
        }


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


def _cache_key(
    spec: str, signature: str, split_seed: int, heldout_fraction: float, validation_fraction: float = 0.0
) -> str:
    key = {"v": CACHE_VERSION, "spec": spec, "sig": signature, "seed": split_seed, "frac": heldout_fraction}
    if validation_fraction > 0:  # caches without a validation split keep their key
        key["val"] = validation_fraction
    payload = json.dumps(key, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


class _Builder:
    """Streams documents into a corpus directory (the module docstring's files), holding one piece
    of a document and a few fixed-size buffers in memory."""

    FLUSH = 1 << 16  # documents per write of the per-document arrays

    def __init__(self, out: Path, shard_bytes: int = SHARD_BYTES, *, distinct_groups: bool = False):
        """``distinct_groups``: the source promises that a group never comes back after another (a
        source of files: a group is a file), so no table of the groups seen is kept and the group
        names are written as they come: memory stays flat in the number of files too."""
        self.out, self.shard_bytes, self.distinct = out, shard_bytes, distinct_groups
        self.groups_file = open(out / "groups.json", "w", encoding="utf-8")
        self.groups_file.write("[")
        self.n_groups = 0
        self.files = {
            name: open(out / name, "wb")
            for name in ("offsets.i64", "flags.u8", "group.u32", "train.i64", "vstart.i64", "runs.i64")
        }
        self.names_file = open(out / "names.jsonl", "w", encoding="utf-8")
        self.buffers = {
            "offsets.i64": array.array("q", [0]),
            "flags.u8": array.array("B"),
            "group.u32": array.array("I"),
            "train.i64": array.array("q"),
            "vstart.i64": array.array("q", [0]),
            "runs.i64": array.array("q"),
        }
        self.shard_sizes: list[int] = []
        self.shard: BinaryIO | None = None
        self._next_shard()
        self.group_ids: dict[str, int] = {}
        self.n = self.n_runs = self.n_train = self.pos = self.vpos = self.k = 0
        self.group, self.group_name = -1, ""
        self.rules = {"group": True, "group#k": True, "group/k": True}  # how names derive from groups

    def _next_shard(self) -> BinaryIO:
        if self.shard is not None:
            self.shard.close()
        self.shard = open(self.out / f"shard-{len(self.shard_sizes):05d}.u8", "wb")
        self.shard_sizes.append(0)
        return self.shard

    def add(self, name: str, group: str, pieces, flag: int) -> None:
        shard = self._next_shard() if self.shard_sizes[-1] >= self.shard_bytes else self.shard
        assert shard is not None
        length = 0
        for piece in pieces:
            shard.write(piece)
            length += len(piece)
        self.shard_sizes[-1] += length
        if self.distinct:
            gid = self.group if self.group >= 0 and group == self.group_name else None
        else:
            gid = self.group_ids.get(group)
        if gid is None or gid != self.group:  # a new run of documents of one group
            if gid is not None:  # the group came back after another: names cannot derive from it
                self.rules = dict.fromkeys(self.rules, False)
            else:
                gid = self.n_groups
                if not self.distinct:
                    self.group_ids[group] = gid
                self.groups_file.write(("," if gid else "") + json.dumps(group))
                self.n_groups += 1
            self.group, self.k, self.group_name = gid, 0, group
            self.buffers["runs.i64"].append(self.n)
            self.n_runs += 1
        else:
            self.k += 1
        rules = self.rules
        rules["group"] = rules["group"] and name == group and self.k == 0
        rules["group#k"] = rules["group#k"] and name == f"{group}#{self.k}"
        rules["group/k"] = rules["group/k"] and name == f"{group}/{self.k}"
        self.names_file.write(json.dumps(name) + "\n")
        self.pos += length
        self.buffers["offsets.i64"].append(self.pos)
        self.buffers["flags.u8"].append(flag)
        self.buffers["group.u32"].append(gid)
        if flag == 0:
            self.buffers["train.i64"].append(self.n)
            self.vpos += length + 2
            self.buffers["vstart.i64"].append(self.vpos)
            self.n_train += 1
        self.n += 1
        if self.n % self.FLUSH == 0:
            self._flush()

    def _flush(self) -> None:
        for name, buf in self.buffers.items():
            buf.tofile(self.files[name])
            del buf[:]

    def finish(self, header: dict, *, part: bool = False) -> dict:
        """Close the files and write the index; ``part``: one worker's share of a parallel build
        (its names kept, and every rule its names follow, for :func:`_merge`)."""
        self._flush()
        if self.shard is not None:
            self.shard.close()
        self.names_file.close()
        for f in self.files.values():
            f.close()
        if part:
            header = {**header, "rules": [r for r, ok in self.rules.items() if ok]}
        rule = next((r for r, ok in self.rules.items() if ok), "stored")
        if not part:
            _settle_names(self.out, rule, self.n, header["spec"])
        self.groups_file.write("]")
        self.groups_file.close()
        index = {
            "version": CACHE_VERSION,
            **header,
            "documents": self.n,
            "bytes": self.pos,
            "shards": self.shard_sizes,
            "runs": self.n_runs,
            "groups": self.n_groups,
            "names": rule,
            "train_documents": self.n_train,
            "train_stream_len": self.vpos,
        }
        if part:
            index["distinct_groups"] = self.distinct
        (self.out / "index.json").write_text(json.dumps(index, indent=1))
        return index


def _settle_names(out: Path, rule: str, n: int, spec: str) -> None:
    """Drop the names file when names derive from groups (unique by construction); else check
    that the stored names are unique."""
    if rule != "stored":
        (out / "names.jsonl").unlink()
        return
    seen: set[bytes] = set()
    with open(out / "names.jsonl", "rb") as names:
        for line in names:
            seen.add(hashlib.blake2b(line, digest_size=16).digest())
    if len(seen) != n:
        raise UserError(f"data spec {spec!r} yields duplicate document names; they must be unique")


def _build_part(job: tuple) -> dict:
    """One worker of a parallel build: its partition of the source into ``out`` (a part)."""
    source, out, split_seed, heldout_fraction, validation_fraction, shard_bytes = job
    out.mkdir()
    builder = _Builder(out, shard_bytes, distinct_groups=getattr(source, "distinct_groups", False))
    for name, group, pieces in source.records():
        held = is_heldout(name, split_seed, heldout_fraction)
        flag = _HELD if held else _VALID if is_validation(name, split_seed, validation_fraction) else 0
        builder.add(name, group, pieces, flag)
        if _DONE is not None:
            with _DONE.get_lock():
                _DONE.value += 1
    return builder.finish({"spec": source.spec}, part=True)


_DONE = None  # a worker's shared count of documents done (set by _worker_init)


def _worker_init(done) -> None:
    global _DONE
    _DONE = done


def _copy_adjusted(src: Path, dst, dtype, add: int = 0, skip: int = 0, chunk: int = 1 << 20) -> None:
    """Append ``src``'s values (from index ``skip``) plus ``add`` to the open file ``dst``, a chunk
    at a time."""
    n = src.stat().st_size // np.dtype(dtype).itemsize
    if n <= skip:
        return
    values = np.memmap(src, dtype=dtype, mode="r", shape=(n,))
    for lo in range(skip, n, chunk):
        block = np.asarray(values[lo : lo + chunk])
        (block + np.asarray(add, dtype) if add else block).astype(dtype).tofile(dst)


_PER_DOC = ("offsets.i64", "flags.u8", "group.u32", "train.i64", "vstart.i64", "runs.i64")


def _merge(parts: list[Path], indexes: list[dict], out: Path, header: dict) -> None:
    """Join the parts of a parallel build, in order, into one corpus directory: the shards are
    renamed, the per-document files appended with their offsets shifted (streamed)."""
    # parts of a source whose groups never recur (files) concatenate their group tables, streamed;
    # else the names are matched across parts
    distinct = all(i.get("distinct_groups") for i in indexes)
    groups: dict[str, int] = {}
    n_groups = 0
    recurring = False
    shard_sizes: list[int] = []
    n = n_bytes = n_runs = n_train = v_len = 0
    files = {name: open(out / name, "wb") for name in _PER_DOC}
    np.zeros(1, np.int64).tofile(files["offsets.i64"])
    np.zeros(1, np.int64).tofile(files["vstart.i64"])
    table_file = open(out / "groups.json", "w", encoding="utf-8")
    table_file.write("[")
    with open(out / "names.jsonl", "wb") as names:
        for part, idx in zip(parts, indexes):
            for k, size in enumerate(idx["shards"]):
                os.replace(part / f"shard-{k:05d}.u8", out / f"shard-{len(shard_sizes):05d}.u8")
                shard_sizes.append(size)
            if distinct:
                body = (part / "groups.json").read_text(encoding="utf-8")[1:-1]
                if body:
                    table_file.write(("," if n_groups else "") + body)
                _copy_adjusted(part / "group.u32", files["group.u32"], np.uint32, add=n_groups)
                n_groups += idx["groups"]
            else:
                table = json.loads((part / "groups.json").read_text(encoding="utf-8"))
                remap = np.empty(len(table), np.uint32)
                for g, name in enumerate(table):
                    recurring = recurring or name in groups
                    if name not in groups:
                        table_file.write(("," if groups else "") + json.dumps(name))
                    remap[g] = groups.setdefault(name, len(groups))
                ids = np.fromfile(part / "group.u32", np.uint32)
                remap[ids].tofile(files["group.u32"])
                n_groups = len(groups)
            _copy_adjusted(part / "offsets.i64", files["offsets.i64"], np.int64, add=n_bytes, skip=1)
            _copy_adjusted(part / "flags.u8", files["flags.u8"], np.uint8)
            _copy_adjusted(part / "runs.i64", files["runs.i64"], np.int64, add=n)
            _copy_adjusted(part / "train.i64", files["train.i64"], np.int64, add=n)
            _copy_adjusted(part / "vstart.i64", files["vstart.i64"], np.int64, add=v_len, skip=1)
            with open(part / "names.jsonl", "rb") as src:
                shutil.copyfileobj(src, names, 1 << 20)
            n, n_bytes, n_runs = n + idx["documents"], n_bytes + idx["bytes"], n_runs + idx["runs"]
            n_train, v_len = n_train + idx["train_documents"], v_len + idx["train_stream_len"]
    for out_file in files.values():
        out_file.close()
    table_file.write("]")
    table_file.close()
    common = set.intersection(*(set(i["rules"]) for i in indexes)) if not recurring else set()
    rule = next((r for r in ("group", "group#k", "group/k") if r in common), "stored")
    _settle_names(out, rule, n, header["spec"])
    index = {
        "version": CACHE_VERSION,
        **header,
        "documents": n,
        "bytes": n_bytes,
        "shards": shard_sizes,
        "runs": n_runs,
        "groups": n_groups,
        "names": rule,
        "train_documents": n_train,
        "train_stream_len": v_len,
    }
    (out / "index.json").write_text(json.dumps(index, indent=1))


def _build(
    source,
    out: Path,
    split_seed: int,
    heldout_fraction: float,
    validation_fraction: float,
    progress: Progress | None,
    shard_bytes: int | None = None,
    workers: int = 1,
) -> None:
    shard_bytes = shard_bytes or SHARD_BYTES
    header = {
        "spec": source.spec,
        "source": source.describe(),
        "split_seed": split_seed,
        "heldout_fraction": heldout_fraction,
        "validation_fraction": validation_fraction,
    }
    partitions = source.partitions(workers) if workers > 1 else [source]
    if len(partitions) > 1:
        _build_parallel(partitions, out, header, shard_bytes, progress)
        return
    builder = _Builder(out, shard_bytes, distinct_groups=getattr(source, "distinct_groups", False))
    for name, group, pieces in source.records(progress):
        held = is_heldout(name, split_seed, heldout_fraction)
        flag = _HELD if held else _VALID if is_validation(name, split_seed, validation_fraction) else 0
        builder.add(name, group, pieces, flag)
    builder.finish(header)


def _build_parallel(partitions, out: Path, header: dict, shard_bytes: int, progress: Progress | None) -> None:
    """One worker process per partition (spawned: the parent may hold JAX's threads), each writing
    a part; then :func:`_merge`. Progress counts documents (of an unknown total)."""
    import multiprocessing  # noqa: PLC0415

    context = multiprocessing.get_context("spawn")
    done = context.Value("q", 0)
    parts = [out / f"part-{k:05d}" for k in range(len(partitions))]
    jobs = [
        (
            p,
            part,
            header["split_seed"],
            header["heldout_fraction"],
            header["validation_fraction"],
            shard_bytes,
        )
        for p, part in zip(partitions, parts)
    ]
    with concurrent.futures.ProcessPoolExecutor(
        len(jobs), mp_context=context, initializer=_worker_init, initargs=(done,)
    ) as pool:
        futures = [pool.submit(_build_part, job) for job in jobs]
        while not all(f.done() for f in futures):
            concurrent.futures.wait(futures, timeout=0.5)
            if progress:
                progress(done.value, 0)
        indexes = [f.result() for f in futures]
    _merge(parts, indexes, out, header)
    for part in parts:
        shutil.rmtree(part)


def load_corpus(
    spec: str = "stdlib",
    *,
    split_seed: int = 0,
    heldout_fraction: float = 0.05,
    validation_fraction: float = 0.0,
    segment_bytes: int = 1024,
    max_eval_bytes: int = 1 << 20,
    cache_dir: str | os.PathLike | None = None,
    progress: Progress | None = None,
    require_split: bool = True,
    workers: int = 1,
    build: bool = True,
) -> Corpus:
    """Prepare (or reuse from the cache) the corpus named by ``spec``; ``workers`` processes share
    the preparation (a source of many files; the result is the same whatever their number).
    ``build=False``: open the prepared corpus only (another process prepared it), never build it.

    Raises :class:`~bytelm.errors.UserError` for bad input: a missing path, an empty directory, a
    glob matching nothing, an unreadable file, or (with ``require_split``) an empty train or
    held-out part.
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise UserError(f"data.heldout_fraction must be in (0, 1), got {heldout_fraction}")
    if not 0.0 <= validation_fraction < 1.0:
        raise UserError(
            f"data.validation_fraction must be in [0, 1) (0: no validation split), got {validation_fraction}"
        )
    if segment_bytes < 1:
        raise UserError(f"data.segment_bytes must be >= 1, got {segment_bytes}")
    if max_eval_bytes < 1:
        raise UserError(f"data.max_eval_bytes must be >= 1, got {max_eval_bytes}")
    source = parse_source(spec)
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    path = (
        root
        / "corpora"
        / _cache_key(source.spec, source.signature(), split_seed, heldout_fraction, validation_fraction)
    )
    if not (path / "index.json").is_file():
        if not build:
            raise UserError(
                f"the corpus {spec!r} is not prepared in {root} (expected {path}): process 0 of a "
                "multi-process job prepares it, so put data.cache_dir on a filesystem every host "
                f"shares, or run 'bytelm data prepare --data {spec} --out {root}' on each host first"
            )
        with atomic_directory(path) as tmp:
            _build(source, tmp, split_seed, heldout_fraction, validation_fraction, progress, workers=workers)
    corpus = Corpus(path, segment_bytes=segment_bytes, max_eval_bytes=max_eval_bytes)
    if require_split:
        _check_split(corpus, spec, heldout_fraction)
        if validation_fraction > 0 and (
            not corpus.validation.any() or not len(corpus.document_indices("train"))
        ):
            raise UserError(
                f"data.validation_fraction {validation_fraction} of {spec!r} leaves "
                f"{int(corpus.validation.sum())} validation and {len(corpus.document_indices('train'))} "
                "train document(s); both must be non-empty: change the fraction or split the files into more "
                "documents"
            )
    return corpus


def load_corpus_from_config(
    data_cfg,
    *,
    progress: Progress | None = None,
    require_split: bool = True,
    workers: int = 1,
    build: bool = True,
) -> Corpus:
    """:func:`load_corpus` with the fields of a ``[data]`` config section (``bytelm.config.DataConfig``)."""
    return load_corpus(
        data_cfg.source,
        split_seed=data_cfg.split_seed,
        heldout_fraction=data_cfg.heldout_fraction,
        validation_fraction=data_cfg.validation_fraction,
        segment_bytes=data_cfg.segment_bytes,
        max_eval_bytes=data_cfg.max_eval_bytes,
        cache_dir=data_cfg.cache_dir or None,
        progress=progress,
        require_split=require_split,
        workers=workers,
        build=build,
    )


def _check_split(corpus: Corpus, spec: str, heldout_fraction: float) -> None:
    n = corpus.n_documents
    if n == 0:
        raise UserError(f"data spec {spec!r} yields no documents")
    if corpus.n_bytes == 0:
        what = "the file is empty" if n == 1 else f"its {n} documents are all empty"
        raise UserError(f"data spec {spec!r} holds no bytes ({what}): give files with some text")
    held = int(corpus.heldout.sum())
    hint = (
        "split the files into more documents with '?split=paragraph' or '?split=line' on the files: spec, "
        "add more files, or change data.heldout_fraction"
    )
    if held == 0:
        raise UserError(
            f"the held-out part of {spec!r} is empty ({n} document(s), heldout_fraction {heldout_fraction}): "
            f"{hint}"
        )
    if held == n:
        raise UserError(f"the train part of {spec!r} is empty ({n} document(s), all held out): {hint}")
    if corpus.eval_bytes == 0:
        raise UserError(
            f"the held-out documents of {spec!r} are all empty, so there is nothing to score: {hint}"
        )
