"""Baselines the byte-level models are compared against: subword tokenizers, written here in
Python + numpy + regex, for the subword token LM.

- :mod:`bytelm.baselines.bpe`: byte-level BPE (trainer, encoder, files, stats).
- :mod:`bytelm.baselines.unigram`: byte-level Unigram LM (trainer, Viterbi encoder, files).
- :mod:`bytelm.baselines.wordpiece`: WordPiece, byte- or character-level (likelihood trainer,
  longest match with ``##`` pieces and a whole-word ``[UNK]``, files).
- :mod:`bytelm.baselines.subword`: what they share (vocabulary, special and added tokens, the
  encode/decode API, greedy longest match over any vocabulary).

:func:`load_tokenizer` reads any kind from its directory (by its native file);
:func:`train_tokenizer` trains any kind on a corpus, :func:`train_on_documents` on documents, and
:func:`save_tokenizer` writes one over another kind's directory. :data:`OWN_ENCODER` is each kind's
own segmentation rule; BPE and Unigram vocabularies can also be segmented by greedy longest match
(``"longest"``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from bytelm.errors import UserError

KINDS = ("bpe", "unigram", "wordpiece")
#: Each kind's own rule (the default ``encoder``).
OWN_ENCODER = {"bpe": "ranks", "unigram": "viterbi", "wordpiece": "wordpiece"}
#: The native file of each kind: the one a directory is read by (written last).
NATIVE_FILES = {
    "bpe": "bytelm_bpe.json",
    "unigram": "bytelm_unigram.json",
    "wordpiece": "bytelm_wordpiece.json",
}


def encoders_of(kind: str) -> tuple[str, ...]:
    """The rules a ``kind`` tokenizer can record: its own, and longest match for BPE and Unigram."""
    return (OWN_ENCODER[kind],) if kind == "wordpiece" else (OWN_ENCODER[kind], "longest")


def is_saved(directory) -> bool:
    """Whether ``directory`` holds a complete saved tokenizer (its native file is written last)."""
    d = Path(directory)
    return any((d / name).is_file() for name in (*NATIVE_FILES.values(), "bytelm_imported.json"))


def load_tokenizer(directory):
    """The tokenizer saved in ``directory``, BPE, Unigram or WordPiece (by its native file)."""
    from bytelm.baselines.bpe.io import NATIVE_FILE as BPE_FILE
    from bytelm.baselines.bpe.tokenizer import Tokenizer
    from bytelm.baselines.hf_import import inner_from_tokenizer_json
    from bytelm.baselines.imported import NATIVE_FILE as IMPORTED_FILE
    from bytelm.baselines.imported import ImportedTokenizer
    from bytelm.baselines.unigram.tokenizer import NATIVE_FILE as UNIGRAM_FILE
    from bytelm.baselines.unigram.tokenizer import UnigramTokenizer
    from bytelm.baselines.wordpiece.tokenizer import NATIVE_FILE as WORDPIECE_FILE
    from bytelm.baselines.wordpiece.tokenizer import WordPieceTokenizer

    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise UserError(
            f"{d} is a file; a tokenizer is the directory 'bytelm tokenizer train --out DIR' wrote (give DIR)"
        )
    if not d.exists():
        raise UserError(f"tokenizer directory {d} does not exist; train one with 'bytelm tokenizer train'")
    if (d / IMPORTED_FILE).is_file():
        return ImportedTokenizer.load(d, load_tokenizer, inner_from_tokenizer_json)
    if (d / WORDPIECE_FILE).is_file():
        return WordPieceTokenizer.load(d)
    if (d / UNIGRAM_FILE).is_file():
        return UnigramTokenizer.load(d)
    if d.is_dir() and not (d / BPE_FILE).is_file():
        raise UserError(
            f"{d} holds none of {BPE_FILE}, {UNIGRAM_FILE}, {WORDPIECE_FILE}: it is not a bytelm tokenizer "
            "directory (or its save did not finish); train one with 'bytelm tokenizer train' or import one "
            "with 'bytelm tokenizer import'"
        )
    return Tokenizer.load(d)


def train_tokenizer(kind: str, data, *, vocab_size: int, **kwargs):
    """Train a ``kind`` (:data:`KINDS`) tokenizer on a corpus (a data spec or a loaded corpus);
    ``kwargs`` go to :func:`~bytelm.baselines.bpe.trainer.train_bpe_on_corpus`,
    :func:`~bytelm.baselines.unigram.trainer.train_unigram_on_corpus` or
    :func:`~bytelm.baselines.wordpiece.trainer.train_wordpiece_on_corpus`."""
    if kind == "bpe":
        from bytelm.baselines.bpe.trainer import train_bpe_on_corpus

        return train_bpe_on_corpus(data, vocab_size=vocab_size, **kwargs)
    if kind == "unigram":
        from bytelm.baselines.unigram.trainer import train_unigram_on_corpus

        return train_unigram_on_corpus(data, vocab_size=vocab_size, **kwargs)
    if kind == "wordpiece":
        from bytelm.baselines.wordpiece.trainer import train_wordpiece_on_corpus

        return train_wordpiece_on_corpus(data, vocab_size=vocab_size, **kwargs)
    raise UserError(f"tokenizer kind {kind!r} is not one of {list(KINDS)}")


def train_on_documents(
    kind: str,
    documents: Iterable[bytes],
    *,
    encoder: str | None = None,
    level: str = "byte",
    max_input_chars_per_word: int | None = None,
    **kwargs,
):
    """Train a ``kind`` (:data:`KINDS`) tokenizer on ``documents`` (streamed), recording ``encoder``
    (default: the kind's own, :data:`OWN_ENCODER`); ``level`` and ``max_input_chars_per_word`` are
    WordPiece's; ``kwargs`` go to :func:`~bytelm.baselines.bpe.trainer.train_bpe`,
    :func:`~bytelm.baselines.unigram.trainer.train_unigram` or
    :func:`~bytelm.baselines.wordpiece.trainer.train_wordpiece`."""
    if kind == "bpe":
        from bytelm.baselines.bpe import train_bpe

        tok = train_bpe(documents, **kwargs)
    elif kind == "unigram":
        from bytelm.baselines.unigram import train_unigram

        tok = train_unigram(documents, **kwargs)
    elif kind == "wordpiece":
        from bytelm.baselines.wordpiece import train_wordpiece

        tok = train_wordpiece(
            documents, level=level, max_input_chars_per_word=max_input_chars_per_word, **kwargs
        )
    else:
        raise UserError(f"tokenizer kind {kind!r} is not one of {list(KINDS)}")
    if encoder is not None and encoder != OWN_ENCODER[kind]:
        tok = tok.with_encoder(encoder)
    return tok


def save_tokenizer(tok, directory, kind: str, **kwargs) -> None:
    """``tok.save(directory, **kwargs)``, then remove what a tokenizer of another kind left in
    ``directory`` (``kind``: :data:`KINDS` or ``"imported"``): its native file would be read
    first, its tiktoken ranks would mislead."""
    tok.save(directory, **kwargs)
    stale = [name for k, name in NATIVE_FILES.items() if k != kind]
    if kind != "bpe" and kind != "imported":
        stale.append("ranks.tiktoken")
    if kind != "imported":
        stale.append("bytelm_imported.json")
    for name in stale:
        if (Path(directory) / name).is_file():
            (Path(directory) / name).unlink()
