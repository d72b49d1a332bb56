"""Analytic FLOPs of every family, by one convention.

**The convention.** Count the multiply-adds the model semantically needs, 2 FLOPs each, and
nothing else (elementwise work, norms, softmax and gathers count 0; Kaplan et al. 2020,
Hoffmann et al. 2022 appendix F). For a pre-norm stack of ``L`` layers of width ``d``, SwiGLU
width ``F``, whose positions attend to ``n`` keys on average, the forward FLOPs per position are

    2 * (4 d^2 + 3 d F) * L      the attention projections and the MLP
    + 4 * d * n * L              the scores QK^T and the weighted sum over the values

and the head adds ``2 d V`` (``V`` the padded vocabulary rows). What ``n`` is:

- causal self-attention: position ``t`` (from 0) attends ``min(t + 1, w)`` keys, ``w`` the sliding
  window or the whole context; ``n`` is the mean over the context (:func:`mean_attended`);
- cross-attention: a query attends the keys it is allowed to see: a BLT patch query the bytes of
  its own patch (so ``k`` keys per byte over a patch's ``k`` queries), a byte the ``k`` slots of
  its one source patch;
- a model over patches runs over the real patches of a window, at the measured mean patch length
  (BLT) or the patch size (MegaByte), not over padding slots.

Training = 3 x forward (the backward pass is twice the forward); per byte = per position / bytes
per position (1 for bytes, the mean bytes per token for a subword model). A BLT entropy model's
inference is counted on its own (:func:`entropy_inference_flops_per_byte`) and added to BLT's in
the "total inference FLOPs/byte" of reports; its training is its own run's budget.

``dense=True`` counts instead what a dense program computes (every self-attention over its whole
context, every patch slot, every gathered row of a patch): ``tests/test_flops.py`` checks those
counts against XLA's cost analysis of the compiled training step, term by term the same formulas.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from bytelm.constants import NUM_BYTE_IDS
from bytelm.models.core import pad_vocab


def mean_attended(context: int, window: int = 0, *, dense: bool = False) -> float:
    """Mean number of keys a causal position attends over a ``context`` of positions, with a
    sliding ``window`` (0: none); ``dense``: the whole context, as a dense program computes it.

    >>> mean_attended(4), mean_attended(4, 2), mean_attended(4, dense=True)
    (2.5, 1.75, 4.0)
    """
    if dense:
        return float(context)
    w = window if 0 < window < context else context
    # positions 0 .. w-1 attend 1 .. w keys; the remaining context - w attend w each
    return (w * (w + 1) / 2 + (context - w) * w) / context


def stack_forward_flops_per_position(d_model: int, n_layers: int, mlp_dim: int, attended: float) -> float:
    """Forward FLOPs per position of a stack whose positions attend ``attended`` keys each."""
    return 2.0 * (4 * d_model * d_model + 3 * d_model * mlp_dim) * n_layers + 4.0 * d_model * attended * n_layers


def head_flops(d_model: int, vocab_multiple: int, n_valid: int = NUM_BYTE_IDS) -> float:
    return 2.0 * d_model * pad_vocab(n_valid, vocab_multiple)


def decoder_lm_forward_flops_per_position(mcfg, n_valid: int, seq_len: int, *, dense: bool = False) -> float:
    """A :class:`~bytelm.models.lm.DecoderLM` (byte LM, subword LM) over ``seq_len`` positions."""
    attended = mean_attended(seq_len, mcfg.window, dense=dense)
    return stack_forward_flops_per_position(mcfg.d_model, mcfg.n_layers, mcfg.mlp_dim, attended) + head_flops(mcfg.d_model, mcfg.vocab_multiple, n_valid)


def megabyte_forward_flops_per_byte(mcfg, seq_len: int, *, dense: bool = False) -> float:
    """MegaByte over windows of ``n = seq_len + 1`` ids (the BOS and ``T = seq_len`` bytes) in patches
    of ``C``, per predicted byte: the global stack once per patch (``P = ceil(n / C)`` patches,
    causal over them), the ``E -> D`` projection of every position's slice and the local stack
    within each patch (causal over ``C``) at the ``n`` positions, and the head at the ``T`` predicted
    ones. ``dense``: every position of the padded row (``P * C``), the head included."""
    C = mcfg.patch_size
    n, T = seq_len + 1, seq_len
    P = -(-n // C)
    global_per_patch = stack_forward_flops_per_position(mcfg.global_d_model, mcfg.global_layers, mcfg.global_mlp_dim, mean_attended(P, dense=dense))
    local = stack_forward_flops_per_position(mcfg.local_d_model, mcfg.local_layers, mcfg.local_mlp_dim, mean_attended(C, dense=dense))
    projection = 2.0 * mcfg.embed_dim * mcfg.local_d_model
    head = head_flops(mcfg.local_d_model, mcfg.vocab_multiple)
    if dense:
        return (global_per_patch * P + (projection + local + head) * P * C) / T
    return (global_per_patch * P + (projection + local) * n + head * T) / T


def blt_cross_layers(mcfg) -> tuple[int, int]:
    """``(encoder, decoder)`` cross-attention layers of a BLT config."""
    if not mcfg.cross_attention:
        return 0, 0
    enc = mcfg.encoder_layers if mcfg.encoder_cross_all_layers and mcfg.encoder_layers else 1
    dec = max(mcfg.decoder_layers, 1) if mcfg.decoder_cross_all_layers else 1
    return enc, dec


def blt_forward_flops_per_byte(mcfg, seq_len: int, mean_patch_len: float, *, dense: bool = False) -> float:
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
    d, G, k = mcfg.local_d_model, mcfg.global_d_model, mcfg.queries_per_patch
    T = seq_len
    n_enc, n_dec = blt_cross_layers(mcfg)
    local_att = mean_attended(T, mcfg.local_window, dense=dense)
    per_byte = (
        stack_forward_flops_per_position(d, mcfg.encoder_layers, mcfg.local_mlp_dim, local_att)
        + stack_forward_flops_per_position(d, mcfg.decoder_layers, mcfg.local_mlp_dim, local_att)
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
        + stack_forward_flops_per_position(G, mcfg.global_layers, mcfg.global_mlp_dim, mean_attended(round(patches), dense=dense))
        + n_dec * 4.0 * k * d * d
    )
    return per_byte + per_patch * patches / T


def entropy_inference_flops_per_byte(entropy_cfg, seq_len: int) -> float:
    """The entropy model's forward FLOPs per byte when it patches windows of ``seq_len + 1`` ids."""
    return decoder_lm_forward_flops_per_position(entropy_cfg, NUM_BYTE_IDS, seq_len + 1)


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
