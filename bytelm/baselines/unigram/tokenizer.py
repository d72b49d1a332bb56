"""The byte-level Unigram :class:`UnigramTokenizer`: pieces with log-probabilities, encoded by
the Viterbi best segmentation of each chunk.

Ids as for BPE: byte ``b`` is id ``b`` (every byte is a piece, so nothing is ever unknown), the
learned pieces follow (ids ``256 ..``), then special tokens, then added tokens. The shared API
(special and added tokens, ``encode``, ``decode_bytes``, the incremental decoder) is
:class:`~bytelm.baselines.subword.SubwordTokenizer`'s.

**Encoding** (:meth:`UnigramTokenizer.viterbi`, the readable reference): in each chunk, the
segmentation with the highest sum of piece log-probabilities. Ties go to the path whose last
piece is the longest, applied from the end (HF ``tokenizers``' rule: its loop visits start
positions in order and keeps the first best). Scores are summed left to right in float64.

>>> tok = UnigramTokenizer([b"ab", b"bc"], [-2.0] * 256 + [-3.0, -2.5], pattern=r"\\S+|\\s+")
>>> [tok.token_bytes(i) for i in tok.encode("abc")]     # a|b|c -6, ab|c -5, a|bc -4.5
[b'a', b'bc']

:meth:`UnigramTokenizer.encode_documents` is the fast batch path (the chunk cache of the BPE
encoder, and new chunks segmented together in numpy by
:meth:`~bytelm.baselines.unigram.lattice.Lattice.viterbi`); it gives the same ids.
:meth:`UnigramTokenizer.encode_sampled` draws segmentations instead (subword regularisation,
for training data only). ``encoder="longest"`` segments the same pieces by greedy longest match.

Files (:meth:`UnigramTokenizer.save`): ``bytelm_unigram.json`` (native, versioned, fingerprint
checked on load), ``tokenizer.json`` (HF ``tokenizers``: a ``Unigram`` model with the scores, or
``WordPiece`` for longest match; same ids) and ``vocab.txt`` (for people).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from bytelm.baselines.bpe.asciisplit import PACKED_BYTES
from bytelm.baselines.bpe.bytelevel import bytes_to_chars, chars_to_bytes
from bytelm.baselines.bpe.fast import FastEncoder, _ChunkCache
from bytelm.baselines.bpe.io import (
    FORMAT_VERSION,
    HF_FILE,
    VOCAB_DUMP_FILE,
    hf_longest_match_model,
    hf_tokenizer_json,
    invalid,
    read_native,
    write_files,
)
from bytelm.baselines.subword import SubwordTokenizer, _literal_regex, as_text, check_loaded
from bytelm.baselines.unigram.lattice import MAX_PIECE_BYTES, Chunks, Lattice, PieceIndex, find_edges
from bytelm.errors import UserError

FORMAT_NAME = "bytelm-unigram"
_VECTOR_CHUNK = 64  # longer new chunks go through the reference viterbi()
NATIVE_FILE = "bytelm_unigram.json"


class UnigramTokenizer(SubwordTokenizer):
    """A byte-level Unigram tokenizer (see the module docstring).

    Args:
      pieces: the learned pieces (ids 256, 257, ...), each 2 to 16 bytes, all distinct.
      scores: the log-probability of every mergeable id: the 256 bytes, then the pieces.
      pattern: ``"gpt2"``, ``"cl100k"`` or a regex (``regex`` module syntax).
      special_tokens, added_tokens: as for BPE.
      encoder: ``"viterbi"`` (the default) or ``"longest"``.
    """

    kind = "unigram"
    encoders = ("viterbi", "longest")

    def __init__(
        self,
        pieces: Sequence[bytes],
        scores: Sequence[float],
        *,
        pattern: str = "cl100k",
        special_tokens: Iterable[str] = (),
        added_tokens: Iterable[str] = (),
        encoder: str | None = None,
    ) -> None:
        vocab = [bytes([b]) for b in range(256)]
        id_of = {v: i for i, v in enumerate(vocab)}
        for p in pieces:
            p = bytes(p)
            if not 2 <= len(p) <= MAX_PIECE_BYTES:
                raise UserError(f"piece {p!r} has {len(p)} bytes; a learned piece has 2..{MAX_PIECE_BYTES}")
            if p in id_of:
                raise UserError(f"piece {p!r} is listed twice")
            id_of[p] = len(vocab)
            vocab.append(p)
        scores = [float(s) for s in scores]
        if len(scores) != len(vocab):
            raise UserError(
                f"{len(scores)} scores for {len(vocab)} pieces (256 bytes + {len(vocab) - 256} learned): one "
                "score each"
            )
        bad = next((i for i, s in enumerate(scores) if not math.isfinite(s)), None)
        if bad is not None:
            raise UserError(
                f"the score of piece {bad} ({vocab[bad]!r}) is {scores[bad]}, not a finite log-probability"
            )
        self.scores = scores
        self._init_vocab(
            vocab,
            id_of,
            pattern=pattern,
            special_tokens=special_tokens,
            added_tokens=added_tokens,
            encoder=encoder,
        )
        self._max_len = max(map(len, vocab))
        self._logp = np.asarray(scores, np.float64)
        self._index: PieceIndex | None = None

    def _fingerprint_payload(self) -> dict:
        return {
            "format": FORMAT_NAME,
            "pattern": self.pattern,
            "encoder": self.encoder,
            "pieces": [p.hex() for p in self.vocab[256:]],
            "scores": [s.hex() for s in self.scores],
            "special_tokens": list(self.special_tokens),
            "added_tokens": list(self.added_tokens),
        }

    def __repr__(self) -> str:
        return (
            f"UnigramTokenizer(n_vocab={self.n_vocab}, pieces={self.n_mergeable - 256}, pattern="
            f"{self.pretokenizer.name or self.pattern!r}, special_tokens={list(self.special_tokens)}, "
            f"encoder={self.encoder!r})"
        )

    def __getstate__(self):
        return {
            "pieces": self.vocab[256:],
            "scores": self.scores,
            "pattern": self.pattern,
            "special_tokens": list(self.special_tokens),
            "added_tokens": list(self.added_tokens),
            "encoder": self.encoder,
        }

    def __setstate__(self, state) -> None:
        UnigramTokenizer.__init__(
            self,
            state["pieces"],
            state["scores"],
            pattern=state["pattern"],
            special_tokens=state["special_tokens"],
            added_tokens=state["added_tokens"],
            encoder=state["encoder"],
        )

    def with_encoder(self, encoder: str) -> UnigramTokenizer:
        """The same pieces and tokens segmented by another rule."""
        return UnigramTokenizer(
            self.vocab[256:],
            self.scores,
            pattern=self.pattern,
            special_tokens=list(self.special_tokens),
            added_tokens=list(self.added_tokens),
            encoder=encoder,
        )

    # -- encoding -------------------------------------------------------------------------------
    def viterbi(self, piece: bytes) -> tuple[int, ...]:
        """The ids of one chunk's best segmentation (the reference; module docstring for ties).

        >>> tok = UnigramTokenizer([b"ab", b"bc"], [-2.0] * 256 + [-3.0, -2.5])
        >>> tok.viterbi(b"abc")
        (97, 257)
        """
        n = len(piece)
        best = [0.0] + [-math.inf] * n
        back: list[tuple[int, int] | None] = [None] * (n + 1)
        id_of, scores, longest = self._id_of, self.scores, self._max_len
        for start in range(n):  # HF's loop: starts in order, then ends in order; the first best stays
            here = best[start]
            for end in range(start + 1, min(n, start + longest) + 1):
                i = id_of.get(piece[start:end])
                if i is None:
                    continue
                s = here + scores[i]
                if back[end] is None or s > best[end]:
                    best[end] = s
                    back[end] = (start, i)
        out = []
        end = n
        while end > 0:
            step = back[end]
            if step is None:  # (every position is reachable: the 256 byte pieces are in every vocabulary)
                raise ValueError(f"no segmentation reaches byte {end} of {piece!r}")
            start, i = step
            out.append(i)
            end = start
        return tuple(reversed(out))

    _segment_native = viterbi

    def piece_index(self) -> PieceIndex:
        if self._index is None:
            self._index = PieceIndex(self.vocab)
        return self._index

    def viterbi_many(self, pieces: list[bytes]) -> list[tuple[int, ...]]:
        """:meth:`viterbi` of many chunks at once, in numpy (the same ids)."""
        out: list[tuple[int, ...] | None] = [None] * len(pieces)
        short = []
        for i, p in enumerate(pieces):
            if len(p) > _VECTOR_CHUNK:  # a pass costs numpy calls per byte of the longest chunk
                out[i] = self.viterbi(p)
            else:
                short.append(i)
        if short:
            chunks = Chunks.of([pieces[i] for i in short])
            paths, _ = Lattice(chunks, find_edges(chunks, self.piece_index())).viterbi(self._logp)
            for i, path in zip(short, paths):
                out[i] = tuple(path.tolist())
        return [ids for ids in out if ids is not None]

    def encode_sampled(
        self, text: str | bytes, *, alpha: float = 0.1, rng: np.random.Generator | int | None = None
    ) -> list[int]:
        """An ordinary encoding with each chunk's segmentation *drawn* with probability
        proportional to ``P(segmentation) ** alpha`` (subword regularisation, Kudo 2018: small
        ``alpha`` is close to uniform, large ``alpha`` close to Viterbi). For training data
        only; evaluation always uses :meth:`encode`. Added tokens match as in
        :meth:`encode_ordinary`."""
        if not alpha > 0:
            raise ValueError(f"alpha must be positive, got {alpha!r}")
        rng = np.random.default_rng(rng)
        text = as_text(text)
        parts: list[str | int] = []
        matcher = _literal_regex(self.added_tokens.keys())
        pos = 0
        for m in matcher.finditer(text) if matcher else ():
            parts.append(text[pos : m.start()])
            parts.append(self.added_tokens[m.group()])
            pos = m.end()
        parts.append(text[pos:])
        pieces = [
            [c.encode("utf-8", "surrogateescape") for c in self.pretokenizer.splitter_for(p)(p)]
            if isinstance(p, str)
            else p
            for p in parts
        ]
        chunks = [c for p in pieces if isinstance(p, list) for c in p]
        table = Chunks.of(chunks)
        paths = iter(
            Lattice(table, find_edges(table, self.piece_index())).sample(self._logp, alpha, rng)
            if chunks
            else ()
        )
        out: list[int] = []
        for p in pieces:
            if isinstance(p, int):
                out.append(p)
            else:
                for _ in p:
                    out += next(paths).tolist()
        return out

    def encode_documents(
        self, documents: Iterable[bytes | str], *, num_workers: int | None = None, dtype=np.int32
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ordinary encoding of many documents into ``(ids, counts)``, as for BPE
        (:meth:`bytelm.baselines.bpe.tokenizer.Tokenizer.encode_documents`); the same ids as
        :meth:`encode_ordinary`. With ``encoder="longest"``: the reference path."""
        if self.encoder != "viterbi":
            return self._reference_documents(documents, dtype)
        if self._fast is None:
            self._fast = LatticeEncoder(self)
        return self._fast.encode_documents(list(documents), num_workers=num_workers, dtype=dtype)

    # -- files ----------------------------------------------------------------------------------
    def hf_model(self) -> dict:
        """The ``model`` of ``tokenizer.json``: HF's ``Unigram`` with these scores (no unknown
        token: every byte is a piece), or ``WordPiece`` for longest match."""
        if self.encoder == "longest":
            return hf_longest_match_model(self)
        vocab = [[bytes_to_chars(p), s] for p, s in zip(self.vocab, self.scores)]
        return {"type": "Unigram", "unk_id": None, "vocab": vocab, "byte_fallback": False}

    def save(self, directory) -> Path:
        """Write ``bytelm_unigram.json``, ``tokenizer.json`` and ``vocab.txt`` into ``directory``."""
        return write_files(
            directory,
            [
                (HF_FILE, hf_tokenizer_json(self)),
                (VOCAB_DUMP_FILE, self._vocab_dump()),
                (NATIVE_FILE, self._native_json()),
            ],
        )

    def _native_json(self) -> str:
        head = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "pattern": self.pattern,
            "encoder": self.encoder,
            "n_vocab": self.n_vocab,
            "n_mergeable": self.n_mergeable,
            "special_tokens": [{"id": i, "content": s} for s, i in self.special_tokens.items()],
            "added_tokens": [{"id": i, "content": s} for s, i in self.added_tokens.items()],
            "fingerprint": self.fingerprint,
        }
        text = json.dumps(head, indent=1, ensure_ascii=False)
        rows = ",\n".join(
            f"  [{json.dumps(bytes_to_chars(p), ensure_ascii=False)}, {s!r}]"
            for p, s in zip(self.vocab, self.scores)
        )
        return text[:-2] + ',\n "pieces": [\n' + rows + "\n ]\n}\n"

    def _vocab_dump(self) -> str:
        lines = [
            f"# bytelm byte-level Unigram vocabulary: {self.n_vocab} ids ({self.n_mergeable} pieces = 256 "
            f"bytes + {self.n_mergeable - 256} learned, {len(self.special_tokens)} special)",
            f"# pattern: {self.pattern}",
            f"# encoder: {self.encoder}",
            f"# fingerprint: {self.fingerprint}",
            "# id\tkind\tbytes (Python literal)\tlog-probability",
        ]
        for i in range(self.n_mergeable):
            lines.append(f"{i}\t{'byte' if i < 256 else 'piece'}\t{self.vocab[i]!r}\t{self.scores[i]:.6f}")
        kinds = {i: "special" for i in self.special_tokens.values()}
        for i in range(self.n_mergeable, self.n_vocab):
            lines.append(f"{i}\t{kinds.get(i, 'added')}\t{self._id_to_bytes[i]!r}")
        return "\n".join(lines) + "\n"

    @classmethod
    def load(cls, directory) -> UnigramTokenizer:
        """Read a tokenizer written by :meth:`save`; the ids and fingerprint are checked."""
        path, doc = read_native(directory, name=NATIVE_FILE, format_name=FORMAT_NAME)
        try:
            rows = doc["pieces"]
            vocab = [chars_to_bytes(c) for c, _ in rows]
            if vocab[:256] != [bytes([b]) for b in range(256)]:
                raise ValueError("the first 256 pieces are not the bytes in order")
            specials, added = list(doc["special_tokens"]), list(doc["added_tokens"])
            tok = cls(
                vocab[256:],
                [float(s) for _, s in rows],
                pattern=doc["pattern"],
                special_tokens=[e["content"] for e in specials],
                added_tokens=[e["content"] for e in added],
                encoder=doc.get("encoder"),
            )
            expected = {e["content"]: e["id"] for e in specials + added}
        except (KeyError, TypeError, ValueError) as e:
            raise invalid(path, f"{type(e).__name__}: {e}") from None
        check_loaded(tok, doc, expected, lambda why: invalid(path, why))
        return tok


class LatticeEncoder(FastEncoder):
    """The BPE fast path's document machinery (chunk cache, numpy split of ASCII text) with new
    chunks segmented together by the numpy Viterbi (:meth:`UnigramTokenizer.viterbi_many`)."""

    def __init__(self, tokenizer: UnigramTokenizer) -> None:
        self.tokenizer = tokenizer
        self.pretokenizer = tokenizer.pretokenizer
        self._cache = _ChunkCache()

    def _prepare(self) -> None:
        self.tokenizer.piece_index()

    def _prepare_tables(self) -> None:
        self._prepare()

    def _segment_many(self, chunks: list[str | bytes | int]) -> list[tuple[int, ...]]:
        pieces = [c.encode("utf-8", "surrogateescape") if type(c) is str else c for c in chunks]
        return self.tokenizer.viterbi_many(pieces)

    def _tokens_of_packed(self, keys: np.ndarray) -> list[tuple[int, ...]]:
        lens = np.where(keys >> np.uint64(63), (keys >> np.uint64(56)) & np.uint64(0x7F), 8).astype(np.int64)
        rows = keys.astype("<u8").view(np.uint8).reshape(-1, PACKED_BYTES)
        return self._segment_many([r[:m].tobytes() for r, m in zip(rows, lens.tolist())])
