"""Two small pure helpers of byte-pair encoding, shared by the trainer and the encoder.

Training counts adjacent pairs (:func:`pair_counts`) and merges the most frequent; encoding
repeatedly merges the lowest-ranked pair (:func:`merge`). Ids are byte values (0-255) or tokens
made by earlier merges (docs/tokenizers.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def pair_counts(words: dict[tuple[int, ...], int]) -> Counter:
    """Sliding-window counts of adjacent pairs over ``{word: count}``.

    >>> a, b, c = 97, 98, 99
    >>> pair_counts({(a, b, a, b): 3, (a, b, a, c): 1})[(a, b)]
    7
    >>> pair_counts({(a, a, a): 1})[(a, a)]     # overlapping occurrences both count
    2
    """
    out: Counter = Counter()
    for word, n in words.items():
        for pair in zip(word, word[1:]):
            out[pair] += n
    return out


def merge(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every occurrence of ``pair`` in ``ids`` by ``new_id``, left to right.

    >>> merge([97, 97, 97], (97, 97), 256)        # 'aaa' -> [aa, a]
    [256, 97]
    >>> merge([1, 2, 3, 1, 2], (1, 2), 9)
    [9, 3, 9]
    """
    out: list[int] = []
    i = 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out
