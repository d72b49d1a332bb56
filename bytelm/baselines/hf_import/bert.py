"""HF's ``BertPreTokenizer``, written here: whitespace removed, each punctuation character a word of
its own, by HF's own definitions of both (:data:`BERT_WHITESPACE`, :func:`is_bert_punct`)."""

from __future__ import annotations

import unicodedata

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
