"""The byte-level BPE :class:`Tokenizer`: rank-based encoding with a tiktoken-style API.

Ids: byte ``b`` is id ``b`` (0-255); the token made by merge ``k`` is id ``256 + k`` (a merge
whose bytes already exist reuses that id, so in general the mergeable ids are ``0 ..
n_mergeable - 1``); special tokens follow, then added tokens (:meth:`Tokenizer.add_tokens`).
The mergeable ids double as tiktoken ranks: ``ranks.tiktoken`` stores ``bytes -> id``.

Encoding never counts anything (NOTES.md): split the text into chunks with the pattern, then, in
each chunk, start from the bytes and repeatedly apply the applicable merge with the **lowest
rank** (the leftmost occurrence first) until none applies. It is not longest-match:

>>> tok = Tokenizer([(ord("a"), ord("b")), (ord("c"), ord("d")), (256, ord("c"))], pattern=r"\\S+|\\s+")
>>> [tok.token_bytes(i) for i in tok.encode("abcd")]
[b'ab', b'cd']

Special and added tokens are matched as whole strings, longest first, before BPE runs; BPE only
sees the text between them. A special token found in text that is not allowed raises
``ValueError`` (untrusted text must never silently become a control token).
"""

from __future__ import annotations

import codecs
import hashlib
import heapq
import json
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from itertools import chain, count, islice, repeat
from operator import lshift, or_
from typing import Literal

import numpy as np

from bytelm.baselines.bpe.asciisplit import (
    PACKED_BYTES,
    NUMBERED_WORDS,
    IntTable,
    cl100k_starts,
    factorize,
    number_chunks,
    pack_bytes,
    pack_chunks,
)
from bytelm.baselines.bpe.parallel import balanced_shards, resolve_workers, shard_map
from bytelm.baselines.bpe.pretokenize import PreTokenizer, resolve_pattern
from bytelm.errors import UserError

PAIR_SHIFT = 21  # same packing as the trainer: pair key = left << PAIR_SHIFT | right
_NO_MERGE = 1 << 62
_LONG_CHUNK = 256  # chunks longer than this use the O(n log n) heap merger
_VECTOR_CHUNK = 64  # new chunks up to this length are merged together by numpy (_bpe_many)
_CACHE_LIMIT = 1 << 20  # chunk cache entries before it is cleared
_PARALLEL_BYTES = 1 << 20  # inputs smaller than this are encoded in-process
_BATCH_BYTES = 1 << 22
_SHARDS_PER_WORKER = 4  # the documents fast path works on batches of about this size

FORMAT_NAME = "bytelm-bpe"


def check_special_tokens(tokens: Iterable[str]) -> list[str]:
    """Validate special (or added) token strings: non-empty, unique ``str``; return them as a list."""
    if isinstance(tokens, str):
        raise UserError(f"special tokens must be a list of strings, got the single string {tokens!r}")
    out: list[str] = []
    for t in tokens:
        if not isinstance(t, str) or not t:
            raise UserError(f"a special or added token must be a non-empty string, got {t!r}")
        if t in out:
            raise UserError(f"token {t!r} is listed twice")
        out.append(t)
    return out


def _literal_regex(tokens: Collection[str]) -> re.Pattern | None:
    """A regex matching any of ``tokens``, longest first (so the leftmost-longest wins)."""
    if not tokens:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=lambda t: (-len(t), t))))


class Tokenizer:
    """A byte-level BPE tokenizer: an ordered merge list, a pattern and reserved tokens.

    Build one with :func:`~bytelm.baselines.bpe.trainer.train_bpe` or :meth:`load`, or
    directly from a merge list (pairs of ids, in rank order).

    Args:
      merges: ``[(left id, right id), ...]`` in rank order; ids refer to bytes (0-255) or to
        tokens made by earlier merges.
      pattern: ``"gpt2"``, ``"cl100k"`` or a regex string (``regex`` module syntax).
      special_tokens: reserved control tokens (ids after the mergeable ones); only encoded when
        allowed (see :meth:`encode`).
      added_tokens: ordinary tokens matched as whole strings before BPE, always allowed.
    """

    def __init__(
        self,
        merges: Iterable[tuple[int, int]],
        *,
        pattern: str = "cl100k",
        special_tokens: Iterable[str] = (),
        added_tokens: Iterable[str] = (),
    ) -> None:
        self.pattern = resolve_pattern(pattern)
        self._pretok = PreTokenizer(self.pattern)
        vocab: list[bytes] = [bytes([b]) for b in range(256)]
        id_of: dict[bytes, int] = {v: i for i, v in enumerate(vocab)}
        ranks: dict[int, int] = {}
        results: list[int] = []
        merge_list: list[tuple[int, int]] = []
        for rank, pair in enumerate(merges):
            try:
                left, right = (int(x) for x in pair)
            except (TypeError, ValueError):
                raise UserError(f"merge {rank} is {pair!r}, not a pair of token ids") from None
            if not (0 <= left < len(vocab) and 0 <= right < len(vocab)):
                raise UserError(
                    f"merge {rank} ({left}, {right}) refers to an id that does not exist yet "
                    f"(ids 0..{len(vocab) - 1} exist before it)"
                )
            new = vocab[left] + vocab[right]
            t = id_of.get(new)
            if t is None:
                t = len(vocab)
                vocab.append(new)
                id_of[new] = t
            ranks.setdefault((left << PAIR_SHIFT) | right, rank)  # a repeated pair keeps its first rank
            results.append(t)
            merge_list.append((left, right))
        self.merges: list[tuple[int, int]] = merge_list
        self._vocab = vocab
        self._id_of = id_of
        self._ranks = ranks
        self._results = results
        self.n_mergeable = len(vocab)
        specials = check_special_tokens(special_tokens)
        self.special_tokens: dict[str, int] = {s: self.n_mergeable + i for i, s in enumerate(specials)}
        self._id_to_bytes: list[bytes] = vocab + [s.encode("utf-8") for s in specials]
        self.added_tokens: dict[str, int] = {}
        self._cache = _ChunkCache()
        self._whole_tokens: dict[bytes, int] | None = None  # see _prepare()
        self._pair_arrays: tuple[IntTable | None, np.ndarray] | None = None  # see _pair_table()
        self._whole_packed_table: IntTable | None = None  # see _whole_packed()
        self._fingerprint: str | None = None
        self._literal_ids: dict[str, int] = dict(self.special_tokens)
        self._matcher_cache: dict[frozenset[str], re.Pattern | None] = {}
        self.add_tokens(added_tokens)

    # -- vocabulary -------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        """Number of ids: mergeable tokens + special tokens + new added tokens (= largest id + 1)."""
        return len(self._id_to_bytes)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token (a special or added token: its UTF-8 spelling)."""
        if not isinstance(token_id, (int, np.integer)) or not 0 <= token_id < self.n_vocab:
            raise ValueError(f"unknown token id {token_id!r}: valid ids are 0..{self.n_vocab - 1}")
        return self._id_to_bytes[token_id]

    def token_id(self, token: bytes | str) -> int | None:
        """The id of a mergeable token's bytes, or of a special/added token's string, else None."""
        if isinstance(token, str):
            if token in self.special_tokens:
                return self.special_tokens[token]
            if token in self.added_tokens:
                return self.added_tokens[token]
            token = token.encode("utf-8")
        return self._id_of.get(bytes(token))

    def add_tokens(self, tokens: Iterable[str]) -> list[int]:
        """Add ordinary tokens, matched as whole strings before BPE (allowed by default).

        Returns their ids: a new id after all existing ones, or the existing id when the string
        already is an added token, a special token or a mergeable token (HF's rule).
        """
        ids = []
        for tok in check_special_tokens(tokens):
            if tok in self.added_tokens:
                ids.append(self.added_tokens[tok])
                continue
            if tok in self.special_tokens:
                ids.append(self.special_tokens[tok])
                continue
            existing = self._id_of.get(tok.encode("utf-8"))
            if existing is None:
                existing = len(self._id_to_bytes)
                self._id_to_bytes.append(tok.encode("utf-8"))
            self.added_tokens[tok] = existing
            ids.append(existing)
        self._fingerprint = None
        self._literal_ids = {**self.added_tokens, **self.special_tokens}
        self._matcher_cache.clear()
        return ids

    @property
    def fingerprint(self) -> str:
        """sha256 (hex) of what determines the ids: pattern, merges, special and added tokens."""
        if self._fingerprint is None:
            payload = json.dumps(
                {
                    "format": FORMAT_NAME,
                    "pattern": self.pattern,
                    "merges": self.merges,
                    "special_tokens": list(self.special_tokens),
                    "added_tokens": list(self.added_tokens),
                },
                separators=(",", ":"),
                ensure_ascii=True,
            )
            self._fingerprint = hashlib.sha256(payload.encode("ascii")).hexdigest()
        return self._fingerprint

    def __repr__(self) -> str:
        return (
            f"Tokenizer(n_vocab={self.n_vocab}, merges={len(self.merges)}, pattern="
            f"{self._pretok.name or self.pattern!r}, special_tokens={list(self.special_tokens)})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __getstate__(self):
        whole = self._whole_tokens
        return {
            "merges": self.merges,
            "pattern": self.pattern,
            "special_tokens": list(self.special_tokens),
            "added_tokens": list(self.added_tokens),
            # the result of _prepare(), so that a worker process need not redo it
            "not_whole": None if whole is None else sorted(set(range(self.n_mergeable)) - set(whole.values())),
        }

    def __setstate__(self, state) -> None:
        self.__init__(
            state["merges"],
            pattern=state["pattern"],
            special_tokens=state["special_tokens"],
            added_tokens=state["added_tokens"],
        )
        if state.get("not_whole") is not None:
            skip = set(state["not_whole"])
            self._whole_tokens = {self._vocab[i]: i for i in range(self.n_mergeable) if i not in skip}

    # -- BPE on one chunk ---------------------------------------------------------------------
    def _bpe(self, piece: bytes) -> tuple[int, ...]:
        """Merge the bytes of one chunk: lowest rank first, leftmost first."""
        n = len(piece)
        if n < 2:
            return tuple(piece)
        if n > _LONG_CHUNK:
            return self._bpe_long(piece)
        ranks, results, S, NO = self._ranks, self._results, PAIR_SHIFT, _NO_MERGE
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
        ranks, results, S = self._ranks, self._results, PAIR_SHIFT
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

    def _prepare(self) -> None:
        """One-time setup of the encoder's shortcut: a chunk whose bytes are a token that BPE
        encodes to itself is that token, without running the merges (tiktoken makes the same
        shortcut). Every token of a tokenizer trained by :func:`train_bpe` encodes to itself;
        for an arbitrary merge list only the tokens checked to do so are used."""
        if self._whole_tokens is None:
            vocab = self._vocab
            self._whole_tokens = {vocab[i]: i for i in range(self.n_mergeable) if self._bpe(vocab[i]) == (i,)}

    def _prepare_tables(self) -> None:
        """Build every one-time table of the batch encoders (before worker processes fork, so
        that they inherit them instead of each building its own)."""
        self._prepare()
        self._pair_table()
        if self._pretok.name == "cl100k":
            self._whole_packed()

    def clear_cache(self) -> None:
        """Forget the chunk cache (e.g. to measure cold-cache speed)."""
        self._cache = _ChunkCache()

    # -- encoding ordinary text -------------------------------------------------------------------
    def _encode_plain(self, text: str) -> list[int]:
        """BPE over the pattern's chunks (no special or added tokens), through the chunk cache."""
        chunks = self._pretok.splitter_for(text)(text)
        self._bound_cache()
        cache = self._cache
        entries = list(map(cache.index.__getitem__, chunks))  # new chunks get new entries here
        self._complete(cache)
        return list(chain.from_iterable(map(cache.tokens.__getitem__, entries)))

    def _bound_cache(self) -> None:
        """Start a new chunk cache once it holds over ``_CACHE_LIMIT`` chunks (called between
        texts or batches, never while entries of the current cache are in use)."""
        if len(self._cache.index) > _CACHE_LIMIT:
            self._cache = _ChunkCache()

    def _complete(self, cache: _ChunkCache) -> None:
        """Run BPE on the chunks that got a cache entry since the last call."""
        n_new = len(cache.index) - len(cache.tokens)
        if n_new:
            self._prepare()
            new = list(islice(reversed(cache.index), n_new))
            new.reverse()
            cache.tokens += self._bpe_many(new)

    def _bpe_many(self, chunks: list[str | bytes]) -> list[tuple[int, ...]]:
        """The token ids of many chunks (cache keys as str or bytes; packed integer keys get theirs
        in :meth:`_ascii_entries`). A chunk whose bytes are a whole token is that token; the other chunks of up to ``_VECTOR_CHUNK`` bytes merge together in numpy, one merge per
        chunk per round (each round merges, in every chunk, its lowest-ranked pair, leftmost
        first: exactly :meth:`_bpe`); longer chunks go through :meth:`_bpe`."""
        whole = self._whole_tokens
        out: list = [None] * len(chunks)
        todo_at, todo = [], []
        for i, chunk in enumerate(chunks):
            piece = chunk.encode("utf-8", "surrogateescape") if type(chunk) is str else chunk
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

    def _pair_table(self) -> tuple[IntTable | None, np.ndarray]:
        """The merges as a hash table from pair key to rank (``None`` without merges), and each
        rank's resulting id (for :meth:`_bpe_arrays`)."""
        if self._pair_arrays is None:
            n = len(self._ranks)
            keys = np.fromiter(self._ranks.keys(), dtype=np.uint64, count=n)
            ranks = np.fromiter(self._ranks.values(), dtype=np.int64, count=n)
            self._pair_arrays = (IntTable(keys, ranks) if n else None, np.asarray(self._results, dtype=np.int64))
        return self._pair_arrays

    def _whole_packed(self) -> IntTable:
        """:meth:`_prepare`'s whole-token shortcut for packed keys (:func:`.asciisplit.pack_chunks`):
        the ASCII tokens of up to 8 bytes that encode to themselves."""
        if self._whole_packed_table is None:
            self._prepare()
            items = [(pack_bytes(b), i) for b, i in self._whole_tokens.items() if len(b) <= PACKED_BYTES and b.isascii()]
            keys = np.array([k for k, _ in items], dtype=np.uint64)
            self._whole_packed_table = IntTable(keys, np.array([i for _, i in items], dtype=np.int64))
        return self._whole_packed_table

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

    def _encode_with(self, text: str, matcher: re.Pattern | None) -> list[int]:
        if matcher is None:
            return self._encode_plain(text)
        out: list[int] = []
        pos = 0
        lookup = self._literal_ids
        for m in matcher.finditer(text):
            if m.start() > pos:
                out += self._encode_plain(text[pos : m.start()])
            out.append(lookup[m.group()])
            pos = m.end()
        if pos < len(text):
            out += self._encode_plain(text[pos:])
        return out

    def _matchers(self, allowed: frozenset[str]) -> re.Pattern | None:
        """The regex of the whole-string tokens to match: added tokens + ``allowed`` specials."""
        try:
            return self._matcher_cache[allowed]
        except KeyError:
            m = self._matcher_cache[allowed] = _literal_regex(set(self.added_tokens) | allowed)
            return m

    @staticmethod
    def _as_text(text: str | bytes) -> str:
        if isinstance(text, str):
            return text
        if isinstance(text, (bytes, bytearray, memoryview)):
            return bytes(text).decode("utf-8", "surrogateescape")
        raise TypeError(f"encode takes str or bytes, got {type(text).__name__}")

    def encode_ordinary(self, text: str | bytes) -> list[int]:
        """Encode ignoring special tokens (their spelling is ordinary text); added tokens match.

        ``text`` may be ``str`` or ``bytes`` (any bytes, valid UTF-8 or not).
        """
        return self._encode_with(self._as_text(text), self._matchers(frozenset()))

    def encode(
        self,
        text: str | bytes,
        *,
        allowed_special: Literal["all"] | Collection[str] = frozenset(),
        disallowed_special: Literal["all"] | Collection[str] = "all",
    ) -> list[int]:
        """Encode ``text`` (``str``, or ``bytes`` of any kind) to token ids.

        Special tokens in ``allowed_special`` (or all, with ``"all"``) are encoded as their ids.
        A special token in ``disallowed_special`` (default ``"all"``: every special token not
        allowed) raises ``ValueError``; other special tokens' spellings are ordinary text.

        >>> tok = Tokenizer([], special_tokens=["<|eot|>"])
        >>> tok.encode("hi<|eot|>", allowed_special="all")
        [104, 105, 256]
        >>> tok.encode("hi<|eot|>", disallowed_special=())
        [104, 105, 60, 124, 101, 111, 116, 124, 62]
        """
        text = self._as_text(text)
        specials = self.special_tokens
        if allowed_special == "all":
            allowed = frozenset(specials)
        else:
            allowed = frozenset(allowed_special)
            unknown = allowed - specials.keys()
            if unknown:
                raise ValueError(
                    f"allowed_special names {sorted(unknown)!r}, which are not special tokens of this "
                    f"tokenizer (its special tokens: {sorted(specials)!r})"
                )
        disallowed = specials.keys() - allowed if disallowed_special == "all" else frozenset(disallowed_special)
        if disallowed:
            m = _literal_regex(disallowed).search(text)
            if m:
                tok = m.group()
                raise ValueError(
                    f"the text contains the special token {tok!r}, which is disallowed by default so that "
                    f"untrusted text cannot inject control tokens. To encode it as the special token, pass "
                    f"allowed_special={{{tok!r}}} (or allowed_special='all'); to encode it as ordinary text, "
                    f"pass disallowed_special=() (or a set without it)."
                )
        return self._encode_with(text, self._matchers(allowed))

    def encode_batch(
        self,
        texts: Sequence[str | bytes],
        *,
        num_workers: int | None = None,
        allowed_special: Literal["all"] | Collection[str] = frozenset(),
        disallowed_special: Literal["all"] | Collection[str] = "all",
    ) -> list[list[int]]:
        """:meth:`encode` for many texts; large batches are split across worker processes."""
        texts = list(texts)
        kwargs = {"allowed_special": allowed_special, "disallowed_special": disallowed_special}
        workers = resolve_workers(num_workers)
        sizes = [len(t) for t in texts]
        self._prepare_tables()  # once, before the workers fork
        if workers <= 1 or sum(sizes) < _PARALLEL_BYTES:
            return [self.encode(t, **kwargs) for t in texts]
        shards = balanced_shards(sizes, _SHARDS_PER_WORKER * workers)
        parts = shard_map(_encode_batch_shard, (self, texts, shards, kwargs), len(shards), workers)
        return [ids for part in parts for ids in part]

    def encode_documents(
        self,
        documents: Iterable[bytes | str],
        *,
        num_workers: int | None = None,
        dtype=np.int32,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The token LM's fast path: ordinary encoding of many documents into one array.

        Returns ``(ids, counts)``: the concatenated ids of all documents (``dtype``) and the
        number of tokens of each document (``int64``), so document ``i`` is
        ``ids[offsets[i]:offsets[i + 1]]`` with ``offsets = concatenate([[0], cumsum(counts)])``.
        Inputs of 1 MiB or more are split across ``num_workers`` processes (default: all CPUs;
        forked on Linux, and they run no JAX code); ``num_workers=1`` stays in-process. With the
        ``cl100k`` pattern, ASCII documents are split by numpy rather than the regex
        (:mod:`.asciisplit`, exactly the same chunks).
        """
        docs = list(documents)
        workers = resolve_workers(num_workers)
        sizes = [len(d) for d in docs]
        self._prepare_tables()  # once, before the workers fork
        if workers <= 1 or sum(sizes) < _PARALLEL_BYTES:
            return _encode_documents_shard((self, docs, [(0, len(docs))], dtype), 0)
        shards = balanced_shards(sizes, _SHARDS_PER_WORKER * workers)  # a worker's cache serves all its shards
        parts = shard_map(_encode_documents_shard, (self, docs, shards, dtype), len(shards), workers)
        if not parts:
            return np.zeros(0, dtype), np.zeros(0, np.int64)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _encode_batch_plain(self, docs: list, dtype) -> tuple[np.ndarray, np.ndarray]:
        """Ordinary encoding of a batch of documents into one array (and per-document counts):
        per document, the chunk cache maps chunks to token tuples and numpy gathers them."""
        if not docs:
            return np.zeros(0, dtype), np.zeros(0, np.int64)
        as_text = self._as_text
        if self.added_tokens:  # rare: added tokens split documents first
            parts = [self._encode_with(as_text(d), self._matchers(frozenset())) for d in docs]
            counts = np.array([len(p) for p in parts], dtype=np.int64)
            return np.fromiter(chain.from_iterable(parts), dtype=dtype, count=int(counts.sum())), counts
        splitter_for = self._pretok.splitter_for
        self._bound_cache()
        kinds: list = [None] * len(docs)
        n_chunks = np.zeros(len(docs), dtype=np.int64)
        cache = self._cache
        entry = cache.index.__getitem__  # a new chunk gets a new entry
        ascii_at, ascii_docs = [], []
        vectorized = self._pretok.name == "cl100k"
        for j, doc in enumerate(docs):
            if vectorized and doc.isascii():
                ascii_at.append(j)
                ascii_docs.append(doc.encode() if isinstance(doc, str) else doc)
                continue
            text = as_text(doc)
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
        ids = flat[np.repeat(starts[kind] - (ends - n_tok), n_tok) + np.arange(total)].astype(dtype, copy=False)
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

    # -- decoding -------------------------------------------------------------------------------
    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The exact bytes of a token sequence (``decode_bytes(encode(b)) == b`` for all bytes)."""
        ids = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
        if not ids:
            return b""
        n = len(self._id_to_bytes)
        try:
            lo, hi = min(ids), max(ids)
        except TypeError:
            bad = next(i for i in ids if not isinstance(i, (int, np.integer)))
            raise ValueError(f"token ids must be integers, got {bad!r}") from None
        if lo < 0 or hi >= n:
            bad = lo if lo < 0 else hi
            raise ValueError(f"unknown token id {bad}: valid ids are 0..{n - 1}")
        try:
            return b"".join(map(self._id_to_bytes.__getitem__, ids))
        except TypeError:
            bad = next(i for i in ids if not isinstance(i, (int, np.integer)))
            raise ValueError(f"token ids must be integers, got {bad!r}") from None

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Decode to text. Lossy: bytes that are not valid UTF-8 (say, a sequence cut inside a
        character) become U+FFFD with the default ``errors="replace"``; use
        :meth:`decode_bytes` for the exact bytes, or :meth:`incremental_decoder` for streams."""
        return self.decode_bytes(ids).decode("utf-8", errors)

    def incremental_decoder(self, errors: str = "replace") -> IncrementalDecoder:
        """A streaming decoder that holds back an incomplete UTF-8 sequence at the end."""
        return IncrementalDecoder(self, errors=errors)

    # -- files ----------------------------------------------------------------------------------
    def save(self, directory) -> None:
        """Write the tokenizer files into ``directory`` (see :mod:`bytelm.baselines.bpe.io`)."""
        from bytelm.baselines.bpe.io import save_tokenizer  # noqa: PLC0415

        save_tokenizer(self, directory)

    @classmethod
    def load(cls, directory) -> Tokenizer:
        """Read a tokenizer written by :meth:`save`."""
        from bytelm.baselines.bpe.io import load_tokenizer  # noqa: PLC0415

        return load_tokenizer(directory)


class _ChunkCache:
    """The ids of the chunks seen so far: ``index`` maps a chunk to its entry, ``tokens[entry]``
    holds its ids; :meth:`arrays` gives the same as flat numpy arrays, for gathering."""

    def __init__(self) -> None:
        # a new chunk gets the next entry; keys are the chunk (str), or, from the ASCII fast path
        # (Tokenizer._ascii_entries), its bytes or its pack_chunks integer
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


class IncrementalDecoder:
    """Decode a stream of token ids to text, holding back incomplete UTF-8 at the end.

    >>> tok = Tokenizer([])
    >>> dec = tok.incremental_decoder()
    >>> ids = tok.encode("é!")                    # 0xC3 0xA9 0x21: three byte tokens
    >>> dec.decode(ids[:1]), dec.decode(ids[1:]), dec.flush()
    ('', 'é!', '')
    """

    def __init__(self, tokenizer: Tokenizer, errors: str = "replace") -> None:
        self.tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors)

    def decode(self, ids: Iterable[int]) -> str:
        """The text completed by ``ids``."""
        return self._decoder.decode(self.tokenizer.decode_bytes(ids))

    def flush(self) -> str:
        """End of stream: what is held back, decoded with the error handler."""
        return self._decoder.decode(b"", final=True)

    def reset(self) -> None:
        self._decoder.reset()


# -- worker functions (module level so that process pools can call them) ----------------------
def _encode_batch_shard(payload, i: int) -> list[list[int]]:
    tok, texts, shards, kwargs = payload
    start, stop = shards[i]
    return [tok.encode(t, **kwargs) for t in texts[start:stop]]


def _encode_documents_shard(payload, i: int) -> tuple[np.ndarray, np.ndarray]:
    tok, docs, shards, dtype = payload
    start, stop = shards[i]
    id_parts, count_parts = [], []
    batch: list = []
    size = 0
    for doc in docs[start:stop]:
        batch.append(doc)
        size += len(doc)
        if size >= _BATCH_BYTES:
            ids, counts = tok._encode_batch_plain(batch, dtype)
            id_parts.append(ids)
            count_parts.append(counts)
            batch, size = [], 0
    ids, counts = tok._encode_batch_plain(batch, dtype)
    id_parts.append(ids)
    count_parts.append(counts)
    return np.concatenate(id_parts), np.concatenate(count_parts)
