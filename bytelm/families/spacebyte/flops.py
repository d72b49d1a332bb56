"""SpaceByte's analytic FLOPs (the convention of :mod:`bytelm.models.flops`)."""

from __future__ import annotations

from bytelm.models.flops import head_flops, mean_attended, stack_forward_flops_per_position


def forward_flops_per_byte(mcfg, seq_len: int, bytes_per_global: float, *, dense: bool = False) -> float:
    """Per byte: the local encoder and decoder blocks (sliding window over the window's bytes) and the
    head; per global position (one per ``bytes_per_global`` bytes: the rate measured in training, or
    the slots' rate when planning) the global stack, causal over the window's global positions.
    ``dense``: what the compiled program computes: every attention over its whole context, the global
    stack over all of its slots. Zero by the convention: the gather, the zero padding, the add-back."""
    T = float(seq_len)
    loc = mcfg.local
    attended = mean_attended(seq_len, loc.window, dense=dense)
    per_byte = stack_forward_flops_per_position(
        loc.d_model, loc.encoder_layers + loc.decoder_layers, loc.mlp_dim, attended
    ) + head_flops(loc.d_model, mcfg.vocab_multiple)
    globals_ = float(mcfg.slots_for(seq_len)) if dense else T / float(bytes_per_global)
    g = mcfg.global_
    per_global = stack_forward_flops_per_position(
        g.d_model, g.layers, g.mlp_dim, mean_attended(max(round(globals_), 1), dense=dense)
    )
    return per_byte + per_global * globals_ / T
