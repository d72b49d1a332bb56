"""Importing a Hugging Face ``tokenizer.json`` whose model is BPE, WordPiece or Unigram.

Supported (the combinations HF's trainers produce, checked component by component; anything
else is refused with a :class:`UserError` naming the JSON key and its value):

- ``BPE`` + ``ByteLevel`` pre-tokenizer (its GPT-2 regex or none, ``add_prefix_space`` either
  way): the inner tokenizer is bytelm's own BPE (the merges, over GPT-2's byte characters); all
  256 bytes must be in the vocabulary (HF silently drops a byte it has no token for).
- ``WordPiece`` (``continuing_subword_prefix = "##"``) + ``BertPreTokenizer``: whitespace
  removed, every punctuation character a word of its own (:func:`bert_words`: HF's definition,
  ASCII symbols and the Unicode ``P*`` categories of HF's own Unicode tables), then bytelm's
  character-level WordPiece on each word.
- ``Unigram`` + ``Metaspace`` (``prepend_scheme`` always/first/never, ``split`` either way):
  spaces become ``▁``, then HF's Viterbi over the pieces (:meth:`MetaspaceUnigram.viterbi`,
  unknown characters fused into one ``unk_id``).

- **bytelm's own files** (what ``bytelm tokenizer train`` writes): the pre-tokenizer is the
  ``Sequence`` bytelm writes (``Split`` on its pattern, ``Isolated``; for its WordPiece a
  ``Split`` on ``"#"``; then ``ByteLevel`` without prefix space or regex, absent for a
  character-level WordPiece), and the tokenizer is rebuilt as the bytelm class it came from
  (:func:`_import_bytelm_form`): ``BPE`` as bytelm's BPE (merges that re-make a token included),
  ``Unigram`` as bytelm's Unigram, ``WordPiece`` with ``"##"`` as bytelm's WordPiece and without a
  prefix (greedy longest match, ``encoder = "longest"``) as :class:`LongestMatchTokenizer`. Its
  vocabulary must be laid out as bytelm lays it out (checked id by id), so the ids are the original's.

Every file is checked for shape first (:func:`_check_shape`): a missing key, a wrong type, an empty
vocabulary, two tokens with one id, a merge that is not two tokens: one :class:`UserError` naming the
key. The normalizer must be absent or an identity (``BertNormalizer`` with every option off); the
post-processor is not applied (ids as HF's ``encode(text, add_special_tokens=False)``);
``truncation`` is refused; the decoder is not read.

**Added tokens** (``added_tokens``: the special tokens a trainer was given, and any added later) are
applied as HF applies them (:class:`AddedTokens`): the text is first cut at each occurrence of an
added token's content, leftmost-longest, those with ``normalized = false`` first and then, in what
is left, those with ``normalized = true`` (the normalizer is an identity here); each occurrence is
that token's id, and each piece between them goes through the pre-tokenizer and the model by itself
(so ``ByteLevel``'s prefix space is added to every piece, and ``Metaspace``'s ``prepend_scheme =
"first"`` prepends only to a piece at the start of the text). ``single_word``, ``lstrip`` and
``rstrip`` (matching that depends on, or swallows, the characters beside the token) are refused.

**Byte-exactness.** Only ``ByteLevel`` BPE without ``add_prefix_space`` gives tokens whose bytes
reproduce the text; every other import records why not (``lossy``: whitespace dropped, a space
prepended, ``▁`` and space one character, unknown characters) and the subword LM refuses it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Literal

import numpy as np
import regex

from bytelm.baselines.bpe.bytelevel import BYTE_TO_CHAR, bytes_to_chars, chars_to_bytes
from bytelm.baselines.bpe.pretokenize import GPT2_PATTERN
from bytelm.baselines.bpe.tokenizer import Tokenizer
from bytelm.baselines.subword import SubwordTokenizer, as_text
from bytelm.baselines.unigram.tokenizer import UnigramTokenizer
from bytelm.baselines.wordpiece.tokenizer import WordPieceTokenizer
from bytelm.errors import UserError

HF_MODELS = ("BPE", "WordPiece", "Unigram")
SOURCE_KIND = "tokenizer.json"
_ONE_CHUNK = r"(?s).+"  # ByteLevel(use_regex=false): the whole text is one chunk
_NO_WORD_LIMIT = 1 << 30  # max_input_chars_per_word bytelm writes where words have no length limit
_IGNORED_POST = {None, "TemplateProcessing", "BertProcessing", "RobertaProcessing", "ByteLevel"}

# -- BertPreTokenizer ------------------------------------------------------------------------------
#: Rust's ``char::is_whitespace`` (the Unicode White_Space property), which HF splits on.
BERT_WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B)))
)
# HF's P* categories come from an older Unicode than Python's: these P* code points are not
# punctuation there, and two others (then Po) are. tests/test_import.py checks every code point.
_NOT_HF_PUNCT = [
    (0x61D, 0x61D), (0x9FD, 0x9FD), (0xA76, 0xA76), (0xC77, 0xC77), (0xC84, 0xC84), (0x1B4E, 0x1B4F),
    (0x1B7D, 0x1B7F), (0x2E43, 0x2E4F), (0x2E52, 0x2E5D), (0x2E60, 0x2E63), (0x10D6E, 0x10D6E),
    (0x10EAD, 0x10EAD), (0x10ED0, 0x10ED0), (0x10F55, 0x10F59), (0x10F86, 0x10F89), (0x113D4, 0x113D5),
    (0x113D7, 0x113D8), (0x1144B, 0x1144F), (0x1145A, 0x1145B), (0x1145D, 0x1145D), (0x11660, 0x1166C),
    (0x116B9, 0x116B9), (0x1183B, 0x1183B), (0x11944, 0x11946), (0x119E2, 0x119E2), (0x11A3F, 0x11A46),
    (0x11A9A, 0x11A9C), (0x11A9E, 0x11AA2), (0x11C41, 0x11C45),
    (0x11C70, 0x11C71), (0x11EF7, 0x11EF8), (0x11FFF, 0x11FFF), (0x12FF1, 0x12FF2),
    (0x16E97, 0x16E9A),
    (0x16FE2, 0x16FE2), (0x1E95E, 0x1E95F),
]  # fmt: skip
_HF_PUNCT_EXTRA = frozenset("\u166d\U000111c9")


def is_bert_punct(c: str) -> bool:
    """HF's ``is_bert_punc``: ASCII symbols 33-47, 58-64, 91-96, 123-126, or Unicode ``P*`` (HF's tables)."""
    cp = ord(c)
    if cp < 128:
        return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
    if c in _HF_PUNCT_EXTRA:
        return True
    if not unicodedata.category(c).startswith("P"):
        return False
    return not any(a <= cp <= b for a, b in _NOT_HF_PUNCT)


def bert_words(text: str) -> list[str]:
    """HF's ``BertPreTokenizer``: split on whitespace (removed), each punctuation character isolated.

    >>> bert_words("Hi,  you're\\tok!")
    ['Hi', ',', 'you', "'", 're', 'ok', '!']
    """
    out: list[str] = []
    word: list[str] = []
    for c in text:
        if c in BERT_WHITESPACE or is_bert_punct(c):
            if word:
                out.append("".join(word))
                word = []
            if c not in BERT_WHITESPACE:
                out.append(c)
        else:
            word.append(c)
    if word:
        out.append("".join(word))
    return out


# -- added tokens ----------------------------------------------------------------------------------
class AddedTokens:
    """HF's added-token pass (module docstring) over ``(content, id, normalized)`` entries.

    >>> AddedTokens([("<s>", 0, False), ("<s>x", 1, False), ("s>", 2, False)]).split("a<s>xs>b")
    [(None, 0, 1), (1, 1, 5), (2, 5, 7), (None, 7, 8)]
    """

    def __init__(self, entries: list[tuple[str, int, bool]], special: dict[str, int] | None = None) -> None:
        self.id_of = {c: i for c, i, _ in entries}
        self.special = dict(special or {})  # the special ones among them

        def matcher(contents: list[str]):
            if not contents:
                return None  # longest first: at the leftmost match the longest alternative wins
            return re.compile("|".join(re.escape(c) for c in sorted(contents, key=lambda c: (-len(c), c))))

        self.raw = matcher([c for c, _, n in entries if not n])
        self.normalized = matcher([c for c, _, n in entries if n])

    def split(self, text: str) -> list[tuple[int | None, int, int]]:
        """``(added id or None, start, end)`` covering ``text`` in order, no empty piece."""
        pieces: list[tuple[int | None, int, int]] = [(None, 0, len(text))] if text else []
        for pattern in (self.raw, self.normalized):
            if pattern is None:
                continue
            out: list[tuple[int | None, int, int]] = []
            for tid, a, b in pieces:
                if tid is not None:
                    out.append((tid, a, b))
                    continue
                at = a
                for m in pattern.finditer(text, a, b):
                    if m.start() > at:
                        out.append((None, at, m.start()))
                    out.append((self.id_of[m.group()], m.start(), m.end()))
                    at = m.end()
                if at < b:
                    out.append((None, at, b))
            pieces = out
        return pieces


def _model_vocab(model: dict) -> dict[str, int]:
    """The model's ``{token string: id}`` (a Unigram's pieces by position, the first one kept)."""
    if model.get("type") == "Unigram":
        out: dict[str, int] = {}
        for i, (piece, _) in enumerate(model["vocab"]):
            out.setdefault(str(piece), i)
        return out
    return dict(model["vocab"])


def _added_tokens(path, doc: dict) -> AddedTokens | None:
    """The ``added_tokens`` of a tokenizer.json (None when there are none); refuses what is not exact.

    Ids are given as HF gives them when it loads the file (not read from the JSON's ``id``, which a
    file saved by HF always agrees with): a token whose content is a string of the model's vocabulary
    takes the model's id, any other the next id from the model's vocabulary size on, in file order;
    a content seen before keeps its first id."""
    model_ids = _model_vocab(doc["model"])
    size = len(model_ids) if doc["model"].get("type") != "Unigram" else len(doc["model"]["vocab"])
    entries: list[tuple[str, int, bool]] = []
    special: dict[str, int] = {}
    ids: dict[str, int] = {}
    for k, t in enumerate(doc.get("added_tokens") or []):
        if not isinstance(t, dict) or not isinstance(t.get("content"), str):
            raise _refuse(path, f"added_tokens[{k}]", t, "is not an added token (content, id, ...)")
        for flag in ("single_word", "lstrip", "rstrip"):
            if t.get(flag):
                raise _refuse(
                    path,
                    f"added_tokens[{k}].{flag}",
                    True,
                    f"(token {t['content']!r}) is not supported: its match depends on or takes in the "
                    "characters beside it; only false",
                )
        content = t["content"]
        if not content or content in ids:
            continue
        if content in model_ids:
            ids[content] = model_ids[content]
        else:
            top = max(ids.values(), default=-1)
            ids[content] = top + 1 if top >= size else size
        entries.append((content, ids[content], bool(t.get("normalized", True))))
        if t.get("special"):
            special[content] = ids[content]
    if not entries:
        return None
    return AddedTokens(entries, special)


# -- the adapters ----------------------------------------------------------------------------------
class HFPipeline:
    """An imported tokenizer that bytelm's classes do not hold whole: HF's pre-tokenizer (written
    here) over the text, then a segmentation of each word. Ids are the source's own. A subclass
    implements :meth:`words` (``(word, bytes of the text it covers)`` in order) and
    :meth:`segment_word` (``(id, bytes)`` per token)."""

    kind = "subword"
    encoder = ""
    pattern = ""
    lossy: str | None = None

    def __init__(
        self, strings: list[str], doc: dict, *, unk_id: int | None, added: AddedTokens | None
    ) -> None:
        self.added = added
        strings = list(strings)  # the source's token string of each id
        #: added tokens outside the model's vocabulary (one inside it is the model's token: its bytes)
        self.added_ids: dict[int, str] = {}
        if self.added is not None:
            for content, i in self.added.id_of.items():
                if i >= len(strings) or not strings[i]:
                    strings += [""] * (i + 1 - len(strings))
                    strings[i] = content
                    self.added_ids[i] = content
        self.strings = strings
        self.n_vocab = len(strings)
        self.unk_id = unk_id
        self.special_tokens: dict[str, int] = dict(self.added.special) if self.added else {}
        self.added_tokens: dict[str, int] = (
            {c: i for c, i in self.added.id_of.items() if c not in self.special_tokens} if self.added else {}
        )
        self._cache: dict[str, list] = {}
        payload = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        self.fingerprint = hashlib.sha256(payload.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_vocab={self.n_vocab})"

    def words(self, text: str) -> list[tuple[str, int]]:
        raise NotImplementedError

    def segment_word(self, word: str, nbytes: int) -> list[tuple[int, int]]:
        raise NotImplementedError

    def encode_ordinary_with_bytes(self, text: str | bytes) -> tuple[list[int], list[int]]:
        """The ids and the bytes of text each stands for (what the pre-tokenizer drops is charged
        to no token: see ``lossy``); added tokens first (module docstring)."""
        text = as_text(text)
        if self.added is None:
            return self.encode_section(text, True)
        ids: list[int] = []
        nbytes: list[int] = []
        for tid, a, b in self.added.split(text):
            if tid is not None:
                ids.append(tid)
                nbytes.append(len(text[a:b].encode("utf-8", "surrogateescape")))
            else:
                more, n = self.encode_section(text[a:b], a == 0)
                ids += more
                nbytes += n
        return ids, nbytes

    def encode_section(self, text: str, at_start: bool) -> tuple[list[int], list[int]]:
        """:meth:`encode_ordinary_with_bytes` of a piece without added tokens (``at_start``: the piece
        begins the text)."""
        ids: list[int] = []
        nbytes: list[int] = []
        for word, n in self.words(text):
            key = f"{n}:{word}"
            toks = self._cache.get(key)
            if toks is None:
                toks = self._cache[key] = self.segment_word(word, n)
            for i, b in toks:
                ids.append(i)
                nbytes.append(b)
        return ids, nbytes

    def encode_ordinary(self, text: str | bytes) -> list[int]:
        return self.encode_ordinary_with_bytes(text)[0]

    def encode(
        self,
        text: str | bytes,
        *,
        allowed_special: Literal["all"] | Collection[str] = frozenset(),
        disallowed_special: Literal["all"] | Collection[str] = "all",
    ) -> list[int]:
        """HF's ids (:meth:`encode_ordinary`: every added token applied, as by HF), with the same guard
        as bytelm's tokenizers: a special token's spelling in the text raises ``ValueError`` unless it is
        in ``allowed_special`` (``"all"``: every one), so that untrusted text (a sampling prompt)
        cannot inject control tokens; ``disallowed_special=()`` lifts the guard."""
        specials = set(self.special_tokens)
        allowed = specials if allowed_special == "all" else set(allowed_special)
        if allowed - specials:
            raise ValueError(
                f"allowed_special names {sorted(allowed - specials)!r}, which are not special tokens of this "
                f"tokenizer.json (its special tokens: {sorted(specials)!r})"
            )
        disallowed = specials - allowed if disallowed_special == "all" else set(disallowed_special)
        found = [t for t in sorted(disallowed) if t in as_text(text)]
        if found:
            raise ValueError(
                f"the text contains the special token {found[0]!r}, which is disallowed by default so that "
                f"untrusted text cannot inject control tokens; pass allowed_special={{{found[0]!r}}} (or "
                "'all') to encode it as HF does"
            )
        return self.encode_ordinary(text)

    def encode_batch(self, texts, **kwargs) -> list[list[int]]:
        kwargs.pop("num_workers", None)
        return [self.encode(t, **kwargs) for t in texts]

    def encode_documents(self, documents: Iterable, *, num_workers: int | None = None, dtype=np.int32):
        parts = [self.encode_ordinary(d) for d in documents]
        counts = np.array([len(p) for p in parts], np.int64)
        return np.fromiter((i for p in parts for i in p), dtype=dtype, count=int(counts.sum())), counts

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.n_vocab:
            raise ValueError(f"unknown token id {token_id!r}: valid ids are 0..{self.n_vocab - 1}")
        if token_id in self.added_ids:
            return self.added_ids[token_id].encode("utf-8", "surrogateescape")
        return self.model_token_bytes(token_id)

    def model_token_bytes(self, token_id: int) -> bytes:
        """The bytes a model token stands for (a subclass undoes its pre-tokenizer's marks)."""
        return self.strings[token_id].encode("utf-8", "surrogateescape")

    def check_added_tokens(self) -> None:
        """Called by a subclass once built: an added token that is a model token whose bytes are not
        the token's text (a ByteLevel vocabulary's "é" is byte 0xE9) makes the import lossy."""
        if self.added is None or self.lossy is not None:
            return
        for content, i in self.added.id_of.items():
            if i not in self.added_ids and self.model_token_bytes(i) != content.encode(
                "utf-8", "surrogateescape"
            ):
                self.lossy = (
                    f"added token {content!r} is the model's token {i}, which stands for the bytes "
                    f"{self.model_token_bytes(i)!r}: an occurrence of the text does not decode to itself"
                )
                return

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return b"".join(self.token_bytes(int(i)) for i in ids)

    def clear_cache(self) -> None:
        self._cache = {}


class BertWordPiece(HFPipeline):
    """``BertPreTokenizer`` then bytelm's character-level WordPiece (HF's loop) on each word."""

    kind = "wordpiece"
    encoder = "wordpiece"
    pattern = "BertPreTokenizer"
    lossy = (
        "pre_tokenizer BertPreTokenizer drops whitespace (and an [UNK] hides its characters): the "
        "tokens' bytes do not reproduce the text"
    )

    def __init__(
        self, vocab: dict[str, int], unk_token: str, max_chars: int, doc: dict, added: AddedTokens | None
    ) -> None:
        strings = _strings_of(vocab)
        super().__init__(strings, doc, unk_id=vocab[unk_token], added=added)
        pieces, source = [], [vocab[unk_token]]
        for s, i in sorted(vocab.items(), key=lambda kv: kv[1]):
            cont = s.startswith("##") and len(s) > 2
            body = s[2:] if cont else s
            # a piece no BERT word can hold (whitespace, or punctuation beside anything) is never reached
            if s == unk_token or any(c in BERT_WHITESPACE for c in body):
                continue
            if len(body) > 1 and any(is_bert_punct(c) for c in body):
                continue
            pieces.append((body.encode("utf-8", "surrogateescape"), cont))
            source.append(i)
        self.wp = WordPieceTokenizer(pieces, level="char", max_input_chars_per_word=max_chars, pattern=r"\S+")
        self.wp_to_source = source

    def words(self, text: str) -> list[tuple[str, int]]:
        return [(w, len(w.encode("utf-8", "surrogateescape"))) for w in bert_words(text)]

    def segment_word(self, word: str, nbytes: int) -> list[tuple[int, int]]:
        ids = [self.wp_to_source[i] for i in self.wp.wordpiece(word.encode("utf-8", "surrogateescape"))]
        if ids == [self.unk_id]:
            return [(ids[0], nbytes)]
        return [(i, len(self.strings[i].removeprefix("##").encode("utf-8", "surrogateescape"))) for i in ids]

    def model_token_bytes(self, token_id: int) -> bytes:
        return super().model_token_bytes(token_id).removeprefix(b"##") if token_id != self.unk_id else b""


class MetaspaceUnigram(HFPipeline):
    """``Metaspace`` then HF's Unigram Viterbi (:meth:`viterbi`) on each word."""

    kind = "unigram"
    encoder = "viterbi"
    lossy = (
        "pre_tokenizer Metaspace makes ' ' and its replacement one character and prepends one: two "
        "texts can share one encoding (and an unknown token hides its characters)"
    )

    def __init__(
        self,
        pieces: list[tuple[str, float]],
        unk_id: int | None,
        meta: dict,
        doc: dict,
        added: AddedTokens | None,
    ) -> None:
        super().__init__([p for p, _ in pieces], doc, unk_id=unk_id, added=added)
        self.replacement = meta["replacement"]
        self.prepend = meta["prepend_scheme"]
        self.split = meta["split"]
        self.pattern = f"Metaspace({self.replacement!r}, {meta['prepend_scheme']}, split={self.split})"
        self.scores = [float(s) for _, s in pieces]
        self.id_of = {p: i for i, (p, _) in enumerate(pieces)}
        self.unk_score = min(self.scores, default=0.0) - 10.0  # HF's K_UNK_PENALTY
        self.max_chars = max((len(p) for p, _ in pieces), default=1)

    def metaspace(self, text: str, at_start: bool = True) -> list[tuple[str, list[int]]]:
        """The words after ``Metaspace``, each with the bytes of text each of its characters stands
        for (1 for a space made the replacement, 0 for a prepended replacement)."""
        if not text:
            return []
        rep = self.replacement
        chars = [rep if c == " " else c for c in text]
        cost = [len(c.encode("utf-8", "surrogateescape")) for c in text]
        prepend = self.prepend == "always" or (self.prepend == "first" and at_start)
        if prepend and chars[0] != rep:
            chars, cost = [rep, *chars], [0, *cost]
        cuts = [0]
        if self.split:  # MergedWithNext: each replacement starts a word
            cuts += [i for i in range(1, len(chars)) if chars[i] == rep]
        cuts.append(len(chars))
        return [("".join(chars[a:b]), cost[a:b]) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]

    def encode_section(self, text: str, at_start: bool) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        nbytes: list[int] = []
        for word, cost in self.metaspace(text, at_start):
            pieces = self._cache.get(word)
            if pieces is None:
                pieces = self._cache[word] = [
                    (len(p), self.id_of.get(p, self.unk_id)) for p in self.viterbi(word)
                ]
            at = 0
            for n, i in pieces:
                ids.append(i)
                nbytes.append(sum(cost[at : at + n]))
                at += n
        return ids, nbytes

    def viterbi(self, word: str) -> list[str]:
        """HF's ``Unigram::encode_optimized``: the best path over the pieces, an unknown character
        an ``unk`` edge (score ``min - 10``) where no one-character piece starts, first best kept,
        consecutive unknowns fused into one string."""
        n = len(word)
        best = [(0.0, -1, -1)] * (n + 1)  # (score, start, id) of the best path ending here
        reached = [False] * (n + 1)
        reached[0] = True
        for start in range(n):
            here = best[start][0]
            single = False
            for end in range(start + 1, min(n, start + self.max_chars) + 1):
                i = self.id_of.get(word[start:end])
                if i is None:
                    continue
                score = here + self.scores[i]
                if not reached[end] or score > best[end][0]:
                    best[end], reached[end] = (score, start, i), True
                single = single or end == start + 1
            if not single:
                if self.unk_id is None:
                    raise ValueError(
                        f"{word[start]!r} is not in the vocabulary and the Unigram has no unk_id"
                    )
                score = here + self.unk_score
                if not reached[start + 1] or score > best[start + 1][0]:
                    best[start + 1], reached[start + 1] = (score, start, self.unk_id), True
        out: list[str] = []
        unknown: list[str] = []
        end = n
        while end > 0:
            _, start, i = best[end]
            if i == self.unk_id:
                unknown.append(word[start:end])
            else:
                if unknown:
                    out.append("".join(reversed(unknown)))
                    unknown = []
                out.append(word[start:end])
            end = start
        if unknown:
            out.append("".join(reversed(unknown)))
        return out[::-1]

    def model_token_bytes(self, token_id: int) -> bytes:
        if token_id == self.unk_id:
            return b""
        return super().model_token_bytes(token_id).replace(self.replacement.encode(), b" ")


class ByteLevelBPE(HFPipeline):
    """bytelm's BPE (the inner ``bpe``, its ids mapped to the source's by ``to_source``) behind HF's
    added tokens and, with ``prefix``, ``ByteLevel(add_prefix_space=true)``: a space before each piece
    that does not start with one (lossy). Without either the import is the inner BPE itself."""

    kind = "bpe"
    encoder = "ranks"

    def __init__(
        self, bpe: Tokenizer, to_source: list[int], doc: dict, *, prefix: bool, added: AddedTokens | None
    ) -> None:
        strings = [""] * (max(to_source) + 1)
        for inner, src in enumerate(to_source):
            strings[src] = bpe.token_bytes(inner).decode("utf-8", "surrogateescape")
        super().__init__(strings, doc, unk_id=None, added=added)
        self.bpe, self.to_source, self.prefix = bpe, np.asarray(to_source, np.int64), prefix
        self.pattern = bpe.pattern
        self.lossy = (
            "pre_tokenizer ByteLevel add_prefix_space=true prepends a space: 'a' and ' a' share one encoding"
            if prefix
            else None
        )
        self.check_added_tokens()

    def _piece(self, text: str) -> str:
        return " " + text if self.prefix and not text.startswith(" ") else text

    def encode_section(self, text: str, at_start: bool) -> tuple[list[int], list[int]]:
        if not text:
            return [], []
        ids = self.to_source[self.bpe.encode_ordinary(self._piece(text))].tolist()
        nbytes = [len(self.strings[i].encode("utf-8", "surrogateescape")) for i in ids]
        if not text.startswith(" ") and self.prefix:  # the prepended space stands for no byte of the text
            nbytes[0] -= 1
        return ids, nbytes

    def encode_documents(self, documents: Iterable, *, num_workers: int | None = None, dtype=np.int32):
        """The inner BPE's fast path on the pieces between added tokens, the added ids put back."""
        texts = [as_text(d) for d in documents]
        layout = [self.added.split(t) if self.added else [(None, 0, len(t))] * bool(t) for t in texts]
        pieces = [
            self._piece(t[a:b]) for t, parts in zip(texts, layout) for tid, a, b in parts if tid is None
        ]
        ids, counts = self.bpe.encode_documents(pieces, num_workers=num_workers, dtype=np.int64)
        ids = self.to_source[ids]
        ends = np.cumsum(counts)
        out: list[np.ndarray] = []
        doc_counts = np.zeros(len(texts), np.int64)
        k = 0
        for j, parts in enumerate(layout):
            for tid, _, _ in parts:
                if tid is None:
                    part = ids[ends[k] - counts[k] : ends[k]]
                    k += 1
                else:
                    part = np.array([tid], np.int64)
                out.append(part)
                doc_counts[j] += len(part)
        flat = np.concatenate(out) if out else np.zeros(0, np.int64)
        return flat.astype(dtype), doc_counts


# -- reading tokenizer.json ------------------------------------------------------------------------
def _strings_of(vocab: dict[str, int]) -> list[str]:
    strings = [""] * (max(vocab.values(), default=-1) + 1)
    for s, i in vocab.items():
        strings[i] = s
    return strings


def read_tokenizer_json(path: str | Path) -> dict | None:
    """The parsed file when it is a ``tokenizer.json``; ``None`` when it is not JSON (a tiktoken
    rank file); :class:`UserError` for broken JSON or a JSON that is no tokenizer.json."""
    path = Path(path)
    try:
        head = path.read_bytes()[:64].lstrip()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not head.startswith(b"{"):
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(
            f"{path} is not valid JSON ({e}); give an HF tokenizer.json or a tiktoken rank file"
        ) from None
    model = doc.get("model") if isinstance(doc, dict) else None
    kind = model.get("type") if isinstance(model, dict) else None
    if kind not in HF_MODELS:
        raise UserError(
            f"{path}: model.type = {kind!r}, not one of {list(HF_MODELS)}: give a tokenizer.json of a BPE, "
            "WordPiece or Unigram model (Tokenizer.save) or a tiktoken rank file"
        )
    return doc


def _refuse(path, key: str, value, why: str) -> UserError:
    shown = json.dumps(value, ensure_ascii=False)
    if len(shown) > 120:
        shown = shown[:100] + f"... ({len(shown)} characters)"
    return UserError(f"{path}: {key} = {shown} {why}")


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_shape(path, doc: dict) -> None:
    """The type and size of every key the importer reads: one refusal naming the first bad one."""
    for key in ("normalizer", "pre_tokenizer", "post_processor"):
        part = doc.get(key)
        if part is not None and not isinstance(part, dict):
            raise _refuse(path, key, part, "is not an object (or null)")
        if part is not None and not isinstance(part.get("type"), str):
            raise _refuse(path, f"{key}.type", part.get("type"), "is missing or not a string")
    if doc.get("added_tokens") is not None and not isinstance(doc["added_tokens"], list):
        raise _refuse(path, "added_tokens", doc["added_tokens"], "is not a list of added tokens (or null)")
    model = doc["model"]
    vocab = model.get("vocab")
    if model["type"] == "Unigram":
        if not isinstance(vocab, list) or not vocab:
            raise _refuse(path, "model.vocab", vocab, "is not a non-empty list of [piece, score] pairs")
        for k, row in enumerate(vocab):
            if not (
                isinstance(row, list)
                and len(row) == 2
                and isinstance(row[0], str)
                and isinstance(row[1], (int, float))
                and not isinstance(row[1], bool)
                and math.isfinite(row[1])
            ):
                raise _refuse(
                    path, f"model.vocab[{k}]", row, "is not a [piece, score] pair (a string, a number)"
                )
        unk = model.get("unk_id")
        if unk is not None and not (_is_id(unk) and unk < len(vocab)):
            raise _refuse(
                path, "model.unk_id", unk, f"is not null or an index into model.vocab (0..{len(vocab) - 1})"
            )
        return
    if not isinstance(vocab, dict) or not vocab:
        raise _refuse(path, "model.vocab", vocab, "is not a non-empty object of {token: id}")
    owner: dict[int, str] = {}
    for token, i in vocab.items():
        key = f"model.vocab[{json.dumps(token, ensure_ascii=False)}]"
        if not _is_id(i):
            raise _refuse(path, key, i, "is not a non-negative integer id")
        if i in owner:
            raise _refuse(path, key, i, f"is also the id of {owner[i]!r}: two tokens cannot share an id")
        owner[i] = token
    if model["type"] == "BPE":
        merges = model.get("merges")
        if not isinstance(merges, list):
            raise _refuse(path, "model.merges", merges, "is not a list of merges")
        for k, m in enumerate(merges):
            pair = m.split(" ") if isinstance(m, str) else m
            if not (
                isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) and x for x in pair)
            ):
                raise _refuse(
                    path,
                    f"model.merges[{k}]",
                    m,
                    'is not a merge of two tokens ("left right" or [left, right])',
                )
    else:
        if not isinstance(model.get("unk_token"), str):
            raise _refuse(path, "model.unk_token", model.get("unk_token"), "is not a string")
        limit = model.get("max_input_chars_per_word")
        if not (_is_id(limit) and limit >= 1):
            raise _refuse(path, "model.max_input_chars_per_word", limit, "is not an integer >= 1")


def _check_common(path, doc: dict) -> None:
    norm = doc.get("normalizer")
    if norm is not None:
        t = norm.get("type")
        if t == "BertNormalizer":
            for opt in ("clean_text", "handle_chinese_chars", "strip_accents", "lowercase"):
                if norm.get(opt):
                    raise _refuse(
                        path,
                        f"normalizer.{opt}",
                        norm.get(opt),
                        "changes the text before the model sees it (not reproduced here); save the "
                        "tokenizer with that option false, or normalise the corpus yourself",
                    )
        elif not (t == "Sequence" and not norm.get("normalizers")):
            raise _refuse(
                path,
                "normalizer.type",
                t,
                "changes the text before the model sees it (not reproduced here); save the tokenizer with "
                '"normalizer": null, or normalise the corpus yourself',
            )
    post = doc.get("post_processor")
    posts = post.get("processors", []) if post and post.get("type") == "Sequence" else [post]
    for p in posts:
        t = None if p is None else p.get("type")
        if t not in _IGNORED_POST:
            raise _refuse(
                path,
                "post_processor.type",
                t,
                f"is not supported (known: {sorted(str(t) for t in _IGNORED_POST if t)})",
            )
    if doc.get("truncation") is not None:
        raise _refuse(path, "truncation", doc["truncation"], 'cuts encodings; save with "truncation": null')


def _pre_type(path, doc: dict, allowed: str, model: str) -> dict:
    pre = doc.get("pre_tokenizer")
    t = None if pre is None else pre.get("type")
    if t != allowed:
        raise _refuse(
            path,
            "pre_tokenizer.type",
            t,
            f"is not supported with a {model} model (only {allowed}, as HF's trainers pair them); train with "
            f"pre_tokenizers.{allowed}()",
        )
    return pre  # type: ignore[return-value]


_BPE_OPTIONS = (
    ("dropout", (None,)),
    ("continuing_subword_prefix", (None, "")),
    ("end_of_word_suffix", (None, "")),
    ("byte_fallback", (False, None)),
    ("ignore_merges", (False, None)),
)


def _bpe_merges(path, model: dict) -> tuple[list[tuple[int, int]], list[int]]:
    """``(merges in inner ids, source id of each inner id)`` of a BPE model over GPT-2's byte
    characters: inner id ``b`` is byte ``b``, each merge that makes a new token the next inner id (a
    merge that re-makes a token an earlier one made adds none, as in bytelm's BPE)."""
    for key, ok in _BPE_OPTIONS:
        if model.get(key) not in ok:
            raise _refuse(path, f"model.{key}", model.get(key), f"is not supported (only {ok[0]!r})")
    vocab: dict[str, int] = model["vocab"]
    to_source = []
    for b in range(256):
        if BYTE_TO_CHAR[b] not in vocab:
            raise UserError(
                f"{path}: model.vocab has no token for byte {b:#04x} ({BYTE_TO_CHAR[b]!r}); HF drops such "
                "bytes from the ids. Train with "
                "BpeTrainer(initial_alphabet=pre_tokenizers.ByteLevel.alphabet())"
            )
        to_source.append(vocab[BYTE_TO_CHAR[b]])
    inner_of = {BYTE_TO_CHAR[b]: b for b in range(256)}
    merges = []
    for k, m in enumerate(model["merges"]):
        left, right = m.split(" ") if isinstance(m, str) else m
        made = left + right
        if left not in inner_of or right not in inner_of or made not in vocab:
            raise _refuse(path, f"model.merges[{k}]", m, "joins tokens that are not in model.vocab")
        merges.append((inner_of[left], inner_of[right]))
        if made not in inner_of:
            inner_of[made] = len(to_source)
            to_source.append(vocab[made])
    return merges, to_source


def _import_bpe(path, doc: dict, added: AddedTokens | None) -> tuple[object, list[int]]:
    pre = _pre_type(path, doc, "ByteLevel", "BPE")
    merges, to_source = _bpe_merges(path, doc["model"])
    pattern = GPT2_PATTERN if pre.get("use_regex", True) else _ONE_CHUNK
    return _bpe_result(
        Tokenizer(merges, pattern=pattern), to_source, doc, added, pre.get("add_prefix_space", True)
    )


def _bpe_result(bpe: Tokenizer, to_source: list[int], doc: dict, added, prefix) -> tuple[object, list[int]]:
    """The inner BPE with its id map, or, with added tokens or a prefix space, the HF pipeline around it."""
    if prefix or added is not None:
        pipeline = ByteLevelBPE(bpe, to_source, doc, prefix=bool(prefix), added=added)
        return pipeline, list(range(pipeline.n_vocab))
    return bpe, to_source


# -- bytelm's own files ----------------------------------------------------------------------------
_BYTELM_SEQUENCE = (
    'a Sequence pre-tokenizer is read as bytelm writes it: Split on a Regex (behavior "Isolated"), for '
    'WordPiece a Split on "#", then ByteLevel (add_prefix_space and use_regex false; none for a '
    "character-level WordPiece)"
)
_BYTE_LEVEL_STEP = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
_HASH_STEP = {"type": "Split", "pattern": {"String": "#"}, "behavior": "Isolated", "invert": False}


def _bytelm_form(path, pre: dict | None) -> tuple[str, bool, bool] | None:
    """``(regex, a "#" split, ByteLevel)`` when ``pre`` is the ``Sequence`` bytelm writes (module
    docstring); ``None`` when it is no ``Sequence``; a refusal naming the step otherwise."""
    if pre is None or pre.get("type") != "Sequence":
        return None
    steps = pre.get("pretokenizers")
    if not isinstance(steps, list) or not steps or not all(isinstance(x, dict) for x in steps):
        raise _refuse(path, "pre_tokenizer.pretokenizers", steps, f"is not supported: {_BYTELM_SEQUENCE}")
    first = steps[0]
    regex_source = first.get("pattern", {}).get("Regex") if isinstance(first.get("pattern"), dict) else None
    if not (
        first.get("type") == "Split"
        and isinstance(regex_source, str)
        and first.get("behavior") == "Isolated"
        and not first.get("invert")
    ):
        raise _refuse(path, "pre_tokenizer.pretokenizers[0]", first, f"is not supported: {_BYTELM_SEQUENCE}")
    hash_split = byte_level = False
    for k, step in enumerate(steps[1:], 1):
        if k == 1 and step == _HASH_STEP:
            hash_split = True
        elif k == len(steps) - 1 and {key: step.get(key) for key in _BYTE_LEVEL_STEP} == _BYTE_LEVEL_STEP:
            byte_level = True
        else:
            raise _refuse(
                path, f"pre_tokenizer.pretokenizers[{k}]", step, f"is not supported: {_BYTELM_SEQUENCE}"
            )
    try:
        regex.compile(regex_source)
    except regex.error as e:
        raise _refuse(
            path, "pre_tokenizer.pretokenizers[0].pattern.Regex", regex_source, f"does not compile ({e})"
        ) from None
    return regex_source, hash_split, byte_level


class LongestMatchTokenizer(SubwordTokenizer):
    """Greedy longest match over a byte vocabulary whose first 256 pieces are the bytes: what a
    ``tokenizer.json`` bytelm wrote for ``encoder = "longest"`` holds (HF's ``WordPiece`` without a
    prefix; the merges or scores that chose the vocabulary are not in the file and not needed)."""

    kind = "longest"
    encoders = ("longest",)

    def __init__(self, vocab: list[bytes], *, pattern: str, special_tokens=(), added_tokens=()) -> None:
        id_of: dict[bytes, int] = {}
        for i, piece in enumerate(vocab):
            id_of.setdefault(piece, i)
        self._init_vocab(
            list(vocab),
            id_of,
            pattern=pattern,
            special_tokens=special_tokens,
            added_tokens=added_tokens,
            encoder="longest",
        )

    def _fingerprint_payload(self) -> dict:
        return {
            "kind": self.kind,
            "pattern": self.pattern,
            "vocab": [p.hex() for p in self.vocab],
            "special_tokens": self.special_tokens,
            "added_tokens": self.added_tokens,
        }

    def encode_documents(self, documents: Iterable, *, num_workers: int | None = None, dtype=np.int32):
        return self._reference_documents(documents, dtype)


def _id_strings(path, vocab: dict[str, int]) -> list[str]:
    """The token string of each id ``0 .. n - 1`` (bytelm's vocabularies have no gap)."""
    strings = _strings_of(vocab)
    if len(strings) != len(vocab):
        gap = next(i for i, s in enumerate(strings) if i not in set(vocab.values()))
        raise _refuse(
            path, "model.vocab", f"<{len(vocab)} ids>", f"has no token with id {gap}; ids must be 0..n-1"
        )
    return strings


def _byte_pieces(path, strings: list[str]) -> list[bytes]:
    """Each string in GPT-2's byte characters as bytes; the first 256 must be the bytes in order."""
    pieces = []
    for i, s in enumerate(strings):
        try:
            pieces.append(chars_to_bytes(s))
        except KeyError:
            raise _refuse(
                path,
                f"model.vocab[{i}]",
                s,
                "is not in GPT-2's byte characters (as a ByteLevel vocabulary is)",
            ) from None
    if pieces[:256] != [bytes([b]) for b in range(256)]:
        raise _refuse(
            path,
            "model.vocab",
            f"<{len(pieces)} pieces>",
            "does not start with the 256 bytes in order, as bytelm's does",
        )
    return pieces


def _import_bytelm_form(path, doc: dict, added: AddedTokens | None, form) -> tuple[object, list[int]]:
    """bytelm's own class for a file in its ``Sequence`` form (module docstring), ids checked."""
    pattern, hash_split, byte_level = form
    model = doc["model"]
    kind = model["type"]
    wordpiece = kind == "WordPiece" and model.get("continuing_subword_prefix") == "##"
    if hash_split != wordpiece or not (byte_level or wordpiece):
        steps = "Split, Split '#' and (byte level) ByteLevel" if wordpiece else "Split then ByteLevel"
        raise _refuse(
            path,
            "pre_tokenizer.pretokenizers",
            [step.get("type") for step in doc["pre_tokenizer"]["pretokenizers"]],
            f"does not go with a {kind} model (bytelm writes {steps} for it)",
        )
    entries = doc.get("added_tokens") or []
    specials = [t["content"] for t in entries if t.get("special")]
    plain = [t["content"] for t in entries if not t.get("special")]
    if kind == "BPE":
        merges, to_source = _bpe_merges(path, model)
        if to_source == list(range(len(to_source))):
            bpe = Tokenizer(merges, pattern=pattern, special_tokens=specials, added_tokens=plain)
            if {**bpe.special_tokens, **bpe.added_tokens} == (added.id_of if added else {}):
                return bpe, list(range(bpe.n_vocab))
        return _bpe_result(Tokenizer(merges, pattern=pattern), to_source, doc, added, False)
    tok: SubwordTokenizer
    try:
        if kind == "Unigram":
            if model.get("unk_id") is not None:
                raise _refuse(
                    path, "model.unk_id", model["unk_id"], "is not null (bytelm's Unigram has none)"
                )
            pieces = _byte_pieces(path, [str(p) for p, _ in model["vocab"]])
            scores = [float(sc) for _, sc in model["vocab"]]
            tok = UnigramTokenizer(
                pieces[256:], scores, pattern=pattern, special_tokens=specials, added_tokens=plain
            )
            strings = [bytes_to_chars(p) for p in tok.vocab]
            written = [str(p) for p, _ in model["vocab"]]
        else:
            written = _id_strings(path, model["vocab"])
            limit = model["max_input_chars_per_word"]
            if not wordpiece:
                if model.get("continuing_subword_prefix") not in ("", None):
                    raise _refuse(
                        path,
                        "model.continuing_subword_prefix",
                        model.get("continuing_subword_prefix"),
                        'is not "##" (WordPiece) or "" (longest match)',
                    )
                if limit < _NO_WORD_LIMIT:  # (HF would turn longer words into its unk_token)
                    raise _refuse(
                        path,
                        "model.max_input_chars_per_word",
                        limit,
                        "turns longer words into the unknown token; bytelm's longest match writes "
                        f"{_NO_WORD_LIMIT}",
                    )
                tok = LongestMatchTokenizer(
                    _byte_pieces(path, written), pattern=pattern, special_tokens=specials, added_tokens=plain
                )
                strings = [bytes_to_chars(p) for p in tok.vocab]
            else:
                level = "byte" if byte_level else "char"
                if byte_level and limit < _NO_WORD_LIMIT:
                    raise _refuse(
                        path,
                        "model.max_input_chars_per_word",
                        limit,
                        "turns longer words into the unknown token; a byte-level WordPiece has none "
                        f"({_NO_WORD_LIMIT})",
                    )
                probe = WordPieceTokenizer([], level=level)
                first = 512 if byte_level else 1
                tok = WordPieceTokenizer(
                    [probe._piece_of_string(x) for x in written[first:]],
                    level=level,
                    max_input_chars_per_word=None if byte_level else limit,
                    pattern=pattern,
                    special_tokens=specials,
                    added_tokens=plain,
                )
                strings = [tok.token_string(i) for i in range(tok.n_mergeable)]
    except UserError as e:
        if str(e).startswith(str(path)):
            raise
        raise UserError(f"{path}: model.vocab: {e}") from None
    if strings != written:
        at = next(
            (i for i, (a, b) in enumerate(zip(strings, written)) if a != b), min(len(strings), len(written))
        )
        raise _refuse(
            path,
            f"model.vocab (id {at})",
            written[at] if at < len(written) else None,
            f"is not where bytelm's {tok.kind} puts it ({strings[at] if at < len(strings) else None!r}): "
            "the ids would differ from the file's",
        )
    if {**tok.special_tokens, **tok.added_tokens} != (added.id_of if added else {}):
        raise _refuse(
            path,
            "added_tokens",
            [t["content"] for t in entries],
            "do not have the ids bytelm gives them (special tokens after the model's, then added ones)",
        )
    return tok, list(range(tok.n_vocab))


def _import_wordpiece(path, doc: dict, added: AddedTokens | None) -> BertWordPiece:
    model = doc["model"]
    if model.get("continuing_subword_prefix") != "##":
        raise _refuse(
            path, "model.continuing_subword_prefix", model.get("continuing_subword_prefix"), 'is not "##"'
        )
    _pre_type(path, doc, "BertPreTokenizer", "WordPiece")
    if model.get("unk_token") not in model["vocab"]:
        raise _refuse(path, "model.unk_token", model.get("unk_token"), "is not in model.vocab")
    max_chars = int(model["max_input_chars_per_word"])
    return BertWordPiece(model["vocab"], model["unk_token"], max_chars, doc, added)


def _import_unigram(path, doc: dict, added: AddedTokens | None) -> MetaspaceUnigram:
    model = doc["model"]
    if model.get("byte_fallback"):
        raise _refuse(path, "model.byte_fallback", True, "is not supported (only false)")
    pre = _pre_type(path, doc, "Metaspace", "Unigram")
    if pre.get("prepend_scheme", "always") not in ("always", "first", "never"):
        raise _refuse(
            path, "pre_tokenizer.prepend_scheme", pre.get("prepend_scheme"), "is not always/first/never"
        )
    meta = {
        "replacement": pre.get("replacement", "\u2581"),
        "prepend_scheme": pre.get("prepend_scheme", "always"),
        "split": pre.get("split", True),
    }
    pieces = [(str(p), float(s)) for p, s in model["vocab"]]
    return MetaspaceUnigram(pieces, model.get("unk_id"), meta, doc, added)


def inner_from_tokenizer_json(path: str | Path) -> tuple[object, list[int]]:
    """``(inner tokenizer, source id of each inner id)`` for a ``tokenizer.json`` (module docstring)."""
    doc = read_tokenizer_json(path)
    if doc is None:
        raise UserError(f"{path} is not a tokenizer.json (it does not start with '{{')")
    _check_shape(path, doc)
    _check_common(path, doc)
    relevant = {k: doc.get(k) for k in ("normalizer", "pre_tokenizer", "model", "added_tokens")}
    added = _added_tokens(path, doc)
    try:
        kind = doc["model"]["type"]
        form = _bytelm_form(path, doc.get("pre_tokenizer"))
        if form is not None:
            return _import_bytelm_form(path, relevant, added, form)
        if kind == "BPE":
            return _import_bpe(path, relevant, added)
        importer = _import_wordpiece if kind == "WordPiece" else _import_unigram
        inner = importer(path, relevant, added)
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UserError(f"{path}: a malformed tokenizer.json ({type(e).__name__}: {e})") from None
    return inner, list(range(inner.n_vocab))
