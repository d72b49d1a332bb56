"""The fast batch path of the WordPiece encoder: :class:`WordPieceEncoder`.

The BPE fast path's document machinery (:class:`~bytelm.baselines.bpe.fast.FastEncoder`: the
chunk cache, the numpy split of ASCII text under ``cl100k``, worker processes), with the chunks
it has not seen yet segmented by :class:`Tries`: one byte trie of the word-initial pieces and one
of the continuation pieces, each walked once per piece, instead of the reference's lookups of
ever shorter substrings. The same ids as
:meth:`~bytelm.baselines.wordpiece.tokenizer.WordPieceTokenizer.wordpiece` (``tests/test_wordpiece.py``
pins the two together).
"""

from __future__ import annotations

import numpy as np

from bytelm.baselines.bpe.asciisplit import PACKED_BYTES
from bytelm.baselines.bpe.fast import FastEncoder, _ChunkCache


class Tries:
    """Longest match over the initial pieces, then the continuation pieces: ``(id, end)`` steps.

    A node is a dict ``{byte: child}``; the id of the piece ending at a node is under the key
    ``-1``. Byte-level units are bytes, so every trie match is a whole number of units; at
    character level a non-ASCII word goes to the reference instead (a lone invalid byte can be a
    piece of its own, which a byte trie could match inside a valid character).
    """

    def __init__(self, initial: dict[bytes, int], continuation: dict[bytes, int]) -> None:
        self.roots = (self._build(initial), self._build(continuation))

    @staticmethod
    def _build(table: dict[bytes, int]) -> dict:
        root: dict = {}
        for piece, i in table.items():
            node = root
            for b in piece:
                node = node.setdefault(b, {})
            node[-1] = i
        return root

    def segment(self, word: bytes) -> tuple[int, ...] | None:
        """The ids of ``word`` (None when some position matches nothing: the word is ``[UNK]``)."""
        out = []
        start, n = 0, len(word)
        root = self.roots[0]
        while start < n:
            node: dict = root
            j = start
            best = best_end = -1
            while j < n:
                child = node.get(word[j])
                if child is None:
                    break
                node = child
                j += 1
                i = node.get(-1)
                if i is not None:
                    best, best_end = i, j
            if best < 0:
                return None
            out.append(best)
            start = best_end
            root = self.roots[1]
        return tuple(out)


class WordPieceEncoder(FastEncoder):
    """:meth:`FastEncoder.encode_documents` with new chunks segmented by :class:`Tries`."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.pretokenizer = tokenizer.pretokenizer
        self._cache = _ChunkCache()
        self._tries: Tries | None = None

    def _prepare(self) -> None:
        if self._tries is None:
            self._tries = Tries(self.tokenizer._initial, self.tokenizer._continuation)

    def _prepare_tables(self) -> None:
        self._prepare()

    def _segment(self, chunk: bytes) -> tuple[int, ...]:
        tok, tries = self.tokenizer, self._tries
        assert tries is not None
        if b"#" in chunk or (tok.level == "char" and not chunk.isascii()):
            return tok._segment_native(chunk)
        limit = tok.max_input_chars_per_word
        if limit is not None and len(chunk) > limit:  # (ASCII here: one unit per byte)
            return (tok.unk_id,)
        ids = tries.segment(chunk)
        return (tok.unk_id,) if ids is None else ids

    def _segment_many(self, chunks: list[str | bytes | int]) -> list[tuple[int, ...]]:
        self._prepare()
        out = []
        for c in chunks:
            if isinstance(c, int):
                raise TypeError(f"a packed chunk key ({c}) has its ids from the ASCII path, not from here")
            out.append(self._segment(c.encode("utf-8", "surrogateescape") if isinstance(c, str) else c))
        return out

    def _tokens_of_packed(self, keys: np.ndarray) -> list[tuple[int, ...]]:
        lens = np.where(keys >> np.uint64(63), (keys >> np.uint64(56)) & np.uint64(0x7F), 8).astype(np.int64)
        rows = keys.astype("<u8").view(np.uint8).reshape(-1, PACKED_BYTES)
        return self._segment_many([r[:m].tobytes() for r, m in zip(rows, lens.tolist())])
