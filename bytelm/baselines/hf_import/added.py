"""The ``added_tokens`` of a ``tokenizer.json``, applied as HF applies them.

The text is first cut at each occurrence of an added token's content, leftmost-longest, those with
``normalized = false`` first and then, in what is left, those with ``normalized = true`` (the
normalizer is an identity here); each occurrence is that token's id, and each piece between them
goes through the pre-tokenizer and the model by itself (so ``ByteLevel``'s prefix space is added to
every piece, and ``Metaspace``'s ``prepend_scheme = "first"`` prepends only to a piece at the start
of the text). ``single_word``, ``lstrip`` and ``rstrip`` (matching that depends on, or swallows, the
characters beside the token) are refused.
"""

from __future__ import annotations

import re

from bytelm.baselines.hf_import.reading import refuse


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


def read_added_tokens(path, doc: dict) -> AddedTokens | None:
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
            raise refuse(path, f"added_tokens[{k}]", t, "is not an added token (content, id, ...)")
        for flag in ("single_word", "lstrip", "rstrip"):
            if t.get(flag):
                raise refuse(
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
