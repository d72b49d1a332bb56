"""Baselines the byte-level models are compared against: subword tokenizers, written here in
Python + numpy + regex, for the subword token LM.

- :mod:`bytelm.baselines.bpe`: byte-level BPE (trainer, encoder, files, stats).
- :mod:`bytelm.baselines.unigram`: byte-level Unigram LM (trainer, Viterbi encoder, files).
- :mod:`bytelm.baselines.subword`: what they share (vocabulary, special and added tokens, the
  encode/decode API, greedy longest match over any vocabulary).

:func:`load_tokenizer` reads either kind from its directory; :func:`train_tokenizer` trains
either kind.
"""

from __future__ import annotations

from pathlib import Path

from bytelm.errors import UserError

KINDS = ("bpe", "unigram")


def is_saved(directory) -> bool:
    """Whether ``directory`` holds a complete saved tokenizer (its native file is written last)."""
    d = Path(directory)
    return (d / "bytelm_bpe.json").is_file() or (d / "bytelm_unigram.json").is_file()


def load_tokenizer(directory):
    """The tokenizer saved in ``directory``, BPE or Unigram (by its native file)."""
    from bytelm.baselines.bpe.io import NATIVE_FILE as BPE_FILE
    from bytelm.baselines.bpe.tokenizer import Tokenizer
    from bytelm.baselines.unigram.tokenizer import NATIVE_FILE as UNIGRAM_FILE
    from bytelm.baselines.unigram.tokenizer import UnigramTokenizer

    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise UserError(
            f"{d} is a file; a tokenizer is the directory 'bytelm tokenizer train --out DIR' wrote (give DIR)"
        )
    if not d.exists():
        raise UserError(f"tokenizer directory {d} does not exist; train one with 'bytelm tokenizer train'")
    if (d / UNIGRAM_FILE).is_file():
        return UnigramTokenizer.load(d)
    if d.is_dir() and not (d / BPE_FILE).is_file():
        raise UserError(
            f"{d} holds neither {BPE_FILE} nor {UNIGRAM_FILE}: it is not a bytelm tokenizer directory "
            "(or its save did not finish); train one with 'bytelm tokenizer train'"
        )
    return Tokenizer.load(d)


def train_tokenizer(kind: str, data, *, vocab_size: int, **kwargs):
    """Train a ``kind`` (``"bpe"`` or ``"unigram"``) tokenizer on a corpus (a data spec or a loaded
    corpus); ``kwargs`` go to :func:`~bytelm.baselines.bpe.trainer.train_bpe_on_corpus` or
    :func:`~bytelm.baselines.unigram.trainer.train_unigram_on_corpus`."""
    if kind == "bpe":
        from bytelm.baselines.bpe.trainer import train_bpe_on_corpus

        return train_bpe_on_corpus(data, vocab_size=vocab_size, **kwargs)
    if kind == "unigram":
        from bytelm.baselines.unigram.trainer import train_unigram_on_corpus

        return train_unigram_on_corpus(data, vocab_size=vocab_size, **kwargs)
    raise UserError(f"tokenizer kind {kind!r} is not one of {list(KINDS)}")
