"""Importing the files HF's trainers write: ``BPE`` + ``ByteLevel`` (bytelm's BPE over the merges,
alone or inside :class:`~.pipelines.ByteLevelBPE`), ``WordPiece`` + ``BertPreTokenizer``
(:class:`~.pipelines.BertWordPiece`) and ``Unigram`` + ``Metaspace``
(:class:`~.pipelines.MetaspaceUnigram`)."""

from __future__ import annotations

from bytelm.baselines.bpe.bytelevel import BYTE_TO_CHAR
from bytelm.baselines.bpe.pretokenize import GPT2_PATTERN
from bytelm.baselines.bpe.tokenizer import Tokenizer
from bytelm.baselines.hf_import.added import AddedTokens
from bytelm.baselines.hf_import.pipelines import BertWordPiece, ByteLevelBPE, MetaspaceUnigram
from bytelm.baselines.hf_import.reading import pre_type, refuse
from bytelm.errors import UserError

_ONE_CHUNK = r"(?s).+"  # ByteLevel(use_regex=false): the whole text is one chunk


_BPE_OPTIONS = (
    ("dropout", (None,)),
    ("continuing_subword_prefix", (None, "")),
    ("end_of_word_suffix", (None, "")),
    ("byte_fallback", (False, None)),
    ("ignore_merges", (False, None)),
)


def bpe_merges(path, model: dict) -> tuple[list[tuple[int, int]], list[int]]:
    """``(merges in inner ids, source id of each inner id)`` of a BPE model over GPT-2's byte
    characters: inner id ``b`` is byte ``b``, each merge that makes a new token the next inner id (a
    merge that re-makes a token an earlier one made adds none, as in bytelm's BPE)."""
    for key, ok in _BPE_OPTIONS:
        if model.get(key) not in ok:
            raise refuse(path, f"model.{key}", model.get(key), f"is not supported (only {ok[0]!r})")
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
            raise refuse(path, f"model.merges[{k}]", m, "joins tokens that are not in model.vocab")
        merges.append((inner_of[left], inner_of[right]))
        if made not in inner_of:
            inner_of[made] = len(to_source)
            to_source.append(vocab[made])
    return merges, to_source


def import_bpe(path, doc: dict, added: AddedTokens | None) -> tuple[object, list[int]]:
    pre = pre_type(path, doc, "ByteLevel", "BPE")
    merges, to_source = bpe_merges(path, doc["model"])
    pattern = GPT2_PATTERN if pre.get("use_regex", True) else _ONE_CHUNK
    return bpe_result(
        Tokenizer(merges, pattern=pattern), to_source, doc, added, pre.get("add_prefix_space", True)
    )


def bpe_result(bpe: Tokenizer, to_source: list[int], doc: dict, added, prefix) -> tuple[object, list[int]]:
    """The inner BPE with its id map, or, with added tokens or a prefix space, the HF pipeline around it."""
    if prefix or added is not None:
        pipeline = ByteLevelBPE(bpe, to_source, doc, prefix=bool(prefix), added=added)
        return pipeline, list(range(pipeline.n_vocab))
    return bpe, to_source


def import_wordpiece(path, doc: dict, added: AddedTokens | None) -> BertWordPiece:
    model = doc["model"]
    if model.get("continuing_subword_prefix") != "##":
        raise refuse(
            path, "model.continuing_subword_prefix", model.get("continuing_subword_prefix"), 'is not "##"'
        )
    pre_type(path, doc, "BertPreTokenizer", "WordPiece")
    if model.get("unk_token") not in model["vocab"]:
        raise refuse(path, "model.unk_token", model.get("unk_token"), "is not in model.vocab")
    max_chars = int(model["max_input_chars_per_word"])
    return BertWordPiece(model["vocab"], model["unk_token"], max_chars, doc, added)


def import_unigram(path, doc: dict, added: AddedTokens | None) -> MetaspaceUnigram:
    model = doc["model"]
    if model.get("byte_fallback"):
        raise refuse(path, "model.byte_fallback", True, "is not supported (only false)")
    pre = pre_type(path, doc, "Metaspace", "Unigram")
    if pre.get("prepend_scheme", "always") not in ("always", "first", "never"):
        raise refuse(
            path, "pre_tokenizer.prepend_scheme", pre.get("prepend_scheme"), "is not always/first/never"
        )
    meta = {
        "replacement": pre.get("replacement", "\u2581"),
        "prepend_scheme": pre.get("prepend_scheme", "always"),
        "split": pre.get("split", True),
    }
    pieces = [(str(p), float(s)) for p, s in model["vocab"]]
    return MetaspaceUnigram(pieces, model.get("unk_id"), meta, doc, added)
