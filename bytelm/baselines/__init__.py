"""Baselines the byte-level models are compared against.

- :mod:`bytelm.baselines.bpe`: a byte-level BPE tokenizer (trainer, encoder, files, stats),
  written here in Python + numpy + regex, for the subword token LM.
"""
