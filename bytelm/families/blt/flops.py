"""BLT's analytic FLOPs, by the convention of :mod:`bytelm.models.flops`, and its entropy model's
forward cost (what its compute ledger charges for patching)."""

from __future__ import annotations

from bytelm.constants import NUM_BYTE_IDS
from bytelm.models.flops import (
    decoder_lm_forward_flops_per_position,
    head_flops,
    mean_attended,
    stack_forward_flops_per_position,
)


def forward_flops_per_byte(mcfg, seq_len: int, mean_patch_len: float, *, dense: bool = False) -> float:
    """BLT over windows of ``seq_len + 1`` ids with patches of ``mean_patch_len`` bytes on average.

    Per byte: the encoder and decoder stacks (sliding window over the ``T`` inputs), the head, and
    per cross-attention layer the byte side of the attention: the encoder's key/value projections
    of the bytes (``4 d^2``) and its ``k`` queries' scores per byte (``4 d k``), the decoder's
    query/output projections (``4 d^2``) and its scores over ``k`` slots (``4 d k``). Per patch: the
    pooled state to ``k`` queries (``2 d kd``), per encoder cross-attention layer their query/output
    projections (``4 k d^2``), the projection to the global width and back (``2 kd G`` each), the
    global stack (causal over the window's real patches), and per decoder cross-attention layer
    the key/value projections of the ``k`` slots (``4 k d^2``); per-patch terms are divided by the
    mean patch length. Hash n-gram embeddings are gathers (0 FLOPs). ``dense``: all
    ``mcfg.patches_for(seq_len)`` slots, and every one of a patch query's ``max_patch_len``
    gathered rows.
    """
    d, G, k = mcfg.local.d_model, mcfg.global_.d_model, mcfg.queries_per_patch
    T = seq_len
    n_enc, n_dec = mcfg.cross_layers()
    local_att = mean_attended(T, mcfg.local.window, dense=dense)
    per_byte = (
        stack_forward_flops_per_position(d, mcfg.local.encoder_layers, mcfg.local.mlp_dim, local_att)
        + stack_forward_flops_per_position(d, mcfg.local.decoder_layers, mcfg.local.mlp_dim, local_att)
        + head_flops(d, mcfg.vocab_multiple)
        + n_enc * 4.0 * d * d
        + n_dec * (4.0 * d * d + 4.0 * d * k)
    )
    patches = mcfg.patches_for(seq_len) if dense else (T + 1) / mean_patch_len  # per window
    enc_keys = k * mcfg.max_patch_len if dense else k * mean_patch_len  # scores of a patch's queries
    per_patch = (
        2.0 * d * k * d
        + n_enc * (4.0 * k * d * d + 4.0 * d * enc_keys)
        + 2.0 * 2.0 * k * d * G
        + stack_forward_flops_per_position(
            G, mcfg.global_.layers, mcfg.global_.mlp_dim, mean_attended(round(patches), dense=dense)
        )
        + n_dec * 4.0 * k * d * d
    )
    return per_byte + per_patch * patches / T


def entropy_forward_flops_per_id(entropy_cfg, seq_len: int) -> float:
    """The entropy model's forward FLOPs per id when it patches windows of ``seq_len + 1`` ids."""
    return decoder_lm_forward_flops_per_position(entropy_cfg, NUM_BYTE_IDS, seq_len + 1)
