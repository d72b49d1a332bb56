"""MambaByte's analytic FLOPs (the convention of :mod:`bytelm.models.flops`)."""

from __future__ import annotations

from bytelm.models.flops import head_flops
from bytelm.models.ssd import ssd_flops_per_position


def forward_flops_per_byte(mcfg, seq_len: int, *, dense: bool = False) -> float:
    """Forward FLOPs per byte: per layer the input projection (to ``z, x, B, C, dt``), the depthwise
    convolution over ``x, B, C``, the chunked SSD (:func:`~bytelm.models.ssd.ssd_flops_per_position`:
    its ``C . B`` scores once per group of heads; within a chunk the causal half of its pairs, or all
    of them ``dense``, as the program computes) and the output projection; then the head. Norms,
    gates, the ``D`` skip: elementwise, 0."""
    D, E, N, G = mcfg.d_model, mcfg.expand * mcfg.d_model, mcfg.d_state, mcfg.groups
    H = E // mcfg.head_dim
    Q = min(mcfg.chunk, seq_len)
    pairs = float(Q) if dense else (Q + 1) / 2  # keys per position within a chunk
    layer = (
        2.0 * D * (2 * E + 2 * G * N + H)
        + 2.0 * mcfg.d_conv * (E + 2 * G * N)
        + ssd_flops_per_position(E, G, N, pairs)
        + 2.0 * E * D
    )
    return mcfg.n_layers * layer + head_flops(D, mcfg.vocab_multiple)
