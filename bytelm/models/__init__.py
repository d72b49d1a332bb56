"""Model families on one shared transformer core.

Shape letters used in array names throughout the package (``bytes_BxT``, ``logits_BxTxV``):

==== ==========================================
B    batch
T    positions (bytes, or tokens for the BPE LM)
P    patches per sequence
S    bytes per patch (patch length / size)
D    model width
F    MLP hidden width
H    attention heads
K    head dimension
V    vocabulary (padded)
N    n-gram order
Q    queries per patch (BLT)
==== ==========================================

This module imports no JAX: config dataclasses live in :mod:`bytelm.models.configs`.
"""
