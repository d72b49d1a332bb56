"""Model families on one shared transformer core.

Shape letters used in array names throughout the package (``bytes_BxT``, ``logits_BxTxV``):

==== ==========================================================================================
B    batch rows
T    positions of a sequence: a window's inputs (bytes, or tokens for the BPE LM)
L    ids of a row with its first input: ``T + 1`` (patching, entropy rows)
W    a fixed, padded row width (the entropy model's single-row program)
S    key/value positions of an attention call (the source of a cross-attention)
Q    query positions of an attention call (BLT: the ``P * k`` patch-query slots)
P    patches per sequence
C    bytes per MegaByte patch (its fixed patch size)
D    model width (the local width of MegaByte and BLT)
G    global model width (MegaByte, BLT)
E    MegaByte's per-byte global embedding width (``G = C * E``)
F    MLP hidden width
H    attention heads
K    head dimension (``K2``: half of it, for rotary)
V    vocabulary rows (padded)
N    flattened leading dimensions (``B * T`` rows of a matmul, ``B * H`` attention problems)
1    a broadcast axis of size one
==== ==========================================================================================

Layout: :mod:`~bytelm.models.configs` (what every family's config shares, and ``StackConfig``; no
JAX), :mod:`~bytelm.models.kernels` (the kernel choices), :mod:`~bytelm.models.attention`
(``attend``), :mod:`~bytelm.models.core` (the shared layers and head), :mod:`~bytelm.models.stack`
(the transformer stack of blocks), :mod:`~bytelm.models.lm` (the flat decoder LM the byte and
subword families share), :mod:`~bytelm.models.cache` (the key/value cache every attention layer
takes for decoding), :mod:`~bytelm.models.scoring` (the one scoring interface),
:mod:`~bytelm.models.flops` (the FLOP convention). Each family's own model lives in its folder,
``bytelm/families/<name>/``.
This package imports nothing from families, patching, training or evaluation.
"""
