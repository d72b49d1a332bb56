"""A subword LM's training split, encoded once into a token stream: sharded and in parallel, in
memory bounded by one part, whatever the corpus's size.

The train documents are cut into parts of about :data:`PART_BYTES` bytes (whole documents, in
order). Each part is encoded on its own (by one of ``workers`` spawned processes, each loading the
tokenizer from its directory and the corpus from its cache) into ``part-NNNNN.u32``:
``[BOS, id+4, ..., EOS]`` per document, the layout of the byte stream. The parts are then joined
in order into ``train.u32`` (a streamed copy), so the result is the same whatever the number of
workers or parts; ``manifest.json`` (written last) holds the counts.

Unigram sampling (``alpha > 0``) draws document ``j``'s segmentation with the generator
``default_rng([seed, j])``, ``j`` counting train documents from 0, so it too is the same however the
split is cut.
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
from pathlib import Path

import numpy as np

from bytelm.constants import BOS_ID, BYTE_OFFSET, EOS_ID
from bytelm.data.sources import Progress

PART_BYTES = 8 << 20  # text bytes per encoded part (a worker holds one part's ids)


def _parts(corpus, part_bytes: int) -> list[tuple[int, int]]:
    """Ranges ``[a, b)`` of train documents (in train order) of about ``part_bytes`` bytes each."""
    docs = corpus.document_indices("train")
    sizes = corpus.offsets[docs + 1] - corpus.offsets[docs]
    ends = np.cumsum(sizes)
    bounds = [0]
    while bounds[-1] < len(docs):
        a = bounds[-1]
        target = (ends[a - 1] if a else 0) + part_bytes
        b = int(np.searchsorted(ends, target, side="left")) + 1
        bounds.append(min(max(b, a + 1), len(docs)))
    return list(zip(bounds[:-1], bounds[1:]))


def _encode_part(job: tuple) -> tuple[int, int]:
    """One part: documents ``[a, b)`` of the train split into ``out`` (module level: spawned
    workers run it). Returns ``(tokens, stream length)``."""
    corpus_path, segment_bytes, tokenizer_dir, a, b, alpha, seed, out = job
    from bytelm.baselines import load_tokenizer
    from bytelm.data.corpus import Corpus

    corpus = Corpus(Path(corpus_path), segment_bytes=segment_bytes)
    tokenizer = _TOKENIZERS.get(tokenizer_dir)
    if tokenizer is None:
        tokenizer = _TOKENIZERS[tokenizer_dir] = load_tokenizer(tokenizer_dir)
    docs = corpus.document_indices("train")[a:b]
    texts = (corpus.document(int(i)).tobytes() for i in docs)
    if alpha > 0:
        parts = [
            tokenizer.encode_sampled(t, alpha=alpha, rng=np.random.default_rng([seed, a + k]))
            for k, t in enumerate(texts)
        ]
        counts = np.array([len(p) for p in parts], np.int64)
        ids = np.fromiter((i for p in parts for i in p), dtype=np.int64, count=int(counts.sum()))
    else:
        ids, counts = tokenizer.encode_documents(texts, dtype=np.int64, num_workers=1)
    n = len(counts)
    stream = np.empty(len(ids) + 2 * n, np.uint32)
    starts = np.concatenate([[0], np.cumsum(counts + 2)])[:-1]
    stream[starts] = BOS_ID
    stream[starts + counts + 1] = EOS_ID
    body = np.ones(len(stream), bool)
    body[starts] = False
    body[starts + counts + 1] = False
    stream[body] = ids + BYTE_OFFSET
    stream.tofile(out)
    # the encoder's cache of chunks seen grows with the distinct words of what it encoded: one part's
    # at a time keeps a worker's memory flat in the corpus's size
    tokenizer.clear_cache()
    return int(len(ids)), int(len(stream))


_TOKENIZERS: dict = {}  # a worker's loaded tokenizer (it encodes many parts)


def encode_train_split(
    corpus,
    tokenizer_dir: str,
    out: Path,
    *,
    workers: int = 1,
    alpha: float = 0.0,
    seed: int = 0,
    part_bytes: int | None = None,
    progress: Progress | None = None,
) -> dict:
    """Encode ``corpus``'s train split with the tokenizer saved in ``tokenizer_dir`` into ``out``
    (an existing, empty directory): ``train.u32`` and ``manifest.json``; returns the manifest."""
    parts = _parts(corpus, part_bytes or PART_BYTES)
    where = (str(corpus.path), corpus.segment_bytes, str(tokenizer_dir))
    jobs = [(*where, a, b, alpha, seed, out / f"part-{k:05d}.u32") for k, (a, b) in enumerate(parts)]
    if workers <= 1 or len(jobs) <= 1:
        results = []
        for k, job in enumerate(jobs):
            results.append(_encode_part(job))
            if progress:
                progress(k + 1, len(jobs))
    else:
        import multiprocessing  # noqa: PLC0415

        # spawned, not forked: the parent may run JAX's threads
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
            futures = [pool.submit(_encode_part, job) for job in jobs]
            for k, _ in enumerate(concurrent.futures.as_completed(futures)):
                if progress:
                    progress(k + 1, len(jobs))
            results = [f.result() for f in futures]
    with open(out / "train.u32", "wb") as stream:
        for job in jobs:
            with open(job[-1], "rb") as part:
                shutil.copyfileobj(part, stream, 1 << 22)
            Path(job[-1]).unlink()
    manifest = {
        "tokens": sum(t for t, _ in results),
        "bytes": corpus.split_bytes("train"),
        "length": sum(n for _, n in results),
        "parts": len(jobs),
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    return manifest
