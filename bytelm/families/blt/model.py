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
   std ``local.d_model ** -0.5`` truncated at 3 std (the reference's ``init_weights``): with
   N(0, 1) tables the six n-gram rows drown the byte's own embedding in noise. Then
   ``local.encoder_layers`` causal sliding-window blocks.
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

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bytelm.constants import NUM_BYTE_IDS
from bytelm.models.attention import attend
from bytelm.models.cache import KVCache, offset_positions
from bytelm.models.core import (
    COMPUTE_DTYPES,
    Dropout,
    Embed,
    RMSNorm,
    apply_dropout,
    drop_at,
    drop_rows,
    head_logits,
    head_param,
    make_dropout,
    ngram_hashes,
    pad_vocab,
    param,
)
from bytelm.models.kernels import resolve_kernels
from bytelm.models.scoring import Scores, next_id_scores
from bytelm.models.stack import Transformer

# model.ngram_dropout's masks: the step's dropout key folded with this (model.dropout's sites are
# folded with 0 to 4: see BLT.__call__), so the two draw independent masks
NGRAM_DROPOUT_SITE = 5

# The reference's hash primes, one per hash function (``compute_hash_embeddings`` in
# facebookresearch/blt and in transformers' BLT port), cycled when there are more functions.
REFERENCE_PRIMES = (
    1000000007,
    5915587277,
    1500450271,
    3267000013,
    5754853343,
    4093082899,
    9576890767,
    3628273133,
    2860486313,
    5463458053,
    3367900313,
)
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
        for i in range(4):
            limbs[i] = limbs[i] + t * np.uint32((power >> (16 * i)) & 0xFFFF)
    carry = jnp.zeros(ids_BxT.shape, jnp.uint32)
    for i in range(4):
        v = limbs[i] + carry
        limbs[i], carry = v & _LIMB, v >> np.uint32(16)
    m = np.uint32(table_size)
    r = jnp.zeros(ids_BxT.shape, jnp.uint32)
    for i in reversed(range(4)):  # bytes from the most significant
        for shift in (8, 0):
            r = (r * np.uint32(256) + ((limbs[i] >> np.uint32(shift)) & np.uint32(0xFF))) % m
    negative = limbs[3] >= np.uint32(0x8000)  # the int64 sum was negative: subtract 2^64 (mod table_size)
    r = jnp.where(negative, (r + m - np.uint32(2**64 % table_size)) % m, r)
    return r.astype(jnp.int32)


def patch_ids_from_lengths(lengths_BxP: jax.Array, length: int) -> jax.Array:
    """Patch index of each of ``length`` positions; positions past the covered ones get ``P``.

    A mark at each patch's first position, then a running count (no ``B x P x L`` comparison)."""
    B, P = lengths_BxP.shape
    starts_BxP = jnp.cumsum(lengths_BxP, axis=1) - lengths_BxP
    marks_BxL = jnp.zeros((B, length + 1), jnp.int32)
    marks_BxL = marks_BxL.at[jnp.arange(B)[:, None], jnp.minimum(starts_BxP, length)].add(
        (lengths_BxP > 0).astype(jnp.int32)
    )
    pid_BxL = jnp.cumsum(marks_BxL[:, :length], axis=1) - 1
    covered_BxL = jnp.arange(length)[None, :] < jnp.sum(lengths_BxP, axis=1, keepdims=True)
    return jnp.where(covered_BxL, pid_BxL, P).astype(jnp.int32)


class PatchCrossAttention(nnx.Module):
    """Cross-attention of ``Q`` queries in each of ``M`` groups over ``J`` source rows gathered
    for that group: ``out[b, m] = attend(q[b, m], src[b, index[b, m]])`` over the valid rows.

    Keys and values are projected on the ``S`` source rows once and then gathered, so a row read
    by several groups is projected once. Queries and sources are RMS-normalised first; the output
    (zero for a group with no valid row) is meant to be added to the queries as a residual."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        rngs: nnx.Rngs,
        dtype,
        implementation: str,
        norm_eps: float = 1e-6,
    ):
        if d_model % n_heads:
            raise ValueError(f"cross-attention width {d_model} is not divisible by its {n_heads} heads")
        hk = (n_heads, d_model // n_heads)
        self.norm_q, self.norm_kv = RMSNorm(d_model, eps=norm_eps), RMSNorm(d_model, eps=norm_eps)
        self.wq = param(rngs, (d_model, *hk), ("embed", "heads", "kv"), fan_in=d_model)
        self.wk = param(rngs, (d_model, *hk), ("embed", "heads", "kv"), fan_in=d_model)
        self.wv = param(rngs, (d_model, *hk), ("embed", "heads", "kv"), fan_in=d_model)
        self.wo = param(rngs, (*hk, d_model), ("heads", "kv", "embed"), fan_in=d_model)
        self.dtype, self.implementation = dtype, implementation

    def __call__(
        self, q_BxMxQxD: jax.Array, src_BxSxD: jax.Array, index_BxMxJ: jax.Array, valid_BxMxJ: jax.Array
    ) -> jax.Array:
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
        out_NxQxHxK = attend(
            q.reshape(B * M, Q, H, K),
            k_NxJxHxK,
            v_NxJxHxK,
            causal=False,
            mask_BxTxS=mask_NxQxJ,
            implementation=self.implementation,
        )
        out_BxMxQxD = jnp.einsum("nqhk,hkd->nqd", out_NxQxHxK, self.wo[...].astype(dt)).reshape(B, M, Q, D)
        return jnp.where(jnp.any(valid_BxMxJ, axis=-1)[:, :, None, None], out_BxMxQxD, 0.0)


@dataclasses.dataclass(frozen=True)
class Variant:
    """What Meta's released BLT does differently from bytelm's own (``model.variant``), in one place:
    the reference's int64 n-gram hash with one table per (hash function, n), cross-attention residuals
    that add their queries twice, and no norm after the global stack."""

    name: str
    reference_hash: bool
    double_residual: bool
    global_norm: bool

    @classmethod
    def of(cls, cfg) -> Variant:
        if cfg.variant == "reference":
            return cls("reference", reference_hash=True, double_residual=True, global_norm=False)
        return cls("bytelm", reference_hash=False, double_residual=False, global_norm=True)

    def residual(self, x: jax.Array, cross_out: jax.Array) -> jax.Array:
        """A cross-attention's residual: ``x + out``; the reference adds its queries twice (its
        cross-attention returns ``x + out`` and the caller adds ``x`` again)."""
        return x + x + cross_out if self.double_residual else x + cross_out

    def hashes(self, cfg, inputs_BxT: jax.Array) -> list[jax.Array]:
        """The rows of the n-grams ending at each position, one array per table."""
        if (
            self.reference_hash
        ):  # one table per (hash function, n), function-major, as the reference fuses them
            sizes = [
                (REFERENCE_PRIMES[f % len(REFERENCE_PRIMES)], n)
                for f in range(cfg.hash_functions)
                for n in cfg.ngram_sizes
            ]
            return [reference_ngram_hashes(inputs_BxT, n, cfg.hash_table_size, prime) for prime, n in sizes]
        return [ngram_hashes(inputs_BxT, n, cfg.hash_table_size) for n in cfg.ngram_sizes]


def _own_bytes(lengths_BxP: jax.Array, n_rows: int, max_patch_len: int) -> tuple[jax.Array, jax.Array]:
    """Each patch's byte rows among ``n_rows`` byte states: ``(index_BxPxJ, valid_BxPxJ)``, row ``j`` of
    patch ``p`` being byte ``s_p + j`` (``J = max_patch_len``: a patch's queries see its first ``J``
    bytes); bytes past the ``n_rows`` given (the window's final target) are not valid."""
    starts_BxP = jnp.cumsum(lengths_BxP, axis=1) - lengths_BxP
    own_BxPxJ = starts_BxP[:, :, None] + jnp.arange(max_patch_len)[None, None, :]
    valid_BxPxJ = (jnp.arange(max_patch_len)[None, None, :] < lengths_BxP[:, :, None]) & (own_BxPxJ < n_rows)
    return jnp.minimum(own_BxPxJ, n_rows - 1), valid_BxPxJ


class LocalEncoder(nnx.Module):
    """Steps 1-2: bytes to byte states (embeddings, hashed n-grams, the windowed layers), and
    patches of byte states to global-width patch vectors (max-pooled queries cross-attending to
    their own bytes). One code path for a whole window and for the new ids of a cached step."""

    def __init__(
        self,
        cfg,
        variant: Variant,
        byte_embed: Embed,
        ngram_embeds: nnx.List,
        stack: Transformer,
        to_queries: nnx.Param,
        to_global: nnx.Param,
        cross: nnx.List,
        dtype,
    ):
        self.cfg, self.variant, self.dtype = cfg, variant, dtype
        self.byte_embed, self.ngram_embeds, self.stack = byte_embed, ngram_embeds, stack
        self.to_queries, self.to_global, self.cross = to_queries, to_global, cross

    def embed(self, inputs_BxT: jax.Array, ngram_drop: Dropout | None = None) -> jax.Array:
        """Byte embedding + hashed n-gram embeddings of the n-grams ending at each position
        (``ngram_drop``, training's ``model.ngram_dropout``: table ``i`` drops each position's row
        through ``ngram_drop.at(i)``)."""
        e = self.byte_embed(inputs_BxT)
        for i, (rows, table) in enumerate(zip(self.variant.hashes(self.cfg, inputs_BxT), self.ngram_embeds)):
            e = e + drop_rows(table(rows), drop_at(ngram_drop, i))
        return e.astype(self.dtype)

    def __call__(
        self,
        ids_BxN: jax.Array,
        *,
        context_BxC: jax.Array | None = None,
        cache: list[KVCache] | None = None,
        pos0=0,
        embeddings_BxNxD: jax.Array | None = None,
        drop: Dropout | None = None,
        ngram_drop: Dropout | None = None,
    ) -> tuple[list[jax.Array], list[KVCache] | None]:
        """Each encoder layer's states of the ids (the embeddings when there is no layer), and the
        caches. A whole window: ``cache`` None. A cached step: the ``N`` new ids at positions
        ``pos0 ..``, ``context_BxC`` the ids just before them (PAD before the start) as many as the
        longest n-gram needs. ``embeddings_BxNxD`` replaces :meth:`embed` (causality tests
        differentiate through it); ``drop``: dropout on the embeddings (site 0) and in the layers (1)."""
        N = ids_BxN.shape[1]
        if embeddings_BxNxD is not None:
            h_BxNxD = embeddings_BxNxD.astype(self.dtype)
        elif context_BxC is not None:
            h_BxNxD = self.embed(jnp.concatenate([context_BxC, ids_BxN], axis=1), ngram_drop)[:, -N:]
        else:
            h_BxNxD = self.embed(ids_BxN, ngram_drop)
        h_BxNxD = apply_dropout(h_BxNxD, drop_at(drop, 0))
        positions_BxN = None if cache is None else offset_positions(pos0, *ids_BxN.shape[:2])
        states, new = [], []  # (new: the layers' updated caches, in a cached call)
        for i, block in enumerate(self.stack.blocks):
            h_BxNxD, layer_cache = block.apply(
                h_BxNxD,
                positions_BxT=positions_BxN,
                window=self.stack.window,
                drop=drop_at(drop_at(drop, 1), i),
                cache=None if cache is None else cache[i],
            )
            states.append(h_BxNxD)
            if layer_cache is not None:
                new.append(layer_cache)
        return states or [h_BxNxD], (None if cache is None else new)

    def pooled_queries(
        self, h_BxMxD: jax.Array, own_BxPxJ: jax.Array, own_valid_BxPxJ: jax.Array
    ) -> jax.Array:
        """``k`` queries per patch from the max over its own bytes (zero for a patch without bytes)."""
        B, P, J = own_BxPxJ.shape
        k, dl, dt = self.cfg.queries_per_patch, self.cfg.local.d_model, self.dtype
        rows_BxPxJxD = jnp.take_along_axis(h_BxMxD, own_BxPxJ.reshape(B, P * J)[:, :, None], axis=1).reshape(
            B, P, J, dl
        )
        neg = jnp.asarray(jnp.finfo(rows_BxPxJxD.dtype).min, rows_BxPxJxD.dtype)
        pooled_BxPxD = jnp.max(jnp.where(own_valid_BxPxJ[..., None], rows_BxPxJxD, neg), axis=2)
        pooled_BxPxD = jnp.where(own_valid_BxPxJ[:, :, :1], pooled_BxPxD, 0.0).astype(dt)
        return (pooled_BxPxD @ self.to_queries[...].astype(dt)).reshape(B, P, k, dl)

    def patches(self, states: list[jax.Array], lengths_BxP: jax.Array) -> jax.Array:
        """The global-width vectors of the ``P`` patches whose bytes' states (one ``B x M x D`` array per
        encoder layer, from :meth:`__call__`) are given in order; zero for an empty slot or a patch
        holding only the window's final target."""
        cfg, dt = self.cfg, self.dtype
        B, P = lengths_BxP.shape
        own_BxPxJ, own_valid_BxPxJ = _own_bytes(lengths_BxP, states[0].shape[1], cfg.max_patch_len)
        if not cfg.cross_attention:
            queries = self.pooled_queries(states[-1], own_BxPxJ, own_valid_BxPxJ)
        elif not self.stack.blocks:  # no encoder layers: the pooled queries attend to the embeddings
            queries = self.pooled_queries(states[0], own_BxPxJ, own_valid_BxPxJ)
            queries = self.variant.residual(
                queries, self.cross[0](queries, states[0], own_BxPxJ, own_valid_BxPxJ)
            )
        else:  # after the last layer, or after every one (pooled at the first)
            cross_after = len(self.stack.blocks) - 1 if not cfg.encoder_cross_all_layers else 0
            queries = self.pooled_queries(states[cross_after], own_BxPxJ, own_valid_BxPxJ)
            for i, layer_states in enumerate(states[cross_after:]):
                queries = self.variant.residual(
                    queries, self.cross[i](queries, layer_states, own_BxPxJ, own_valid_BxPxJ)
                )
        patches_BxPxG = queries.reshape(B, P, cfg.queries_per_patch * cfg.local.d_model) @ self.to_global[
            ...
        ].astype(dt)
        return jnp.where(((lengths_BxP > 0) & own_valid_BxPxJ[:, :, 0])[..., None], patches_BxPxG, 0.0)


class GlobalModel(nnx.Module):
    """Step 3: the latent transformer, causal over patch vectors, and its outputs as the ``k``
    key/value slots per patch that the decoder reads. A whole window (``cache`` None) or new patches."""

    def __init__(self, cfg, stack: Transformer, norm: RMSNorm | None, from_global: nnx.Param, dtype):
        self.cfg, self.stack, self.norm, self.from_global, self.dtype = cfg, stack, norm, from_global, dtype

    def __call__(
        self,
        patches_BxPxG: jax.Array,
        *,
        cache: list[KVCache] | None = None,
        pos0=0,
        drop: Dropout | None = None,
    ) -> tuple[jax.Array, list[KVCache] | None]:
        """``(slots_BxPxkxD, caches)``; ``drop``: dropout on the patch inputs (site 2) and in the stack
        (3)."""
        B, P, _ = patches_BxPxG.shape
        x_BxPxG = apply_dropout(patches_BxPxG, drop_at(drop, 2))
        positions_BxP = None if cache is None else offset_positions(pos0, B, P)
        out_BxPxG, new = self.stack.apply(
            x_BxPxG, positions_BxT=positions_BxP, drop=drop_at(drop, 3), cache=cache
        )
        if self.norm is not None:  # (the reference has none)
            out_BxPxG = self.norm(out_BxPxG)
        slots = out_BxPxG @ self.from_global[...].astype(self.dtype)
        return slots.reshape(B, P, self.cfg.queries_per_patch, self.cfg.local.d_model), new


class LocalDecoder(nnx.Module):
    """Step 4: each byte state reads the ``k`` slots of its source patch (the patch before its
    target's), before every decoder layer or the first, then the layers and the head. A whole
    window (``cache`` None) or the new positions of a cached step."""

    def __init__(
        self,
        cfg,
        variant: Variant,
        cross: nnx.List,
        stack: Transformer,
        norm: RMSNorm,
        head: nnx.Param,
        dtype,
    ):
        self.cfg, self.variant, self.cross, self.stack, self.norm, self.head, self.dtype = (
            cfg,
            variant,
            cross,
            stack,
            norm,
            head,
            dtype,
        )

    def __call__(
        self,
        h_BxTxD: jax.Array,
        slots_BxSxD: jax.Array,
        index_BxTxk: jax.Array,
        valid_BxT: jax.Array,
        *,
        cache: list[KVCache] | None = None,
        pos0=0,
        drop: Dropout | None = None,
    ) -> tuple[jax.Array, list[KVCache] | None]:
        """Logits ``(B, T, V)`` and the caches. Byte ``t`` reads the slot rows ``index[t]`` of
        ``slots_BxSxD`` when ``valid[t]`` (a byte of the first patch has no source);
        ``drop``: dropout in the decoder's layers (site 4)."""
        cfg, dt = self.cfg, self.dtype
        B, T, k = index_BxTxk.shape
        valid_BxT = valid_BxT & cfg.global_path  # global_path = False: what the global model is worth
        positions_BxT = None if cache is None else offset_positions(pos0, B, T)
        if not cfg.cross_attention:  # the projected global state of the source patch, summed over its k slots
            rows_BxTxkxD = jnp.take_along_axis(
                slots_BxSxD, index_BxTxk.reshape(B, T * k)[:, :, None], axis=1
            ).reshape(B, T, k, -1)
            h_BxTxD = h_BxTxD + jnp.where(valid_BxT[..., None], rows_BxTxkxD.sum(axis=2), 0.0)
            h_BxTxD, cache = self.stack.apply(
                h_BxTxD, positions_BxT=positions_BxT, drop=drop_at(drop, 4), cache=cache
            )
            return head_logits(self.norm(h_BxTxD), self.head[...], NUM_BYTE_IDS, dt), cache
        blocks = list(self.stack.blocks)
        new: list[KVCache] = []  # the layers' updated caches, in a cached call
        valid_BxTxk = jnp.broadcast_to(valid_BxT[:, :, None], index_BxTxk.shape)
        for i in range(max(len(blocks), 1)):
            if i < len(self.cross):
                ctx = self.cross[i](h_BxTxD[:, :, None, :], slots_BxSxD, index_BxTxk, valid_BxTxk)
                h_BxTxD = self.variant.residual(h_BxTxD, ctx[:, :, 0, :])
            if i < len(blocks):
                h_BxTxD, layer_cache = blocks[i].apply(
                    h_BxTxD,
                    positions_BxT=positions_BxT,
                    window=self.stack.window,
                    drop=drop_at(drop_at(drop, 4), i),
                    cache=None if cache is None else cache[i],
                )
                if layer_cache is not None:
                    new.append(layer_cache)
        return head_logits(self.norm(h_BxTxD), self.head[...], NUM_BYTE_IDS, dt), (
            None if cache is None else new
        )


class BLT(nnx.Module):
    """The model: :class:`LocalEncoder`, :class:`GlobalModel`, :class:`LocalDecoder` (the module
    docstring's steps), one code path for training, scoring and cached sampling."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.vocab_rows = pad_vocab(NUM_BYTE_IDS, cfg.vocab_multiple)
        dt = COMPUTE_DTYPES[cfg.dtype]
        kernels = resolve_kernels(cfg.attention, cfg.mlp, dtype=cfg.dtype, remat=cfg.remat)
        self.dtype = dt
        self.variant = Variant.of(cfg)
        dl, dg, k = cfg.local.d_model, cfg.global_.d_model, cfg.queries_per_patch
        # the parameters in one fixed order (it decides the initialisation), then the three modules
        std = dl**-0.5  # the reference's init of the byte and hash embeddings (truncated at 3 std)
        byte_embed = Embed(self.vocab_rows, dl, rngs=rngs, std=std, truncated=True)
        n_tables = len(cfg.ngram_sizes) * cfg.hash_functions
        ngram_embeds = nnx.List(
            [
                Embed(cfg.hash_table_size, dl, rngs=rngs, std=std, truncated=True, hashed=True)
                for _ in range(n_tables)
            ]
        )
        local = dict(
            rngs=rngs,
            kernels=kernels,
            window=cfg.local.window,
            rope_base=cfg.rope_base,
            dtype=dt,
            norm_eps=cfg.norm_eps,
        )
        encoder_stack = Transformer(dl, cfg.local.encoder_layers, cfg.local.heads, cfg.local.mlp_dim, **local)
        to_queries = param(rngs, (dl, k * dl), ("embed", "mlp"))
        to_global = param(rngs, (k * dl, dg), ("mlp", "embed"))
        global_stack = Transformer(
            dg,
            cfg.global_.layers,
            cfg.global_.heads,
            cfg.global_.mlp_dim,
            rngs=rngs,
            kernels=kernels,
            rope_base=cfg.rope_base,
            dtype=dt,
            scan=cfg.scan_layers,
            norm_eps=cfg.norm_eps,
        )
        global_norm = RMSNorm(dg, eps=cfg.norm_eps) if self.variant.global_norm else None
        from_global = param(rngs, (dg, k * dl), ("embed", "mlp"))
        cross = dict(rngs=rngs, dtype=dt, implementation=kernels.attention, norm_eps=cfg.norm_eps)
        n_enc, n_dec = cfg.cross_layers()
        encoder_cross = nnx.List([PatchCrossAttention(dl, cfg.cross_heads, **cross) for _ in range(n_enc)])
        decoder_cross = nnx.List([PatchCrossAttention(dl, cfg.cross_heads, **cross) for _ in range(n_dec)])
        decoder_stack = Transformer(dl, cfg.local.decoder_layers, cfg.local.heads, cfg.local.mlp_dim, **local)
        decoder_norm = RMSNorm(dl, eps=cfg.norm_eps)
        head = head_param(rngs, dl, NUM_BYTE_IDS, cfg.vocab_multiple)
        self.encoder = LocalEncoder(
            cfg,
            self.variant,
            byte_embed,
            ngram_embeds,
            encoder_stack,
            to_queries,
            to_global,
            encoder_cross,
            dt,
        )
        self.latent = GlobalModel(cfg, global_stack, global_norm, from_global, dt)
        self.decoder = LocalDecoder(cfg, self.variant, decoder_cross, decoder_stack, decoder_norm, head, dt)

    def __call__(
        self,
        inputs_BxT: jax.Array,
        patch_lengths_BxP: jax.Array,
        *,
        embeddings_BxTxD: jax.Array | None = None,
        drop: Dropout | None = None,
        ngram_drop: Dropout | None = None,
    ) -> jax.Array:
        """Logits ``(B, T, V)`` for the ``T`` inputs; ``patch_lengths`` cover the ``T + 1`` window.

        ``embeddings_BxTxD`` replaces the embeddings (causality tests differentiate through it).
        ``drop`` (training): dropout on the byte + n-gram embeddings (site 0), in the encoder's
        blocks (1), on the global model's patch inputs (2), in the global stack (3) and in the
        decoder's blocks (4); not on the cross-attention outputs. ``ngram_drop``: on the n-gram
        tables' rows (:meth:`LocalEncoder.embed`).
        """
        B, T = inputs_BxT.shape
        P, k = patch_lengths_BxP.shape[1], self.cfg.queries_per_patch
        # 1-2. local encoder, patch vectors
        states, _ = self.encoder(
            inputs_BxT, embeddings_BxNxD=embeddings_BxTxD, drop=drop, ngram_drop=ngram_drop
        )
        patches_BxPxG = self.encoder.patches(states, patch_lengths_BxP)
        # 3. global latent transformer over patches
        slots_BxPxkxD, _ = self.latent(patches_BxPxG, drop=drop)
        # 4. local decoder: byte i reads the global output of the patch before its target's patch (decoder
        # patch ids are the targets': the lengths shifted by one position; the encoder's would leak the
        # future)
        src_pid_BxT = patch_ids_from_lengths(patch_lengths_BxP, T + 1)[:, 1:] - 1
        index_BxTxk = jnp.clip(src_pid_BxT, 0, P - 1)[:, :, None] * k + jnp.arange(k)[None, None, :]
        logits, _ = self.decoder(
            states[-1], slots_BxPxkxD.reshape(B, P * k, -1), index_BxTxk, src_pid_BxT >= 0, drop=drop
        )
        return logits

    # -- decoding (bytelm.families.blt.decoder): bytes through the local models, patches through the global
    # one, each module called with its caches
    def init_cache(self, batch: int, slots: int, max_patches: int) -> dict[str, list[KVCache]]:
        """Empty caches: the local encoder's and decoder's over ``slots`` byte positions, the global
        stack's over ``max_patches`` patch positions."""
        return {
            "encoder": self.encoder.stack.init_cache(batch, slots),
            "global": self.latent.stack.init_cache(batch, max_patches),
            "decoder": self.decoder.stack.init_cache(batch, slots),
        }

    def score(self, batch: dict, *, dropout_key: jax.Array | None = None) -> Scores:
        """``batch["ids"]`` ``(B, T+1)`` and ``batch["patch_lengths"]`` ``(B, P)`` over the window.
        ``dropout_key`` (training only) turns on ``model.dropout`` and ``model.ngram_dropout`` (its
        own stream: the key folded with :data:`NGRAM_DROPOUT_SITE`)."""
        ids = batch["ids"]
        drop = make_dropout(self.cfg.dropout, dropout_key)
        ngram_drop = drop_at(make_dropout(self.cfg.ngram_dropout, dropout_key), NGRAM_DROPOUT_SITE)
        return next_id_scores(
            self(ids[:, :-1], batch["patch_lengths"], drop=drop, ngram_drop=ngram_drop), ids[:, 1:]
        )
