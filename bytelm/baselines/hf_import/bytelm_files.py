"""Importing the ``tokenizer.json`` files bytelm writes (``bytelm tokenizer train``) as the bytelm
class they came from, with the file's ids.

bytelm writes its pre-tokenizer as a ``Sequence``: ``Split`` on its pattern (``Isolated``); for its
WordPiece a ``Split`` on ``"#"``; then ``ByteLevel`` without prefix space or regex, absent for a
character-level WordPiece (:func:`bytelm_form` reads it). ``BPE`` is rebuilt as bytelm's BPE (merges
that re-make a token included), ``Unigram`` as bytelm's Unigram, ``WordPiece`` with ``"##"`` as
bytelm's WordPiece and without a prefix (greedy longest match, ``encoder = "longest"``) as
:class:`LongestMatchTokenizer`. The vocabulary must be laid out as bytelm lays it out (checked id by
id), so the ids are the original's (:func:`import_bytelm_form`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import regex

from bytelm.baselines.bpe.bytelevel import bytes_to_chars, chars_to_bytes
from bytelm.baselines.bpe.tokenizer import Tokenizer
from bytelm.baselines.hf_import.added import AddedTokens
from bytelm.baselines.hf_import.hf_models import bpe_merges, bpe_result
from bytelm.baselines.hf_import.reading import refuse, strings_of
from bytelm.baselines.subword import SubwordTokenizer
from bytelm.baselines.unigram.tokenizer import UnigramTokenizer
from bytelm.baselines.wordpiece.tokenizer import WordPieceTokenizer
from bytelm.errors import UserError

_NO_WORD_LIMIT = 1 << 30  # max_input_chars_per_word bytelm writes where words have no length limit
_BYTELM_SEQUENCE = (
    'a Sequence pre-tokenizer is read as bytelm writes it: Split on a Regex (behavior "Isolated"), for '
    'WordPiece a Split on "#", then ByteLevel (add_prefix_space and use_regex false; none for a '
    "character-level WordPiece)"
)
_BYTE_LEVEL_STEP = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
_HASH_STEP = {"type": "Split", "pattern": {"String": "#"}, "behavior": "Isolated", "invert": False}


def bytelm_form(path, pre: dict | None) -> tuple[str, bool, bool] | None:
    """``(regex, a "#" split, ByteLevel)`` when ``pre`` is the ``Sequence`` bytelm writes (module
    docstring); ``None`` when it is no ``Sequence``; a refusal naming the step otherwise."""
    if pre is None or pre.get("type") != "Sequence":
        return None
    steps = pre.get("pretokenizers")
    if not isinstance(steps, list) or not steps or not all(isinstance(x, dict) for x in steps):
        raise refuse(path, "pre_tokenizer.pretokenizers", steps, f"is not supported: {_BYTELM_SEQUENCE}")
    first = steps[0]
    regex_source = first.get("pattern", {}).get("Regex") if isinstance(first.get("pattern"), dict) else None
    if not (
        first.get("type") == "Split"
        and isinstance(regex_source, str)
        and first.get("behavior") == "Isolated"
        and not first.get("invert")
    ):
        raise refuse(path, "pre_tokenizer.pretokenizers[0]", first, f"is not supported: {_BYTELM_SEQUENCE}")
    hash_split = byte_level = False
    for k, step in enumerate(steps[1:], 1):
        if k == 1 and step == _HASH_STEP:
            hash_split = True
        elif k == len(steps) - 1 and {key: step.get(key) for key in _BYTE_LEVEL_STEP} == _BYTE_LEVEL_STEP:
            byte_level = True
        else:
            raise refuse(
                path, f"pre_tokenizer.pretokenizers[{k}]", step, f"is not supported: {_BYTELM_SEQUENCE}"
            )
    try:
        regex.compile(regex_source)
    except regex.error as e:
        raise refuse(
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
    strings = strings_of(vocab)
    if len(strings) != len(vocab):
        gap = next(i for i, s in enumerate(strings) if i not in set(vocab.values()))
        raise refuse(
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
            raise refuse(
                path,
                f"model.vocab[{i}]",
                s,
                "is not in GPT-2's byte characters (as a ByteLevel vocabulary is)",
            ) from None
    if pieces[:256] != [bytes([b]) for b in range(256)]:
        raise refuse(
            path,
            "model.vocab",
            f"<{len(pieces)} pieces>",
            "does not start with the 256 bytes in order, as bytelm's does",
        )
    return pieces


def import_bytelm_form(path, doc: dict, added: AddedTokens | None, form) -> tuple[object, list[int]]:
    """bytelm's own class for a file in its ``Sequence`` form (module docstring), ids checked."""
    pattern, hash_split, byte_level = form
    model = doc["model"]
    kind = model["type"]
    wordpiece = kind == "WordPiece" and model.get("continuing_subword_prefix") == "##"
    if hash_split != wordpiece or not (byte_level or wordpiece):
        steps = "Split, Split '#' and (byte level) ByteLevel" if wordpiece else "Split then ByteLevel"
        raise refuse(
            path,
            "pre_tokenizer.pretokenizers",
            [step.get("type") for step in doc["pre_tokenizer"]["pretokenizers"]],
            f"does not go with a {kind} model (bytelm writes {steps} for it)",
        )
    entries = doc.get("added_tokens") or []
    specials = [t["content"] for t in entries if t.get("special")]
    plain = [t["content"] for t in entries if not t.get("special")]
    if kind == "BPE":
        merges, to_source = bpe_merges(path, model)
        if to_source == list(range(len(to_source))):
            bpe = Tokenizer(merges, pattern=pattern, special_tokens=specials, added_tokens=plain)
            if {**bpe.special_tokens, **bpe.added_tokens} == (added.id_of if added else {}):
                return bpe, list(range(bpe.n_vocab))
        return bpe_result(Tokenizer(merges, pattern=pattern), to_source, doc, added, False)
    tok: SubwordTokenizer
    try:
        if kind == "Unigram":
            if model.get("unk_id") is not None:
                raise refuse(path, "model.unk_id", model["unk_id"], "is not null (bytelm's Unigram has none)")
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
                    raise refuse(
                        path,
                        "model.continuing_subword_prefix",
                        model.get("continuing_subword_prefix"),
                        'is not "##" (WordPiece) or "" (longest match)',
                    )
                if limit < _NO_WORD_LIMIT:  # (HF would turn longer words into its unk_token)
                    raise refuse(
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
                    raise refuse(
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
        raise refuse(
            path,
            f"model.vocab (id {at})",
            written[at] if at < len(written) else None,
            f"is not where bytelm's {tok.kind} puts it ({strings[at] if at < len(strings) else None!r}): "
            "the ids would differ from the file's",
        )
    if {**tok.special_tokens, **tok.added_tokens} != (added.id_of if added else {}):
        raise refuse(
            path,
            "added_tokens",
            [t["content"] for t in entries],
            "do not have the ids bytelm gives them (special tokens after the model's, then added ones)",
        )
    return tok, list(range(tok.n_vocab))
