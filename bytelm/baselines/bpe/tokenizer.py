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
pins the two together).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from bytelm.baselines.bpe.merges import merge
from bytelm.baselines.bpe.io import FORMAT_NAME, invalid, read_native, write_tokenizer_files
from bytelm.baselines.bpe.fast import FastEncoder
from bytelm.baselines.bpe.parallel import balanced_shards, resolve_workers, shard_map
from bytelm.baselines.bpe.pretokenize import PreTokenizer, resolve_pattern
from bytelm.errors import UserError

_CACHE_LIMIT = 1 << 20  # chunks remembered by encode() before the cache starts over
_PARALLEL_BYTES = 1 << 20  # encode_batch inputs smaller than this stay in-process
_SHARDS_PER_WORKER = 4


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


def as_text(text: str | bytes) -> str:
    """``str`` as is; bytes of any kind as ``str`` through ``surrogateescape`` (invalid UTF-8 survives)."""
    if isinstance(text, str):
        return text
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text).decode("utf-8", "surrogateescape")
    raise TypeError(f"encode takes str or bytes, got {type(text).__name__}")


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
        self.pretokenizer = PreTokenizer(self.pattern)
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
        self.vocab = vocab  # the bytes of each mergeable id
        self._id_of = id_of
        self.n_mergeable = len(vocab)
        specials = check_special_tokens(special_tokens)
        self.special_tokens: dict[str, int] = {s: self.n_mergeable + i for i, s in enumerate(specials)}
        self._id_to_bytes: list[bytes] = vocab + [s.encode("utf-8") for s in specials]
        self.added_tokens: dict[str, int] = {}
        self._cache: dict[bytes, tuple[int, ...]] = {}
        self._fast: FastEncoder | None = None
        self._fingerprint: str | None = None
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
        self._fast = None  # its tables know the added tokens
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
            f"{self.pretokenizer.name or self.pattern!r}, special_tokens={list(self.special_tokens)})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __getstate__(self):
        return {
            "merges": self.merges,
            "pattern": self.pattern,
            "special_tokens": list(self.special_tokens),
            "added_tokens": list(self.added_tokens),
            "fast": self._fast,  # its tables, so that a worker process need not rebuild them
        }

    def __setstate__(self, state) -> None:
        self.__init__(
            state["merges"], pattern=state["pattern"], special_tokens=state["special_tokens"], added_tokens=state["added_tokens"]
        )
        self._fast = state.get("fast")

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

    def _encode_chunks(self, text: str) -> list[int]:
        """BPE over the pattern's chunks of ``text`` (no special or added tokens), each distinct
        chunk merged once (a cache that starts over past ``_CACHE_LIMIT`` chunks)."""
        if len(self._cache) > _CACHE_LIMIT:
            self._cache = {}
        out: list[int] = []
        for chunk in self.pretokenizer.splitter_for(text)(text):
            piece = chunk.encode("utf-8", "surrogateescape")
            ids = self._cache.get(piece)
            if ids is None:
                ids = self._cache[piece] = self.bpe(piece)
            out += ids
        return out

    def _encode_with(self, text: str, literals: Collection[str]) -> list[int]:
        """``literals`` (added tokens, allowed specials) become their ids; BPE runs between them."""
        matcher = _literal_regex(literals)
        if matcher is None:
            return self._encode_chunks(text)
        out: list[int] = []
        pos = 0
        for m in matcher.finditer(text):
            if m.start() > pos:
                out += self._encode_chunks(text[pos : m.start()])
            tok = m.group()
            out.append(self.special_tokens[tok] if tok in self.special_tokens else self.added_tokens[tok])
            pos = m.end()
        if pos < len(text):
            out += self._encode_chunks(text[pos:])
        return out

    def encode_ordinary(self, text: str | bytes) -> list[int]:
        """Encode ignoring special tokens (their spelling is ordinary text); added tokens match.

        ``text`` may be ``str`` or ``bytes`` (any bytes, valid UTF-8 or not).
        """
        return self._encode_with(as_text(text), self.added_tokens.keys())

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
        text = as_text(text)
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
        return self._encode_with(text, self.added_tokens.keys() | allowed)

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
        """Ordinary encoding of many documents into one array, by the fast path
        (:meth:`bytelm.baselines.bpe.fast.FastEncoder.encode_documents`; the same ids as
        :meth:`encode_ordinary` on each document).

        Returns ``(ids, counts)``: the concatenated ids of all documents (``dtype``) and the
        number of tokens of each document (``int64``), so document ``i`` is
        ``ids[offsets[i]:offsets[i + 1]]`` with ``offsets = concatenate([[0], cumsum(counts)])``.
        Inputs of 1 MiB or more are split across ``num_workers`` processes (default: all CPUs);
        ``num_workers=1`` stays in-process.
        """
        if self._fast is None:
            self._fast = FastEncoder(self)
        return self._fast.encode_documents(list(documents), num_workers=num_workers, dtype=dtype)

    def clear_cache(self) -> None:
        """Forget every chunk seen so far (e.g. to measure cold-cache speed)."""
        self._cache = {}
        if self._fast is not None:
            self._fast.clear_cache()

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
    def save(self, directory) -> Path:
        """Write the tokenizer files into ``directory`` (created if needed; :mod:`bytelm.baselines.bpe.io`)."""
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
            )
            expected_ids = {e["content"]: e["id"] for e in specials + added}
        except (KeyError, TypeError, ValueError) as e:
            raise invalid(path, f"{type(e).__name__}: {e}") from None
        if {**tok.special_tokens, **tok.added_tokens} != expected_ids or tok.n_vocab != doc.get("n_vocab"):
            raise invalid(path, "the token ids do not match the merges and token lists")
        if tok.fingerprint != doc.get("fingerprint"):
            raise invalid(path, f"fingerprint mismatch: the file says {doc.get('fingerprint')}, its contents hash to {tok.fingerprint}")
        return tok


def load_tokenizer(directory) -> Tokenizer:
    """:meth:`Tokenizer.load`."""
    return Tokenizer.load(directory)


def save_tokenizer(tok: Tokenizer, directory) -> Path:
    """:meth:`Tokenizer.save`."""
    return tok.save(directory)


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


def _encode_batch_shard(payload, i: int) -> list[list[int]]:
    """A worker's part of :meth:`Tokenizer.encode_batch` (module level: process pools call it)."""
    tok, texts, shards, kwargs = payload
    start, stop = shards[i]
    return [tok.encode(t, **kwargs) for t in texts[start:stop]]
