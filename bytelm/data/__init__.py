"""Byte data pipeline: sources -> corpus (split, fingerprint, cache) -> batches.

>>> corpus = load_corpus("files:some/dir")          # doctest: +SKIP
>>> corpus.fingerprint, len(corpus.segments)        # doctest: +SKIP
"""

from bytelm.data.batches import Stream, WindowBatches, segment_rows
from bytelm.data.corpus import Corpus, default_cache_dir, load_corpus, load_corpus_from_config
from bytelm.data.sources import Document, parse_source
from bytelm.data.split import EVAL_PROTOCOL, Segment, fingerprint_segments, is_heldout, is_validation

__all__ = [
    "Corpus",
    "Document",
    "Segment",
    "Stream",
    "WindowBatches",
    "default_cache_dir",
    "EVAL_PROTOCOL",
    "fingerprint_segments",
    "is_heldout",
    "is_validation",
    "load_corpus",
    "load_corpus_from_config",
    "parse_source",
    "segment_rows",
]
