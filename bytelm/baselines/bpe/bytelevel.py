"""GPT-2's byte <-> printable character bijection (only a way to store tokens as strings).

Bytes that print (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) stand for themselves; the other 68
bytes get ``U+0100``, ``U+0101``, ... in byte order (space 0x20 -> ``Ġ`` U+0120, newline 0x0A ->
``Ċ`` U+010A). HF ``tokenizers``' ``ByteLevel`` uses it in ``tokenizer.json``.

:data:`HF_BYTE_ORDER` is the order in which HF's BPE trainer numbers the 256 base tokens: it sorts
its initial alphabet by the code point of the printable character, i.e. the printable bytes in
byte order, then the remapped ones in byte order. The trainer breaks ties with this order (see
:mod:`bytelm.baselines.bpe.trainer`).

>>> BYTE_TO_CHAR[0x20], BYTE_TO_CHAR[0x0A], BYTE_TO_CHAR[ord("a")]
('Ġ', 'Ċ', 'a')
>>> HF_BYTE_ORDER[:3], HF_BYTE_ORDER[94], HF_BYTE_ORDER[188]
([33, 34, 35], 161, 0)
"""

from __future__ import annotations


def _printable_bytes() -> list[int]:
    return list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))


def _byte_to_char() -> list[str]:
    printable = set(_printable_bytes())
    out, n = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(0x100 + n))
            n += 1
    return out


#: ``BYTE_TO_CHAR[b]``: the printable character that stands for byte ``b``.
BYTE_TO_CHAR: list[str] = _byte_to_char()
#: The inverse of :data:`BYTE_TO_CHAR`.
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
#: The 256 byte values in the order of their printable characters' code points.
HF_BYTE_ORDER: list[int] = sorted(range(256), key=lambda b: ord(BYTE_TO_CHAR[b]))


def bytes_to_chars(data: bytes) -> str:
    """Token bytes as the printable string used in ``tokenizer.json``."""
    return "".join(BYTE_TO_CHAR[b] for b in data)


def chars_to_bytes(text: str) -> bytes:
    """The inverse of :func:`bytes_to_chars`; ``KeyError`` for a character outside the mapping."""
    return bytes(CHAR_TO_BYTE[c] for c in text)
