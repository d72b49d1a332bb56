"""The :class:`WordPieceTokenizer`: greedy longest match with ``##`` continuation pieces and a
whole-word ``[UNK]`` (BERT's WordPiece), byte-level or character-level.

**Words.** The pattern's chunks (as for BPE and Unigram), each cut further so that every ``#``
is a word of its own (HF ``Split("#", "isolated")``). So no word holds ``#`` beside anything
else, and a word-initial piece can never be spelled like a continuation piece (``##x`` is
always the piece ``x`` inside a word, never the three characters ``##x`` at its start): the
token strings of ``tokenizer.json`` stay unambiguous and ``decode_bytes`` exact.

**Units.** ``level="byte"``: a word is its UTF-8 bytes, and the alphabet is the 256 bytes both
word-initially and as ``##`` continuations, so nothing valid is ever unknown (no ``[UNK]`` id).
``level="char"``: a word is its characters (as BERT), the alphabet is the characters seen in
training, and the unknown token ``[UNK]`` is id 0.

**Encoding** (:meth:`WordPieceTokenizer.wordpiece`, the readable reference; HF ``tokenizers``'
loop): a word longer than ``max_input_chars_per_word`` units is ``[UNK]``. Otherwise, from the
left, take the longest vocabulary piece starting here (``##``-prefixed after the word's first
piece) and go on after it; if no piece matches at some position the **whole word** becomes one
``[UNK]`` (never "the matched prefix, then [UNK]").

>>> tok = WordPieceTokenizer([(b"un", False), (b"aff", True), (b"able", True)], pattern=r"\\S+|\\s+")
>>> [tok.token_string(i) for i in tok.encode("unaffable")]
['un', '##aff', '##able']

Ids. ``level="byte"``: byte ``b`` is id ``b`` word-initially and id ``256 + b`` as a continuation;
learned pieces follow from id 512 in training order. ``level="char"``: ``[UNK]`` is id 0, the
pieces follow in the order given (the trainer gives the alphabet's initial characters, then its
continuation characters, each by code point, then the learned pieces). Special tokens, then added
tokens, come last (as for every subword tokenizer: :mod:`bytelm.baselines.subword`).

:meth:`WordPieceTokenizer.encode_documents` is the fast batch path (the BPE encoder's chunk cache
and numpy split, new words matched by a byte trie: :mod:`bytelm.baselines.wordpiece.fast`); it
gives the same ids. :meth:`WordPieceTokenizer.encode_ordinary_with_bytes` gives, beside the ids,
the bytes each occurrence stands for: an ``[UNK]`` stands for the word it replaced (BPB charges it
with those bytes).

Files (:meth:`WordPieceTokenizer.save`): ``bytelm_wordpiece.json`` (native, versioned,
fingerprint checked on load), ``tokenizer.json`` (HF ``tokenizers``: a ``WordPiece`` model behind
``Split`` pattern, ``Split("#")`` and, byte-level, ``ByteLevel``; same ids) and ``vocab.txt``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from bytelm.baselines.bpe.bytelevel import bytes_to_chars, chars_to_bytes
from bytelm.baselines.bpe.io import (
    FORMAT_VERSION,
    HF_FILE,
    VOCAB_DUMP_FILE,
    _hf_added_token,
    invalid,
    read_native,
    write_files,
)
from bytelm.baselines.subword import SubwordTokenizer, _literal_regex, as_text, check_loaded
from bytelm.baselines.wordpiece.fast import WordPieceEncoder
from bytelm.errors import UserError

FORMAT_NAME = "bytelm-wordpiece"
NATIVE_FILE = "bytelm_wordpiece.json"
PREFIX = "##"  # the continuation mark of a piece's string (tokenizer.json, vocab.txt)
UNK = "[UNK]"
LEVELS = ("byte", "char")
BERT_MAX_CHARS = 100  # BERT's max_input_chars_per_word, the character-level default
_HF_NO_LIMIT = 1 << 30  # max_input_chars_per_word in tokenizer.json when words have no limit
_HASH = b"#"


def split_words(chunk: bytes) -> list[bytes]:
    """A chunk's words: every ``#`` on its own (module docstring).

    >>> split_words(b" a##b#")
    [b' a', b'#', b'#', b'b', b'#']
    """
    if _HASH not in chunk:
        return [chunk]
    out = []
    for i, part in enumerate(chunk.split(_HASH)):
        if i:
            out.append(_HASH)
        if part:
            out.append(part)
    return out


def units_of(word: bytes, level: str) -> list[bytes]:
    """A word's units: its bytes, or its characters' UTF-8 bytes (an invalid byte is a unit)."""
    if level == "byte":
        return [word[i : i + 1] for i in range(len(word))]
    return [c.encode("utf-8", "surrogateescape") for c in word.decode("utf-8", "surrogateescape")]


class WordPieceTokenizer(SubwordTokenizer):
    """A WordPiece tokenizer (see the module docstring).

    Args:
      pieces: ``(bytes, continuation)`` per id in order: for ``level="byte"`` the learned pieces
        only (ids 512..; the 512 byte pieces come first by themselves), for ``level="char"``
        every piece after ``[UNK]`` (ids 1..), alphabet included. A piece holding ``#`` is the
        single byte ``#`` (module docstring: ``#`` is a word of its own).
      level: ``"byte"`` or ``"char"``.
      max_input_chars_per_word: a longer word (in units) is ``[UNK]``; default none for bytes
        (there is no ``[UNK]``), 100 (BERT's) for characters.
      pattern, special_tokens, added_tokens: as for BPE.
      encoder: ``"wordpiece"`` (its only rule).
    """

    kind = "wordpiece"
    encoders = ("wordpiece",)

    def __init__(
        self,
        pieces: Sequence[tuple[bytes, bool]],
        *,
        level: str = "byte",
        max_input_chars_per_word: int | None = None,
        pattern: str = "cl100k",
        special_tokens: Iterable[str] = (),
        added_tokens: Iterable[str] = (),
        encoder: str | None = None,
    ) -> None:
        if level not in LEVELS:
            raise UserError(f"level {level!r} is not one of {list(LEVELS)}")
        self.level = level
        if max_input_chars_per_word is None and level == "char":
            max_input_chars_per_word = BERT_MAX_CHARS
        if max_input_chars_per_word is not None:
            if level == "byte":
                raise UserError(
                    "max_input_chars_per_word is for level='char': a byte-level WordPiece has no [UNK] "
                    "to turn long words into (leave it unset)"
                )
            if not isinstance(max_input_chars_per_word, int) or max_input_chars_per_word < 1:
                raise UserError(
                    f"max_input_chars_per_word must be an integer >= 1, got {max_input_chars_per_word!r}"
                )
        self.max_input_chars_per_word = max_input_chars_per_word
        if level == "byte":
            base = [(bytes([b]), False) for b in range(256)] + [(bytes([b]), True) for b in range(256)]
            self.unk_id: int | None = None
        else:
            base = [(UNK.encode(), False)]
            self.unk_id = 0
        self.pieces: list[tuple[bytes, bool]] = list(base)
        initial: dict[bytes, int] = {}
        continuation: dict[bytes, int] = {}
        if level == "byte":
            initial.update({p: i for i, (p, _) in enumerate(base[:256])})
            continuation.update({p: 256 + i for i, (p, _) in enumerate(base[:256])})
        for piece, cont in pieces:
            piece, cont = bytes(piece), bool(cont)
            where = f"piece {len(self.pieces)} ({PREFIX if cont else ''}{piece!r})"
            if not piece:
                raise UserError(f"{where} is empty")
            if _HASH in piece and piece != _HASH:
                raise UserError(f"{where} holds '#' beside other bytes; '#' is always a word of its own")
            if level == "char":
                text = piece.decode("utf-8", "surrogateescape")
                if text.encode("utf-8", "surrogateescape") != piece:
                    raise UserError(f"{where} is not whole characters")
            table = continuation if cont else initial
            if piece in table:
                raise UserError(f"{where} is listed twice")
            table[piece] = len(self.pieces)
            self.pieces.append((piece, cont))
        self._initial, self._continuation = initial, continuation
        self._max_len = max(map(len, initial | continuation), default=1)  # bytes
        vocab = [p for p, _ in self.pieces]
        self._init_vocab(
            vocab,
            dict(initial),
            pattern=pattern,
            special_tokens=special_tokens,
            added_tokens=added_tokens,
            encoder=encoder,
        )

    def _fingerprint_payload(self) -> dict:
        return {
            "format": FORMAT_NAME,
            "level": self.level,
            "max_input_chars_per_word": self.max_input_chars_per_word,
            "pattern": self.pattern,
            "pieces": [[p.hex(), c] for p, c in self.pieces],
            "special_tokens": list(self.special_tokens),
            "added_tokens": list(self.added_tokens),
        }

    def __repr__(self) -> str:
        return (
            f"WordPieceTokenizer(n_vocab={self.n_vocab}, level={self.level!r}, pattern="
            f"{self.pretokenizer.name or self.pattern!r}, special_tokens={list(self.special_tokens)})"
        )

    def __getstate__(self):
        return {
            "pieces": self.learned_pieces(),
            "level": self.level,
            "max_input_chars_per_word": self.max_input_chars_per_word,
            "pattern": self.pattern,
            "special_tokens": list(self.special_tokens),
            "added_tokens": list(self.added_tokens),
        }

    def __setstate__(self, state) -> None:
        WordPieceTokenizer.__init__(self, **{**state, "pieces": state["pieces"]})

    def with_encoder(self, encoder: str) -> WordPieceTokenizer:
        """This tokenizer (``"wordpiece"`` is its one rule; anything else is refused)."""
        if encoder not in self.encoders:
            raise UserError(f"encoder {encoder!r} is not a rule of a wordpiece tokenizer: use 'wordpiece'")
        return self

    def learned_pieces(self) -> list[tuple[bytes, bool]]:
        """The ``pieces`` argument that rebuilds this tokenizer (everything after the fixed base)."""
        return self.pieces[512:] if self.level == "byte" else self.pieces[1:]

    # -- strings ---------------------------------------------------------------------------------
    def _unit_string(self, piece: bytes) -> str:
        return bytes_to_chars(piece) if self.level == "byte" else piece.decode("utf-8", "surrogateescape")

    def token_string(self, token_id: int) -> str:
        """A model id's string in ``tokenizer.json`` (continuations ``##``-prefixed; byte-level in
        GPT-2's byte characters); a special or added token's spelling."""
        if token_id >= self.n_mergeable:
            return self.token_bytes(token_id).decode("utf-8")
        if token_id == self.unk_id:
            return UNK
        piece, cont = self.pieces[token_id]
        return (PREFIX if cont else "") + self._unit_string(piece)

    def _piece_of_string(self, s: str) -> tuple[bytes, bool]:
        cont = s.startswith(PREFIX) and len(s) > len(PREFIX)
        body = s[len(PREFIX) :] if cont else s
        piece = chars_to_bytes(body) if self.level == "byte" else body.encode("utf-8", "surrogateescape")
        return piece, cont

    # -- encoding ----------------------------------------------------------------------------------
    def wordpiece(self, word: bytes) -> tuple[int, ...]:
        """The ids of one word (the reference: HF's loop, on units). ``(unk_id,)`` when the word
        is too long or some position matches no piece.

        >>> tok = WordPieceTokenizer([(b"ab", False), (b"c", True)], level="char", pattern=r"\\S+")
        >>> [tok.token_string(i) for i in tok.wordpiece(b"abc")], tok.wordpiece(b"abx")
        (['ab', '##c'], (0,))
        """
        units = units_of(word, self.level)
        if self.max_input_chars_per_word is not None and len(units) > self.max_input_chars_per_word:
            return self._unknown(word)
        out = []
        start = 0
        while start < len(units):
            table = self._continuation if start else self._initial
            end = min(len(units), start + self._max_len)  # (no piece is longer)
            while end > start:  # the longest piece first, one unit shorter each time
                i = table.get(b"".join(units[start:end]))
                if i is not None:
                    out.append(i)
                    break
                end -= 1
            else:
                return self._unknown(word)
            start = end
        return tuple(out)

    def _unknown(self, word: bytes) -> tuple[int, ...]:
        if self.unk_id is None:  # (unreachable: every byte is a piece)
            raise ValueError(f"word {word!r} has no segmentation and this tokenizer has no [UNK]")
        return (self.unk_id,)

    def _segment_native(self, piece: bytes) -> tuple[int, ...]:
        out: list[int] = []
        for word in split_words(piece):
            out += self.wordpiece(word)
        return tuple(out)

    def encode_ordinary_with_bytes(self, text: str | bytes) -> tuple[list[int], list[int]]:
        """:meth:`encode_ordinary` with the bytes each token stands for: its own, or for ``[UNK]``
        the word it replaced (so BPB charges an ``[UNK]`` with the bytes it hides)."""
        ids = self.encode_ordinary(text)
        if self.unk_id is None or self.unk_id not in ids:
            return ids, [len(self._id_to_bytes[i]) for i in ids]
        nbytes = []
        # the words again, in order, for the [UNK] lengths
        text = as_text(text)
        matcher = _literal_regex(self.added_tokens.keys())
        parts: list[str | int] = []
        pos = 0
        for m in matcher.finditer(text) if matcher else ():
            parts += [text[pos : m.start()], self.added_tokens[m.group()]]
            pos = m.end()
        parts.append(text[pos:])
        for part in parts:
            if isinstance(part, int):
                nbytes.append(len(self._id_to_bytes[part]))
                continue
            for chunk in self.pretokenizer.splitter_for(part)(part) if part else ():
                for word in split_words(chunk.encode("utf-8", "surrogateescape")):
                    for i in self.wordpiece(word):
                        nbytes.append(len(word) if i == self.unk_id else len(self._id_to_bytes[i]))
        if len(nbytes) != len(ids):  # (the same words, so the same ids)
            raise RuntimeError("the per-token byte counts do not follow the ids")
        return ids, nbytes

    def encode_documents(
        self, documents: Iterable[bytes | str], *, num_workers: int | None = None, dtype=np.int32
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ordinary encoding of many documents into ``(ids, counts)`` by the fast path
        (:mod:`bytelm.baselines.wordpiece.fast`), as for BPE; the same ids as :meth:`encode_ordinary`."""
        if self._fast is None:
            self._fast = WordPieceEncoder(self)
        return self._fast.encode_documents(list(documents), num_workers=num_workers, dtype=dtype)

    # -- files ----------------------------------------------------------------------------------
    def hf_model(self) -> dict:
        """The ``model`` of ``tokenizer.json``: HF's ``WordPiece`` over the same strings."""
        return {
            "type": "WordPiece",
            "unk_token": UNK,
            "continuing_subword_prefix": PREFIX,
            "max_input_chars_per_word": self.max_input_chars_per_word or _HF_NO_LIMIT,
            "vocab": {self.token_string(i): i for i in range(self.n_mergeable)},
        }

    def hf_json(self) -> str:
        """``tokenizer.json`` for HF ``tokenizers`` (same ids; module docstring)."""
        split = [
            {"type": "Split", "pattern": {"Regex": self.pattern}, "behavior": "Isolated", "invert": False},
            {"type": "Split", "pattern": {"String": "#"}, "behavior": "Isolated", "invert": False},
        ]
        decoders: list[dict] = [{"type": "Replace", "pattern": {"String": PREFIX}, "content": ""}]
        if self.level == "byte":
            byte_level = {
                "type": "ByteLevel",
                "add_prefix_space": False,
                "trim_offsets": True,
                "use_regex": False,
            }
            split.append(byte_level)
            decoders.append(byte_level)
        added = [_hf_added_token(i, s, special=True) for s, i in self.special_tokens.items()]
        added += [_hf_added_token(i, s, special=False) for s, i in self.added_tokens.items()]
        doc = {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": split},
            "post_processor": None,
            "decoder": {"type": "Sequence", "decoders": decoders},
            "model": self.hf_model(),
        }
        return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"

    def save(self, directory) -> Path:
        """Write ``bytelm_wordpiece.json``, ``tokenizer.json`` and ``vocab.txt`` into ``directory``."""
        return write_files(
            directory,
            [
                (HF_FILE, self.hf_json()),
                (VOCAB_DUMP_FILE, self._vocab_dump()),
                (NATIVE_FILE, self._native_json()),
            ],
        )

    def _native_json(self) -> str:
        head = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "level": self.level,
            "max_input_chars_per_word": self.max_input_chars_per_word,
            "pattern": self.pattern,
            "n_vocab": self.n_vocab,
            "n_mergeable": self.n_mergeable,
            "special_tokens": [{"id": i, "content": s} for s, i in self.special_tokens.items()],
            "added_tokens": [{"id": i, "content": s} for s, i in self.added_tokens.items()],
            "fingerprint": self.fingerprint,
        }
        text = json.dumps(head, indent=1, ensure_ascii=False)
        first = 512 if self.level == "byte" else 1
        rows = ",\n".join(
            f"  {json.dumps(self.token_string(i), ensure_ascii=False)}"
            for i in range(first, self.n_mergeable)
        )
        return text[:-2] + ',\n "pieces": [\n' + rows + "\n ]\n}\n"

    def _vocab_dump(self) -> str:
        lines = [
            f"# bytelm {self.level}-level WordPiece vocabulary: {self.n_vocab} ids ({self.n_mergeable} "
            "pieces, "
            f"{len(self.special_tokens)} special)",
            f"# pattern: {self.pattern}",
            f"# max_input_chars_per_word: {self.max_input_chars_per_word}",
            f"# fingerprint: {self.fingerprint}",
            "# id\tkind\tbytes (Python literal)\tstring in tokenizer.json",
        ]
        for i in range(self.n_mergeable):
            kind = "unk" if i == self.unk_id else ("continuation" if self.pieces[i][1] else "initial")
            lines.append(f"{i}\t{kind}\t{self.pieces[i][0]!r}\t{self.token_string(i)}")
        kinds = {i: "special" for i in self.special_tokens.values()}
        for i in range(self.n_mergeable, self.n_vocab):
            lines.append(f"{i}\t{kinds.get(i, 'added')}\t{self._id_to_bytes[i]!r}")
        return "\n".join(lines) + "\n"

    @classmethod
    def load(cls, directory) -> WordPieceTokenizer:
        """Read a tokenizer written by :meth:`save`; the ids and fingerprint are checked."""
        path, doc = read_native(directory, name=NATIVE_FILE, format_name=FORMAT_NAME)
        try:
            level = doc["level"]
            if level not in LEVELS:
                raise ValueError(f"level {level!r}")
            probe = cls([], level=level)
            specials, added = list(doc["special_tokens"]), list(doc["added_tokens"])
            tok = cls(
                [probe._piece_of_string(s) for s in doc["pieces"]],
                level=level,
                max_input_chars_per_word=doc["max_input_chars_per_word"] if level == "char" else None,
                pattern=doc["pattern"],
                special_tokens=[e["content"] for e in specials],
                added_tokens=[e["content"] for e in added],
            )
            expected = {e["content"]: e["id"] for e in specials + added}
        except (KeyError, TypeError, ValueError) as e:
            raise invalid(path, f"{type(e).__name__}: {e}") from None
        check_loaded(tok, doc, expected, lambda why: invalid(path, why))
        return tok
