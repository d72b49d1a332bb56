"""The byte-level BPE :class:`Tokenizer`: the readable reference, with a tiktoken-style API.

Ids: byte ``b`` is id ``b`` (0-255); the token made by merge ``k`` is id ``256 + k`` (a merge
whose bytes already exist reuses that id, so in general the mergeable ids are ``0 ..
n_mergeable - 1``); special tokens follow, then added tokens (:meth:`Tokenizer.add_tokens`).
The mergeable ids double as tiktoken ranks: ``ranks.tiktoken`` stores ``bytes -> id``.

Encoding never counts anything (docs/tokenizers.md): split the text into chunks with the
pattern, then, in each chunk, start from the bytes and repeatedly apply the applicable merge with
the **lowest rank** (the leftmost first) until none applies (:meth:`Tokenizer.bpe`). It is not
longest-match:

>>> tok = Tokenizer([(ord("a"), ord("b")), (ord("c"), ord("d")), (256, ord("c"))], pattern=r"\\S+|\\s+")
>>> [tok.token_bytes(i) for i in tok.encode("abcd")]
[b'ab', b'cd']

Special and added tokens are matched as whole strings, longest first, before BPE runs; BPE only
sees the text between them. A special token found in text that is not allowed raises
``ValueError`` (untrusted text must never silently become a control token).

This module is the algorithm; :meth:`Tokenizer.encode_documents` hands large batches to the fast
path, :mod:`bytelm.baselines.bpe.fast`, which gives exactly the same ids (``tests/test_bpe.py``
pins the two together). The vocabulary, special and added tokens and the encode/decode API are
shared with the Unigram tokenizer (:mod:`bytelm.baselines.subword`); ``encoder="longest"``
segments the same vocabulary by greedy longest match instead of ranks.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from bytelm.baselines.bpe.fast import FastEncoder
from bytelm.baselines.bpe.io import FORMAT_NAME, invalid, read_native, write_tokenizer_files
from bytelm.baselines.bpe.merges import merge
from bytelm.baselines.subword import (  # noqa: F401  (re-exported: the BPE API predates the shared module)
    IncrementalDecoder,
    SubwordTokenizer,
    as_text,
    check_loaded,
    check_special_tokens,
)
from bytelm.errors import UserError


class Tokenizer(SubwordTokenizer):
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
      encoder: ``"ranks"`` (BPE, the default) or ``"longest"`` (greedy longest match over the
        same vocabulary; :class:`~bytelm.baselines.subword.LongestMatch`).
    """

    kind = "bpe"
    encoders = ("ranks", "longest")

    def __init__(
        self,
        merges: Iterable[tuple[int, int]],
        *,
        pattern: str = "cl100k",
        special_tokens: Iterable[str] = (),
        added_tokens: Iterable[str] = (),
        encoder: str | None = None,
    ) -> None:
        vocab: list[bytes] = [bytes([b]) for b in range(256)]
        id_of: dict[bytes, int] = {v: i for i, v in enumerate(vocab)}
        self.merges: list[tuple[int, int]] = []
        self.ranks: dict[tuple[int, int], int] = {}  # pair -> its rank (a repeated pair keeps its first)
        self.merge_results: list[int] = []  # rank -> the id the merge makes
        self._remakes: set[int] = set()  # ranks whose merge re-makes a token an earlier merge made
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
            if new in id_of:
                self._remakes.add(rank)
            else:
                id_of[new] = len(vocab)
                vocab.append(new)
            self.ranks.setdefault((left, right), rank)
            self.merge_results.append(id_of[new])
            self.merges.append((left, right))
        self._init_vocab(
            vocab,
            id_of,
            pattern=pattern,
            special_tokens=special_tokens,
            added_tokens=added_tokens,
            encoder=encoder,
        )

    def _fingerprint_payload(self) -> dict:
        payload = {
            "format": FORMAT_NAME,
            "pattern": self.pattern,
            "merges": self.merges,
            "special_tokens": list(self.special_tokens),
            "added_tokens": list(self.added_tokens),
        }
        if self.encoder != "ranks":  # the default rule leaves the fingerprints of older files unchanged
            payload["encoder"] = self.encoder
        return payload

    def __repr__(self) -> str:
        rule = "" if self.encoder == "ranks" else f", encoder={self.encoder!r}"
        return (
            f"Tokenizer(n_vocab={self.n_vocab}, merges={len(self.merges)}, pattern="
            f"{self.pretokenizer.name or self.pattern!r}, special_tokens={list(self.special_tokens)}{rule})"
        )

    def __getstate__(self):
        return {
            "merges": self.merges,
            "pattern": self.pattern,
            "special_tokens": list(self.special_tokens),
            "added_tokens": list(self.added_tokens),
            "encoder": self.encoder,
            "fast": self._fast,  # its tables, so that a worker process need not rebuild them
        }

    def __setstate__(self, state) -> None:
        Tokenizer.__init__(
            self,
            state["merges"],
            pattern=state["pattern"],
            special_tokens=state["special_tokens"],
            added_tokens=state["added_tokens"],
            encoder=state.get("encoder"),
        )
        self._fast = state.get("fast")

    def with_encoder(self, encoder: str) -> Tokenizer:
        """The same merges and tokens segmented by another rule (``"ranks"`` or ``"longest"``)."""
        return Tokenizer(
            self.merges,
            pattern=self.pattern,
            special_tokens=list(self.special_tokens),
            added_tokens=list(self.added_tokens),
            encoder=encoder,
        )

    # -- encoding -------------------------------------------------------------------------------
    def bpe(self, piece: bytes) -> tuple[int, ...]:
        """The ids of one chunk: from its bytes, merge the lowest-ranked adjacent pair (the
        leftmost first) and look again, until no pair has a rank.

        >>> tok = Tokenizer([(ord("a"), ord("b")), (ord("b"), ord("c"))])
        >>> tok.bpe(b"abc")                   # a+b has the lower rank: [ab, c]
        (256, 99)

        A merge that makes a new token applies to every occurrence of its pair in one left-to-right
        pass (:func:`~bytelm.baselines.bpe.merges.merge`), which gives the same ids as one occurrence
        at a time: the pairs it creates contain the new token, and every merge using that token
        comes later in the list. A merge that re-makes an older token (two pairs spelling the same
        bytes) may create pairs that rank lower than itself, so it applies to the leftmost
        occurrence only before the next look.
        """
        ids = list(piece)
        none = len(self.merges)  # ranks are below it
        while len(ids) >= 2:
            pair = min(zip(ids, ids[1:]), key=lambda p: self.ranks.get(p, none))
            rank = self.ranks.get(pair)
            if rank is None:
                break
            if rank in self._remakes:
                i = list(zip(ids, ids[1:])).index(pair)
                ids[i : i + 2] = [self.merge_results[rank]]
            else:
                ids = merge(ids, pair, self.merge_results[rank])
        return tuple(ids)

    _segment_native = bpe

    def encode_documents(
        self,
        documents: Iterable[bytes | str],
        *,
        num_workers: int | None = None,
        dtype=np.int32,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ordinary encoding of many documents into one array, by the fast path
        (:meth:`bytelm.baselines.bpe.fast.FastEncoder.encode_documents`; the same ids as
        :meth:`encode_ordinary` on each document).

        Returns ``(ids, counts)``: the concatenated ids of all documents (``dtype``) and the
        number of tokens of each document (``int64``), so document ``i`` is
        ``ids[offsets[i]:offsets[i + 1]]`` with ``offsets = concatenate([[0], cumsum(counts)])``.
        Inputs of 1 MiB or more are split across ``num_workers`` processes (default: all CPUs);
        ``num_workers=1`` stays in-process. With ``encoder="longest"``: the reference path.
        """
        if self.encoder != "ranks":
            return self._reference_documents(documents, dtype)
        if self._fast is None:
            self._fast = FastEncoder(self)
        return self._fast.encode_documents(list(documents), num_workers=num_workers, dtype=dtype)

    # -- files ----------------------------------------------------------------------------------
    def save(self, directory) -> Path:
        """Write the tokenizer files into ``directory`` (created if needed;
        :mod:`bytelm.baselines.bpe.io`)."""
        return write_tokenizer_files(self, directory)

    @classmethod
    def load(cls, directory) -> Tokenizer:
        """Read a tokenizer written by :meth:`save`; the ids and fingerprint are checked."""
        path, doc = read_native(directory)
        try:
            specials = list(doc["special_tokens"])
            added = list(doc["added_tokens"])
            tok = cls(
                [tuple(m) for m in doc["merges"]],
                pattern=doc["pattern"],
                special_tokens=[e["content"] for e in specials],
                added_tokens=[e["content"] for e in added],
                encoder=doc.get("encoder", "ranks"),
            )
            expected_ids = {e["content"]: e["id"] for e in specials + added}
        except (KeyError, TypeError, ValueError) as e:
            raise invalid(path, f"{type(e).__name__}: {e}") from None
        check_loaded(tok, doc, expected_ids, lambda why: invalid(path, why))
        return tok


def load_tokenizer(directory) -> Tokenizer:
    """:meth:`Tokenizer.load`."""
    return Tokenizer.load(directory)


def save_tokenizer(tok: Tokenizer, directory) -> Path:
    """:meth:`Tokenizer.save`."""
    return tok.save(directory)
