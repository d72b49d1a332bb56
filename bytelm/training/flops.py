"""Analytic training FLOPs, per position and per byte, for each family.

Convention (Kaplan et al. 2020, Hoffmann et al. 2022 appendix F), for a transformer stack of
``L`` layers, width ``d``, attention width ``d_attn = d`` over a context of ``T`` positions:

- forward FLOPs per position = ``2 * N_matmul + 4 * L * T_att * d_attn``, where ``N_matmul`` is
  the parameter count of every matrix multiplied per position (attention projections ``4 d^2``,
  SwiGLU ``3 d F`` per layer, and the output head ``d * V_rows``; the input embedding is a gather
  and counts 0, norms are elementwise and count 0), and the second term is the attention
  logits ``QK^T`` plus the value reduction over the ``T_att`` attended positions. ``T_att = T``:
  the dense attention computed here evaluates the full ``T x T`` score matrix even under a causal
  or sliding-window mask, and this counts what is computed. (The "useful" causal share would be
  about half; MFU computed from this count is therefore comparable with implementations that
  also compute the full matrix.)
- training FLOPs per position = 3 x forward (backward = 2 x forward).
- per byte = per position / bytes per position (1 for bytes; mean bytes per token for BPE).

Families with several stacks (MegaByte, BLT) add their own terms; see each function.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from bytelm.constants import NUM_BYTE_IDS
from bytelm.models.core import pad_vocab


def stack_matmul_params(d_model: int, n_layers: int, mlp_dim: int, d_kv: int | None = None) -> int:
    d_kv = d_kv or d_model
    per_layer = 2 * d_model * d_model + 2 * d_kv * d_model + 3 * d_model * mlp_dim
    return n_layers * per_layer


def stack_forward_flops_per_position(d_model: int, n_layers: int, mlp_dim: int, context: int) -> float:
    return 2.0 * stack_matmul_params(d_model, n_layers, mlp_dim) + 4.0 * n_layers * context * d_model


def decoder_lm_forward_flops_per_position(mcfg, n_valid: int, seq_len: int) -> float:
    """Forward FLOPs per position of a :class:`~bytelm.models.lm.DecoderLM`."""
    head = mcfg.d_model * pad_vocab(n_valid, mcfg.vocab_multiple)
    return stack_forward_flops_per_position(mcfg.d_model, mcfg.n_layers, mcfg.mlp_dim, seq_len) + 2.0 * head


def byte_lm_train_flops_per_byte(mcfg, seq_len: int) -> float:
    return 3.0 * decoder_lm_forward_flops_per_position(mcfg, NUM_BYTE_IDS, seq_len)


def token_lm_train_flops_per_byte(mcfg, n_valid: int, seq_len: int, bytes_per_token: float) -> float:
    return 3.0 * decoder_lm_forward_flops_per_position(mcfg, n_valid, seq_len) / bytes_per_token


def measure_matmul_peak(n: int = 2048, repeats: int = 5, dtype=None) -> float:
    """Best observed FLOP/s of an ``n x n`` matmul on the default device (the MFU denominator)."""
    dtype = dtype or jnp.float32
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def megabyte_train_flops_per_byte(mcfg, seq_len: int) -> float:
    """MegaByte: global cost per patch / P + projection d_G -> d_L + local cost per byte.

    - global: one position per patch of P bytes over a context of ``K = ceil(T/P)`` patches,
      ``stack_forward(D_G, K)`` per patch, hence divided by P per byte;
    - projection: ``2 * d_G * d_L`` per byte;
    - local: ``stack_forward(d_L, context P)`` per byte plus the head ``2 * d_L * V_rows``.
    Training = 3 x forward. Padding positions are computed too; this counts per *position* of the
    padded sequence, which equals per byte when T is a multiple of P.
    """
    P = mcfg.patch_size
    K = -(-seq_len // P)
    global_fwd = stack_forward_flops_per_position(mcfg.global_d_model, mcfg.global_layers, mcfg.global_mlp_dim, K) / P
    projection = 2.0 * mcfg.embed_dim * mcfg.local_d_model
    local_fwd = stack_forward_flops_per_position(mcfg.local_d_model, mcfg.local_layers, mcfg.local_mlp_dim, P)
    head = 2.0 * mcfg.local_d_model * pad_vocab(NUM_BYTE_IDS, mcfg.vocab_multiple)
    return 3.0 * (global_fwd + projection + local_fwd + head)


def blt_train_flops_per_byte(mcfg, seq_len: int, mean_patch_len: float) -> float:
    """BLT: local encoder + decoder per byte, cross-attentions, global cost per patch / mean patch length.

    Per byte (forward): encoder and decoder stacks ``stack_forward(d_L, layers, span)`` with
    ``span = min(local_window, T)``; the head ``2 d_L V``; the encoder cross-attention's key/value
    projections ``4 d_L^2`` and its scores over the patch queries, and the decoder cross-attention's
    query/output projections ``4 d_L^2`` and scores over the ``k P`` global slots (both computed
    densely with a mask: ``4 * d_L * (k P)`` per byte each, ``P`` = patch slots). Per patch: the
    pooled-state projections ``2 d_L k d_L + 2 k d_L d_G``, the encoder cross-attention's
    query/output projections ``4 k d_L^2``, the global-to-local projection ``2 d_G k d_L``, and the
    global stack ``stack_forward(d_G, L_G, P)``; per-patch terms are divided by the mean patch length.
    Hash n-gram embeddings are gathers (0 FLOPs). Training = 3 x forward.
    """
    dl, dg, k = mcfg.local_d_model, mcfg.global_d_model, mcfg.queries_per_patch
    slots = mcfg.patches_for(seq_len)
    span = min(mcfg.local_window, seq_len) if mcfg.local_window else seq_len
    per_byte = (
        stack_forward_flops_per_position(dl, mcfg.encoder_layers, mcfg.local_mlp_dim, span)
        + stack_forward_flops_per_position(dl, mcfg.decoder_layers, mcfg.local_mlp_dim, span)
        + 2.0 * dl * pad_vocab(NUM_BYTE_IDS, mcfg.vocab_multiple)
    )
    per_patch = 2.0 * dl * k * dl + 2.0 * k * dl * dg + 2.0 * dg * k * dl
    per_patch += stack_forward_flops_per_position(dg, mcfg.global_layers, mcfg.global_mlp_dim, slots)
    if mcfg.cross_attention:
        per_byte += 4.0 * dl * dl + 4.0 * dl * (k * slots) + 4.0 * dl * dl + 4.0 * dl * (k * slots)
        per_patch += 4.0 * k * dl * dl
    return 3.0 * (per_byte + per_patch / mean_patch_len)
