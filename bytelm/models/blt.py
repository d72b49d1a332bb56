"""BLT, the Byte Latent Transformer (Pagnoni et al. 2024), on the shared core.

The model takes a window of ids ``(B, T+1)`` and the **patch lengths** of that window
``(B, P)`` (computed outside the model by :mod:`bytelm.patching` from an entropy model; zero
entries are empty padding patches). Positions ``0..T-1`` are the inputs; position ``i`` predicts
id ``i + 1``.

1. **Local encoder.** Byte embedding plus hashed n-gram embeddings: for each ``n`` in
   ``ngram_sizes`` the n-gram of ids *ending* at position ``i`` is hashed (a polynomial rolling
   hash in wrapping uint32 arithmetic) into its own table of ``hash_table_size`` rows. Then
   ``encoder_layers`` causal sliding-window blocks.
2. **Patch pooling.** Each patch's query is the segment-max of the byte states of its own
   positions, projected to ``k = queries_per_patch`` queries; the queries cross-attend to the
   byte states of their own patch only; the ``k`` outputs are concatenated and projected to the
   global width. Empty patches give zero vectors (never NaN or -inf).
3. **Global latent transformer**, causal over the ``P`` patch slots (padding slots come after
   every real patch, so no real patch sees them).
4. **Local decoder.** The byte state at position ``i`` (whose target ``i + 1`` lies in patch
   ``j``) cross-attends to the ``k`` key/value slots made from the global output of patch
   ``j - 1`` only: decoder patch ids are the patch ids of the *targets*, i.e. the lengths
   shifted by one position; using the encoder's patch ids would leak the future. A position
   whose target is in patch 0 has no earlier patch and receives nothing. Then ``decoder_layers``
   sliding-window blocks and the byte logits.

With ``cross_attention = False`` the two cross-attentions are replaced by projections: the
pooled state itself is projected to the global width, and the global output of patch ``j - 1``
is projected and added to the byte state. With one byte per patch, no encoder/decoder layers,
no n-grams and identity projections, that variant is exactly a flat byte transformer ``G`` over
the byte embeddings ``e`` with an embedding skip into the head: ``logits_i = head(norm(e_i +
G(e)_i))``, ``G(e)_i`` seeing bytes ``<= i`` (the test that pins the alignment down).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bytelm.constants import NUM_BYTE_IDS, PAD_ID
from bytelm.models.core import COMPUTE_DTYPES, Attention, Embed, OutputHead, RMSNorm, Transformer, pad_vocab, param
from bytelm.models.kernels import resolve_kernels
from bytelm.models.scoring import Scores, next_id_scores

_HASH_MULT = np.uint32(1_000_003)


def ngram_hashes(ids_BxT: jax.Array, n: int, table_size: int) -> jax.Array:
    """Row index of the n-gram ending at each position (ids before the start count as PAD)."""
    padded = jnp.pad(ids_BxT.astype(jnp.uint32), ((0, 0), (n - 1, 0)), constant_values=PAD_ID)
    T = ids_BxT.shape[1]
    h = jnp.full(ids_BxT.shape, np.uint32(n), jnp.uint32)
    for m in range(n):  # oldest id first
        h = h * _HASH_MULT + padded[:, m : m + T] + np.uint32(1)
    return (h % np.uint32(table_size)).astype(jnp.int32)


def patch_ids_from_lengths(lengths_BxP: jax.Array, length: int) -> jax.Array:
    """Patch index of each of ``length`` positions; positions past the covered ones get ``P``."""
    ends_BxP = jnp.cumsum(lengths_BxP, axis=1)
    pos_L = jnp.arange(length)
    return jnp.sum(pos_L[None, None, :] >= ends_BxP[:, :, None], axis=1).astype(jnp.int32)


class BLT(nnx.Module):
    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.vocab_rows = pad_vocab(NUM_BYTE_IDS, cfg.vocab_multiple)
        dt = COMPUTE_DTYPES[cfg.dtype]
        kernels = resolve_kernels(cfg.attention, cfg.mlp, dtype=cfg.dtype)
        self.dtype = dt
        dl, dg, k = cfg.local_d_model, cfg.global_d_model, cfg.queries_per_patch
        self.byte_embed = Embed(self.vocab_rows, dl, rngs=rngs)
        self.ngram_embeds = nnx.List([Embed(cfg.hash_table_size, dl, rngs=rngs) for _ in cfg.ngram_sizes])
        self.encoder = Transformer(dl, cfg.encoder_layers, cfg.local_heads, cfg.local_mlp_dim, rngs=rngs, kernels=kernels, window=cfg.local_window, rope_base=cfg.rope_base, dtype=dt)
        self.to_queries = param(rngs, (dl, k * dl), ("embed", "mlp"))
        self.to_global = param(rngs, (k * dl, dg), ("mlp", "embed"))
        self.global_stack = Transformer(dg, cfg.global_layers, cfg.global_heads, cfg.global_mlp_dim, rngs=rngs, kernels=kernels, rope_base=cfg.rope_base, dtype=dt)
        self.global_norm = RMSNorm(dg)
        self.from_global = param(rngs, (dg, k * dl), ("embed", "mlp"))
        if cfg.cross_attention:
            self.encoder_cross = Attention(dl, cfg.cross_heads, rngs=rngs, dtype=dt, implementation=kernels.attention)
            self.encoder_cross_norm = RMSNorm(dl)
            self.decoder_cross = Attention(dl, cfg.cross_heads, rngs=rngs, dtype=dt, implementation=kernels.attention)
            self.decoder_cross_norm = RMSNorm(dl)
        self.decoder = Transformer(dl, cfg.decoder_layers, cfg.local_heads, cfg.local_mlp_dim, rngs=rngs, kernels=kernels, window=cfg.local_window, rope_base=cfg.rope_base, dtype=dt)
        self.decoder_norm = RMSNorm(dl)
        self.head = OutputHead(dl, NUM_BYTE_IDS, cfg.vocab_multiple, rngs=rngs, dtype=dt)

    def embed(self, inputs_BxT: jax.Array) -> jax.Array:
        """Byte embedding + hashed n-gram embeddings of the n-grams ending at each position."""
        e = self.byte_embed(inputs_BxT)
        for n, table in zip(self.cfg.ngram_sizes, self.ngram_embeds):
            e = e + table(ngram_hashes(inputs_BxT, n, self.cfg.hash_table_size))
        return e.astype(self.dtype)

    def __call__(self, inputs_BxT: jax.Array, patch_lengths_BxP: jax.Array, *, embeddings_BxTxD: jax.Array | None = None) -> jax.Array:
        """Logits ``(B, T, V)`` for the ``T`` inputs; ``patch_lengths`` cover the ``T + 1`` window.

        ``embeddings_BxTxD`` replaces :meth:`embed` (causality tests differentiate through it).
        """
        cfg, dt = self.cfg, self.dtype
        B, T = inputs_BxT.shape
        P = patch_lengths_BxP.shape[1]
        k, dl = cfg.queries_per_patch, cfg.local_d_model
        pid_BxL = patch_ids_from_lengths(patch_lengths_BxP, T + 1)  # L = T + 1 ids of the window
        enc_pid_BxT = pid_BxL[:, :T]  # patch of each input position
        src_pid_BxT = pid_BxL[:, 1:] - 1  # decoder: the patch before the target's patch
        patch_valid_BxP = patch_lengths_BxP > 0

        # 1. local encoder
        h_BxTxD = self.embed(inputs_BxT) if embeddings_BxTxD is None else embeddings_BxTxD.astype(dt)
        h_BxTxD = self.encoder(h_BxTxD)

        # 2. patch pooling: segment max over each patch's own positions
        seg = (enc_pid_BxT + P * jnp.arange(B)[:, None]).reshape(-1)
        seg = jnp.where(enc_pid_BxT.reshape(-1) < P, seg, B * P)  # uncovered positions -> a dropped segment
        pooled = jax.ops.segment_max(h_BxTxD.reshape(B * T, dl), seg, num_segments=B * P + 1)[: B * P]
        n_inputs = jax.ops.segment_sum(jnp.ones(B * T, jnp.int32), seg, num_segments=B * P + 1)[: B * P]
        has_inputs_BxP = (n_inputs > 0).reshape(B, P)  # a patch made only of the final target has none
        pooled_BxPxD = jnp.where(has_inputs_BxP[..., None], pooled.reshape(B, P, dl), 0.0).astype(dt)
        queries_BxQxD = (pooled_BxPxD @ self.to_queries[...].astype(dt)).reshape(B, P * k, dl)
        if cfg.cross_attention:
            q_patch_Q = jnp.repeat(jnp.arange(P), k)
            own_BxQxT = q_patch_Q[None, :, None] == enc_pid_BxT[:, None, :]
            attended = self.encoder_cross(self.encoder_cross_norm(queries_BxQxD), kv_BxSxD=h_BxTxD, mask_BxTxS=own_BxQxT)
            has_bytes = jnp.any(own_BxQxT, axis=-1, keepdims=True)
            queries_BxQxD = queries_BxQxD + jnp.where(has_bytes, attended, 0.0)
        patches_BxPxG = queries_BxQxD.reshape(B, P, k * dl) @ self.to_global[...].astype(dt)
        patches_BxPxG = jnp.where((patch_valid_BxP & has_inputs_BxP)[..., None], patches_BxPxG, 0.0)

        # 3. global latent transformer over patches
        global_BxPxG = self.global_norm(self.global_stack(patches_BxPxG))

        # 4. local decoder: byte i reads the global output of the patch before its target's patch
        kv_BxQxD = (global_BxPxG @ self.from_global[...].astype(dt)).reshape(B, P * k, dl)
        has_src_BxT = src_pid_BxT >= 0
        if cfg.cross_attention:
            kv_patch_Q = jnp.repeat(jnp.arange(P), k)
            reads_BxTxQ = kv_patch_Q[None, None, :] == src_pid_BxT[:, :, None]
            ctx = self.decoder_cross(self.decoder_cross_norm(h_BxTxD), kv_BxSxD=kv_BxQxD, mask_BxTxS=reads_BxTxQ)
        else:  # the projected global state of the source patch, summed over its k slots
            per_patch = kv_BxQxD.reshape(B, P, k, dl).sum(axis=2)
            ctx = jnp.take_along_axis(per_patch, jnp.clip(src_pid_BxT, 0, P - 1)[..., None], axis=1)
        h_BxTxD = h_BxTxD + jnp.where(has_src_BxT[..., None], ctx, 0.0)
        return self.head(self.decoder_norm(self.decoder(h_BxTxD)))

    def score(self, batch: dict) -> Scores:
        """``batch["ids"]`` ``(B, T+1)`` and ``batch["patch_lengths"]`` ``(B, P)`` over the window."""
        ids = batch["ids"]
        return next_id_scores(self(ids[:, :-1], batch["patch_lengths"]), ids[:, 1:])
