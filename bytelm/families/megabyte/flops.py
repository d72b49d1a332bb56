"""MegaByte's analytic FLOPs, by the convention of :mod:`bytelm.models.flops`."""

from __future__ import annotations

from bytelm.models.flops import head_flops, mean_attended, stack_forward_flops_per_position


def forward_flops_per_byte(mcfg, seq_len: int, *, dense: bool = False) -> float:
    """MegaByte over windows of ``n = seq_len + 1`` ids (the BOS and ``T = seq_len`` bytes) in patches
    of ``C``, per predicted byte: the global stack once per patch (``P = ceil(n / C)`` patches,
    causal over them), the ``E -> D`` projection of every position's slice and the local stack
    within each patch (causal over ``C``) at the ``n`` positions, and the head at the ``T`` predicted
    ones. ``dense``: every position of the padded row (``P * C``), the head included."""
    C = mcfg.patch_size
    n, T = seq_len + 1, seq_len
    P = -(-n // C)
    global_per_patch = stack_forward_flops_per_position(
        mcfg.global_.d_model, mcfg.global_.layers, mcfg.global_.mlp_dim, mean_attended(P, dense=dense)
    )
    local = stack_forward_flops_per_position(
        mcfg.local.d_model, mcfg.local.layers, mcfg.local.mlp_dim, mean_attended(C, dense=dense)
    )
    projection = 2.0 * mcfg.embed_dim * mcfg.local.d_model
    head = head_flops(mcfg.local.d_model, mcfg.vocab_multiple)
    if dense:
        return (global_per_patch * P + (projection + local + head) * P * C) / T
    return (global_per_patch * P + (projection + local) * n + head * T) / T
