"""WordPiece training: merges chosen by the likelihood score, on the pre-tokenized chunks.

The algorithm (Schuster & Nakajima 2012; as the HF course describes BERT's WordPiece):

1. Pre-tokenize the documents into chunks and count each distinct chunk once
   (:func:`~bytelm.baselines.bpe.trainer.count_chunks`); cut chunks into words so that every
   ``#`` is a word of its own (:func:`~bytelm.baselines.wordpiece.tokenizer.split_words`).
2. A word starts as its units: the first one word-initial, the others ``##`` continuations.
   ``level="byte"``: units are bytes and the alphabet is all 256 bytes in both forms (512 ids,
   seen or not). ``level="char"``: units are characters and the alphabet is the characters seen,
   word-initially and inside words.
3. Repeatedly merge the adjacent pair ``(x, y)`` with the highest **score**
   ``f(xy) / (f(x) f(y))``: the pair's count over the word counts (sliding window: ``aaa``
   holds ``a + ##a`` once and ``##a + ##a`` once) divided by the product of the two tokens'
   counts. The new token is ``x`` followed by ``y``'s bytes, a continuation when ``x`` is one.
   A pair is replaced left to right in every word holding it; the counts are updated for those
   words only, and a heap (with stale entries re-queued) finds the best pair: every pair of a
   token whose count fell is queued again at its new, higher score.

**Tie rule** (part of the tokenizer's contract): the score is ``c / (f(x) * f(y))`` in float64 (the
integer product, then one correctly rounded division); among equal scores the pair with the
higher count ``c`` wins, then the smaller ``(id of x, id of y)``. Ids: byte-level, byte ``b`` is
``b`` initially and ``256 + b`` as a continuation; character-level, the initial characters by code
point from 1, then the continuation characters by code point; learned tokens in creation order.

**Vocabulary size**: ``vocab_size`` counts every id (the alphabet, ``[UNK]`` at character level,
the learned tokens, the special tokens) and is reached exactly unless the corpus runs out of
pairs. A merge whose result already is a token (the same bytes, the same position kind: made
earlier by another pair) reuses it and adds no id.

**Against HF ``tokenizers``**: HF's ``WordPieceTrainer`` is its BPE trainer with a ``##`` prefix:
it merges the *most frequent* pair, not the likelihood score, so the two vocabularies differ from
the first merge on any corpus where the most frequent pair is not also the most "surprising" one
(``tests/test_wordpiece.py`` shows the first difference). The *encoders* agree id for id: HF's
``WordPiece`` model loading our ``tokenizer.json``.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from bytelm.baselines.bpe.trainer import count_chunks
from bytelm.baselines.subword import check_special_tokens
from bytelm.baselines.wordpiece.tokenizer import LEVELS, WordPieceTokenizer, split_words, units_of
from bytelm.data import load_corpus
from bytelm.errors import UserError

log = logging.getLogger(__name__)

Progress = Callable[[int, int | None], None]  # (done, total; None when unknown)
_S = 32  # a pair of ids as one integer key: x << _S | y


def count_words(chunk_counts: dict[bytes, int]) -> dict[bytes, int]:
    """``{word: count}`` from ``{chunk: count}``: chunks cut at every ``#``.

    >>> count_words({b"a#b": 2, b"a": 1})
    {b'a': 3, b'#': 2, b'b': 2}
    """
    out: Counter = Counter()
    for chunk, n in chunk_counts.items():
        for w in split_words(chunk):
            out[w] += n
    return dict(out)


def alphabet(word_counts: dict[bytes, int], level: str) -> list[tuple[bytes, bool]]:
    """The starting tokens in id order (after ``[UNK]`` at character level; module docstring)."""
    if level == "byte":
        return [(bytes([b]), False) for b in range(256)] + [(bytes([b]), True) for b in range(256)]
    first, inner = set(), set()
    for w in word_counts:
        units = units_of(w, level)
        first.add(units[0])
        inner.update(units[1:])

    def order(u: bytes) -> int:
        return ord(u.decode("utf-8", "surrogateescape"))

    return [(u, False) for u in sorted(first, key=order)] + [(u, True) for u in sorted(inner, key=order)]


def learn_wordpieces(
    word_counts: dict[bytes, int],
    n_learned: int,
    *,
    level: str = "byte",
    progress: Progress | None = None,
) -> tuple[list[tuple[bytes, bool]], list[tuple[bytes, bool]]]:
    """``(alphabet, learned tokens)`` from ``{word: count}``: up to ``n_learned`` new tokens by the
    likelihood score (module docstring), each ``(bytes, continuation)``, in creation order.

    >>> _, learned = learn_wordpieces({b"ab": 5, b"ac": 1, b"db": 4}, 2, level="char")
    >>> learned      # a+##b 5/(6*9), a+##c 1/(6*1), d+##b 4/(4*9): a+##c first; then
    [(b'ac', False), (b'ab', False)]
    >>> # a+##b 5/(5*9) ties d+##b 4/(4*9): the higher count wins
    """
    if level not in LEVELS:
        raise UserError(f"level {level!r} is not one of {list(LEVELS)}")
    if n_learned < 0:
        raise ValueError(f"n_learned must be >= 0, got {n_learned}")
    base = alphabet(word_counts, level)
    first = 1 if level == "char" else 0  # ([UNK] is id 0 at character level)
    tokens: list[tuple[bytes, bool]] = [(b"", False)] * first + base
    id_of = {t: i for i, t in enumerate(tokens) if i >= first}
    words: list[list[int]] = []
    wcount: list[int] = []
    for word, n in word_counts.items():
        if n <= 0:
            continue
        units = units_of(word, level)
        words.append([id_of[(units[0], False)]] + [id_of[(u, True)] for u in units[1:]])
        wcount.append(n)
    f = [0] * len(tokens)  # token counts
    pc: dict[int, int] = {}  # pair counts
    where: dict[int, set[int]] = {}  # pair -> the words holding it
    partners: list[set[int]] = [set() for _ in tokens]  # token -> the pairs it is in
    for wi, (w, n) in enumerate(zip(words, wcount)):
        for u in w:
            f[u] += n
        for x, y in zip(w, w[1:]):
            k = (x << _S) | y
            pc[k] = pc.get(k, 0) + n
            where.setdefault(k, set()).add(wi)
            partners[x].add(k)
            partners[y].add(k)

    mask = (1 << _S) - 1

    def entry(k: int) -> tuple[float, int, int, int]:
        c = pc[k]
        x, y = k >> _S, k & mask
        return (-c / (f[x] * f[y]), -c, x, y)

    heap = [entry(k) for k in pc]
    heapq.heapify(heap)
    push = heapq.heappush
    learned: list[tuple[bytes, bool]] = []
    n_tokens = 0
    report_every = max(1, n_learned // 200)
    while n_tokens < n_learned and heap:
        item = heapq.heappop(heap)
        k = (item[2] << _S) | item[3]
        if k not in pc:
            continue
        now = entry(k)
        if now != item:  # stale: queue it at its current score
            heapq.heappush(heap, now)
            continue
        x, y = item[2], item[3]
        new = (tokens[x][0] + tokens[y][0], tokens[x][1])
        t = id_of.get(new)
        if t is None:
            t = id_of[new] = len(tokens)
            tokens.append(new)
            f.append(0)
            partners.append(set())
            learned.append(new)
            n_tokens += 1
        touched: set[int] = set()
        for wi in list(where.get(k, ())):
            w, n = words[wi], wcount[wi]
            merged = _merge(w, x, y, t)
            for u in w:
                f[u] -= n
            for a, b in zip(w, w[1:]):
                q = (a << _S) | b
                left = pc[q] - n
                if left:
                    pc[q] = left
                else:
                    del pc[q]
                    partners[a].discard(q)
                    partners[b].discard(q)
                ws = where.get(q)
                if ws is not None:  # (a word can hold a pair twice)
                    ws.discard(wi)
                    if not ws:
                        del where[q]
            for u in merged:
                f[u] += n
            for a, b in zip(merged, merged[1:]):
                q = (a << _S) | b
                pc[q] = pc.get(q, 0) + n
                where.setdefault(q, set()).add(wi)
                partners[a].add(q)
                partners[b].add(q)
                touched.add(q)
            words[wi] = merged
        # scores rose for every pair of x and y (their counts fell) and for the pairs gained
        # (inlined entry(): this loop is most of the trainer's time)
        for q in touched | partners[x] | partners[y]:
            c = pc.get(q)
            if c:
                a, b = q >> _S, q & mask
                push(heap, (-c / (f[a] * f[b]), -c, a, b))
        if progress is not None and n_tokens % report_every == 0:
            progress(n_tokens, n_learned)
    if progress is not None:
        progress(n_tokens, n_learned)
    if n_tokens < n_learned:
        log.warning("the corpus ran out of pairs after %d of %d new tokens", n_tokens, n_learned)
    return base, learned


def _merge(w: list[int], x: int, y: int, t: int) -> list[int]:
    """``w`` with each ``x, y`` replaced by ``t``, left to right (``aaa`` -> ``[aa, a]``)."""
    out = []
    i, n = 0, len(w)
    while i < n:
        if i + 1 < n and w[i] == x and w[i + 1] == y:
            out.append(t)
            i += 2
        else:
            out.append(w[i])
            i += 1
    return out


def train_wordpiece(
    documents: Iterable[bytes],
    *,
    vocab_size: int,
    level: str = "byte",
    pattern: str = "cl100k",
    special_tokens: Sequence[str] = (),
    max_input_chars_per_word: int | None = None,
    num_workers: int | None = None,
    progress: Progress | None = None,
    count_progress: Progress | None = None,
    total_bytes: int | None = None,
) -> WordPieceTokenizer:
    """Train a :class:`~bytelm.baselines.wordpiece.tokenizer.WordPieceTokenizer`.

    Args mirror :func:`~bytelm.baselines.bpe.trainer.train_bpe`; ``level`` is ``"byte"`` or
    ``"char"`` and ``max_input_chars_per_word`` (character level only) the longest word that is
    not ``[UNK]`` (default 100, BERT's). Raises :class:`~bytelm.errors.UserError` for a
    vocabulary smaller than the alphabet + special tokens, or an empty corpus.
    """
    specials = check_special_tokens(special_tokens)
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
        raise UserError(f"vocab_size must be an integer, got {vocab_size!r}")
    if level not in LEVELS:
        raise UserError(f"level {level!r} is not one of {list(LEVELS)}")
    WordPieceTokenizer([], level=level, max_input_chars_per_word=max_input_chars_per_word, pattern=pattern)
    t0 = time.perf_counter()
    chunks = count_chunks(
        documents, pattern=pattern, num_workers=num_workers, progress=count_progress, total_bytes=total_bytes
    )
    if not chunks:
        raise UserError(
            "the training corpus is empty (no documents, or only empty ones): nothing to learn from"
        )
    words = count_words(chunks)
    fixed = (1 if level == "char" else 0) + len(alphabet(words, level)) + len(specials)
    if vocab_size < fixed:
        raise UserError(
            f"vocab_size {vocab_size} is below the {level}-level alphabet and reserved ids of this corpus "
            f"({fixed}: {'[UNK] + ' if level == 'char' else ''}initial and ## units + {len(specials)} "
            "special); "
            f"use at least {fixed} (vocab_size counts every id, as in HF tokenizers)"
        )
    base, learned = learn_wordpieces(words, vocab_size - fixed, level=level, progress=progress)
    log.info("wordpiece: %d learned tokens in %.2fs", len(learned), time.perf_counter() - t0)
    pieces = learned if level == "byte" else base + learned
    return WordPieceTokenizer(
        pieces,
        level=level,
        max_input_chars_per_word=max_input_chars_per_word,
        pattern=pattern,
        special_tokens=specials,
    )


def train_wordpiece_on_corpus(data, *, vocab_size: int, split: str = "train", **kwargs) -> WordPieceTokenizer:
    """:func:`train_wordpiece` on the ``split`` documents of a corpus (a data spec or a loaded corpus)."""
    corpus = load_corpus(data) if isinstance(data, str) else data
    return train_wordpiece(
        corpus.documents(split), vocab_size=vocab_size, total_bytes=corpus.split_bytes(split), **kwargs
    )
