"""Unigram LM training (Kudo 2018, as SentencePiece's ``unigram`` trainer does it) on bytes.

1. **Chunks.** Pre-tokenize the documents with a named pattern, as BPE does, and count each
   distinct chunk once (:func:`~bytelm.baselines.bpe.trainer.count_chunks`). Chunks are sorted by
   their bytes, so that the result does not depend on the number of worker processes. A chunk
   longer than 4192 bytes (SentencePiece's longest sentence; it skips longer ones) is cut into
   pieces of 4192 bytes for training: a pass over the lattice costs a few numpy calls per byte of
   the longest chunk.
2. **Seed vocabulary** (:func:`seed_pieces`): a bounded substring count. Every substring of 2 to
   16 bytes inside a chunk is counted (weighted by the chunk's count), length by length; a
   substring is only counted when its one-byte-shorter prefix occurred at least twice, so the
   work shrinks with the length. Substrings that occur at least twice are ranked by
   ``occurrences x length`` (SentencePiece's seed score) and the best ``seed_size`` are kept,
   ties broken by the bytes. The 256 single bytes are always pieces (scored by their counts), so
   every input, valid UTF-8 or not, has a segmentation: there is no unknown token.
3. **EM** (:meth:`~bytelm.baselines.unigram.lattice.Lattice.expected_counts`): the E-step takes
   the expected count of every piece over *all* segmentations of every chunk (forward-backward
   in log space); the M-step sets ``log p(x) = digamma(c(x)) - digamma(sum c)`` (SentencePiece's
   variational-Bayes update) and drops learned pieces whose expected count is below 0.5.
4. **Pruning**: after ``em_steps`` EM steps, each learned piece ``x`` is scored by the likelihood
   lost without it. Its bytes are then segmented by the best path that avoids ``x`` itself
   (Viterbi), and its count moves onto those pieces; the loss is
   ``c(x)/C * (log p(x) - sum_y log p'(y))`` with the counts moved, as in SentencePiece (which
   weights by the fraction of sentences holding ``x``; here chunks play the sentences, and a
   chunk rarely holds a piece twice). The pieces with the largest loss survive: a fraction
   ``shrink`` per round, never fewer than ``1.1 x`` the target. Single bytes are never pruned.
5. **Final size**: the rounds stop at most 10% above the target; the learned pieces with the
   highest log-probability are kept, and one more EM step gives the final scores. A byte whose
   expected count is below 0.5 (say, one that never occurs) scores 10 below the lowest score
   (SentencePiece's unknown-token penalty), in training and in the result. The final scores are
   rounded to multiples of 2**-12 (2.4e-4 nats). Two reasons: such a number's shortest decimal
   has at most 15 significant digits, which every JSON reader parses to the same double (HF's
   reader is not correctly rounded on 17-digit decimals, and a one-ulp difference flipped near
   ties); and every path's score is then an exact float64 sum in any order, so ties are true
   ties, broken by the documented rule in every implementation.

**Sizes** (as for BPE): ``vocab_size`` counts every id: 256 bytes, learned pieces and special
tokens. The learned pieces get ids 256.. in order of decreasing score (ties by bytes).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from bytelm.baselines.bpe.pretokenize import PreTokenizer
from bytelm.baselines.bpe.trainer import count_chunks
from bytelm.baselines.subword import learnable_ids
from bytelm.baselines.unigram.lattice import MAX_PIECE_BYTES, Chunks, Lattice, PieceIndex, _words, find_edges
from bytelm.baselines.unigram.tokenizer import UnigramTokenizer
from bytelm.data import load_corpus
from bytelm.errors import UserError

log = logging.getLogger(__name__)

Progress = Callable[[int, int | None], None]  # (done, total; None when unknown)
MIN_EXPECTED_COUNT = 0.5  # SentencePiece's kExpectedFrequencyThreshold
UNSEEN_BYTE_PENALTY = 10.0  # SentencePiece's kUnkPenalty, relative to the lowest score
SCORE_GRID = float(1 << 12)  # scores are multiples of 2**-12 (module docstring, 5)
MAX_CHUNK_BYTES = 4192  # SentencePiece's max_sentence_length (it skips longer sentences)


@contextlib.contextmanager
def small_pages() -> Iterator[None]:
    """numpy without ``madvise(MADV_HUGEPAGE)`` on its large arrays, for the duration.

    Why: training makes hundreds of short-lived arrays of tens of MB (edge keys, orders, gathers).
    numpy asks for transparent huge pages on every array of 4 MiB or more; where the kernel's THP
    ``defrag`` mode is ``madvise`` (the kernel's default), each fresh madvised region may stall in
    direct compaction before its first write. On the 2-core benchmark machine a fresh 36 MB array
    took 0.3-0.4 s that way instead of 25 ms, and training on the stdlib corpus took 13.0 s instead
    of 8.4 s (``benchmarks/RESULTS.md`` at 3372114). numpy's setting is process-wide, so it is restored after.
    """
    setter = None
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):  # numpy >= 2, numpy < 2
        with contextlib.suppress(ImportError):
            setter = getattr(importlib.import_module(module), "_set_madvise_hugepage", None)
        if setter is not None:
            break
    if setter is None:
        yield
        return
    _set_madvise_hugepage = setter
    before = _set_madvise_hugepage(False)
    try:
        yield
    finally:
        _set_madvise_hugepage(before)


def digamma(x: np.ndarray) -> np.ndarray:
    """The digamma function for ``x > 0``: the recurrence up to ``x >= 6``, then the asymptotic
    series (error below 1e-12 there).

    >>> round(float(digamma(np.array([1.0]))[0]), 10)  # -Euler's gamma
    -0.5772156649
    """
    x = np.asarray(x, dtype=np.float64).copy()
    out = np.zeros_like(x)
    for _ in range(6):
        small = x < 6
        out[small] -= 1.0 / x[small]
        x[small] += 1.0
    inv2 = 1.0 / (x * x)
    series = inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 * (1 / 252 - inv2 * (1 / 240 - inv2 / 132))))
    return out + np.log(x) - 0.5 / x - series


def floored(logp: np.ndarray, scored: np.ndarray) -> np.ndarray:
    """``logp`` where ``scored``, elsewhere 10 below the lowest scored value (module docstring, 5)."""
    return np.where(scored, logp, logp[scored].min() - UNSEEN_BYTE_PENALTY)


def chunk_table(chunks: dict[bytes, int], max_chunk_bytes: int = MAX_CHUNK_BYTES) -> Chunks:
    """The distinct chunks, sorted by their bytes, with their counts; a chunk longer than
    ``max_chunk_bytes`` is cut into pieces of that size (module docstring, 1)."""
    cut: dict[bytes, int] = {}
    for k, n in chunks.items():
        if len(k) <= max_chunk_bytes:
            cut[k] = cut.get(k, 0) + n
        else:
            for i in range(0, len(k), max_chunk_bytes):
                part = k[i : i + max_chunk_bytes]
                cut[part] = cut.get(part, 0) + n
    keys = sorted(cut)
    return Chunks.of(keys, [cut[k] for k in keys])


def seed_pieces(
    chunks: Chunks, seed_size: int, max_piece_bytes: int = MAX_PIECE_BYTES
) -> tuple[list[bytes], np.ndarray]:
    """The seed vocabulary: ``(pieces, occurrences)`` of the ``seed_size`` substrings of 2 to
    ``max_piece_bytes`` bytes with the highest ``occurrences x length`` among those occurring at
    least twice (see the module docstring)."""
    data, n = chunks.data, len(chunks.data)
    owner = np.repeat(np.arange(len(chunks)), chunks.lens)
    room = (chunks.starts + chunks.lens)[owner] - np.arange(n)
    weight = chunks.counts[owner]
    words = _words(data)
    alive = np.arange(n)
    found_pos, found_len, found_freq = [], [], []
    for m in range(1, max_piece_bytes + 1):
        alive = alive[room[alive] >= m]
        if not len(alive):
            break
        lo = words[alive] & np.uint64((1 << (8 * min(m, 8))) - 1 if m < 8 else 0xFFFFFFFFFFFFFFFF)
        if m > 8:
            hi = words[alive + 8] & np.uint64((1 << (8 * (m - 8))) - 1 if m < 16 else 0xFFFFFFFFFFFFFFFF)
            order = np.lexsort((hi, lo))
            same = (lo[order][1:] == lo[order][:-1]) & (hi[order][1:] == hi[order][:-1])
        else:
            order = np.argsort(lo, kind="stable")
            same = lo[order][1:] == lo[order][:-1]
        starts = np.flatnonzero(np.r_[True, ~same])
        freq = np.add.reduceat(weight[alive[order]], starts)
        frequent = freq >= 2
        run_of = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(order))))
        keep = frequent[run_of]
        if m >= 2:
            found_pos.append(alive[order[starts[frequent]]])
            found_len.append(np.full(int(frequent.sum()), m, np.int64))
            found_freq.append(freq[frequent])
        alive = np.sort(alive[order[keep]])
    if not found_pos:
        return [], np.zeros(0)
    pos, length, freq = np.concatenate(found_pos), np.concatenate(found_len), np.concatenate(found_freq)
    raw = data.tobytes()
    pieces = [raw[p : p + m] for p, m in zip(pos.tolist(), length.tolist())]
    score = freq * length
    # the best seed_size by score, ties by the bytes (deterministic)
    if len(pieces) > seed_size:
        cut = np.sort(score)[::-1][seed_size - 1]
        sure = np.flatnonzero(score > cut)
        tied = sorted(np.flatnonzero(score == cut).tolist(), key=pieces.__getitem__)[: seed_size - len(sure)]
        chosen = np.sort(np.concatenate([sure, np.asarray(tied, np.int64)]))
        pieces = [pieces[i] for i in chosen.tolist()]
        freq = freq[chosen]
    return pieces, freq


class _Model:
    """The pieces being trained (single bytes first: piece ``b`` is byte ``b``) and their lattice.
    A piece that an M-step drops stays in the arrays with a score of ``-inf`` (``alive`` is
    False) until the next pruning compacts the lattice once: removing edges costs a pass over
    all of them, and an edge scored ``-inf`` contributes exactly nothing."""

    def __init__(self, chunks: Chunks, pieces: list[bytes], logp: np.ndarray) -> None:
        self.chunks = chunks
        self.pieces = pieces
        self.logp = logp
        self.alive = np.ones(len(pieces), bool)
        self.counts = np.zeros(len(pieces))
        self.lattice = Lattice(chunks, find_edges(chunks, PieceIndex(pieces)))

    @property
    def n_alive(self) -> int:
        return int(self.alive.sum())

    def keep(self, keep: np.ndarray) -> None:
        """Keep only the pieces at indexes ``keep`` (sorted; the 256 bytes among them)."""
        new_id = np.full(len(self.pieces), -1, np.int64)
        new_id[keep] = np.arange(len(keep))
        self.lattice = self.lattice.take(new_id[self.lattice.edges.piece] >= 0)
        self.lattice.edges.piece = new_id[self.lattice.edges.piece].astype(np.int32)
        self.pieces = [self.pieces[i] for i in keep.tolist()]
        self.logp = self.logp[keep]
        self.counts = self.counts[keep]
        self.alive = self.alive[keep]

    def em_step(self) -> float:
        """One E-step and M-step; returns the log-likelihood (nats) before the update. A byte
        whose expected count is below the threshold stays, scored 10 below the lowest score."""
        counts, loglik = self.lattice.expected_counts(self.logp, len(self.pieces))
        small = counts < MIN_EXPECTED_COUNT
        self.alive &= ~(small & (np.arange(len(self.pieces)) >= 256))
        total = counts[~small].sum()
        logp = digamma(np.maximum(counts, MIN_EXPECTED_COUNT)) - digamma(np.array([total]))[0]
        self.logp = np.where(self.alive, floored(logp, ~small), -np.inf)
        self.counts = counts
        return loglik

    def learned(self) -> np.ndarray:
        """The indexes of the live learned pieces."""
        return np.flatnonzero(self.alive[256:]) + 256

    def prune(self, target: int, shrink: float) -> None:
        """Drop the learned pieces whose removal loses the least likelihood (module docstring, 4)."""
        n = self.n_alive
        keep_n = max(target, int(shrink * n))
        if n <= keep_n:
            return
        learned = self.learned()
        live = np.flatnonzero(self.alive)
        # each learned piece's best segmentation without itself
        own = Chunks.of([self.pieces[i] for i in learned.tolist()])
        edges = find_edges(own, PieceIndex([self.pieces[i] for i in live.tolist()], ids=live))
        first, last = own.first_nodes(), own.last_nodes()
        selfedge = (
            (edges.piece == learned[edges.chunk])
            & (edges.src == first[edges.chunk])
            & (edges.dst == last[edges.chunk])
        )
        alts, _ = Lattice(own, edges.take(~selfedge)).viterbi(self.logp)
        c = self.counts
        C = c[self.alive].sum()
        lens = np.fromiter(map(len, alts), dtype=np.int64, count=len(alts))
        alt_piece = np.concatenate(alts)
        alt_owner = np.repeat(np.arange(len(alts)), lens)
        cx = c[learned]
        with np.errstate(divide="ignore", invalid="ignore"):
            logprob_sp = np.log(cx) - math.log(C)
            logsum_alt = np.log(C + cx * (lens - 1))
            logprob_alt = (
                np.bincount(alt_owner, weights=np.log(c[alt_piece] + cx[alt_owner]), minlength=len(alts))
                - lens * logsum_alt
            )
            loss = np.where(cx > 0, cx / C * (logprob_sp - logprob_alt), 0.0)
        # the highest losses survive; ties by the lower index (deterministic)
        order = np.lexsort((learned, -loss))
        survivors = np.sort(learned[order[: keep_n - 256]])
        self.keep(np.concatenate([np.arange(256), survivors]))


def learn_pieces(
    chunks: dict[bytes, int],
    n_learned: int,
    *,
    seed_size: int | None = None,
    em_steps: int = 2,
    shrink: float = 0.75,
    progress: Progress | None = None,
) -> tuple[list[bytes], np.ndarray, dict]:
    """Train on counted chunks: ``(learned pieces, log-probabilities of bytes then pieces, stats)``.

    ``seed_size`` defaults to ``max(10 * n_learned, 4096)`` capped at 1,000,000 (SentencePiece's
    default seed size). ``progress(round, rounds)`` is called after each pruning round.
    """
    with small_pages():
        return _learn_pieces(
            chunks, n_learned, seed_size=seed_size, em_steps=em_steps, shrink=shrink, progress=progress
        )


def _learn_pieces(chunks, n_learned, *, seed_size, em_steps, shrink, progress):
    table = chunk_table(chunks)
    seed_size = seed_size or min(1_000_000, max(10 * n_learned, 4096))
    t0 = time.perf_counter()
    seeds, seed_freq = seed_pieces(table, seed_size)
    byte_count = np.bincount(table.data, weights=np.repeat(table.counts, table.lens), minlength=256)
    score = np.concatenate(
        [byte_count, seed_freq * np.fromiter(map(len, seeds), dtype=np.float64, count=len(seeds))]
    )
    with np.errstate(divide="ignore"):
        logp = floored(np.log(score) - math.log(score.sum()), score > 0)
    model = _Model(table, [bytes([b]) for b in range(256)] + seeds, logp)
    target = 256 + n_learned
    desired = max(target, int(1.1 * target))
    rounds = (
        max(1, math.ceil(math.log(max(len(model.pieces), 1) / desired) / math.log(1 / shrink)) + 1)
        if len(model.pieces) > desired
        else 1
    )
    done = 0
    rounds_log: list[dict] = []
    stats: dict = {
        "seed_pieces": len(seeds),
        "distinct_chunks": len(table),
        "seed_s": time.perf_counter() - t0,
        "rounds": rounds_log,
    }
    log.info("%d distinct chunks, %d seed pieces (%.2fs)", len(table), len(seeds), stats["seed_s"])
    while True:
        for _ in range(em_steps):
            loglik = model.em_step()
        rounds_log.append({"pieces": model.n_alive, "loglik": loglik})
        done += 1
        if progress is not None:
            progress(min(done, rounds), rounds)
        if model.n_alive <= desired:
            break
        model.prune(desired, shrink)
    learned = model.learned()
    if len(learned) > n_learned:  # the final cut: the highest scores
        learned = learned[np.lexsort((learned, -model.logp[learned]))[:n_learned]]
    model.keep(np.concatenate([np.arange(256), np.sort(learned)]))
    stats["final_loglik"] = model.em_step()
    model.keep(np.flatnonzero(model.alive))
    # ids: the bytes, then the learned pieces by decreasing score (ties by bytes)
    ranked = sorted(range(256, len(model.pieces)), key=lambda i: (-model.logp[i], model.pieces[i]))
    pieces = [model.pieces[i] for i in ranked]
    logp = np.concatenate([model.logp[:256], model.logp[ranked]]) if ranked else model.logp[:256]
    stats["train_s"] = time.perf_counter() - t0
    return pieces, np.round(logp * SCORE_GRID) / SCORE_GRID, stats


def train_unigram(
    documents: Iterable[bytes],
    *,
    vocab_size: int,
    pattern: str = "cl100k",
    special_tokens: Sequence[str] = (),
    seed_size: int | None = None,
    num_workers: int | None = None,
    progress: Progress | None = None,
    count_progress: Progress | None = None,
    total_bytes: int | None = None,
) -> UnigramTokenizer:
    """Train a byte-level Unigram :class:`~bytelm.baselines.unigram.tokenizer.UnigramTokenizer`.

    Args mirror :func:`~bytelm.baselines.bpe.trainer.train_bpe`; ``seed_size`` is the seed
    vocabulary's size (:func:`learn_pieces`). Raises :class:`~bytelm.errors.UserError` (a
    ``ValueError``) for a vocabulary below 256 bytes + the special tokens, or an empty corpus.
    """
    specials, n_learned = learnable_ids(vocab_size, special_tokens, unit="pieces")
    PreTokenizer(pattern)
    chunks = count_chunks(
        documents, pattern=pattern, num_workers=num_workers, progress=count_progress, total_bytes=total_bytes
    )
    if not chunks:
        raise UserError(
            "the training corpus is empty (no documents, or only empty ones): nothing to learn from"
        )
    pieces, logp, stats = learn_pieces(chunks, n_learned, seed_size=seed_size, progress=progress)
    log.info("unigram: %d learned pieces in %.2fs", len(pieces), stats["train_s"])
    return UnigramTokenizer(pieces, logp.tolist(), pattern=pattern, special_tokens=specials)


def train_unigram_on_corpus(data, *, vocab_size: int, split: str = "train", **kwargs) -> UnigramTokenizer:
    """:func:`train_unigram` on the ``split`` documents of a corpus (a data spec or a loaded corpus)."""
    corpus = load_corpus(data) if isinstance(data, str) else data
    return train_unigram(
        corpus.documents(split), vocab_size=vocab_size, total_bytes=corpus.split_bytes(split), **kwargs
    )
