"""Sampling from every family, with caches (``bytelm sample``).

- :mod:`bytelm.sampling.generate`: :func:`~bytelm.sampling.generate.generate` (bytes) and
  :func:`~bytelm.sampling.generate.stream` (an iterator) from a run directory or a decoder.
- :mod:`bytelm.sampling.decoders`: one cached decoder per family, and the full recomputation.
- :mod:`bytelm.sampling.sampler`: greedy, temperature, top-k, top-p.

>>> from bytelm.sampling.generate import generate                              # doctest: +SKIP
>>> generate("runs/blt", b"def main(", max_bytes=64)                           # doctest: +SKIP
"""
