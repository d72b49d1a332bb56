"""Corpus: documents as bytes, a stable train/held-out split, evaluation segments, fingerprint.

:func:`load_corpus` prepares a corpus once into a cache directory (one per source signature and
split; :mod:`bytelm.data.prepare` writes it, streamed) and reuses it after; :class:`Corpus` reads
it. The split and the evaluation set are :mod:`bytelm.data.split`'s (docs/evaluation.md). The
directory holds

- ``shard-NNNNN.u8``: the documents' bytes, concatenated in source order, in shards of about
  :data:`~bytelm.data.prepare.SHARD_BYTES` (a document never spans two shards);
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

import functools
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from bytelm.atomic import atomic_directory
from bytelm.constants import BOS_ID, BYTE_OFFSET, EOS_ID
from bytelm.data.prepare import CACHE_VERSION, FLAG_HELDOUT, FLAG_VALIDATION, build_corpus
from bytelm.data.sources import Progress, parse_source
from bytelm.data.split import EVAL_PROTOCOL, Segment, fingerprint_segments, plan_segments, stratified_order
from bytelm.errors import UserError


def default_cache_dir() -> Path:
    """``$BYTELM_CACHE_DIR``, else ``$XDG_CACHE_HOME/bytelm``, else ``~/.cache/bytelm``."""
    if os.environ.get("BYTELM_CACHE_DIR"):
        return Path(os.environ["BYTELM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bytelm"


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
        self.heldout = (flags & FLAG_HELDOUT) > 0
        self.validation = (flags & FLAG_VALIDATION) > 0
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


def _cache_key(
    spec: str, signature: str, split_seed: int, heldout_fraction: float, validation_fraction: float = 0.0
) -> str:
    key = {"v": CACHE_VERSION, "spec": spec, "sig": signature, "seed": split_seed, "frac": heldout_fraction}
    if validation_fraction > 0:  # caches without a validation split keep their key
        key["val"] = validation_fraction
    payload = json.dumps(key, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


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
            build_corpus(
                source, tmp, split_seed, heldout_fraction, validation_fraction, progress, workers=workers
            )
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
