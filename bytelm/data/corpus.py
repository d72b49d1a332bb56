"""Corpus: documents as bytes, a stable train/held-out split, evaluation segments, fingerprint.

docs/evaluation.md describes the split and the fingerprint. The prepared corpus lives in a cache directory
(one per source signature and split) holding

- ``bytes.u8``: every document's bytes, concatenated in source order (flat ``uint8``);
- ``offsets.i64``: ``n_docs + 1`` offsets into it;
- ``train.u16``: the training id stream ``[BOS, b+4, ..., EOS, BOS, ...]`` over the train docs;
- ``manifest.json``: names, groups, the held-out flags and the counts.

The directory is written atomically (temporary sibling + rename): a second run reuses it, a
crashed run leaves nothing that a later run could mistake for a finished cache.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bytelm.atomic import atomic_directory
from bytelm.constants import BOS_ID, BYTE_OFFSET, EOS_ID
from bytelm.data.sources import Progress, parse_source
from bytelm.errors import UserError

CACHE_VERSION = 1


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
        self.manifest = json.loads((self.path / "manifest.json").read_text())
        self.spec: str = self.manifest["spec"]
        self.names: list[str] = self.manifest["names"]
        self.groups: list[str] = self.manifest["groups"]
        self.heldout = np.asarray(self.manifest["heldout"], dtype=bool)
        # carved from the train documents (data.validation_fraction); absent in older caches
        self.validation = np.asarray(self.manifest.get("validation") or [False] * len(self.names), dtype=bool)
        self.offsets = np.fromfile(self.path / "offsets.i64", dtype=np.int64)
        n_bytes = int(self.offsets[-1])
        self.data = (
            np.memmap(self.path / "bytes.u8", dtype=np.uint8, mode="r", shape=(n_bytes,))
            if n_bytes
            else np.zeros(0, np.uint8)
        )
        self.segment_bytes = segment_bytes
        self.max_eval_bytes = max_eval_bytes

    # -- documents -------------------------------------------------------------------------
    @property
    def n_documents(self) -> int:
        return len(self.names)

    @property
    def n_bytes(self) -> int:
        return int(self.offsets[-1])

    def document(self, i: int) -> np.ndarray:
        """Document ``i`` as a read-only ``uint8`` view."""
        return self.data[self.offsets[i] : self.offsets[i + 1]]

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

    def split_bytes(self, split: str) -> int:
        idx = self.document_indices(split)
        return int((self.offsets[idx + 1] - self.offsets[idx]).sum())

    # -- training stream -----------------------------------------------------------------
    @functools.cached_property
    def train_stream(self) -> np.ndarray:
        """``uint16`` ids of the train documents, each as ``[BOS, b+4, ..., EOS]``, concatenated."""
        n = int(self.manifest["train_stream_len"])
        if n == 0:
            return np.zeros(0, np.uint16)
        return np.memmap(self.path / "train.u16", dtype=np.uint16, mode="r", shape=(n,))

    # -- evaluation -------------------------------------------------------------------------
    @functools.cached_property
    def segments(self) -> list[Segment]:
        """Held-out documents in canonical order, cut into pieces of at most ``segment_bytes``,
        capped at ``max_eval_bytes`` in total (the last piece is cut to fit the cap)."""
        return self.segments_of("heldout")

    @functools.cached_property
    def validation_segments(self) -> list[Segment]:
        """The validation documents cut like the held-out ones (empty without a validation split)."""
        return self.segments_of("validation")

    def segments_of(self, split: str) -> list[Segment]:
        out: list[Segment] = []
        budget = self.max_eval_bytes
        for d in self.document_indices(split):
            length = int(self.offsets[d + 1] - self.offsets[d])
            for start in range(0, length, self.segment_bytes):
                if budget <= 0:
                    return out
                n = min(self.segment_bytes, length - start, budget)
                out.append(Segment(len(out), int(d), start, n, self.names[d], self.groups[d]))
                budget -= n
        return out

    def segment_bytes_of(self, seg: Segment) -> bytes:
        base = int(self.offsets[seg.doc]) + seg.start
        return self.data[base : base + seg.length].tobytes()

    def segment_data(self, segments: list[Segment] | None = None) -> list[bytes]:
        return [self.segment_bytes_of(s) for s in (self.segments if segments is None else segments)]

    @property
    def eval_bytes(self) -> int:
        return sum(s.length for s in self.segments)

    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 over the evaluation segments (each prefixed by its 8-byte length) and their total."""
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
            "fingerprint": self.fingerprint,
            "cache": str(self.path),
        }


def fingerprint_segments(segments: list[bytes]) -> str:
    h = hashlib.sha256()
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


def _build(
    source,
    out: Path,
    split_seed: int,
    heldout_fraction: float,
    validation_fraction: float,
    progress: Progress | None,
) -> None:
    names: list[str] = []
    groups: list[str] = []
    heldout: list[bool] = []
    validation: list[bool] = []
    offsets = [0]
    train_len = 0
    with open(out / "bytes.u8", "wb") as fb, open(out / "train.u16", "wb") as ft:
        for doc in source.documents(progress):
            names.append(doc.name)
            groups.append(doc.group)
            held = is_heldout(doc.name, split_seed, heldout_fraction)
            heldout.append(held)
            valid = not held and is_validation(doc.name, split_seed, validation_fraction)
            validation.append(valid)
            fb.write(doc.data)
            offsets.append(offsets[-1] + len(doc.data))
            if not held and not valid:
                ids = np.empty(len(doc.data) + 2, np.uint16)
                ids[0] = BOS_ID
                ids[1:-1] = np.frombuffer(doc.data, np.uint8)
                ids[1:-1] += BYTE_OFFSET
                ids[-1] = EOS_ID
                ft.write(ids.tobytes())
                train_len += len(ids)
    if len(set(names)) != len(names):
        raise UserError(f"data spec {source.spec!r} yields duplicate document names; they must be unique")
    np.asarray(offsets, np.int64).tofile(out / "offsets.i64")
    manifest = {
        "version": CACHE_VERSION,
        "spec": source.spec,
        "source": source.describe(),
        "split_seed": split_seed,
        "heldout_fraction": heldout_fraction,
        "names": names,
        "groups": groups,
        "heldout": heldout,
        "validation_fraction": validation_fraction,
        "validation": validation,
        "train_stream_len": train_len,
    }
    (out / "manifest.json").write_text(json.dumps(manifest))


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
) -> Corpus:
    """Prepare (or reuse from the cache) the corpus named by ``spec``.

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
    if not (path / "manifest.json").is_file():
        with atomic_directory(path) as tmp:
            _build(source, tmp, split_seed, heldout_fraction, validation_fraction, progress)
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
    data_cfg, *, progress: Progress | None = None, require_split: bool = True
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
    )


def _check_split(corpus: Corpus, spec: str, heldout_fraction: float) -> None:
    n = corpus.n_documents
    if n == 0:
        raise UserError(f"data spec {spec!r} yields no documents")
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
