"""Reading a ``tokenizer.json`` and checking it before anything is built from it: its shape (every
key the importer reads, :func:`check_shape`), and what bytelm does not reproduce (a normalizer that
changes the text, a post-processor other than the ones ignored, ``truncation``:
:func:`check_common`). A refusal is one :class:`~bytelm.errors.UserError` naming the JSON key and its
value (:func:`refuse`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from bytelm.errors import UserError

HF_MODELS = ("BPE", "WordPiece", "Unigram")
SOURCE_KIND = "tokenizer.json"
_IGNORED_POST = {None, "TemplateProcessing", "BertProcessing", "RobertaProcessing", "ByteLevel"}


def strings_of(vocab: dict[str, int]) -> list[str]:
    """The token string of each id of ``{token: id}`` (``""`` for an id no token has)."""
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


def refuse(path, key: str, value, why: str) -> UserError:
    shown = json.dumps(value, ensure_ascii=False)
    if len(shown) > 120:
        shown = shown[:100] + f"... ({len(shown)} characters)"
    return UserError(f"{path}: {key} = {shown} {why}")


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_shape(path, doc: dict) -> None:
    """The type and size of every key the importer reads: one refusal naming the first bad one."""
    for key in ("normalizer", "pre_tokenizer", "post_processor"):
        part = doc.get(key)
        if part is not None and not isinstance(part, dict):
            raise refuse(path, key, part, "is not an object (or null)")
        if part is not None and not isinstance(part.get("type"), str):
            raise refuse(path, f"{key}.type", part.get("type"), "is missing or not a string")
    if doc.get("added_tokens") is not None and not isinstance(doc["added_tokens"], list):
        raise refuse(path, "added_tokens", doc["added_tokens"], "is not a list of added tokens (or null)")
    model = doc["model"]
    vocab = model.get("vocab")
    if model["type"] == "Unigram":
        if not isinstance(vocab, list) or not vocab:
            raise refuse(path, "model.vocab", vocab, "is not a non-empty list of [piece, score] pairs")
        for k, row in enumerate(vocab):
            if not (
                isinstance(row, list)
                and len(row) == 2
                and isinstance(row[0], str)
                and isinstance(row[1], (int, float))
                and not isinstance(row[1], bool)
                and math.isfinite(row[1])
            ):
                raise refuse(
                    path, f"model.vocab[{k}]", row, "is not a [piece, score] pair (a string, a number)"
                )
        unk = model.get("unk_id")
        if unk is not None and not (_is_id(unk) and unk < len(vocab)):
            raise refuse(
                path, "model.unk_id", unk, f"is not null or an index into model.vocab (0..{len(vocab) - 1})"
            )
        return
    if not isinstance(vocab, dict) or not vocab:
        raise refuse(path, "model.vocab", vocab, "is not a non-empty object of {token: id}")
    owner: dict[int, str] = {}
    for token, i in vocab.items():
        key = f"model.vocab[{json.dumps(token, ensure_ascii=False)}]"
        if not _is_id(i):
            raise refuse(path, key, i, "is not a non-negative integer id")
        if i in owner:
            raise refuse(path, key, i, f"is also the id of {owner[i]!r}: two tokens cannot share an id")
        owner[i] = token
    if model["type"] == "BPE":
        merges = model.get("merges")
        if not isinstance(merges, list):
            raise refuse(path, "model.merges", merges, "is not a list of merges")
        for k, m in enumerate(merges):
            pair = m.split(" ") if isinstance(m, str) else m
            if not (
                isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) and x for x in pair)
            ):
                raise refuse(
                    path,
                    f"model.merges[{k}]",
                    m,
                    'is not a merge of two tokens ("left right" or [left, right])',
                )
    else:
        if not isinstance(model.get("unk_token"), str):
            raise refuse(path, "model.unk_token", model.get("unk_token"), "is not a string")
        limit = model.get("max_input_chars_per_word")
        if not (_is_id(limit) and limit >= 1):
            raise refuse(path, "model.max_input_chars_per_word", limit, "is not an integer >= 1")


def check_common(path, doc: dict) -> None:
    norm = doc.get("normalizer")
    if norm is not None:
        t = norm.get("type")
        if t == "BertNormalizer":
            for opt in ("clean_text", "handle_chinese_chars", "strip_accents", "lowercase"):
                if norm.get(opt):
                    raise refuse(
                        path,
                        f"normalizer.{opt}",
                        norm.get(opt),
                        "changes the text before the model sees it (not reproduced here); save the "
                        "tokenizer with that option false, or normalise the corpus yourself",
                    )
        elif not (t == "Sequence" and not norm.get("normalizers")):
            raise refuse(
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
            raise refuse(
                path,
                "post_processor.type",
                t,
                f"is not supported (known: {sorted(str(t) for t in _IGNORED_POST if t)})",
            )
    if doc.get("truncation") is not None:
        raise refuse(path, "truncation", doc["truncation"], 'cuts encodings; save with "truncation": null')


def pre_type(path, doc: dict, allowed: str, model: str) -> dict:
    pre = doc.get("pre_tokenizer")
    t = None if pre is None else pre.get("type")
    if t != allowed:
        raise refuse(
            path,
            "pre_tokenizer.type",
            t,
            f"is not supported with a {model} model (only {allowed}, as HF's trainers pair them); train with "
            f"pre_tokenizers.{allowed}()",
        )
    return pre  # type: ignore[return-value]
