"""The ``cl100k`` pre-tokenization of ASCII text, computed with numpy instead of a regex.

The encoder's fast path for documents: where every byte of a batch of documents is ASCII, the
chunk boundaries follow from the character classes of each byte and of its neighbours, so they
can be found with a few array operations over the whole batch. The result is exactly the split
of :data:`~bytelm.baselines.bpe.pretokenize.CL100K_PATTERN` (``tests/test_bpe.py`` checks it
against the ``regex`` module on random text).

The rules, derived from the pattern's alternatives in order (leftmost alternative wins). Text
is cut into maximal runs of letters (L), digits (N), whitespace (W) and other characters (O);
a run never crosses a document boundary. Every run starts a chunk, except where noted:

- N run: a chunk every 3 digits from its start (``\\p{N}{1,3}``).
- W run: if it follows an O run, its leading newlines (``\\r``, ``\\n``) end that O run's chunk
  (``[\\r\\n]*``). What is left starts a chunk that runs up to and including its last newline
  (``\\s*[\\r\\n]+``). After that, the non-newline rest (r characters): at the end of a document
  it is one chunk; otherwise its last character starts a new chunk (``\\s+(?!\\S)`` leaves it).
  That last character joins a following L run (``[^\\r\\n\\p{L}\\p{N}]?\\p{L}+``), and, if it is
  a space, a following O run (`` ?[^\\s\\p{L}\\p{N}]+``).
- O run of one character followed by an L run, not joined to a space: it joins the L run,
  unless it is ``'`` and the letters begin with a contraction (``s t re ve m ll d``, any case),
  which is a chunk of its own (``(?i:'s|'t|...)``); the rest of the letters start a chunk.
- Any other O run is one chunk with the newlines right after it.
- L run: one chunk (with the character that joins it, if any).
"""

from __future__ import annotations

import functools

import numpy as np
import regex

L, N, O, S, NL = 0, 1, 2, 3, 4  # noqa: E741  letter, digit, other, whitespace (not a newline), \r or \n
W = S  # run class of whitespace: S and NL together


@functools.lru_cache(maxsize=1)
def _classes() -> np.ndarray:
    """The class of each ASCII byte, taken from the ``regex`` module's ``\\p{L}``, ``\\p{N}`` and
    ``\\s`` (the classes the pattern uses)."""
    table = np.full(128, O, np.uint8)
    for c in range(128):
        ch = chr(c)
        if ch in "\r\n":
            table[c] = NL
        elif regex.fullmatch(r"\p{L}", ch):
            table[c] = L
        elif regex.fullmatch(r"\p{N}", ch):
            table[c] = N
        elif regex.fullmatch(r"\s", ch):
            table[c] = S
    return table


def _lower(b: np.ndarray) -> np.ndarray:
    return b | np.uint8(0x20)  # ASCII letters only: folds A-Z onto a-z


def cl100k_starts(buf: np.ndarray, doc_starts: np.ndarray) -> np.ndarray:
    """The start offset of every ``cl100k`` chunk of ASCII documents concatenated in ``buf``.

    ``buf``: ``uint8`` bytes, all below 128. ``doc_starts``: offsets at which documents start
    (``0`` among them; repeats and ``len(buf)`` allowed, for empty documents). Chunk ``i`` is
    ``buf[starts[i]:starts[i + 1]]`` (the last one ends at ``len(buf)``).

    >>> text = b"Hello world's 12345!!\\n  x"
    >>> starts = cl100k_starts(np.frombuffer(text, np.uint8), np.array([0]))
    >>> [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)])]
    [b'Hello', b' world', b"'s", b' ', b'123', b'45', b'!!\\n', b' ', b' x']
    """
    n = len(buf)
    if n == 0:
        return np.zeros(0, np.int64)
    cls = _classes()[buf]
    doc = np.zeros(n + 1, bool)  # a document starts here (and at n, the end)
    doc[doc_starts] = True
    doc[n] = True
    same = ~doc[1:n]  # same[i]: bytes i and i + 1 are in one document

    def prev(x):  # prev(x)[i]: x[i - 1], in the same document
        out = np.zeros(n, bool)
        np.logical_and(x[:-1], same, out=out[1:])
        return out

    def next_(x):  # next_(x)[i]: x[i + 1], in the same document
        out = np.zeros(n, bool)
        np.logical_and(x[1:], same, out=out[:-1])
        return out

    is_l, is_n, is_o = cls == L, cls == N, cls == O
    is_s, is_nl = cls == S, cls == NL
    run = np.minimum(cls, W)  # S and NL form one run class
    start = np.zeros(n + 1, bool)  # chunk starts (n: a sentinel, dropped at the end)
    start[0] = True
    np.not_equal(run[1:], run[:-1], out=start[1:n])
    start[:n] |= doc[:n]
    prev_s, prev_o, prev_nl = prev(is_s), prev(is_o), prev(is_nl)
    prev_space = prev(buf == 32)

    # letters take the whitespace character before them ([^\r\n\p{L}\p{N}]?\p{L}+)
    start[:n] &= ~(is_l & prev_s)
    # an other-run takes the space before it ( ?[^\s\p{L}\p{N}]+)
    start[:n] &= ~(is_o & prev_space)
    # one other character before letters joins them, unless it opens a contraction
    at = np.flatnonzero(is_o & ~prev_o & ~prev_space & next_(is_l))
    start[at + 1] = False
    quote = at[buf[at] == 39]
    if len(quote):
        c1 = _lower(buf[quote + 1])
        third = np.minimum(quote + 2, n - 1)
        c2 = np.where((quote + 2 < n) & ~doc[third], _lower(buf[third]), 0)
        m = np.zeros(len(quote), np.int64)
        m[np.isin(c1, np.frombuffer(b"stmd", np.uint8))] = 1
        m[((c1 == ord("r")) | (c1 == ord("v"))) & (c2 == ord("e"))] = 2
        m[(c1 == ord("l")) & (c2 == ord("l"))] = 2
        start[(quote + 1 + m)[m > 0]] = True  # the letters after the contraction

    # digits: a chunk every 3 (\p{N}{1,3})
    n_start = np.flatnonzero(is_n & ~prev(is_n))
    n_end = np.flatnonzero(is_n & ~next_(is_n)) + 1
    extra = (n_end - n_start - 1) // 3
    if extra.any():
        base = np.repeat(n_start, extra)
        step = np.arange(int(extra.sum())) - np.repeat(np.cumsum(extra) - extra, extra) + 1
        start[base + 3 * step] = True

    # newlines right after an other-run end its chunk ([\r\n]*)
    nl_end = np.flatnonzero(is_nl & ~next_(is_nl)) + 1
    absorbed = np.flatnonzero(is_nl & prev_o)
    start[absorbed] = False
    start[nl_end[np.searchsorted(nl_end, absorbed, side="right")]] = True
    # after the last newline of a whitespace run (\s*[\r\n]+), the rest starts a chunk
    s_end = np.flatnonzero(is_s & ~next_(is_s)) + 1
    after_nl = np.flatnonzero(is_s & prev_nl)
    end = s_end[np.searchsorted(s_end, after_nl, side="right")]
    then_nl = np.zeros(len(end), bool)
    inside = end < n
    then_nl[inside] = is_nl[end[inside]] & ~doc[end[inside]]
    start[after_nl[~then_nl]] = True
    # ... and, before a non-space, its last character starts another (\s+(?!\S))
    start[:n] |= is_s & prev_s & next_(~(is_s | is_nl))
    return np.flatnonzero(start[:n])


# -- chunk keys without Python strings ------------------------------------------------------------
#: Chunks of up to this many bytes are keyed by one integer (:func:`pack_chunks`).
PACKED_BYTES = 8
#: Chunks of up to this many 8-byte words are numbered by content in numpy (:func:`number_chunks`).
NUMBERED_WORDS = 4
_MASK = np.array([(1 << (8 * i)) - 1 for i in range(8)] + [(1 << 64) - 1], np.uint64)
_TAG = np.array([(0x80 | i) << 56 for i in range(8)] + [0], np.uint64)


def pack_chunks(data: bytes, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """A ``uint64`` key for each ASCII chunk ``data[start:start + len]`` with ``1 <= len <= 8``:
    the bytes little-endian, and, for fewer than 8, bit 63 set and the length in bits 56-62 (an
    8-byte ASCII chunk has bit 63 clear). Distinct chunks get distinct keys.

    ``data`` must extend at least 7 bytes past the last chunk (its 8-byte window is read).

    >>> key = int(pack_chunks(b"hi" + bytes(7), np.array([0]), np.array([2]))[0])
    >>> hex(key), unpack_chunk(key)
    ('0x8200000000006968', b'hi')
    """
    words = np.ndarray((len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
    return (words[starts] & _MASK[lens]) | _TAG[lens]


def pack_bytes(chunk: bytes) -> int:
    """The :func:`pack_chunks` key of one ASCII chunk of 1 to 8 bytes."""
    key = int.from_bytes(chunk, "little")
    return key if len(chunk) == PACKED_BYTES else key | ((0x80 | len(chunk)) << 56)


def unpack_chunk(key: int) -> bytes:
    """The bytes of a :func:`pack_chunks` key."""
    if key >> 63:
        return key.to_bytes(8, "little")[: (key >> 56) & 0x7F]
    return key.to_bytes(8, "little")


_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: 2**64 / golden ratio, odd


class IntTable:
    """A read-only hash table from distinct ``uint64`` keys to non-negative ``int64`` values,
    looked up for a whole array of keys at once (open addressing, linear probing, load at most
    1/4): a few vectorized passes, where ``np.searchsorted`` takes ~log2(n) dependent steps per
    key.

    >>> table = IntTable(np.array([5, 0, 9], np.uint64), np.array([50, 0, 90]))
    >>> table.get(np.array([9, 4, 0, 5], np.uint64), default=-1)
    array([90, -1,  0, 50])
    """

    def __init__(self, keys: np.ndarray, values: np.ndarray) -> None:
        if len(values) and values.min() < 0:
            raise ValueError("IntTable values must be non-negative")
        bits = max(4, (4 * len(keys)).bit_length())
        self._wrap = (1 << bits) - 1
        self._shift = np.uint64(64 - bits)
        self._keys = np.zeros(self._wrap + 1, np.uint64)
        self._values = np.full(self._wrap + 1, -1, np.int64)  # -1: an empty slot
        slot = self._slot(keys)
        pos = np.arange(len(keys))
        owner = np.full(self._wrap + 1, -1, np.int64)
        while len(pos):  # each pending key claims its slot if free; one claimant wins per slot
            free = self._values[slot] < 0
            claim_slot, claim_pos = slot[free], pos[free]
            owner[claim_slot] = claim_pos
            won = owner[claim_slot] == claim_pos
            self._keys[claim_slot[won]] = keys[claim_pos[won]]
            self._values[claim_slot[won]] = values[claim_pos[won]]
            pos = np.concatenate([pos[~free], claim_pos[~won]])
            slot = (np.concatenate([slot[~free], claim_slot[~won]]) + 1) & self._wrap

    def _slot(self, keys: np.ndarray) -> np.ndarray:
        return ((keys * _MIX) >> self._shift).astype(np.int64)

    def get(self, keys: np.ndarray, default: int) -> np.ndarray:
        """The value of each key, ``default`` for keys not in the table."""
        slot = self._slot(keys)
        value = self._values[slot]
        hit = self._keys[slot] == keys
        hit &= value >= 0
        out = np.where(hit, value, default)
        todo = np.flatnonzero((value >= 0) & ~hit)  # a different key holds the slot: probe on
        while len(todo):
            slot_t = (slot[todo] + 1) & self._wrap
            slot[todo] = slot_t
            value = self._values[slot_t]
            hit = (self._keys[slot_t] == keys[todo]) & (value >= 0)
            out[todo[hit]] = value[hit]
            todo = todo[(value >= 0) & ~hit]
        return out


def factorize(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(uniq, index)``: the sorted distinct ``uint64`` keys and, for each key, its position in
    ``uniq`` (``uniq[index] == keys``), like ``np.unique(keys, return_inverse=True)``.

    Sorting is fast, but numpy's argsort (which ``return_inverse`` needs) is several times
    slower than a sort, so the positions come from an :class:`IntTable` of ``uniq``.

    >>> factorize(np.array([7, 3, 7, 0], np.uint64))
    (array([0, 3, 7], dtype=uint64), array([2, 1, 2, 0]))
    """
    if not len(keys):
        return keys[:0].copy(), np.zeros(0, np.int64)
    srt = np.sort(keys)
    uniq = srt[np.r_[True, srt[1:] != srt[:-1]]]
    return uniq, IntTable(uniq, np.arange(len(uniq))).get(keys, default=-1)


def number_chunks(data: bytes, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Number ASCII chunks ``data[start:start + len]`` (``1 <= len <= 8 * NUMBERED_WORDS``) by
    content: ``(number, example)``, where ``number[i] == number[j]`` exactly when chunks ``i``
    and ``j`` are equal, and chunk ``example[k]`` is one with number ``k``.

    Each 8-byte word of the chunks (:func:`pack_chunks`, an absent word keyed as empty) is
    numbered with :func:`factorize`, and the numbers are combined word by word, renumbering
    after each word so that they stay small. ``data`` must extend ``8 * NUMBERED_WORDS - 1``
    bytes past the last chunk.

    >>> data = b" interpreter interpreter interpreted" + bytes(31)
    >>> number, example = number_chunks(data, np.array([0, 12, 24]), np.array([12, 12, 12]))
    >>> bool(number[0] == number[1] != number[2]), len(example)
    (True, 2)
    """
    if not len(lens):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    words = -(-int(lens.max()) // PACKED_BYTES)
    if words > NUMBERED_WORDS:
        raise ValueError(f"chunks longer than {PACKED_BYTES * NUMBERED_WORDS} bytes cannot be numbered")
    _, number = factorize(pack_chunks(data, starts, np.minimum(lens, PACKED_BYTES)))
    for j in range(1, words):
        part = np.clip(lens - PACKED_BYTES * j, 0, PACKED_BYTES)
        _, word = factorize(pack_chunks(data, starts + PACKED_BYTES * j, part))
        _, number = factorize((number * (int(word.max()) + 1) + word).astype(np.uint64))
    example = np.empty(int(number.max()) + 1, np.int64)
    example[number] = np.arange(len(number))  # any occurrence will do: they are all equal
    return number, example
