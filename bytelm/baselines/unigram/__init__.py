"""Byte-level Unigram LM tokenization (Kudo 2018; SentencePiece's default), written here.

>>> from bytelm.baselines.unigram import train_unigram
>>> tok = train_unigram([b"low lower lowest " * 20], vocab_size=270, pattern="gpt2", num_workers=1)
>>> tok.decode_bytes(tok.encode(b"lowest\\xff")) == b"lowest\\xff"
True

Modules:

- :mod:`~bytelm.baselines.unigram.lattice`: the segmentation lattice of many chunks in numpy
  (piece lookup, forward-backward, Viterbi, sampling).
- :mod:`~bytelm.baselines.unigram.trainer`: :func:`train_unigram` (seed substrings, EM, pruning).
- :mod:`~bytelm.baselines.unigram.tokenizer`: :class:`UnigramTokenizer` (the reference Viterbi,
  the fast batch path, files and the HF export).
"""

from bytelm.baselines.unigram.tokenizer import UnigramTokenizer
from bytelm.baselines.unigram.trainer import (
    digamma,
    learn_pieces,
    seed_pieces,
    train_unigram,
    train_unigram_on_corpus,
)

__all__ = [
    "UnigramTokenizer",
    "digamma",
    "learn_pieces",
    "seed_pieces",
    "train_unigram",
    "train_unigram_on_corpus",
]
