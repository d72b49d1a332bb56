"""H-Net's analytic FLOPs, by the convention of :mod:`bytelm.models.flops`."""

from __future__ import annotations

from collections.abc import Sequence

from bytelm.models.flops import head_flops, mean_attended, stack_forward_flops_per_position
from bytelm.models.hybrid import parse_pattern
from bytelm.models.ssd import mamba2_layer_flops


def router_flops(d: int) -> float:
    """Per position: the two ``d x d`` projections (``4 d^2``) and the cosine (``q.k``, ``|q|^2``,
    ``|k|^2``: ``6 d``)."""
    return 4.0 * d * d + 6.0 * d


def layers_flops_per_position(mcfg, spec, positions: int, *, dense: bool = False) -> float:
    """Per position of a stage's encoder and decoder (their layer patterns, :mod:`bytelm.models.hybrid`)
    over windows of ``positions`` positions: an attention layer ``8 d^2`` for its projections and ``4 d``
    per attended key (its sliding window; ``dense``: the whole context), an MLP ``6 d f``, a Mamba-2
    layer :func:`~bytelm.models.ssd.mamba2_layer_flops` (``dense``: every pair of its chunks)."""
    d, total = spec.d_model, 0.0
    attended = mean_attended(max(positions, 1), spec.window, dense=dense)
    for mixer, has_mlp in parse_pattern(spec.encoder) + parse_pattern(spec.decoder):
        if mixer == "attention":
            total += 8.0 * d * d + 4.0 * d * attended
        else:
            total += mamba2_layer_flops(d, mcfg.ssm, max(positions, 1), dense=dense)
        if has_mlp:
            total += 6.0 * d * spec.mlp_dim
    return total


def forward_flops_per_byte(mcfg, seq_len: int, chunk_lens: Sequence[float], *, dense: bool = False) -> float:
    """An H-Net over windows of ``seq_len`` input positions, each stage chunking at the mean length
    ``chunk_lens[s]`` (positions of its level per chunk: the target N before training, the measured
    rate after it).

    Per position of a stage of width ``d``: its encoder and decoder layers
    (:func:`layers_flops_per_position`), the router (:func:`router_flops`), the float32 residual
    projection (``2 d^2``). Per chunk: the dechunking average (``z = P zhat + (1 - P) z_prev``, two
    multiply-adds per value: ``4 d``, elementwise but the model's own recurrence, so counted). The main
    network runs at the innermost chunk rate, causal over a window's chunks; the head at every byte.
    Zero by the convention: the chunk gather and the scatter back to positions (they move values, no
    multiply-adds), the learned padding of the widths, the straight-through factor and the norms.

    ``dense``: what the compiled program computes instead: every attention over its whole context,
    every Mamba-2 chunk's pairs in full, and each level over all of its chunk slots
    (:meth:`HNetConfig.slots_for`), whatever the chunks.
    """
    T = float(seq_len)
    total = head_flops(mcfg.local.d_model, mcfg.vocab_multiple) * T
    positions = T
    for spec, length in zip(mcfg.stage_specs(), chunk_lens):
        d = spec.d_model
        per_position = (
            layers_flops_per_position(mcfg, spec, max(round(positions), 1), dense=dense)
            + router_flops(d)
            + 2.0 * d * d
        )
        chunks = float(mcfg.slots_for(round(positions), spec.target)) if dense else positions / float(length)
        total += per_position * positions + 4.0 * d * chunks
        positions = chunks
    main = stack_forward_flops_per_position(
        mcfg.global_.d_model,
        mcfg.global_.layers,
        mcfg.global_.mlp_dim,
        mean_attended(max(round(positions), 1), dense=dense),
    )
    return (total + main * positions) / T
