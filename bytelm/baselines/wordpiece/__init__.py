"""WordPiece (BERT's tokenizer), written here: byte-level or character-level.

>>> from bytelm.baselines.wordpiece import train_wordpiece
>>> tok = train_wordpiece([b"low lower lowest " * 20], vocab_size=520, pattern="gpt2", num_workers=1)
>>> tok.decode_bytes(tok.encode(b"lowest\\xff")) == b"lowest\\xff"
True

Modules:

- :mod:`~bytelm.baselines.wordpiece.trainer`: :func:`train_wordpiece` (merges chosen by the
  likelihood score ``f(xy) / (f(x) f(y))``; the tie rule is documented there).
- :mod:`~bytelm.baselines.wordpiece.tokenizer`: :class:`WordPieceTokenizer` (the readable
  reference encoder, files and the HF export); :mod:`~bytelm.baselines.wordpiece.fast` its fast
  batch path (same ids).
"""

from bytelm.baselines.wordpiece.tokenizer import WordPieceTokenizer, split_words
from bytelm.baselines.wordpiece.trainer import learn_wordpieces, train_wordpiece, train_wordpiece_on_corpus

__all__ = [
    "WordPieceTokenizer",
    "learn_wordpieces",
    "split_words",
    "train_wordpiece",
    "train_wordpiece_on_corpus",
]
