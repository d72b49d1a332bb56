"""BLT, the Byte Latent Transformer (Pagnoni et al. 2024, "Byte Latent Transformer: Patches Scale
Better Than Tokens"), on the shared core. Reference implementation: facebookresearch/blt
(``bytelatent/model/blt.py``, ``local_models.py``, ``latent_transformer.py``).

The model takes a window of ids ``(B, T+1)`` and the **patch lengths** of that window
``(B, P)`` (computed outside the model by :mod:`bytelm.patching` from an entropy model; zero
entries are empty padding slots; position 0 is always a patch of its own). Positions ``0..T-1``
are the inputs; position ``i`` predicts id ``i + 1``.

1. **Local encoder.** Byte embedding plus hashed n-gram embeddings: for each ``n`` in
   ``ngram_sizes`` the n-gram of ids *ending* at position ``i`` is hashed into its own table of
   ``hash_table_size`` rows, and the rows are summed with the byte embedding (the reference's
   ``compute_hash_embeddings``). Every table, and the byte embedding, starts from a normal of
   std ``local_d_model ** -0.5`` truncated at 3 std (the reference's ``init_weights``): with
   N(0, 1) tables the six n-gram rows drown the byte's own embedding in noise. Then
   ``encoder_layers`` causal sliding-window blocks.
2. **Patch queries.** Each patch's bytes are max-pooled (``cross_attn_init_by_pooling`` with
   ``downsampling_by_pooling = "max"``) and projected to ``k = queries_per_patch`` queries, which
   cross-attend to the bytes of their own patch only, after the last encoder layer (or after
   every one, ``encoder_cross_all_layers``). Queries and keys/values are RMS-normalised
   (``cross_attn_norm_q`` / ``cross_attn_norm_kv``). The ``k`` outputs are concatenated and
   projected to the global width. Empty slots give zero vectors (never NaN).
3. **Global latent transformer**, causal over the ``P`` patch slots (padding slots come after
   every real patch, so no real patch sees them).
4. **Local decoder.** Its input is the encoder's byte states. The byte at position ``i`` (whose
   target ``i + 1`` lies in patch ``j``) cross-attends to the ``k`` key/value slots made from the
   global output of patch ``j - 1`` only: decoder patch ids are the patch ids of the *targets*,
   i.e. the lengths shifted by one position (the reference's ``decoder_patch_ids_from_lengths``);
   using the encoder's patch ids would leak the future. The cross-attention comes before every
   decoder layer (``decoder_cross_all_layers``, the reference's 1B configuration) or before the
   first only. Then the byte logits.

**Cross-attention by gather.** No tensor of shape ``B x P x T`` is formed: a patch's queries
attend to its own bytes, gathered (at most ``max_patch_len`` of them), and a byte attends to the
``k`` slots of its one source patch, gathered. When a window ran out of patch slots, its last
patch may hold more than ``max_patch_len`` bytes; its queries then see the first
``max_patch_len`` of them, which changes nothing: the last slot's global output is read by no
byte (the patch after it does not exist).

With ``cross_attention = False`` the cross-attentions are replaced by projections: the pooled
state itself is projected to the global width, and the global output of patch ``j - 1`` is
projected and added to the byte state once. With one byte per patch, no encoder/decoder layers,
no n-grams and identity projections, that variant is exactly a flat byte transformer ``G`` over
the byte embeddings ``e`` with an embedding skip into the head: ``logits_i = head(norm(e_i +
G(e)_i))``, ``G(e)_i`` seeing bytes ``<= i`` (the test that pins the alignment down).

``variant = "reference"`` is the architecture of Meta's released BLT exactly, which converted
checkpoints use (:mod:`bytelm.interop.hf`, ``docs/interop.md``): the reference's int64 n-gram hash
(:func:`reference_ngram_hashes`, one table per hash function and ``n``), cross-attention residuals
that add their queries twice (``2q + out``: the reference's cross-attention returns ``q + out`` and
its caller adds ``q`` again), and no norm after the global stack.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bytelm.constants import NUM_BYTE_IDS
from bytelm.models.attention import attend
from bytelm.models.cache import KVCache, block_extend, stack_cache, stack_extend
from bytelm.models.core import (
    COMPUTE_DTYPES, Dropout, Embed, RMSNorm, Transformer, apply_dropout, drop_at, drop_rows, head_logits, head_param, make_dropout, ngram_hashes,
    pad_vocab, param,
)
from bytelm.models.kernels import resolve_kernels
from bytelm.models.scoring import Scores, next_id_scores

# model.ngram_dropout's masks: the step's dropout key folded with this (model.dropout's sites are
# folded with 0 to 4: see BLT.__call__), so the two draw independent masks
NGRAM_DROPOUT_SITE = 5

# The reference's hash primes, one per hash function (``compute_hash_embeddings`` in
# facebookresearch/blt and in transformers' BLT port), cycled when there are more functions.
REFERENCE_PRIMES = (1000000007, 5915587277, 1500450271, 3267000013, 5754853343, 4093082899, 9576890767, 3628273133,
                    2860486313, 5463458053, 3367900313)
_LIMB = np.uint32(0xFFFF)


def reference_ngram_hashes(ids_BxT: jax.Array, n: int, table_size: int, prime: int) -> jax.Array:
    """The reference's row index of the n-gram ending at each position, exactly.

    The reference computes ``sum_j ids[i - n + 1 + j] * prime**j`` (oldest id first, ids before
    the start counting as 0) in wrapping int64 arithmetic, then Python's floor modulo by
    ``table_size``. JAX keeps int64 off by default, so the 64-bit sum is carried here as four
    16-bit limbs in uint32 (each limb sums at most 64 products of an id < 2^9 and a 16-bit limb
    of ``prime**j mod 2^64``, which stays below 2^32), the two's-complement sign is read from the
    top limb, and the modulo runs byte by byte (Horner's rule; ``table_size < 2^24`` keeps every
    partial product below 2^32).
    """
    T = ids_BxT.shape[1]
    padded = jnp.pad(ids_BxT.astype(jnp.uint32), ((0, 0), (n - 1, 0)))
    limbs = [jnp.zeros(ids_BxT.shape, jnp.uint32) for _ in range(4)]
    for j in range(n):
        power = pow(prime, j, 2**64)
        t = padded[:, j : j + T]
        for l in range(4):
            limbs[l] = limbs[l] + t * np.uint32((power >> (16 * l)) & 0xFFFF)
    carry = jnp.zeros(ids_BxT.shape, jnp.uint32)
    for l in range(4):
        v = limbs[l] + carry
        limbs[l], carry = v & _LIMB, v >> np.uint32(16)
    m = np.uint32(table_size)
    r = jnp.zeros(ids_BxT.shape, jnp.uint32)
    for l in reversed(range(4)):  # bytes from the most significant
        for shift in (8, 0):
            r = (r * np.uint32(256) + ((limbs[l] >> np.uint32(shift)) & np.uint32(0xFF))) % m
    negative = limbs[3] >= np.uint32(0x8000)  # the int64 sum was negative: subtract 2^64 (mod table_size)
    r = jnp.where(negative, (r + m - np.uint32(2**64 % table_size)) % m, r)
    return r.astype(jnp.int32)


def patch_ids_from_lengths(lengths_BxP: jax.Array, length: int) -> jax.Array:
    """Patch index of each of ``length`` positions; positions past the covered ones get ``P``.

    A mark at each patch's first position, then a running count (no ``B x P x L`` comparison)."""
    B, P = lengths_BxP.shape
    starts_BxP = jnp.cumsum(lengths_BxP, axis=1) - lengths_BxP
    marks_BxL = jnp.zeros((B, length + 1), jnp.int32)
    marks_BxL = marks_BxL.at[jnp.arange(B)[:, None], jnp.minimum(starts_BxP, length)].add((lengths_BxP > 0).astype(jnp.int32))
    pid_BxL = jnp.cumsum(marks_BxL[:, :length], axis=1) - 1
    covered_BxL = jnp.arange(length)[None, :] < jnp.sum(lengths_BxP, axis=1, keepdims=True)
    return jnp.where(covered_BxL, pid_BxL, P).astype(jnp.int32)


class PatchCrossAttention(nnx.Module):
    """Cross-attention of ``Q`` queries in each of ``M`` groups over ``J`` source rows gathered
    for that group: ``out[b, m] = attend(q[b, m], src[b, index[b, m]])`` over the valid rows.

    Keys and values are projected on the ``S`` source rows once and then gathered, so a row read
    by several groups is projected once. Queries and sources are RMS-normalised first; the output
    (zero for a group with no valid row) is meant to be added to the queries as a residual."""

    def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs, dtype, implementation: str, norm_eps: float = 1e-6):
        if d_model % n_heads:
            raise ValueError(f"cross-attention width {d_model} is not divisible by its {n_heads} heads")
        hk = (n_heads, d_model // n_heads)
        self.norm_q, self.norm_kv = RMSNorm(d_model, eps=norm_eps), RMSNorm(d_model, eps=norm_eps)
        self.wq = param(rngs, (d_model, *hk), ("embed", "heads", "kv"), fan_in=d_model)
        self.wk = param(rngs, (d_model, *hk), ("embed", "heads", "kv"), fan_in=d_model)
        self.wv = param(rngs, (d_model, *hk), ("embed", "heads", "kv"), fan_in=d_model)
        self.wo = param(rngs, (*hk, d_model), ("heads", "kv", "embed"), fan_in=d_model)
        self.dtype, self.implementation = dtype, implementation

    def __call__(self, q_BxMxQxD: jax.Array, src_BxSxD: jax.Array, index_BxMxJ: jax.Array, valid_BxMxJ: jax.Array) -> jax.Array:
        dt = self.dtype
        B, M, Q, D = q_BxMxQxD.shape
        J = index_BxMxJ.shape[-1]
        q = jnp.einsum("bmqd,dhk->bmqhk", self.norm_q(q_BxMxQxD).astype(dt), self.wq[...].astype(dt))
        src = self.norm_kv(src_BxSxD).astype(dt)
        k_BxSxHxK = jnp.einsum("bsd,dhk->bshk", src, self.wk[...].astype(dt))
        v_BxSxHxK = jnp.einsum("bsd,dhk->bshk", src, self.wv[...].astype(dt))
        flat = index_BxMxJ.reshape(B, M * J)
        gather = lambda x: jnp.take_along_axis(x, flat[:, :, None, None], axis=1)  # noqa: E731
        H, K = k_BxSxHxK.shape[2:]
        k_NxJxHxK = gather(k_BxSxHxK).reshape(B * M, J, H, K)
        v_NxJxHxK = gather(v_BxSxHxK).reshape(B * M, J, H, K)
        mask_NxQxJ = jnp.broadcast_to(valid_BxMxJ.reshape(B * M, 1, J), (B * M, Q, J))
        out_NxQxHxK = attend(q.reshape(B * M, Q, H, K), k_NxJxHxK, v_NxJxHxK, causal=False, mask_BxTxS=mask_NxQxJ, implementation=self.implementation)
        out_BxMxQxD = jnp.einsum("nqhk,hkd->nqd", out_NxQxHxK, self.wo[...].astype(dt)).reshape(B, M, Q, D)
        return jnp.where(jnp.any(valid_BxMxJ, axis=-1)[:, :, None, None], out_BxMxQxD, 0.0)


class BLT(nnx.Module):
    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.vocab_rows = pad_vocab(NUM_BYTE_IDS, cfg.vocab_multiple)
        dt = COMPUTE_DTYPES[cfg.dtype]
        kernels = resolve_kernels(cfg.attention, cfg.mlp, dtype=cfg.dtype, remat=cfg.remat)
        self.dtype = dt
        dl, dg, k = cfg.local_d_model, cfg.global_d_model, cfg.queries_per_patch
        std = dl**-0.5  # the reference's init of the byte and hash embeddings (truncated at 3 std)
        self.byte_embed = Embed(self.vocab_rows, dl, rngs=rngs, std=std, truncated=True)
        n_tables = len(cfg.ngram_sizes) * cfg.hash_functions
        self.ngram_embeds = nnx.List([Embed(cfg.hash_table_size, dl, rngs=rngs, std=std, truncated=True, hashed=True) for _ in range(n_tables)])
        self.reference = cfg.variant == "reference"
        local = dict(rngs=rngs, kernels=kernels, window=cfg.local_window, rope_base=cfg.rope_base, dtype=dt, norm_eps=cfg.norm_eps)
        self.encoder = Transformer(dl, cfg.encoder_layers, cfg.local_heads, cfg.local_mlp_dim, **local)
        self.to_queries = param(rngs, (dl, k * dl), ("embed", "mlp"))
        self.to_global = param(rngs, (k * dl, dg), ("mlp", "embed"))
        self.global_stack = Transformer(
            dg, cfg.global_layers, cfg.global_heads, cfg.global_mlp_dim, rngs=rngs, kernels=kernels, rope_base=cfg.rope_base, dtype=dt,
            scan=cfg.scan_layers, norm_eps=cfg.norm_eps,
        )
        self.global_norm = None if self.reference else RMSNorm(dg, eps=cfg.norm_eps)  # the reference has none
        self.from_global = param(rngs, (dg, k * dl), ("embed", "mlp"))
        cross = dict(rngs=rngs, dtype=dt, implementation=kernels.attention, norm_eps=cfg.norm_eps)
        n_enc, n_dec = cfg.cross_layers()
        self.encoder_cross = nnx.List([PatchCrossAttention(dl, cfg.cross_heads, **cross) for _ in range(n_enc)])
        self.decoder_cross = nnx.List([PatchCrossAttention(dl, cfg.cross_heads, **cross) for _ in range(n_dec)])
        self.decoder = Transformer(dl, cfg.decoder_layers, cfg.local_heads, cfg.local_mlp_dim, **local)
        self.decoder_norm = RMSNorm(dl, eps=cfg.norm_eps)
        self.head = head_param(rngs, dl, NUM_BYTE_IDS, cfg.vocab_multiple)

    def embed(self, inputs_BxT: jax.Array, ngram_drop: Dropout | None = None) -> jax.Array:
        """Byte embedding + hashed n-gram embeddings of the n-grams ending at each position
        (``ngram_drop``, training's ``model.ngram_dropout``: table ``i`` drops each position's row
        through ``ngram_drop.at(i)``)."""
        cfg = self.cfg
        if self.reference:  # one table per (hash function, n), function-major, as the reference fuses them
            sizes = [(REFERENCE_PRIMES[f % len(REFERENCE_PRIMES)], n) for f in range(cfg.hash_functions) for n in cfg.ngram_sizes]
            hashes = [reference_ngram_hashes(inputs_BxT, n, cfg.hash_table_size, prime) for prime, n in sizes]
        else:
            hashes = [ngram_hashes(inputs_BxT, n, cfg.hash_table_size) for n in cfg.ngram_sizes]
        e = self.byte_embed(inputs_BxT)
        for i, (rows, table) in enumerate(zip(hashes, self.ngram_embeds)):
            e = e + drop_rows(table(rows), drop_at(ngram_drop, i))
        return e.astype(self.dtype)

    def _residual(self, x: jax.Array, cross_out: jax.Array) -> jax.Array:
        """A cross-attention's residual: ``x + out``; the reference adds its queries twice (its
        cross-attention returns ``x + out`` and the caller adds ``x`` again)."""
        return x + x + cross_out if self.reference else x + cross_out

    def _global_out(self, out_BxPxG: jax.Array) -> jax.Array:
        return out_BxPxG if self.global_norm is None else self.global_norm(out_BxPxG)

    def __call__(
        self, inputs_BxT: jax.Array, patch_lengths_BxP: jax.Array, *, embeddings_BxTxD: jax.Array | None = None, drop: Dropout | None = None,
        ngram_drop: Dropout | None = None,
    ) -> jax.Array:
        """Logits ``(B, T, V)`` for the ``T`` inputs; ``patch_lengths`` cover the ``T + 1`` window.

        ``embeddings_BxTxD`` replaces :meth:`embed` (causality tests differentiate through it).
        ``drop`` (training): dropout on the byte + n-gram embeddings (site 0), in the encoder's
        blocks (1), on the global model's patch inputs (2), in the global stack (3) and in the
        decoder's blocks (4); not on the cross-attention outputs. ``ngram_drop``: on the n-gram
        tables' rows (:meth:`embed`).
        """
        cfg, dt = self.cfg, self.dtype
        B, T = inputs_BxT.shape
        P = patch_lengths_BxP.shape[1]
        k, dl = cfg.queries_per_patch, cfg.local_d_model
        pid_BxL = patch_ids_from_lengths(patch_lengths_BxP, T + 1)  # L = T + 1 ids of the window
        enc_pid_BxT = pid_BxL[:, :T]  # patch of each input position
        src_pid_BxT = pid_BxL[:, 1:] - 1  # decoder: the patch before the target's patch
        # the input bytes of each patch, gathered: patch p starts at s_p; row j is byte s_p + j
        starts_BxP = jnp.cumsum(patch_lengths_BxP, axis=1) - patch_lengths_BxP
        own_BxPxJ = starts_BxP[:, :, None] + jnp.arange(cfg.max_patch_len)[None, None, :]
        own_valid_BxPxJ = (jnp.arange(cfg.max_patch_len)[None, None, :] < patch_lengths_BxP[:, :, None]) & (own_BxPxJ < T)
        own_BxPxJ = jnp.minimum(own_BxPxJ, T - 1)
        has_inputs_BxP = own_valid_BxPxJ[:, :, 0]  # a patch made only of the final target has none

        # 1. local encoder; 2. patch queries from max-pooled bytes, cross-attending to their bytes
        h_BxTxD = self.embed(inputs_BxT, ngram_drop) if embeddings_BxTxD is None else embeddings_BxTxD.astype(dt)
        h_BxTxD = apply_dropout(h_BxTxD, drop_at(drop, 0))
        queries_BxPxkxD = None
        cross_after = len(self.encoder.blocks) - 1 if not cfg.encoder_cross_all_layers else 0
        for i, block in enumerate(self.encoder.blocks):
            h_BxTxD = block(h_BxTxD, window=self.encoder.window, drop=drop_at(drop_at(drop, 1), i))
            if i >= cross_after and cfg.cross_attention:
                queries_BxPxkxD = self._encoder_cross(i - cross_after, queries_BxPxkxD, h_BxTxD, own_BxPxJ, own_valid_BxPxJ)
        if queries_BxPxkxD is None:  # no encoder layers (or no cross-attention): the pooled queries alone
            queries_BxPxkxD = self._pooled_queries(h_BxTxD, own_BxPxJ, own_valid_BxPxJ)
            if cfg.cross_attention:
                queries_BxPxkxD = self._residual(queries_BxPxkxD, self.encoder_cross[0](queries_BxPxkxD, h_BxTxD, own_BxPxJ, own_valid_BxPxJ))
        patches_BxPxG = queries_BxPxkxD.reshape(B, P, k * dl) @ self.to_global[...].astype(dt)
        patches_BxPxG = jnp.where(((patch_lengths_BxP > 0) & has_inputs_BxP)[..., None], patches_BxPxG, 0.0)

        # 3. global latent transformer over patches
        patches_BxPxG = apply_dropout(patches_BxPxG, drop_at(drop, 2))
        global_BxPxG = self._global_out(self.global_stack(patches_BxPxG, drop=drop_at(drop, 3)))

        # 4. local decoder: byte i reads the global output of the patch before its target's patch
        slots_BxQxD = (global_BxPxG @ self.from_global[...].astype(dt)).reshape(B, P * k, dl)
        has_src_BxT = (src_pid_BxT >= 0) & cfg.global_path  # global_path = False: what the global model is worth
        src_BxT = jnp.clip(src_pid_BxT, 0, P - 1)
        if not cfg.cross_attention:  # the projected global state of the source patch, summed over its k slots
            per_patch_BxPxD = slots_BxQxD.reshape(B, P, k, dl).sum(axis=2)
            ctx_BxTxD = jnp.take_along_axis(per_patch_BxPxD, src_BxT[..., None], axis=1)
            h_BxTxD = h_BxTxD + jnp.where(has_src_BxT[..., None], ctx_BxTxD, 0.0)
            return head_logits(self.decoder_norm(self.decoder(h_BxTxD, drop=drop_at(drop, 4))), self.head[...], NUM_BYTE_IDS, dt)
        slot_BxTxk = src_BxT[:, :, None] * k + jnp.arange(k)[None, None, :]
        slot_valid_BxTxk = jnp.broadcast_to(has_src_BxT[:, :, None], slot_BxTxk.shape)
        blocks = list(self.decoder.blocks)
        for i in range(max(len(blocks), 1)):
            if i < len(self.decoder_cross):
                ctx = self.decoder_cross[i](h_BxTxD[:, :, None, :], slots_BxQxD, slot_BxTxk, slot_valid_BxTxk)
                h_BxTxD = self._residual(h_BxTxD, ctx[:, :, 0, :])
            if i < len(blocks):
                h_BxTxD = blocks[i](h_BxTxD, window=self.decoder.window, drop=drop_at(drop_at(drop, 4), i))
        return head_logits(self.decoder_norm(h_BxTxD), self.head[...], NUM_BYTE_IDS, dt)

    def _pooled_queries(self, h_BxTxD, own_BxPxJ, own_valid_BxPxJ) -> jax.Array:
        """``k`` queries per patch from the max over its own bytes (zero for a patch without bytes)."""
        B, P, J = own_BxPxJ.shape
        k, dl, dt = self.cfg.queries_per_patch, self.cfg.local_d_model, self.dtype
        rows_BxPxJxD = jnp.take_along_axis(h_BxTxD, own_BxPxJ.reshape(B, P * J)[:, :, None], axis=1).reshape(B, P, J, dl)
        neg = jnp.asarray(jnp.finfo(rows_BxPxJxD.dtype).min, rows_BxPxJxD.dtype)
        pooled_BxPxD = jnp.max(jnp.where(own_valid_BxPxJ[..., None], rows_BxPxJxD, neg), axis=2)
        pooled_BxPxD = jnp.where(own_valid_BxPxJ[:, :, :1], pooled_BxPxD, 0.0).astype(dt)
        return (pooled_BxPxD @ self.to_queries[...].astype(dt)).reshape(B, P, k, dl)

    def _encoder_cross(self, i, queries_BxPxkxD, h_BxTxD, own_BxPxJ, own_valid_BxPxJ) -> jax.Array:
        """Cross-attention ``i`` of the patch queries to their own bytes (pooled at the first)."""
        if queries_BxPxkxD is None:
            queries_BxPxkxD = self._pooled_queries(h_BxTxD, own_BxPxJ, own_valid_BxPxJ)
        return self._residual(queries_BxPxkxD, self.encoder_cross[i](queries_BxPxkxD, h_BxTxD, own_BxPxJ, own_valid_BxPxJ))

    # -- decoding (bytelm.sampling): bytes through the local models, patches through the global ----
    def init_cache(self, batch: int, slots: int, max_patches: int) -> dict[str, list[KVCache]]:
        """Empty caches: the local encoder's and decoder's over ``slots`` byte positions, the global
        stack's over ``max_patches`` patch positions."""
        return {
            "encoder": stack_cache(self.encoder, batch, slots),
            "global": stack_cache(self.global_stack, batch, max_patches),
            "decoder": stack_cache(self.decoder, batch, slots),
        }

    def encode_extend(self, ids_BxN: jax.Array, context_BxC: jax.Array, caches: list[KVCache], pos0: jax.Array):
        """The local encoder over ``N`` new ids at positions ``pos0 ..``; ``context`` holds the ids
        just before them (PAD before the start), as many as the longest n-gram needs. Returns each
        encoder layer's states of the new ids (the embeddings when there is no layer) and the caches."""
        N = ids_BxN.shape[1]
        h_BxNxD = self.embed(jnp.concatenate([context_BxC, ids_BxN], axis=1))[:, -N:]
        states = [] if self.encoder.blocks else [h_BxNxD]
        new = []
        for block, cache in zip(self.encoder.blocks, caches):
            h_BxNxD, cache = block_extend(block, h_BxNxD, cache, pos0, self.encoder.window)
            states.append(h_BxNxD)
            new.append(cache)
        return states, new

    def close_patches(self, states: list[jax.Array], lengths_BxP: jax.Array) -> jax.Array:
        """The global-width vectors of ``P`` complete patches, made of the ``M`` bytes whose states
        (one ``B x M x D`` array per encoder layer, from :meth:`encode_extend`) are given in order."""
        cfg, dt = self.cfg, self.dtype
        B, P = lengths_BxP.shape
        M = states[0].shape[1]
        J, k, dl = cfg.max_patch_len, cfg.queries_per_patch, cfg.local_d_model
        starts_BxP = jnp.cumsum(lengths_BxP, axis=1) - lengths_BxP
        own_BxPxJ = starts_BxP[:, :, None] + jnp.arange(J)[None, None, :]
        own_valid_BxPxJ = (jnp.arange(J)[None, None, :] < lengths_BxP[:, :, None]) & (own_BxPxJ < M)
        own_BxPxJ = jnp.minimum(own_BxPxJ, M - 1)
        if not cfg.cross_attention:
            queries = self._pooled_queries(states[-1], own_BxPxJ, own_valid_BxPxJ)
        elif not self.encoder.blocks:
            queries = self._pooled_queries(states[0], own_BxPxJ, own_valid_BxPxJ)
            queries = self._residual(queries, self.encoder_cross[0](queries, states[0], own_BxPxJ, own_valid_BxPxJ))
        else:
            cross_after = len(self.encoder.blocks) - 1 if not cfg.encoder_cross_all_layers else 0
            queries = None
            for i, layer_states in enumerate(states[cross_after:]):
                queries = self._encoder_cross(i, queries, layer_states, own_BxPxJ, own_valid_BxPxJ)
        patches_BxPxG = queries.reshape(B, P, k * dl) @ self.to_global[...].astype(dt)
        return jnp.where((lengths_BxP > 0)[..., None], patches_BxPxG, 0.0)

    def global_extend(self, patches_BxNxG: jax.Array, caches: list[KVCache], pos0: jax.Array):
        """The global step for ``N`` new patches: their ``k`` key/value slots for the decoder,
        ``B x N x k x D``, and the caches."""
        B, N, _ = patches_BxNxG.shape
        out_BxNxG, caches = stack_extend(self.global_stack, patches_BxNxG, caches, pos0)
        slots = self._global_out(out_BxNxG) @ self.from_global[...].astype(self.dtype)
        return slots.reshape(B, N, self.cfg.queries_per_patch, self.cfg.local_d_model), caches

    def decode_extend(self, h_BxNxD: jax.Array, slots_BxNxkxD: jax.Array, has_src_BxN: jax.Array, caches: list[KVCache], pos0: jax.Array):
        """Logits for ``N`` new positions: each byte's encoder state (the decoder's input) reads the
        ``k`` slots of its source patch (``has_src`` False: none), through the decoder layers."""
        cfg, dt = self.cfg, self.dtype
        B, N, k, dl = slots_BxNxkxD.shape
        has_src_BxN = has_src_BxN & cfg.global_path
        blocks, new = list(self.decoder.blocks), list(caches)
        if not cfg.cross_attention:
            h_BxNxD = h_BxNxD + jnp.where(has_src_BxN[..., None], slots_BxNxkxD.sum(axis=2), 0.0)
            h_BxNxD, new = stack_extend(self.decoder, h_BxNxD, caches, pos0)
            return head_logits(self.decoder_norm(h_BxNxD), self.head[...], NUM_BYTE_IDS, dt), new
        src_BxSxD = slots_BxNxkxD.reshape(B, N * k, dl)
        index_BxNxk = jnp.broadcast_to(jnp.arange(N)[:, None] * k + jnp.arange(k)[None, :], (B, N, k))
        valid_BxNxk = jnp.broadcast_to(has_src_BxN[:, :, None], (B, N, k))
        for i in range(max(len(blocks), 1)):
            if i < len(self.decoder_cross):
                h_BxNxD = self._residual(h_BxNxD, self.decoder_cross[i](h_BxNxD[:, :, None, :], src_BxSxD, index_BxNxk, valid_BxNxk)[:, :, 0, :])
            if i < len(blocks):
                h_BxNxD, new[i] = block_extend(blocks[i], h_BxNxD, caches[i], pos0, self.decoder.window)
        return head_logits(self.decoder_norm(h_BxNxD), self.head[...], NUM_BYTE_IDS, dt), new

    def score(self, batch: dict, *, dropout_key: jax.Array | None = None) -> Scores:
        """``batch["ids"]`` ``(B, T+1)`` and ``batch["patch_lengths"]`` ``(B, P)`` over the window.
        ``dropout_key`` (training only) turns on ``model.dropout`` and ``model.ngram_dropout`` (its
        own stream: the key folded with :data:`NGRAM_DROPOUT_SITE`)."""
        ids = batch["ids"]
        drop = make_dropout(self.cfg.dropout, dropout_key)
        ngram_drop = drop_at(make_dropout(self.cfg.ngram_dropout, dropout_key), NGRAM_DROPOUT_SITE)
        return next_id_scores(self(ids[:, :-1], batch["patch_lengths"], drop=drop, ngram_drop=ngram_drop), ids[:, 1:])
