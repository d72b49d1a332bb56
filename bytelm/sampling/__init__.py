"""Sampling's building blocks (``bytelm sample`` runs them through :mod:`bytelm.generate`).

- :mod:`bytelm.sampling.decoders`: the decoder interface every family's cached decoder implements,
  and the flat LMs' decoder (MegaByte's and BLT's live in their family folders).
- :mod:`bytelm.sampling.sampler`: greedy, temperature, top-k, top-p.

>>> from bytelm.generate import generate                                       # doctest: +SKIP
>>> generate("runs/blt", b"def main(", max_bytes=64)                           # doctest: +SKIP
"""
