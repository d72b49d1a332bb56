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
   words only (the BPE trainer's word merging, :mod:`~bytelm.baselines.bpe.trainer`).

**Finding the best pair.** A merge lowers ``f(x)`` and ``f(y)`` and so *raises* the score of every
other pair holding ``x`` or ``y`` (often hundreds), which a heap with lazy invalidation cannot defer;
re-queueing them all was three quarters of the training time. Instead a pair is either *hot*, with an
exact entry in the heap (re-queued when a count of its tokens falls), or *cold*, covered by an upper
bound kept per token: a token ``d`` that last scored (*scanned*) its cold pairs when its count was
``fref(d)`` and found at most ``w(d)`` bounds them by ``w(d) * fref(d) / f(d) * CAP`` from then on,
``CAP`` bounding the rise of the partner's count factor (a token whose count falls below
``fref / CAP`` is rescanned at once). The heap's best entry is taken only when no token's bound
reaches its score (a token that does is rescanned first: its pairs scoring near the best become
hot). Every pair is still scored exactly before it is taken; the search constants change the work,
never the result (``tests/test_wordpiece.py`` runs them at both extremes against a recount from
scratch). With the BPE trainer's string-based word merging this brought the merge loop on stdlib
(32,768 ids) from 6.3 s to 1.3 s at byte level, 6.8 s to 1.6 s at character level.

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

import numpy as np

from bytelm.baselines.bpe.trainer import MAX_VOCAB_SIZE, _initial_pairs, count_chunks, merge_pair
from bytelm.baselines.subword import check_special_tokens
from bytelm.baselines.wordpiece.tokenizer import LEVELS, WordPieceTokenizer, split_words
from bytelm.data import load_corpus
from bytelm.errors import UserError

log = logging.getLogger(__name__)

Progress = Callable[[int, int | None], None]  # (done, total; None when unknown)
# Finding the best pair (module docstring): a token whose count fell below fref / _CAP since its
# last scan is scanned at once; bounds are compared with a relative margin _ROUNDING - 1 for the
# float rounding of their products; pairs scoring under (the best score) / (_CAP * _ROUNDING**2 *
# _THETA) are left cold, so that a token just scanned is never due again at once (the second
# _ROUNDING absorbs the rounding of the bound itself; _THETA >= 1 is the slack: larger, fewer scans
# and more hot pairs to re-queue).
_CAP = 1.05
_THETA = 1.35
_ROUNDING = 1.0 + 1e-9


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
    first: set[str] = set()
    inner: set[str] = set()
    for w in word_counts:
        text = w.decode("utf-8", "surrogateescape")  # (the characters of units_of)
        if text:
            first.add(text[0])
            inner.update(text[1:])

    def unit(c: str) -> bytes:
        return c.encode("utf-8", "surrogateescape")

    return [(unit(c), False) for c in sorted(first)] + [(unit(c), True) for c in sorted(inner)]


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
    if len(tokens) + n_learned > MAX_VOCAB_SIZE:
        raise UserError(
            f"at most {MAX_VOCAB_SIZE} ids are supported, asked for {len(tokens) + n_learned}: use a smaller "
            "vocab_size"
        )
    id_of = {t: i for i, t in enumerate(tokens) if i >= first}
    all_words: list[str] = []  # each word as the str of its ids (chr(id)), as the BPE trainer's
    all_counts: list[int] = []
    if level == "byte":
        inner = str.maketrans({chr(b): chr(256 + b) for b in range(256)})
        for word, n in word_counts.items():
            if n > 0 and word:
                text = word.decode("latin-1")
                all_words.append(text[0] + text[1:].translate(inner))
                all_counts.append(n)
    else:
        head = {u.decode("utf-8", "surrogateescape"): chr(i) for (u, c), i in id_of.items() if not c}
        rest = str.maketrans(
            {u.decode("utf-8", "surrogateescape"): chr(i) for (u, c), i in id_of.items() if c}
        )
        for word, n in word_counts.items():
            if n > 0 and word:
                text = word.decode("utf-8", "surrogateescape")
                all_words.append(head[text[0]] + text[1:].translate(rest))
                all_counts.append(n)
    f = _unit_counts(all_words, all_counts, len(tokens))  # token counts
    multi = [i for i, w in enumerate(all_words) if len(w) > 1]  # (one-unit words hold no pair)
    words = [all_words[i] for i in multi]
    wcount = [all_counts[i] for i in multi]
    del all_words, all_counts
    pc, init_where = _initial_pairs(words, wcount)  # pair (2-char str) -> count; -> word indices
    where: dict[str, list[int]] = {}  # pair -> words it was created in since (may repeat)
    learned: list[tuple[bytes, bool]] = []
    if not pc or not n_learned:
        if n_learned:
            log.warning("the corpus ran out of pairs after 0 of %d new tokens", n_learned)
        return base, learned

    # The best pair is found with a heap of exact scores for the "hot" pairs and, per token, an
    # upper bound on the scores of its other ("cold") pairs; module docstring, "Finding the best
    # pair". State per token d: partners[d] (its live pairs), hot[d], w[d] and fref[d] (the bound
    # is w[d] * fref[d] / f[d]), and an entry in `bounds`, a max-heap of those bounds.
    n0 = len(tokens)
    partners: list[set[str]] = [set() for _ in range(n0)]
    hot: list[set[str]] = [set() for _ in range(n0)]
    w = [0.0] * n0
    fref = list(f)
    heap: list[tuple[float, int, int, int]] = []  # (-score, -count, x, y)
    bounds: list[tuple[float, int]] = []  # (-bound, token)
    push, pop, replace = heapq.heappush, heapq.heappop, heapq.heapreplace

    def scan(d: int, theta: float) -> None:
        """Score every pair of ``d`` exactly: those >= theta go (back) on the heap, hot; the rest are
        cold, under d's new bound."""
        hd, wd = hot[d], 0.0
        for q in partners[d]:
            c = pc[q]
            a, b = ord(q[0]), ord(q[1])
            v = c / (f[a] * f[b])
            if v >= theta:
                if q not in hd:
                    hd.add(q)
                    hot[b if a == d else a].add(q)
                push(heap, (-v, -c, a, b))
            else:
                if v > wd:
                    wd = v
                if q in hd:
                    hd.discard(q)
                    hot[b if a == d else a].discard(q)
        w[d], fref[d] = wd, f[d]
        if wd:
            push(bounds, (-wd, d))

    scores = {q: c / (f[ord(q[0])] * f[ord(q[1])]) for q, c in pc.items()}
    cut = _CAP * _ROUNDING * _ROUNDING * _THETA
    theta = max(scores.values()) / cut
    for q, v in scores.items():
        a, b = ord(q[0]), ord(q[1])
        partners[a].add(q)
        partners[b].add(q)
        if v >= theta:
            hot[a].add(q)
            hot[b].add(q)
            heap.append((-v, -pc[q], a, b))
        elif v > w[a]:
            w[a] = v  # (cold: under its left token's bound)
    del scores
    heapq.heapify(heap)
    bounds = [(-wd, d) for d, wd in enumerate(w) if wd]
    heapq.heapify(bounds)

    n_tokens = 0
    report_every = max(1, n_learned // 200)
    while n_tokens < n_learned and (heap or bounds):
        # 1. the best exact heap entry (stale ones are dropped or re-queued at their score)
        s, item = 0.0, None
        while heap:
            item = heap[0]
            x, y = item[2], item[3]
            c = pc.get(chr(x) + chr(y))
            if not c:
                pop(heap)
                item = None
                continue
            now = (-c / (f[x] * f[y]), -c, x, y)
            if now != item:
                replace(heap, now)
                item = None
                continue
            s = -now[0]
            break
        # 2. no cold pair may reach it: scan every token whose bound (times the partner's factor,
        # at most _CAP) is not below it, then look again
        scanned = False
        while bounds:
            nb, d = bounds[0]
            b_now = w[d] * fref[d] / f[d] if f[d] else 0.0
            if b_now != -nb:  # (stale: the token was scanned or its count moved since)
                if b_now:
                    replace(bounds, (-b_now, d))
                else:
                    pop(bounds)
                continue
            if b_now * _CAP * _ROUNDING < s:
                break
            pop(bounds)
            scan(d, max(s, b_now) / cut)
            scanned = True
        if scanned or item is None:
            continue
        pop(heap)
        # 3. merge x, y in every word holding them
        x, y = item[2], item[3]
        ab = chr(x) + chr(y)
        new = (tokens[x][0] + tokens[y][0], tokens[x][1])
        t = id_of.get(new)
        reused = t is not None
        if t is None:
            t = id_of[new] = len(tokens)
            tokens.append(new)
            f.append(0)
            fref.append(0)
            w.append(0.0)
            partners.append(set())
            hot.append(set())
            learned.append(new)
            n_tokens += 1
        created, lost, merged = merge_pair(words, wcount, where, init_where, ab, chr(t), pc)
        f[x] -= merged
        f[y] -= merged
        f[t] += merged
        for q in [ab, *lost]:
            if not pc.get(q):
                pc.pop(q, None)
                a, b = ord(q[0]), ord(q[1])
                partners[a].discard(q)
                partners[b].discard(q)
                hot[a].discard(q)
                hot[b].discard(q)
        for q in created:
            c = pc[q]
            a, b = ord(q[0]), ord(q[1])
            partners[a].add(q)
            partners[b].add(q)
            hot[a].add(q)
            hot[b].add(q)
            push(heap, (-c / (f[a] * f[b]), -c, a, b))
        # 4. the counts of x and y fell (their pairs' scores rose), t's rose
        theta = s / cut
        if reused:
            scan(t, theta)
        else:
            fref[t] = f[t]
        for d in (x, y) if x != y else (x,):
            if not f[d]:
                continue
            if fref[d] > _CAP * f[d]:
                scan(d, theta)
                continue
            hd, wd, scale, cold = hot[d], w[d], f[d] / fref[d], []
            for q in hd:
                c = pc[q]
                a, b = ord(q[0]), ord(q[1])
                v = c / (f[a] * f[b])
                if v >= theta:
                    push(heap, (-v, -c, a, b))
                else:
                    cold.append(q)
                    if v * scale > wd:
                        wd = v * scale
            for q in cold:
                hd.discard(q)
                a, b = ord(q[0]), ord(q[1])
                hot[b if a == d else a].discard(q)
            w[d] = wd
            if wd:
                push(bounds, (-(wd * fref[d] / f[d]), d))
        if progress is not None and n_tokens % report_every == 0:
            progress(n_tokens, n_learned)
    if progress is not None:
        progress(n_tokens, n_learned)
    if n_tokens < n_learned:
        log.warning("the corpus ran out of pairs after %d of %d new tokens", n_tokens, n_learned)
    return base, learned


def _unit_counts(words: list[str], counts: list[int], n: int) -> list[int]:
    """Each id's count over the words (``str`` of ids), weighted by the word counts."""
    if not words:
        return [0] * n
    lens = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    flat = np.frombuffer("".join(words).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    weights = np.repeat(np.asarray(counts, dtype=np.int64), lens)
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, flat.astype(np.int64), weights)
    return out.tolist()


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
