"""What every subword tokenizer of bytelm shares: a vocabulary of byte pieces, reserved special
tokens, added tokens, and the tiktoken-style API (``encode``, ``encode_ordinary``,
``encode_batch``, ``decode_bytes``, an incremental decoder).

A tokenizer is a vocabulary plus a *segmentation rule* (its ``encoder``), applied to each chunk of
the pre-tokenizer's split: ranked merges (:class:`~bytelm.baselines.bpe.tokenizer.Tokenizer`),
the Viterbi best path (:class:`~bytelm.baselines.unigram.tokenizer.UnigramTokenizer`), or, over
either vocabulary, greedy longest match (:class:`LongestMatch`). The rule is part of the
tokenizer's contract: it is recorded in the files and in the fingerprint.

Ids: byte ``b`` is id ``b`` (0-255), then the learned pieces (ids ``256 .. n_mergeable - 1``),
then the special tokens, then added tokens (:meth:`SubwordTokenizer.add_tokens`).

Special and added tokens are matched as whole strings, longest first, before the rule runs; the
rule only sees the text between them. A special token found in text that is not allowed raises
``ValueError`` (untrusted text must never silently become a control token).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from collections.abc import Collection, Iterable, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Literal

import numpy as np

from bytelm.baselines.bpe.parallel import balanced_shards, resolve_workers, shard_map
from bytelm.baselines.bpe.pretokenize import PreTokenizer, resolve_pattern
from bytelm.errors import UserError

if TYPE_CHECKING:
    from bytelm.baselines.bpe.fast import FastEncoder

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


def learnable_ids(vocab_size, special_tokens, *, unit: str) -> tuple[list[str], int]:
    """``(validated special tokens, ids left to learn)`` for a trainer's ``vocab_size``, which
    counts every id (256 bytes + learned + special, as HF counts it); ``UserError`` otherwise."""
    specials = check_special_tokens(special_tokens)
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
        raise UserError(f"vocab_size must be an integer, got {vocab_size!r}")
    minimum = 256 + len(specials)
    if vocab_size < minimum:
        raise UserError(
            f"vocab_size {vocab_size} is below 256 byte {unit} + {len(specials)} special token(s) = "
            f"{minimum}; use at least {minimum} (vocab_size counts every id, as in HF tokenizers)"
        )
    return specials, vocab_size - minimum


def check_loaded(tok, doc: dict, expected_ids: dict, invalid) -> None:
    """The checks after loading a native file: its token ids and size, then its fingerprint
    (``invalid(why)`` builds the error naming the file)."""
    if {**tok.special_tokens, **tok.added_tokens} != expected_ids or tok.n_vocab != doc.get("n_vocab"):
        raise invalid("the token ids do not match the vocabulary and token lists")
    if tok.fingerprint != doc.get("fingerprint"):
        raise invalid(
            f"fingerprint mismatch: the file says {doc.get('fingerprint')}, its contents hash to "
            f"{tok.fingerprint}"
        )


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


class LongestMatch:
    """Greedy longest match over a vocabulary (WordPiece's rule, without its ``##`` marks: on a
    byte alphabet every position can continue, so nothing becomes unknown): from the left, take
    the longest piece that starts here, then go on after it. A byte trie, walked once per piece.

    >>> lm = LongestMatch([b"a", b"b", b"c", b"d", b"ab", b"cd", b"abc"])
    >>> lm.segment(b"abcd")                  # ranked merges [a+b, c+d, ab+c] give [ab, cd]
    (6, 3)
    """

    def __init__(self, vocab: Sequence[bytes]) -> None:
        self.children: list[dict[int, int]] = [{}]
        self.terminal: list[int] = [-1]
        for i, piece in enumerate(vocab):
            node = 0
            for b in piece:
                nxt = self.children[node].get(b)
                if nxt is None:
                    nxt = len(self.children)
                    self.children[node][b] = nxt
                    self.children.append({})
                    self.terminal.append(-1)
                node = nxt
            if self.terminal[node] < 0:  # a piece listed twice keeps its first id
                self.terminal[node] = i

    def segment(self, piece: bytes) -> tuple[int, ...]:
        out = []
        i, n = 0, len(piece)
        children, terminal = self.children, self.terminal
        while i < n:
            node, j = 0, i
            best, best_end = -1, i
            while j < n:
                node = children[node].get(piece[j], -1)
                if node < 0:
                    break
                j += 1
                if terminal[node] >= 0:
                    best, best_end = terminal[node], j
            if best < 0:
                raise ValueError(
                    f"byte {piece[i]:#04x} is not in the vocabulary: longest match needs every byte"
                )
            out.append(best)
            i = best_end
        return tuple(out)


class SubwordTokenizer:
    """The shared part of the subword tokenizers (see the module docstring). A subclass sets
    ``encoders`` (its rules, the native one first), builds its vocabulary and calls
    :meth:`_init_vocab`, and implements :meth:`_segment_native` and :meth:`_fingerprint_payload`."""

    kind = "subword"
    encoders: tuple[str, ...] = ()

    def _init_vocab(
        self,
        vocab: list[bytes],
        id_of: dict[bytes, int],
        *,
        pattern: str,
        special_tokens,
        added_tokens,
        encoder: str | None,
    ) -> None:
        self.pattern = resolve_pattern(pattern)
        self.pretokenizer = PreTokenizer(self.pattern)
        encoder = encoder or self.encoders[0]
        if encoder not in self.encoders:
            raise UserError(
                f"encoder {encoder!r} is not a rule of a {self.kind} tokenizer: use one of "
                f"{list(self.encoders)}"
            )
        self.encoder = encoder
        self.vocab = vocab  # the bytes of each mergeable id
        self._id_of = id_of
        self.n_mergeable = len(vocab)
        specials = check_special_tokens(special_tokens)
        self.special_tokens: dict[str, int] = {s: self.n_mergeable + i for i, s in enumerate(specials)}
        self._id_to_bytes: list[bytes] = vocab + [s.encode("utf-8") for s in specials]
        self.added_tokens: dict[str, int] = {}
        self._cache: dict[bytes, tuple[int, ...]] = {}
        self._fast: FastEncoder | None = None  # the batch encoder (its kind's), built on first use
        self._longest: LongestMatch | None = None
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
        """Add ordinary tokens, matched as whole strings before segmentation (allowed by default).

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
        """sha256 (hex) of what determines the ids (the subclass's payload)."""
        if self._fingerprint is None:
            payload = json.dumps(self._fingerprint_payload(), separators=(",", ":"), ensure_ascii=True)
            self._fingerprint = hashlib.sha256(payload.encode("ascii")).hexdigest()
        return self._fingerprint

    def _fingerprint_payload(self) -> dict:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubwordTokenizer) and self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    # -- segmentation ---------------------------------------------------------------------------
    def _segment_native(self, piece: bytes) -> tuple[int, ...]:
        raise NotImplementedError

    def segment(self, piece: bytes) -> tuple[int, ...]:
        """The ids of one chunk by this tokenizer's rule."""
        if self.encoder == "longest":
            if self._longest is None:
                self._longest = LongestMatch(self.vocab)
            return self._longest.segment(piece)
        return self._segment_native(piece)

    def _encode_chunks(self, text: str) -> list[int]:
        """The rule over the pattern's chunks of ``text`` (no special or added tokens), each distinct
        chunk segmented once (a cache that starts over past ``_CACHE_LIMIT`` chunks)."""
        if len(self._cache) > _CACHE_LIMIT:
            self._cache = {}
        out: list[int] = []
        for chunk in self.pretokenizer.splitter_for(text)(text):
            piece = chunk.encode("utf-8", "surrogateescape")
            ids = self._cache.get(piece)
            if ids is None:
                ids = self._cache[piece] = self.segment(piece)
            out += ids
        return out

    def _encode_with(self, text: str, literals: Collection[str]) -> list[int]:
        """``literals`` (added tokens, allowed specials) become their ids; the rule runs between them."""
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

    def encode_ordinary_with_bytes(self, text: str | bytes) -> tuple[list[int], list[int]]:
        """:meth:`encode_ordinary` and the bytes of text each token stands for (its own length here;
        a tokenizer with an unknown token charges it with the bytes it replaced), so that they sum
        to the text's length."""
        ids = self.encode_ordinary(text)
        return ids, [len(self._id_to_bytes[i]) for i in ids]

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
        disallowed = (
            specials.keys() - allowed if disallowed_special == "all" else frozenset(disallowed_special)
        )
        pattern = _literal_regex(disallowed)
        if pattern is not None:
            m = pattern.search(text)
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
        parts = shard_map(_encode_batch_shard, (self, kwargs), [texts[a:b] for a, b in shards], workers)
        return [ids for part in parts for ids in part]

    def _reference_documents(self, documents: Iterable[bytes | str], dtype) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`encode_ordinary` of each document, as ``(ids, counts)`` (see ``encode_documents``)."""
        parts = [self.encode_ordinary(d) for d in documents]
        counts = np.array([len(p) for p in parts], dtype=np.int64)
        return np.fromiter(chain.from_iterable(parts), dtype=dtype, count=int(counts.sum())), counts

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


class IncrementalDecoder:
    """Decode a stream of token ids to text, holding back incomplete UTF-8 at the end.

    >>> from bytelm.baselines.bpe import Tokenizer
    >>> tok = Tokenizer([])
    >>> dec = tok.incremental_decoder()
    >>> ids = tok.encode("é!")                    # 0xC3 0xA9 0x21: three byte tokens
    >>> dec.decode(ids[:1]), dec.decode(ids[1:]), dec.flush()
    ('', 'é!', '')
    """

    def __init__(self, tokenizer: SubwordTokenizer, errors: str = "replace") -> None:
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


def _encode_batch_shard(shared, texts: list) -> list[list[int]]:
    """A worker's part of :meth:`SubwordTokenizer.encode_batch` (module level: process pools call it)."""
    tok, kwargs = shared
    return [tok.encode(t, **kwargs) for t in texts]
