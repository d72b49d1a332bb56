"""Byte-level BPE training: count unique chunks once, then merge with incremental pair counts.

The algorithm (Sennrich et al. 2016 on bytes, as in GPT-2):

1. Pre-tokenize every document into chunks (:mod:`~bytelm.baselines.bpe.pretokenize`), in
   worker processes, and count each distinct chunk once (:func:`count_chunks`).
2. Each distinct chunk becomes a *word*: a list of token ids, initially its bytes, weighted by
   the chunk's count. Count every adjacent pair (sliding window: ``aaa`` holds ``a+a`` twice)
   and keep, per pair, the set of words it occurs in.
3. Repeatedly take the most frequent pair (a heap with lazy invalidation), record the merge,
   replace the pair left to right in exactly the words that contain it, and apply the
   resulting count changes (``-1`` for the pairs destroyed next to each replacement, ``+1``
   for the pairs created) instead of recounting anything.

**Tie-breaking rule** (part of the tokenizer's contract): among pairs with the highest count,
take the one with the smallest ``(left, right)`` where tokens are numbered in *HF order*: the 256
bytes in the order of :data:`~bytelm.baselines.bpe.bytelevel.HF_BYTE_ORDER` (GPT-2's printable
characters sorted by code point), then learned tokens in creation order. This makes the merge
list identical to HF ``tokenizers``' ``BpeTrainer`` (with ``initial_alphabet`` set to the byte
alphabet and a ``Split`` + ``ByteLevel(use_regex=False)`` pre-tokenizer on the same pattern);
numbering bytes by value instead gives the same merges up to the first tie, then diverges.
As in HF, a merge whose bytes equal an existing token reuses that token's id (rare).

**Vocabulary size** (as in HF): ``vocab_size`` counts every id: the 256 byte tokens, the learned
tokens and the special tokens. So ``vocab_size - 256 - len(special_tokens)`` merges are learned
(fewer if the corpus runs out of pairs). Special tokens are reserved ids after the learned ones
and are never learned: their spelling in a training document is ordinary text.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from bytelm.baselines.bpe.bytelevel import HF_BYTE_ORDER
from bytelm.baselines.bpe.parallel import balanced_shards, resolve_workers, shard_map
from bytelm.baselines.bpe.pretokenize import PreTokenizer
from bytelm.baselines.bpe.tokenizer import Tokenizer
from bytelm.baselines.subword import learnable_ids
from bytelm.data import Corpus, load_corpus
from bytelm.errors import UserError

log = logging.getLogger(__name__)

Progress = Callable[[int, int | None], None]  # (done, total; None when unknown)

#: Token ids are packed into one int per pair: ``left << PAIR_SHIFT | right``.
PAIR_SHIFT = 21
_RIGHT_MASK = (1 << PAIR_SHIFT) - 1
_KEY_SHIFT = 2 * PAIR_SHIFT
_PAIR_MASK = (1 << _KEY_SHIFT) - 1
#: Words are ``str`` of ids while training (``chr(id)``), so ids stop below 0x110000.
MAX_VOCAB_SIZE = 0x110000
_PARALLEL_BYTES = 1 << 20  # smaller corpora are pre-tokenized in-process


# -- small pure helpers (reference semantics, used by tests) -------------------------------
# -- 1. counting chunks -------------------------------------------------------------------
def _count_shard(pretok: PreTokenizer, docs: list[bytes]) -> dict[str, int]:
    counts: Counter = Counter()
    split = pretok.split
    for doc in docs:
        counts.update(split(doc.decode("utf-8", "surrogateescape")))
    return counts


def count_chunks(
    documents: Iterable[bytes],
    *,
    pattern: str = "cl100k",
    num_workers: int | None = None,
    block_bytes: int = 1 << 28,
    progress: Progress | None = None,
    total_bytes: int | None = None,
) -> dict[bytes, int]:
    """``{chunk bytes: occurrences}`` over all documents, pre-tokenized with ``pattern``.

    Documents are read in blocks of about ``block_bytes``; each block is split across
    ``num_workers`` processes (default: all CPUs). ``progress(bytes_done, total_bytes)`` is
    called after each block (``total_bytes`` may be ``None`` when unknown).

    >>> count_chunks([b"ab ab", b"ab"], pattern="gpt2", num_workers=1)
    {b'ab': 2, b' ab': 1}
    """
    pretok = PreTokenizer(pattern)
    workers = resolve_workers(num_workers)
    total: Counter = Counter()
    done = 0

    def flush(block: list[bytes]) -> None:
        nonlocal done
        sizes = [len(d) for d in block]
        parallel = workers > 1 and sum(sizes) >= _PARALLEL_BYTES
        shards = balanced_shards(sizes, 2 * workers if parallel else 1)
        for part in shard_map(_count_shard, pretok, [block[a:b] for a, b in shards], workers):
            total.update(part)
        done += sum(sizes)
        if progress is not None:
            progress(done, total_bytes)

    block: list[bytes] = []
    size = 0
    for doc in documents:
        if not isinstance(doc, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"documents must be bytes, got {type(doc).__name__}; encode text with .encode('utf-8')"
            )
        doc = bytes(doc)
        block.append(doc)
        size += len(doc)
        if size >= block_bytes:
            flush(block)
            block, size = [], 0
    if block:
        flush(block)
    return {chunk.encode("utf-8", "surrogateescape"): n for chunk, n in total.items()}


# -- 2-3. merging -------------------------------------------------------------------------
# Internally a word is a ``str`` whose characters are token ids (``chr(id)``, ids in HF order),
# so that finding a pair, skipping words that no longer hold it, and replacing it left to right
# (``str.find`` / ``str.replace``, exactly HF's non-overlapping left-to-right scan) run in C.
# A pair is the 2-character string of its two ids.
def learn_merges(
    chunk_counts: dict[bytes, int],
    n_merges: int,
    *,
    progress: Progress | None = None,
) -> list[tuple[int, int]]:
    """Learn up to ``n_merges`` merges from ``{chunk bytes: count}``.

    Returns the ordered merge list as ``(left id, right id)`` pairs in *output* ids: byte ``b``
    is id ``b``, and the token made by merge ``k`` is id ``256 + k`` (unless its bytes already
    existed, see the module docstring). Ties: highest count, then smallest pair in HF order.

    >>> learn_merges({b"abab": 3, b"abac": 1}, 2)     # a+b (count 7), then ab+ab (count 3)
    [(97, 98), (256, 256)]
    >>> learn_merges({b"aaabdaaabac": 1}, 3)   # Wikipedia's example: at step 2 aa+a ties a+b
    [(97, 97), (97, 98), (256, 257)]
    """
    if n_merges < 0:
        raise ValueError(f"n_merges must be >= 0, got {n_merges}")
    if 256 + n_merges > MAX_VOCAB_SIZE:
        raise ValueError(f"at most {MAX_VOCAB_SIZE - 256} merges are supported, got {n_merges}")
    to_internal = bytes.maketrans(bytes(range(256)), bytes(HF_BYTE_ORDER.index(b) for b in range(256)))
    tok_bytes: list[bytes] = [bytes([b]) for b in HF_BYTE_ORDER]  # internal id -> bytes
    id_of: dict[bytes, int] = {t: i for i, t in enumerate(tok_bytes)}

    # Words of one byte hold no pair and never change: leave them out.
    items = [(c.translate(to_internal), n) for c, n in chunk_counts.items() if len(c) > 1 and n > 0]
    words: list[str] = [c.decode("latin-1") for c, _ in items]
    wcount: list[int] = [n for _, n in items]
    merges: list[tuple[int, int]] = []  # internal ids

    if items and n_merges:
        pc, init_where = _initial_pairs(words, wcount)
        where: dict[str, list[int]] = {}  # pair -> words it was created in (may repeat)
        count_cap = max(pc.values()) + 1
        heap = [((count_cap - c) << _KEY_SHIFT) | _pair_int(p) for p, c in pc.items() if c > 0]
        heapq.heapify(heap)
        heappop, heappush = heapq.heappop, heapq.heappush
        n_tokens_target = 256 + n_merges
        n_tokens = 256
        report_every = max(1, n_merges // 200)
        while n_tokens < n_tokens_target and heap:
            key = heappop(heap)
            ab = chr((key >> PAIR_SHIFT) & _RIGHT_MASK) + chr(key & _RIGHT_MASK)
            cnt = count_cap - (key >> _KEY_SHIFT)
            cur = pc.get(ab, 0)
            if cnt != cur:  # stale entry: re-queue with the current count
                if cur > 0:
                    heappush(heap, ((count_cap - cur) << _KEY_SHIFT) | (key & _PAIR_MASK))
                continue
            a, b = ord(ab[0]), ord(ab[1])
            new = tok_bytes[a] + tok_bytes[b]
            t = id_of.get(new)
            if t is None:
                t = len(tok_bytes)
                tok_bytes.append(new)
                id_of[new] = t
                n_tokens += 1
            merges.append((a, b))
            created, _, _ = merge_pair(words, wcount, where, init_where, ab, chr(t), pc)
            for q in created:
                cq = pc[q]
                if cq > 0:
                    heappush(heap, ((count_cap - cq) << _KEY_SHIFT) | _pair_int(q))
            if progress is not None and len(merges) % report_every == 0:
                progress(len(merges), n_merges)
    if progress is not None:
        progress(len(merges), n_merges)
    if len(merges) < n_merges:
        log.warning("the corpus ran out of pairs after %d of %d merges", len(merges), n_merges)

    def out_id(i: int) -> int:
        return HF_BYTE_ORDER[i] if i < 256 else i

    return [(out_id(a), out_id(b)) for a, b in merges]


def _pair_int(p: str) -> int:
    return (ord(p[0]) << PAIR_SHIFT) | ord(p[1])


def _initial_pairs(
    words: list[str], counts: list[int]
) -> tuple[defaultdict[str, int], dict[str, np.ndarray]]:
    """Pair counts over the initial words (``str`` of token ids) and, per pair, the indices of the
    words holding it (once each)."""
    lens = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    flat = np.frombuffer("".join(words).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    flat = flat.astype(np.int64)
    wid = np.repeat(np.arange(len(words), dtype=np.int64), lens)
    keys = (flat[:-1] << PAIR_SHIFT) | flat[1:]
    valid = wid[:-1] == wid[1:]  # both ids in the same word
    keys, wid = keys[valid], wid[:-1][valid]
    weights = np.asarray(counts, dtype=np.int64)[wid]
    order = np.lexsort((wid, keys))
    keys, wid, weights = keys[order], wid[order], weights[order]
    uniq, starts = np.unique(keys, return_index=True)
    sums = np.add.reduceat(weights, starts) if len(keys) else np.zeros(0, np.int64)
    names = [chr(k >> PAIR_SHIFT) + chr(k & _RIGHT_MASK) for k in uniq.tolist()]
    pc: defaultdict[str, int] = defaultdict(int, zip(names, sums.tolist()))
    # list each word once per pair
    first = np.ones(len(keys), dtype=bool)
    first[1:] = (keys[1:] != keys[:-1]) | (wid[1:] != wid[:-1])
    keys, wid = keys[first], wid[first]
    bounds = np.searchsorted(keys, np.append(uniq, 1 << _KEY_SHIFT))
    init_where = {p: wid[bounds[j] : bounds[j + 1]] for j, p in enumerate(names)}
    return pc, init_where


def merge_pair(
    words: list[str],
    wcount: list[int],
    where: dict[str, list[int]],
    init_where: dict[str, np.ndarray],
    ab: str,
    t: str,
    pc: defaultdict[str, int],
) -> tuple[dict[str, list[int]], list[str], int]:
    """One merge step of the word state shared by the BPE and WordPiece trainers: replace ``ab`` by
    ``t`` in the words holding it (``where`` and, until first used, ``init_where``), delete ``ab``
    from ``pc`` and list the words of each created pair in ``where``. Returns what
    :func:`_merge_words` returns."""
    ws = where.pop(ab, [])
    span = init_where.pop(ab, None)
    if span is not None:
        ws += span.tolist()
    if len(ws) > 64:
        ws.sort()  # visit words in memory order
    created, lost, merged = _merge_words(words, wcount, ws, ab, t, pc)
    del pc[ab]
    for q, wis in created.items():
        old = where.get(q)
        if old is None:
            where[q] = wis
        else:
            old += wis
    return created, lost, merged


def _merge_words(
    words: list[str],
    wcount: list[int],
    word_ids: Iterable[int],
    ab: str,
    t: str,
    pc: defaultdict[str, int],
) -> tuple[dict[str, list[int]], list[str], int]:
    """Replace the pair ``ab`` by the token ``t`` (left to right) in the given words, updating the
    pair counts ``pc`` in place. Returns the pairs that gained occurrences, each with the words
    it gained them in (a word may be listed more than once); the pairs that lost occurrences
    (``ab`` itself not included; the caller deletes it); and the number of replacements, weighted
    by the word counts.

    Each occurrence turns the pairs with its old neighbours ``x a`` / ``b y`` into ``x t`` /
    ``t y``; the changes are summed per neighbour first, then applied once per neighbour. Between
    two adjacent occurrences (``a b a b``) the shared pair ``b a`` becomes ``t t``, counted once,
    so the net changes equal HF's step-by-step ones.
    """
    a, b = ab[0], ab[1]
    left: defaultdict[str, int] = defaultdict(int)  # x -> count of "x a" turned into "x t"
    right: defaultdict[str, int] = defaultdict(int)  # y -> count of "b y" turned into "t y"
    left_words: defaultdict[str, list[int]] = defaultdict(list)
    right_words: defaultdict[str, list[int]] = defaultdict(list)
    adjacent = 0
    adjacent_words: list[int] = []
    find = str.find
    merged = 0
    for wi in word_ids:
        w = words[wi]
        p = find(w, ab)
        if p < 0:
            continue  # the word lost the pair to an earlier merge
        c = wcount[wi]
        n = len(w)
        if p:
            x = w[p - 1]
            left[x] += c
            left_words[x].append(wi)
        while True:
            e = p + 2
            if e >= n:
                break
            p = find(w, ab, e)
            if p == e:
                adjacent += c
                adjacent_words.append(wi)
                continue
            y = w[e]
            right[y] += c
            right_words[y].append(wi)
            if p < 0:
                break
            x = w[p - 1]
            left[x] += c
            left_words[x].append(wi)
        w = words[wi] = w.replace(ab, t)
        merged += c * (n - len(w))  # one id fewer per replacement
    created: dict[str, list[int]] = {}
    lost: list[str] = []
    for x, n in left.items():
        pc[x + a] -= n
        lost.append(x + a)
        q = x + t
        pc[q] += n
        created.setdefault(q, []).extend(left_words[x])
    for y, n in right.items():
        pc[b + y] -= n
        lost.append(b + y)
        q = t + y
        pc[q] += n
        created.setdefault(q, []).extend(right_words[y])
    if adjacent:
        pc[b + a] -= adjacent
        lost.append(b + a)
        pc[t + t] += adjacent
        created.setdefault(t + t, []).extend(adjacent_words)
    return created, lost, merged


# -- the whole trainer ----------------------------------------------------------------------
def train_bpe(
    documents: Iterable[bytes],
    *,
    vocab_size: int,
    pattern: str = "cl100k",
    special_tokens: Sequence[str] = (),
    num_workers: int | None = None,
    progress: Progress | None = None,
    count_progress: Progress | None = None,
    total_bytes: int | None = None,
):
    """Train a byte-level BPE :class:`~bytelm.baselines.bpe.tokenizer.Tokenizer`.

    Args:
      documents: the training documents, as bytes (any bytes; invalid UTF-8 is fine).
      vocab_size: every id counted: 256 bytes + learned tokens + special tokens (HF's meaning).
      pattern: ``"gpt2"``, ``"cl100k"`` or a regex (``regex`` module syntax).
      special_tokens: reserved tokens, given ids after the learned ones, never learned.
      num_workers: processes for pre-tokenization (default: all CPUs).
      progress: ``progress(merges_done, merges_total)`` during the merge phase.
      count_progress: ``count_progress(bytes_done, total_bytes)`` during pre-tokenization.
      total_bytes: the corpus size when known (only passed on to ``count_progress``).

    Raises :class:`~bytelm.errors.UserError` (a ``ValueError``) for a vocabulary too small for
    the 256 bytes and the special tokens, a bad pattern, bad special tokens or an empty corpus.
    """
    specials, n_merges = learnable_ids(vocab_size, special_tokens, unit="tokens")
    if vocab_size > MAX_VOCAB_SIZE:
        raise UserError(f"vocab_size {vocab_size} is above the supported maximum {MAX_VOCAB_SIZE}")
    PreTokenizer(pattern)  # validate before the expensive part
    t0 = time.perf_counter()
    chunks = count_chunks(
        documents, pattern=pattern, num_workers=num_workers, progress=count_progress, total_bytes=total_bytes
    )
    if not chunks:
        raise UserError(
            "the training corpus is empty (no documents, or only empty ones): nothing to learn from"
        )
    t1 = time.perf_counter()
    log.info("counted %d distinct chunks in %.2fs", len(chunks), t1 - t0)
    merges = learn_merges(chunks, n_merges, progress=progress)
    log.info("learned %d merges in %.2fs", len(merges), time.perf_counter() - t1)
    return Tokenizer(merges, pattern=pattern, special_tokens=specials)


def train_bpe_on_corpus(
    data: str | Corpus,
    *,
    vocab_size: int,
    split: str = "train",
    pattern: str = "cl100k",
    special_tokens: Sequence[str] = (),
    num_workers: int | None = None,
    progress: Progress | None = None,
    count_progress: Progress | None = None,
):
    """:func:`train_bpe` on the ``split`` documents of a corpus (a data spec string such as
    ``"stdlib"`` or ``"files:PATH"``, or a loaded :class:`~bytelm.data.Corpus`)."""
    corpus = load_corpus(data) if isinstance(data, str) else data
    return train_bpe(
        corpus.documents(split),
        vocab_size=vocab_size,
        pattern=pattern,
        special_tokens=special_tokens,
        num_workers=num_workers,
        progress=progress,
        count_progress=count_progress,
        total_bytes=corpus.split_bytes(split),
    )
