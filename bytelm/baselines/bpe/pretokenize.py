"""Regex pre-tokenization: split text into chunks that BPE merges never cross.

Two named patterns are provided, plus any custom pattern string (``regex`` module syntax):

- ``gpt2``: GPT-2's pattern. A leading space stays with the following word; a run of digits is
  one chunk (``" 12345"`` -> ``[" 12345"]``).
- ``cl100k``: the cl100k-style pattern. Digits in runs of 1-3 (``"12345"`` -> ``["123", "45"]``),
  case-insensitive contractions, a leading non-letter may join a word, newlines grouped.

Chunks always cover the whole text: where a custom pattern leaves a gap, the gap becomes a chunk
of its own (as in HF ``tokenizers``' ``Split(..., behavior="isolated")``), so no byte is ever
dropped. Bytes that are not valid UTF-8 are carried through with Python's ``surrogateescape``
error handler: each invalid byte becomes one lone surrogate (a "other" character for the
pattern) and turns back into the same byte when the chunk is encoded.

Speed: for the two named patterns, text without code points beyond U+FFFF (nearly all text) is
split by an equivalent pattern compiled with the standard library's ``re`` (about 1.5x faster
than ``regex`` on source code). The equivalent spells out ``\\p{L}``, ``\\p{N}``, ``\\s`` and
the case-insensitive letters as explicit code point ranges taken *from the regex module
itself*, so both engines see the same character classes; ``tests/test_bpe.py`` checks that
they split random text identically. Other text goes to ``regex``.
"""

from __future__ import annotations

import functools
import re
import sys
from array import array

import regex

from bytelm.errors import UserError

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CL100K_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

#: Named pre-tokenization patterns (``--pattern gpt2|cl100k``).
PATTERNS: dict[str, str] = {"gpt2": GPT2_PATTERN, "cl100k": CL100K_PATTERN}


def resolve_pattern(pattern: str) -> str:
    """The pattern string for a name in :data:`PATTERNS`, or ``pattern`` itself once it compiles.

    >>> resolve_pattern("gpt2") == GPT2_PATTERN
    True
    >>> resolve_pattern(r"\\w+|\\W+")
    '\\\\w+|\\\\W+'

    Raises :class:`~bytelm.errors.UserError` (a ``ValueError``) for an empty pattern or one that
    does not compile.
    """
    if not isinstance(pattern, str):
        raise UserError(
            f"pattern must be a string (a name in {sorted(PATTERNS)} or a regex), got {pattern!r}"
        )
    if pattern in PATTERNS:
        return PATTERNS[pattern]
    if not pattern:
        raise UserError(f"pattern is empty: give one of {sorted(PATTERNS)} or a regular expression")
    try:
        regex.compile(pattern)
    except regex.error as e:
        raise UserError(
            f"pattern {pattern!r} does not compile ({e}); give one of {sorted(PATTERNS)} or a valid "
            "regular expression in the syntax of the Python 'regex' module"
        ) from None
    return pattern


def pattern_name(pattern: str) -> str | None:
    """The name of a named pattern string (``"gpt2"``, ``"cl100k"``), else ``None``."""
    for name, pat in PATTERNS.items():
        if pat == pattern:
            return name
    return None


# -- the equivalent ``re`` patterns -------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _all_code_points() -> str:
    # decoded from one array of code points (surrogates included): a join of a million one-character
    # strings would hold them all at once (about 100 MB, three times slower)
    codec = "utf-32-le" if sys.byteorder == "little" else "utf-32-be"
    return array("I", range(0x110000)).tobytes().decode(codec, "surrogatepass")


@functools.lru_cache(maxsize=None)
def _ranges(class_regex: str, max_char: int) -> str:
    """The code points up to ``max_char`` matched by ``class_regex`` (one character, regex
    syntax), written as ``re`` class ranges."""
    out = []
    for m in regex.finditer(f"(?:{class_regex})+", _all_code_points()[: max_char + 1]):
        lo, hi = ord(m.group()[0]), ord(m.group()[-1])
        out.append(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}")
    return "".join(out)


def _re_equivalent(pattern: str, max_char: int) -> str | None:
    """An ``re`` pattern that splits text made of code points up to ``max_char`` exactly like
    the named ``pattern``, or ``None`` for a custom pattern.

    Classes are restricted to ``max_char`` because ``re`` tests a class holding code points
    beyond U+FFFF by scanning a list of ranges (slow); up to U+FFFF it uses a bitmap.
    """
    name = pattern_name(pattern)
    if name is None:
        return None
    L, N, S = (_ranges(c, max_char) for c in (r"\p{L}", r"\p{N}", r"\s"))

    def ci(word: str) -> str:  # one case-insensitive class per letter, as (?i:...) matches them
        return "".join(f"[{_ranges(f'(?i:{c})', max_char)}]" for c in word)

    contractions = ["s", "t", "re", "ve", "m", "ll", "d"]
    if name == "gpt2":
        return "|".join(
            [f"'{c}" for c in contractions]
            + [f" ?[{L}]+", f" ?[{N}]+", f" ?[^{S}{L}{N}]+", f"[{S}]+(?![^{S}])", f"[{S}]+"]
        )
    return "|".join(
        [f"'{ci(c)}" for c in contractions]
        + [
            f"[^\\r\\n{L}{N}]?[{L}]+",
            f"[{N}]{{1,3}}",
            f" ?[^{S}{L}{N}]+[\\r\\n]*",
            f"[{S}]*[\\r\\n]+",
            f"[{S}]+(?![^{S}])",
            f"[{S}]+",
        ]
    )


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


@functools.lru_cache(maxsize=16)
def _engines(pattern: str, fast: bool):
    """``(ascii findall, BMP findall, full findall, compiled full pattern)`` for ``pattern``."""
    full = regex.compile(pattern)
    ascii_re, bmp_re = _re_equivalent(pattern, 0x7F), _re_equivalent(pattern, 0xFFFF)
    if fast and ascii_re is not None and bmp_re is not None:
        return re.compile(ascii_re).findall, re.compile(bmp_re).findall, full.findall, full
    return full.findall, full.findall, full.findall, full


class PreTokenizer:
    """Splits text into chunks with a pre-tokenization pattern (a name or a regex string).

    >>> PreTokenizer("cl100k").split("Hello world 12345!!\\n")
    ['Hello', ' world', ' ', '123', '45', '!!\\n']
    >>> PreTokenizer("gpt2").split("Hello world 12345!!\\n")
    ['Hello', ' world', ' 12345', '!!', '\\n']
    >>> PreTokenizer(r"[a-z]+").split("ab, cd")     # gaps become chunks too
    ['ab', ', ', 'cd']
    """

    def __init__(self, pattern: str = "cl100k", *, fast: bool = True) -> None:
        self.pattern = resolve_pattern(pattern)
        self.name = pattern_name(self.pattern)
        self._ascii, self._bmp, self._findall, self._compiled = _engines(self.pattern, fast)
        # A named pattern matches every character with a non-empty match: findall alone is
        # exact. A custom pattern may leave gaps, match empty strings or have capture groups.
        self._findall_exact = self.name is not None

    def __repr__(self) -> str:
        return f"PreTokenizer({self.name or self.pattern!r})"

    def __getstate__(self):
        return {"pattern": self.pattern, "fast": self._ascii is not self._findall or self.name is None}

    def __setstate__(self, state):
        type(self).__init__(self, state["pattern"], fast=state.get("fast", True))

    def splitter_for(self, text: str):
        """A function splitting ``text`` (or any substring of it) into chunks: the fastest
        engine that is exact for the code points ``text`` holds."""
        if self._findall_exact:
            if text.isascii():
                return self._ascii
            if _ASTRAL.search(text) is None:
                return self._bmp
            return self._findall
        return self.split

    def split(self, text: str) -> list[str]:
        """The chunks of ``text``, in order; their concatenation is ``text``."""
        if self._findall_exact:
            if text.isascii():
                return self._ascii(text)
            if _ASTRAL.search(text) is None:
                return self._bmp(text)
            return self._findall(text)
        if self._compiled.groups == 0:
            chunks = self._findall(text)
            if sum(map(len, chunks)) == len(text) and "" not in chunks:
                return chunks
        out: list[str] = []
        pos = 0
        for m in self._compiled.finditer(text):
            start, end = m.span()
            if start > pos:
                out.append(text[pos:start])
            if end > start:
                out.append(text[start:end])
            pos = max(pos, end)
        if pos < len(text):
            out.append(text[pos:])
        return out

    def split_bytes(self, data: bytes) -> list[bytes]:
        """The chunks of arbitrary bytes (invalid UTF-8 included), as bytes."""
        text = data.decode("utf-8", "surrogateescape")
        return [c.encode("utf-8", "surrogateescape") for c in self.split(text)]
