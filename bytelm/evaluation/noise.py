"""BLT's five noises (Pagnoni et al. 2024, arXiv 2412.09871, section 6.1), on raw bytes.

The text is read as characters (UTF-8; an invalid byte is one character of its own and is kept
as it is, so the noised text is bytes again without loss), every character counts, spaces
included. The choices the paper leaves open, fixed here:

- ``antspeak``: the text uppercased, then a space after every character but the last
  (``"ab c" -> "A B   C"``: a space is a character too);
- ``drop``: every character removed with probability 0.1, independently;
- ``randomcase``: every character uppercased with probability 0.5, else lowercased;
- ``repeat``: every character, with probability 0.2, followed by 1, 2 or 3 more copies (uniform),
  so a character appears at most 4 times in all ("up to 4 times" counts the original);
- ``uppercase``: every character uppercased.

Case changes use Python's ``str.upper`` / ``str.lower`` (a character may change length: "ß" ->
"SS"); on a script without case they change nothing, which :func:`noise` reports through the
noised text being equal to the clean one. Random draws come from the ``numpy.random.Generator``
passed in, one uniform number per character (and one more per repeated character), so a seed
fixes every noised text.
"""

from __future__ import annotations

import numpy as np

NOISES = ("antspeak", "drop", "randomcase", "repeat", "uppercase")
DROP_RATE = 0.1
UPPER_RATE = 0.5
REPEAT_RATE = 0.2
MAX_COPIES = 4  # a repeated character appears at most this many times in all


def characters(data: bytes) -> list[str]:
    """``data`` as characters: UTF-8 decoded, an invalid byte one (surrogate-escaped) character."""
    return list(data.decode("utf-8", errors="surrogateescape"))


def encode(chars: list[str]) -> bytes:
    return "".join(chars).encode("utf-8", errors="surrogateescape")


def _upper(c: str) -> str:
    return c if "\udc80" <= c <= "\udcff" else c.upper()


def _lower(c: str) -> str:
    return c if "\udc80" <= c <= "\udcff" else c.lower()


def noise(kind: str, data: bytes, rng: np.random.Generator) -> bytes:
    """``data`` with the noise ``kind`` (one of :data:`NOISES`) applied; see the module docstring."""
    chars = characters(data)
    if kind == "uppercase":
        return encode([_upper(c) for c in chars])
    if kind == "antspeak":
        return encode([" ".join(_upper(c) for c in chars)])
    u = rng.random(len(chars))
    if kind == "drop":
        return encode([c for c, x in zip(chars, u) if x >= DROP_RATE])
    if kind == "randomcase":
        return encode([_upper(c) if x < UPPER_RATE else _lower(c) for c, x in zip(chars, u)])
    if kind == "repeat":
        out = []
        for c, x in zip(chars, u):
            out.append(c)
            if x < REPEAT_RATE:
                out += [c] * int(rng.integers(1, MAX_COPIES))
        return encode(out)
    raise ValueError(f"unknown noise {kind!r}; known: {', '.join(NOISES)}")
