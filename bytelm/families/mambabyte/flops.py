"""MambaByte's analytic FLOPs (the convention of :mod:`bytelm.models.flops`)."""

from __future__ import annotations

from bytelm.models.flops import head_flops
from bytelm.models.ssd import mamba2_layer_flops


def forward_flops_per_byte(mcfg, seq_len: int, *, dense: bool = False) -> float:
    """Forward FLOPs per byte: ``n_layers`` Mamba-2 layers (:func:`~bytelm.models.ssd.mamba2_layer_flops`:
    projections, convolution, the chunked SSD with its ``C . B`` scores once per group of heads), then
    the head."""
    layer = mamba2_layer_flops(mcfg.d_model, mcfg.ssm(), seq_len, dense=dense)
    return mcfg.n_layers * layer + head_flops(mcfg.d_model, mcfg.vocab_multiple)
