"""Byte-level BPE, written here: the subword baseline the byte models are compared against.

>>> from bytelm.baselines.bpe import Tokenizer, train_bpe
>>> tok = train_bpe([b"low lower lowest " * 20], vocab_size=260, pattern="gpt2", num_workers=1)
>>> tok.decode_bytes(tok.encode(b"lowest\\xff")) == b"lowest\\xff"
True

Modules (one idea each):

- :mod:`~bytelm.baselines.bpe.pretokenize`: the ``gpt2`` / ``cl100k`` / custom regex split.
- :mod:`~bytelm.baselines.bpe.trainer`: :func:`train_bpe` (merge list identical to HF's
  ``BpeTrainer``; the tie-breaking rule and the ``vocab_size`` convention are documented there).
- :mod:`~bytelm.baselines.bpe.merges`: the pure helpers :func:`pair_counts` and :func:`merge`.
- :mod:`~bytelm.baselines.bpe.tokenizer`: :class:`Tokenizer`, the readable reference encoder
  with a tiktoken-style API; :mod:`~bytelm.baselines.bpe.fast` its fast batch path (same ids).
- :mod:`~bytelm.baselines.bpe.io`: versioned files, ``tokenizer.json`` (HF) and
  ``ranks.tiktoken`` exports, a human-readable vocab dump.
- :mod:`~bytelm.baselines.bpe.stats`: bytes/token and the per-group token tax.
- :mod:`~bytelm.baselines.bpe.extend`: embedding rows for new tokens.
"""

from bytelm.baselines.bpe.extend import extend_embeddings
from bytelm.baselines.bpe.merges import merge, pair_counts
from bytelm.baselines.bpe.pretokenize import PATTERNS, PreTokenizer, resolve_pattern
from bytelm.baselines.bpe.stats import GroupStats, TokenizerStats, tokenizer_stats
from bytelm.baselines.bpe.tokenizer import IncrementalDecoder, Tokenizer, load_tokenizer, save_tokenizer
from bytelm.baselines.bpe.trainer import count_chunks, learn_merges, train_bpe, train_bpe_on_corpus

__all__ = [
    "PATTERNS",
    "GroupStats",
    "IncrementalDecoder",
    "PreTokenizer",
    "Tokenizer",
    "TokenizerStats",
    "count_chunks",
    "extend_embeddings",
    "learn_merges",
    "load_tokenizer",
    "merge",
    "pair_counts",
    "resolve_pattern",
    "save_tokenizer",
    "tokenizer_stats",
    "train_bpe",
    "train_bpe_on_corpus",
]
