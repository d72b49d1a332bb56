"""bytelm: tokenizer-free language modelling in JAX.

The package is organised by concern (docs/architecture.md): ``bytelm.data`` turns a source spec into a
split, fingerprinted, cached corpus and batches; ``bytelm.models`` holds the model families on
one transformer core; ``bytelm.baselines`` the byte-level BPE tokenizer; ``bytelm.patching`` the
BLT patchers; ``bytelm.training`` the Task seam and the one trainer; ``bytelm.evaluation`` the
bits-per-byte protocol and reports; ``bytelm.experiments`` the main job, ``bytelm compare``.
"""

__version__ = "0.1.0"
