"""The fast batch path of the BPE encoder: :meth:`FastEncoder.encode_documents`.

Gives exactly the ids of :meth:`bytelm.baselines.bpe.tokenizer.Tokenizer.encode_ordinary` on
every document (``tests/test_bpe.py`` pins the two together), several times faster on large
corpora. The tokenizer module is the algorithm; this one is engineering:

- a chunk cache: each distinct chunk is merged once, and documents are assembled from the
  cache's flat arrays by one numpy gather;
- a whole-token shortcut: a chunk whose bytes are a token that encodes to itself is that token
  (tiktoken makes the same shortcut);
- under the ``cl100k`` pattern, ASCII documents are split by numpy (:mod:`.asciisplit`), and
  their chunks keyed by integers (packed, or numbered by content) rather than Python strings;
- new chunks of up to ``_VECTOR_CHUNK`` bytes merge together in numpy, one merge per chunk per
  round; long chunks go through a heap of pair ranks; the rest through a plain loop;
- inputs of 1 MiB or more are split across worker processes (:mod:`.parallel`), which receive the
  encoder with its tables.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from itertools import chain, count, islice, repeat
from operator import lshift, or_

import numpy as np

from bytelm.baselines.bpe.asciisplit import (
    NUMBERED_WORDS,
    PACKED_BYTES,
    IntTable,
    cl100k_starts,
    factorize,
    number_chunks,
    pack_bytes,
    pack_chunks,
)
from bytelm.baselines.bpe.parallel import balanced_shards, resolve_workers, shard_map

PAIR_SHIFT = 21  # a pair of ids as one integer key: left << PAIR_SHIFT | right
_NO_MERGE = 1 << 62
_LONG_CHUNK = 256  # chunks longer than this use the O(n log n) heap merger
_VECTOR_CHUNK = 64  # new chunks up to this length are merged together by numpy (_segment_many)
_CACHE_LIMIT = 1 << 20  # chunk cache entries before it is cleared
_PARALLEL_BYTES = 1 << 20  # inputs smaller than this are encoded in-process
_BATCH_BYTES = 1 << 22
_SHARDS_PER_WORKER = 4  # the documents path works on batches of about this size


class FastEncoder:
    """The batch encoder of one :class:`~bytelm.baselines.bpe.tokenizer.Tokenizer` (built by it,
    and rebuilt when its added tokens change). Its one public method is :meth:`encode_documents`."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.pretokenizer = tokenizer.pretokenizer
        self.vocab: list[bytes] = tokenizer.vocab
        self.n_mergeable = tokenizer.n_mergeable
        self.ranks: dict[int, int] = {(a << PAIR_SHIFT) | b: r for (a, b), r in tokenizer.ranks.items()}
        self.results: list[int] = tokenizer.merge_results
        self._cache = _ChunkCache()
        # one-time tables, built on first use (worker processes receive them built, see __getstate__)
        self._whole_tokens: dict[bytes, int] | None = None
        self._pair_arrays: tuple[IntTable | None, np.ndarray] | None = None
        self._whole_packed_table: IntTable | None = None

    def clear_cache(self) -> None:
        self._cache = _ChunkCache()

    def __getstate__(self) -> dict:
        # the tables travel to worker processes (building them again costs seconds); the chunk cache
        # does not (it can hold a million entries, and a worker fills its own)
        return {k: v for k, v in self.__dict__.items() if k != "_cache"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._cache = _ChunkCache()

    # -- the one entry point ------------------------------------------------------------------
    def encode_documents(
        self, docs: list, *, num_workers: int | None = None, dtype=np.int32
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, counts)`` of the ordinary encoding of ``docs`` (see
        :meth:`~bytelm.baselines.bpe.tokenizer.Tokenizer.encode_documents`)."""
        workers = resolve_workers(num_workers)
        sizes = [len(d) for d in docs]
        self._prepare_tables()  # once, here: the workers receive them
        if workers <= 1 or sum(sizes) < _PARALLEL_BYTES:
            return _encode_documents_shard((self, dtype), docs)
        shards = balanced_shards(
            sizes, _SHARDS_PER_WORKER * workers
        )  # a worker's cache serves all its shards
        parts = shard_map(_encode_documents_shard, (self, dtype), [docs[a:b] for a, b in shards], workers)
        if not parts:
            return np.zeros(0, dtype), np.zeros(0, np.int64)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    # -- tables -----------------------------------------------------------------------------------
    def _prepare(self) -> None:
        self._whole()

    def _whole(self) -> dict[bytes, int]:
        """The whole-token shortcut: the tokens whose bytes BPE encodes to themselves (every
        token of a tokenizer trained by :func:`train_bpe`; for an arbitrary merge list only the
        tokens checked to do so)."""
        if self._whole_tokens is None:
            vocab = self.vocab
            self._whole_tokens = {vocab[i]: i for i in range(self.n_mergeable) if self._bpe(vocab[i]) == (i,)}
        return self._whole_tokens

    def _prepare_tables(self) -> None:
        self._prepare()
        self._pair_table()
        if self.pretokenizer.name == "cl100k":
            self._whole_packed()

    def _pair_table(self) -> tuple[IntTable | None, np.ndarray]:
        """The merges as a hash table from pair key to rank (``None`` without merges), and each
        rank's resulting id (for :meth:`_bpe_arrays`)."""
        if self._pair_arrays is None:
            n = len(self.ranks)
            keys = np.fromiter(self.ranks.keys(), dtype=np.uint64, count=n)
            ranks = np.fromiter(self.ranks.values(), dtype=np.int64, count=n)
            self._pair_arrays = (
                IntTable(keys, ranks) if n else None,
                np.asarray(self.results, dtype=np.int64),
            )
        return self._pair_arrays

    def _whole_packed(self) -> IntTable:
        """:meth:`_prepare`'s whole-token shortcut for packed keys (:func:`.asciisplit.pack_chunks`):
        the ASCII tokens of up to 8 bytes that encode to themselves."""
        if self._whole_packed_table is None:
            items = [
                (pack_bytes(b), i) for b, i in self._whole().items() if len(b) <= PACKED_BYTES and b.isascii()
            ]
            keys = np.array([k for k, _ in items], dtype=np.uint64)
            self._whole_packed_table = IntTable(keys, np.array([i for _, i in items], dtype=np.int64))
        return self._whole_packed_table

    # -- merging one chunk --------------------------------------------------------------------
    def _bpe(self, piece: bytes) -> tuple[int, ...]:
        """:meth:`Tokenizer.bpe` on packed pair keys (lowest rank first, leftmost first)."""
        n = len(piece)
        if n < 2:
            return tuple(piece)
        if n > _LONG_CHUNK:
            return self._bpe_long(piece)
        ranks, results, S, NO = self.ranks, self.results, PAIR_SHIFT, _NO_MERGE
        ids = list(piece)
        get = ranks.get
        rk = list(map(get, map(or_, map(lshift, piece, repeat(S, n)), piece[1:]), repeat(NO, n)))
        while rk:
            best = min(rk)
            if best == NO:
                break
            i = rk.index(best)
            t = results[best]
            ids[i : i + 2] = (t,)
            del rk[i]
            if i:
                rk[i - 1] = get((ids[i - 1] << S) | t, NO)
            if i < len(rk):
                rk[i] = get((t << S) | ids[i + 1], NO)
        return tuple(ids)

    def _bpe_long(self, piece: bytes) -> tuple[int, ...]:
        """:meth:`_bpe` for long chunks: a heap of (rank, position) over a linked list."""
        ranks, results, S = self.ranks, self.results, PAIR_SHIFT
        ids = list(piece)
        n = len(ids)
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(n - 1):
            r = ranks.get((ids[i] << S) | ids[i + 1])
            if r is not None:
                heap.append((r << 32) | i)
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        mask = (1 << 32) - 1
        while heap:
            e = pop(heap)
            r, i = e >> 32, e & mask
            left = ids[i]
            if left < 0:
                continue
            j = nxt[i]
            if j >= n or ranks.get((left << S) | ids[j]) != r:
                continue  # stale entry
            t = results[r]
            ids[i] = t
            ids[j] = -1
            k = nxt[j]
            nxt[i] = k
            if k < n:
                prv[k] = i
                r2 = ranks.get((t << S) | ids[k])
                if r2 is not None:
                    push(heap, (r2 << 32) | i)
            p = prv[i]
            if p >= 0:
                r2 = ranks.get((ids[p] << S) | t)
                if r2 is not None:
                    push(heap, (r2 << 32) | p)
        return tuple(x for x in ids if x >= 0)

    # -- merging many chunks ----------------------------------------------------------------------
    def _complete(self, cache: _ChunkCache) -> None:
        """Run BPE on the chunks that got a cache entry since the last call."""
        n_new = len(cache.index) - len(cache.tokens)
        if n_new:
            self._prepare()
            new = list(islice(reversed(cache.index), n_new))
            new.reverse()
            cache.tokens += self._segment_many(new)

    def _segment_many(self, chunks: list[str | bytes | int]) -> list[tuple[int, ...]]:
        """The token ids of many chunks (cache keys as str or bytes; packed integer keys get theirs
        in :meth:`_ascii_entries`). A chunk whose bytes are a whole token is that token; the other
        chunks of up to ``_VECTOR_CHUNK`` bytes merge together in numpy (:meth:`_bpe_arrays`);
        longer chunks go through :meth:`_bpe`."""
        whole = self._whole()
        out: list = [None] * len(chunks)
        todo_at: list[int] = []
        todo: list[bytes] = []
        for i, chunk in enumerate(chunks):
            if isinstance(chunk, int):
                raise TypeError(
                    f"a packed chunk key ({chunk}) has its ids from the ASCII path, not from here"
                )
            piece = chunk.encode("utf-8", "surrogateescape") if type(chunk) is str else chunk
            assert isinstance(piece, bytes)
            t = whole.get(piece)
            if t is not None:
                out[i] = (t,)
            elif len(piece) > _VECTOR_CHUNK or len(piece) < 2:
                out[i] = self._bpe(piece)
            else:
                todo_at.append(i)
                todo.append(piece)
        if todo:
            for i, ids in zip(todo_at, self._bpe_vectorized(todo)):
                out[i] = ids
        return out

    def _tokens_of_packed(self, keys: np.ndarray) -> list[tuple[int, ...]]:
        """The token ids of chunks given by packed keys: whole tokens by one table lookup, the
        rest merged together by :meth:`_bpe_arrays`."""
        whole = self._whole_packed().get(keys, default=-1)
        out: list = [(t,) for t in whole.tolist()]
        miss = np.flatnonzero(whole < 0)
        if len(miss):
            k = keys[miss]
            lens = np.where(k >> np.uint64(63), (k >> np.uint64(56)) & np.uint64(0x7F), 8).astype(np.int64)
            rows = k.astype("<u8").view(np.uint8).reshape(-1, PACKED_BYTES)  # the bytes, in order
            ids = rows[np.arange(PACKED_BYTES) < lens[:, None]].astype(np.int64)
            for j, t in zip(miss.tolist(), self._bpe_arrays(ids, lens)):
                out[j] = t
        return out

    def _bpe_vectorized(self, pieces: list[bytes]) -> list[tuple[int, ...]]:
        lens = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        return self._bpe_arrays(np.frombuffer(b"".join(pieces), dtype=np.uint8).astype(np.int64), lens)

    def _bpe_arrays(self, ids: np.ndarray, lens: np.ndarray) -> list[tuple[int, ...]]:
        """BPE on many chunks at once: ``ids`` holds their bytes back to back (``int64``),
        ``lens`` their lengths (each at least 1). Each round merges, in every chunk, its
        lowest-ranked pair, leftmost first (exactly :meth:`_bpe`)."""
        table, results = self._pair_table()
        n_chunks = len(lens)
        NO = np.int64(_NO_MERGE)
        owner = np.repeat(np.arange(n_chunks), lens)  # chunk of each position (non-decreasing)
        done_ids, done_owner = [], []
        while len(ids) and table is not None:
            # the rank of each adjacent pair inside a chunk (NO where none or across chunks)
            rank = np.empty(len(ids), np.int64)
            rank[:-1] = table.get(((ids[:-1] << PAIR_SHIFT) | ids[1:]).astype(np.uint64), default=_NO_MERGE)
            rank[:-1][owner[:-1] != owner[1:]] = NO
            rank[-1] = NO
            starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
            best = np.minimum.reduceat(rank, starts)
            finished = best == NO
            chunk_len = np.diff(np.r_[starts, len(ids)])
            if finished.any():  # chunks with nothing left to merge leave the active set
                fin_pos = np.repeat(finished, chunk_len)
                done_ids.append(ids[fin_pos])
                done_owner.append(owner[fin_pos])
                keep = ~fin_pos
                ids, owner, rank = ids[keep], owner[keep], rank[keep]
                best, chunk_len = best[~finished], chunk_len[~finished]
                if not len(ids):
                    break
            # the leftmost position holding its chunk's best rank
            hits = np.flatnonzero(rank == np.repeat(best, chunk_len))
            first = hits[np.r_[True, owner[hits[1:]] != owner[hits[:-1]]]]
            ids[first] = results[rank[first]]
            drop = np.ones(len(ids), dtype=bool)
            drop[first + 1] = False
            ids, owner = ids[drop], owner[drop]
        done_ids.append(ids)  # (what is left when there are no merges at all)
        done_owner.append(owner)
        all_ids = np.concatenate(done_ids)
        all_owner = np.concatenate(done_owner)
        order = np.argsort(all_owner, kind="stable")
        bounds = np.searchsorted(all_owner[order], np.arange(n_chunks + 1))
        flat = all_ids[order].tolist()
        return [tuple(flat[a:b]) for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]

    # -- documents --------------------------------------------------------------------------------
    def _encode_batch(self, docs: list, dtype) -> tuple[np.ndarray, np.ndarray]:
        """Ordinary encoding of a batch of documents into one array (and per-document counts):
        per document, the chunk cache maps chunks to token tuples and numpy gathers them."""
        if not docs:
            return np.zeros(0, dtype), np.zeros(0, np.int64)
        tok = self.tokenizer
        if tok.added_tokens:  # rare: added tokens split documents first (the reference path)
            parts = [tok.encode_ordinary(d) for d in docs]
            counts = np.array([len(p) for p in parts], dtype=np.int64)
            return np.fromiter(chain.from_iterable(parts), dtype=dtype, count=int(counts.sum())), counts
        splitter_for = self.pretokenizer.splitter_for
        if len(self._cache.index) > _CACHE_LIMIT:  # between batches, never while entries are in use
            self._cache = _ChunkCache()
        kinds: list = [None] * len(docs)
        n_chunks = np.zeros(len(docs), dtype=np.int64)
        cache = self._cache
        entry = cache.index.__getitem__  # a new chunk gets a new entry
        ascii_at, ascii_docs = [], []
        vectorized = self.pretokenizer.name == "cl100k"
        for j, doc in enumerate(docs):
            if vectorized and doc.isascii():
                ascii_at.append(j)
                ascii_docs.append(doc.encode() if isinstance(doc, str) else doc)
                continue
            text = doc if isinstance(doc, str) else bytes(doc).decode("utf-8", "surrogateescape")
            chunks = splitter_for(text)(text)
            kinds[j] = np.fromiter(map(entry, chunks), dtype=np.int64, count=len(chunks))
            n_chunks[j] = len(chunks)
        if ascii_docs:
            kind, counts = self._ascii_entries(ascii_docs)
            n_chunks[ascii_at] = counts
            for j, part in zip(ascii_at, np.split(kind, np.cumsum(counts)[:-1])):
                kinds[j] = part
        self._complete(cache)
        flat, starts, lens = cache.arrays()
        kind = np.concatenate(kinds)
        n_tok = lens[kind]  # tokens per chunk occurrence
        ends = np.cumsum(n_tok)
        total = int(ends[-1]) if len(ends) else 0
        ids = flat[np.repeat(starts[kind] - (ends - n_tok), n_tok) + np.arange(total)].astype(
            dtype, copy=False
        )
        cum = np.concatenate([[0], ends])
        bounds = np.concatenate([[0], np.cumsum(n_chunks)])
        return ids, cum[bounds[1:]] - cum[bounds[:-1]]

    def _ascii_entries(self, docs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """The chunk cache entries of ASCII documents under the ``cl100k`` pattern, found with
        numpy (:mod:`.asciisplit`) for all documents at once: the split; then chunks of up to 8
        bytes are keyed by one integer, chunks of up to 32 bytes numbered by content, and only
        one of each distinct chunk reaches the cache's dict (chunks longer than 32 bytes all do).
        Returns ``(entries of all chunks, number of chunks of each document)``."""
        sizes = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
        doc_starts = np.cumsum(sizes) - sizes
        data = b"".join(docs) + bytes(PACKED_BYTES * NUMBERED_WORDS)  # room for 8-byte windows
        n = int(sizes.sum())
        starts = cl100k_starts(np.frombuffer(data, np.uint8, count=n), doc_starts)
        lens = np.append(starts[1:], n) - starts
        short = lens <= PACKED_BYTES
        uniq, index = factorize(pack_chunks(data, starts[short], lens[short]))
        cache = self._cache
        self._complete(cache)  # entries still without ids come first (entries are numbered in order)
        n_done = len(cache.tokens)
        entry = cache.index.__getitem__
        uniq_entry = np.fromiter(map(entry, uniq.tolist()), dtype=np.int64, count=len(uniq))
        new = uniq_entry >= n_done  # new entries, numbered n_done, n_done + 1, ... in this order
        if new.any():
            cache.tokens += self._tokens_of_packed(uniq[new])
        kind = np.empty(len(starts), np.int64)
        kind[short] = uniq_entry[index]
        mid = np.flatnonzero(~short & (lens <= PACKED_BYTES * NUMBERED_WORDS))

        def entries_of(at: np.ndarray) -> np.ndarray:  # dict lookups keyed by the chunks' bytes
            pieces = [data[a : a + m] for a, m in zip(starts[at].tolist(), lens[at].tolist())]
            return np.fromiter(map(entry, pieces), dtype=np.int64, count=len(pieces))

        if len(mid):  # one lookup per distinct chunk
            number, example = number_chunks(data, starts[mid], lens[mid])
            kind[mid] = entries_of(mid[example])[number]
        long_at = np.flatnonzero(lens > PACKED_BYTES * NUMBERED_WORDS)
        if len(long_at):
            kind[long_at] = entries_of(long_at)
        bounds = np.searchsorted(starts, np.append(doc_starts, n))
        return kind, np.diff(bounds)


class _ChunkCache:
    """The ids of the chunks seen so far: ``index`` maps a chunk to its entry, ``tokens[entry]``
    holds its ids; :meth:`arrays` gives the same as flat numpy arrays, for gathering."""

    def __init__(self) -> None:
        # a new chunk gets the next entry; keys are the chunk (str), or, from the ASCII path
        # (FastEncoder._ascii_entries), its bytes or its pack_chunks integer
        self.index: dict[str | bytes | int, int] = defaultdict(count().__next__)
        self.tokens: list[tuple[int, ...]] = []
        self._flat = np.zeros(0, np.int64)
        self._lens = np.zeros(0, np.int64)
        self._synced = 0

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(flat ids of all entries, start of each entry, length of each entry)``."""
        new = self.tokens[self._synced :]
        if new:
            lens = np.fromiter(map(len, new), dtype=np.int64, count=len(new))
            flat = np.fromiter(chain.from_iterable(new), dtype=np.int64, count=int(lens.sum()))
            self._flat = np.concatenate([self._flat, flat])
            self._lens = np.concatenate([self._lens, lens])
            self._synced = len(self.tokens)
        starts = np.cumsum(self._lens) - self._lens
        return self._flat, starts, self._lens


def _encode_documents_shard(shared, docs: list) -> tuple[np.ndarray, np.ndarray]:
    """A worker's part of :meth:`FastEncoder.encode_documents` (module level: process pools call it)."""
    enc, dtype = shared
    id_parts, count_parts = [], []
    batch: list = []
    size = 0
    for doc in docs:
        batch.append(doc)
        size += len(doc)
        if size >= _BATCH_BYTES:
            ids, counts = enc._encode_batch(batch, dtype)
            id_parts.append(ids)
            count_parts.append(counts)
            batch, size = [], 0
    ids, counts = enc._encode_batch(batch, dtype)
    id_parts.append(ids)
    count_parts.append(counts)
    return np.concatenate(id_parts), np.concatenate(count_parts)
