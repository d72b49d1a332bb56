"""The imported tokenizers that bytelm's own classes do not hold whole: HF's pre-tokenizer (written
here) over the text, then a segmentation of each word, with the source's own ids and HF's added
tokens (:mod:`.added`): :class:`BertWordPiece`, :class:`MetaspaceUnigram`, and :class:`ByteLevelBPE`
(bytelm's BPE behind added tokens or a prefix space)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable
from typing import Literal

import numpy as np

from bytelm.baselines.bpe.tokenizer import Tokenizer
from bytelm.baselines.hf_import.added import AddedTokens
from bytelm.baselines.hf_import.bert import BERT_WHITESPACE, bert_words, is_bert_punct
from bytelm.baselines.hf_import.reading import strings_of
from bytelm.baselines.subword import as_text
from bytelm.baselines.wordpiece.tokenizer import WordPieceTokenizer


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
        to no token: see ``lossy``); added tokens first (:mod:`.added`)."""
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
        strings = strings_of(vocab)
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
