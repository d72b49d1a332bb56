"""Statistics of a report: per-document scores, cluster-bootstrap intervals, paired differences.

BPB is a ratio of sums (bits over bytes), and the bytes of one document are not independent of
each other, so the unit of resampling is the held-out **document**: a resample draws ``D``
documents with replacement from the ``D`` scored ones and recomputes total bits over total bytes.
With ``K`` seeds per model the bootstrap has two levels: per resample, each model's ``K`` seeds are
drawn with replacement, then the documents (the same documents for every model, so differences are
paired). docs/evaluation.md ("Intervals") states what an interval covers and what it does not.

The random stream is part of the definition, so a plain loop reproduces every interval
(tests/test_stats.py): ``rng = numpy.random.default_rng(seed)``; per resample ``r``, first
``rng.integers(0, D, size=D)`` (the documents), then, only when some model has ``K > 1`` seeds, per
model in order ``rng.integers(0, K, size=K)`` (its seeds). Group intervals resample within each
group (a stratified bootstrap) from their own stream (``seed + 1``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bytelm.atomic import atomic_write_text
from bytelm.bpb import LN2

RESAMPLES = 1000
SEED = 0
CONFIDENCE = 0.95
SCORES_FORMAT = "bytelm-eval-scores"
SCORES_VERSION = 1
_CHUNK_BYTES = 64 << 20  # the resample-count block of one step: at most this many bytes


@dataclasses.dataclass
class DocumentScores:
    """Bits per (model, seed, document) and bytes per document, documents in canonical order.

    ``bits[m]`` is an array ``(K_m, D)``: model ``m``'s seeds may differ in number."""

    names: list[str]  # the models
    docs: np.ndarray  # int64 (D,): corpus document indices
    doc_names: list[str]
    groups: list[str]
    nbytes: np.ndarray  # int64 (D,)
    bits: list[np.ndarray]  # per model: float64 (K, D)

    @property
    def bpb(self) -> np.ndarray:
        """Per model: the mean over its seeds of total bits / total bytes."""
        total = float(self.nbytes.sum())
        return np.asarray([float(b.sum(axis=1).mean()) / total for b in self.bits])


def per_document(segment_docs: np.ndarray, nats: np.ndarray, nbytes: np.ndarray, n_docs_index: np.ndarray):
    """Sum per-segment ``nats`` and ``nbytes`` into the documents ``n_docs_index`` (sorted, unique),
    ``segment_docs`` naming each segment's document. Returns ``(bits, bytes)`` per document."""
    pos = np.searchsorted(n_docs_index, segment_docs)
    n = len(n_docs_index)
    bits = np.bincount(pos, weights=np.asarray(nats, np.float64), minlength=n) / LN2
    counts = np.bincount(pos, weights=np.asarray(nbytes, np.float64), minlength=n)
    return bits, np.rint(counts).astype(np.int64)


def document_scores(eval_set, results: Sequence) -> DocumentScores:
    """The :class:`DocumentScores` of ``results`` (:class:`~bytelm.evaluation.results.ModelResult`,
    with their other seeds' scores in ``seed_scores``) on ``eval_set``."""
    seg_docs = np.asarray([s.doc for s in eval_set.segments], np.int64)
    docs, first = np.unique(seg_docs, return_index=True)
    by_doc = {s.doc: s for s in eval_set.segments}
    bits = []
    nbytes = None
    for r in results:
        rows = []
        for scores in [r.scores, *(getattr(r, "seed_scores", None) or [])]:
            b, nb = per_document(seg_docs, scores.nats, scores.nbytes, docs)
            nbytes = nb if nbytes is None else nbytes
            rows.append(b)
        bits.append(np.stack(rows))
    if nbytes is None:
        lengths = np.asarray([len(d) for d in eval_set.data], np.int64)
        _, nbytes = per_document(seg_docs, np.zeros(len(seg_docs)), lengths, docs)
    return DocumentScores(
        [r.name for r in results],
        docs,
        [by_doc[int(d)].name for d in docs],
        [by_doc[int(d)].group for d in docs],
        nbytes,
        bits,
    )


def bootstrap(
    bits: Sequence[np.ndarray], nbytes: np.ndarray, *, resamples: int = RESAMPLES, seed: int = SEED
) -> np.ndarray:
    """BPB of every model in every resample, ``(resamples, M)``: the cluster bootstrap over
    documents, two-level (seeds, then documents) for a model with several seeds. See the module
    docstring for the random stream."""
    M = len(bits)
    D = len(nbytes)
    Ks = [int(b.shape[0]) for b in bits]
    stacked = np.concatenate([np.asarray(b, np.float64) for b in bits], axis=0)  # (sum K, D)
    rng = np.random.default_rng(seed)
    seeded = max(Ks, default=1) > 1
    out = np.empty((resamples, M))
    chunk = max(1, min(resamples, _CHUNK_BYTES // (8 * max(D, 1))))
    offsets = np.concatenate([[0], np.cumsum(Ks)])
    nb = np.asarray(nbytes, np.float64)
    for r0 in range(0, resamples, chunk):
        rows = min(chunk, resamples - r0)
        counts = np.empty((rows, D))
        weights = [np.ones((rows, k)) for k in Ks]
        for i in range(rows):
            counts[i] = np.bincount(rng.integers(0, D, size=D), minlength=D)
            if seeded:
                for m, k in enumerate(Ks):
                    weights[m][i] = np.bincount(rng.integers(0, k, size=k), minlength=k) / k
        sums = counts @ stacked.T  # (rows, sum K): each seed's bits on the resampled documents
        total = counts @ nb
        for m in range(M):
            seed_bits = sums[:, offsets[m] : offsets[m + 1]]
            out[r0 : r0 + rows, m] = np.einsum("rk,rk->r", weights[m], seed_bits) / total
    return out


def percentile_interval(samples: np.ndarray, confidence: float = CONFIDENCE) -> np.ndarray:
    """The percentile interval of ``samples`` along axis 0: ``(2, ...)`` low and high."""
    tail = 100 * (1 - confidence) / 2
    return np.percentile(samples, [tail, 100 - tail], axis=0)


def paired(samples: np.ndarray, point: np.ndarray, a: int, b: int, confidence: float = CONFIDENCE) -> dict:
    """The difference ``bpb[a] - bpb[b]``, its interval over the same resamples, the fraction of
    resamples whose order differs from the observed one, and whether the interval excludes zero."""
    diff = samples[:, a] - samples[:, b]
    observed = float(point[a] - point[b])
    lo, hi = percentile_interval(diff, confidence)
    flip = float(np.mean(np.sign(diff) != np.sign(observed)))
    return {
        "diff": observed,
        "ci95": [float(lo), float(hi)],
        "flip": flip,
        "separable": bool(lo > 0 or hi < 0),
    }


def group_intervals(
    bits: Sequence[np.ndarray],
    nbytes: np.ndarray,
    labels: Sequence[str],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED + 1,
    confidence: float = CONFIDENCE,
) -> dict[str, np.ndarray]:
    """Per label (a document's group or directory): ``(M, 2)`` intervals of its BPB, from a
    bootstrap that resamples documents within each label (stratified) and seeds as
    :func:`bootstrap`, one uniform draw per document and resample."""
    table: dict[str, int] = {}
    gid = np.asarray([table.setdefault(x, len(table)) for x in labels], np.int64)
    order = np.argsort(gid, kind="stable")
    gid_sorted = gid[order]
    n_g = np.bincount(gid, minlength=len(table))
    start = np.concatenate([[0], np.cumsum(n_g)[:-1]])
    base, size = start[gid_sorted], n_g[gid_sorted]
    Ks = [int(b.shape[0]) for b in bits]
    stacked = np.concatenate([np.asarray(b, np.float64) for b in bits], axis=0)[:, order]
    nb = np.asarray(nbytes, np.float64)[order]
    offsets = np.concatenate([[0], np.cumsum(Ks)])
    D, G, M = len(order), len(table), len(bits)
    rng = np.random.default_rng(seed)
    seeded = max(Ks, default=1) > 1
    samples = np.empty((resamples, G, M))
    chunk = max(1, min(resamples, _CHUNK_BYTES // (8 * max(D, 1))))
    for r0 in range(0, resamples, chunk):
        rows = min(chunk, resamples - r0)
        counts = np.empty((rows, D))
        weights = [np.ones((rows, k)) for k in Ks]
        for i in range(rows):
            pick = base + np.minimum((rng.random(D) * size).astype(np.int64), size - 1)
            counts[i] = np.bincount(pick, minlength=D)
            if seeded:
                for m, k in enumerate(Ks):
                    weights[m][i] = np.bincount(rng.integers(0, k, size=k), minlength=k) / k
        for g in range(G):  # (the documents of a group are contiguous in this order)
            a, b = start[g], start[g] + n_g[g]
            sums = counts[:, a:b] @ stacked[:, a:b].T  # (rows, sum K)
            total = counts[:, a:b] @ nb[a:b]
            for m in range(M):
                seed_bits = sums[:, offsets[m] : offsets[m + 1]]
                samples[r0 : r0 + rows, g, m] = np.einsum("rk,rk->r", weights[m], seed_bits) / total
    lo, hi = percentile_interval(samples, confidence)
    return {name: np.stack([lo[g], hi[g]], axis=1) for name, g in table.items()}


def statistics(
    ds: DocumentScores,
    compared: Sequence[str],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> dict:
    """The ``statistics`` record of a report: per model its interval, per pair of ``compared``
    models (in order of BPB) the paired difference; see :func:`bootstrap`."""
    samples = bootstrap(ds.bits, ds.nbytes, resamples=resamples, seed=seed)
    point = ds.bpb
    lo, hi = percentile_interval(samples, confidence)
    index = {n: i for i, n in enumerate(ds.names)}
    ranked = sorted(
        (n for n in compared if n in index),
        key=lambda n: (not math.isfinite(point[index[n]]), point[index[n]]),
    )
    pairs = []
    for i, a in enumerate(ranked):
        for b in ranked[i + 1 :]:
            if math.isfinite(point[index[a]]) and math.isfinite(point[index[b]]):
                pairs.append({"a": a, "b": b, **paired(samples, point, index[a], index[b], confidence)})
    seeds = {n: int(b.shape[0]) for n, b in zip(ds.names, ds.bits)}
    return {
        "method": "cluster bootstrap over held-out documents"
        + (" (two levels: seeds, then documents)" if max(seeds.values(), default=1) > 1 else ""),
        "interval": "percentile",
        "confidence": confidence,
        "resamples": resamples,
        "seed": seed,
        "documents": int(len(ds.docs)),
        "seeds": seeds,
        "ci95": {n: [float(lo[i]), float(hi[i])] for n, i in index.items()},
        "ranking": ranked,
        "pairs": pairs,
    }


# -- the scores file -------------------------------------------------------------------------
def scores_lines(eval_set, ds: DocumentScores, results: Sequence) -> list[str]:
    """``scores.jsonl``: a header, then per (model, seed, segment) and per (model, seed, document)
    one line (docs/evaluation.md, "Scores as data"). Bits are nats / ln 2."""
    header = {
        "format": SCORES_FORMAT,
        "version": SCORES_VERSION,
        "fingerprint": eval_set.fingerprint,
        "protocol": eval_set.describe().get("protocol"),
        "models": [
            {"name": r.name, "family": r.family, "seeds": int(b.shape[0])} for r, b in zip(results, ds.bits)
        ],
        "segments": len(eval_set.segments),
        "documents": int(len(ds.docs)),
        "bytes": int(ds.nbytes.sum()),
    }
    lines = [json.dumps(header)]
    for r, doc_bits in zip(results, ds.bits):
        for k, scores in enumerate([r.scores, *(getattr(r, "seed_scores", None) or [])]):
            for seg, nats, nb in zip(eval_set.segments, scores.nats, scores.nbytes):
                lines.append(
                    json.dumps(
                        {
                            "level": "segment",
                            "model": r.name,
                            "seed": k,
                            "segment": seg.index,
                            "doc": seg.doc,
                            "name": seg.name,
                            "group": seg.group,
                            "start": seg.start,
                            "bytes": int(nb),
                            "bits": float(nats) / LN2,
                        }
                    )
                )
            for d, name, group, nb, b in zip(ds.docs, ds.doc_names, ds.groups, ds.nbytes, doc_bits[k]):
                lines.append(
                    json.dumps(
                        {
                            "level": "document",
                            "model": r.name,
                            "seed": k,
                            "doc": int(d),
                            "name": name,
                            "group": group,
                            "bytes": int(nb),
                            "bits": float(b),
                        }
                    )
                )
    return lines


def write_scores(path: str | Path, eval_set, ds: DocumentScores, results: Sequence) -> None:
    atomic_write_text(path, "\n".join(scores_lines(eval_set, ds, results)) + "\n")


def read_scores(path: str | Path) -> tuple[dict, DocumentScores]:
    """The header and the document level of a ``scores.jsonl`` (what the report's figures are
    computed from)."""
    with open(path, encoding="utf-8") as f:
        header = json.loads(f.readline())
        if header.get("format") != SCORES_FORMAT:
            raise ValueError(f"{path}: not a {SCORES_FORMAT} file (format {header.get('format')!r})")
        rows = [json.loads(line) for line in f if line.strip()]
    docs = [r for r in rows if r["level"] == "document"]
    names = [m["name"] for m in header["models"]]
    order = sorted({r["doc"] for r in docs})
    pos = {d: i for i, d in enumerate(order)}
    meta: dict[int, dict] = {}
    bits = [np.zeros((m["seeds"], len(order))) for m in header["models"]]
    index = {n: i for i, n in enumerate(names)}
    for r in docs:
        bits[index[r["model"]]][r["seed"], pos[r["doc"]]] = r["bits"]
        meta[r["doc"]] = r
    return header, DocumentScores(
        names,
        np.asarray(order, np.int64),
        [meta[d]["name"] for d in order],
        [meta[d]["group"] for d in order],
        np.asarray([meta[d]["bytes"] for d in order], np.int64),
        bits,
    )
