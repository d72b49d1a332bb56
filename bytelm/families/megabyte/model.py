"""MegaByte (Yu et al. 2023, "MEGABYTE: Predicting Million-byte Sequences with Multiscale Transformers").

For a byte sequence ``x`` of length ``T`` (padded to a multiple of the patch size ``C``;
``P = T / C`` patches; ``E`` = ``embed_dim``, ``G = C * E`` the global width, ``D`` the local width):

1. Global embeddings: each byte gets an ``E``-wide embedding; the ``C`` embeddings of a patch are
   concatenated into one patch vector of width ``G = C * E`` (no LayerNorm/Linear patch embedder).
2. The global input is shifted right by one patch: patch ``p`` sees the vector of patch ``p - 1``
   and patch 0 a learned pad patch, so the global output for patch ``p`` depends on bytes
   ``< pC`` only.
3. A causal global transformer of width ``G`` over the ``P`` patches. Positions enter as
   rotary embeddings of the patch index inside attention (the shared core's positions), where the
   paper adds learned absolute position embeddings; rotary keeps any sequence length valid.
4. The global output is reshaped to ``(P, C, E)`` and each slice projected ``E -> D`` by one
   shared matrix.
5. Local input at position ``c`` of patch ``p``: that projection plus the local embedding of the
   previous byte in the patch, ``[pad, x_pC, ..., x_pC+C-2]`` (a learned pad at ``c = 0``).
6. A causal local transformer of length ``C`` runs as a batch of ``B * P`` sequences, then logits
   over byte ids.

The sequence modelled is ``[BOS, bytes...]``, as every family sees it: the BOS is the first
byte of the first patch, so every byte is predicted with the BOS in its context (what tells a
document's start from a window cut mid-document), and the BOS's own prediction (from the pads) is
not scored. Byte 0x00 (id 4) is a byte like any other; only PAD (id 0) is masked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from bytelm.constants import NUM_BYTE_IDS, PAD_ID
from bytelm.models.cache import KVCache, offset_positions
from bytelm.models.core import (
    COMPUTE_DTYPES,
    Dropout,
    Embed,
    RMSNorm,
    apply_dropout,
    drop_at,
    head_logits,
    head_param,
    make_dropout,
    pad_vocab,
    param,
)
from bytelm.models.kernels import resolve_kernels
from bytelm.models.scoring import Scores, next_id_scores
from bytelm.models.stack import Transformer


class MegaByte(nnx.Module):
    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.patch_size = cfg.patch_size
        dtype = COMPUTE_DTYPES[cfg.dtype]
        self.dtype = dtype
        kernels = resolve_kernels(cfg.attention, cfg.mlp, dtype=cfg.dtype, remat=cfg.remat)
        self.vocab_rows = pad_vocab(NUM_BYTE_IDS, cfg.vocab_multiple)
        self.global_embed = Embed(self.vocab_rows, cfg.embed_dim, rngs=rngs)
        self.global_pad = param(rngs, (cfg.global_.d_model,), ("embed",), std=1.0)
        self.global_stack = Transformer(
            cfg.global_.d_model,
            cfg.global_.layers,
            cfg.global_.heads,
            cfg.global_.mlp_dim,
            rngs=rngs,
            kernels=kernels,
            rope_base=cfg.rope_base,
            dtype=dtype,
            scan=cfg.scan_layers,
            norm_eps=cfg.norm_eps,
        )
        self.global_norm = RMSNorm(cfg.global_.d_model, eps=cfg.norm_eps)
        self.to_local = param(rngs, (cfg.embed_dim, cfg.local.d_model), (None, "embed"))
        self.local_embed = Embed(self.vocab_rows, cfg.local.d_model, rngs=rngs)
        self.local_pad = param(rngs, (cfg.local.d_model,), ("embed",), std=1.0)
        self.local_stack = Transformer(
            cfg.local.d_model,
            cfg.local.layers,
            cfg.local.heads,
            cfg.local.mlp_dim,
            rngs=rngs,
            kernels=kernels,
            rope_base=cfg.rope_base,
            dtype=dtype,
            scan=cfg.scan_layers,
            norm_eps=cfg.norm_eps,
        )
        self.local_norm = RMSNorm(cfg.local.d_model, eps=cfg.norm_eps)
        self.head = head_param(rngs, cfg.local.d_model, NUM_BYTE_IDS, cfg.vocab_multiple)

    def __call__(self, x_BxT: jax.Array, *, drop: Dropout | None = None) -> jax.Array:
        """Logits for every byte of ``x`` (ids, or one-hot floats ``(B, T, V)``); ``T`` must be a
        multiple of the patch size ``C`` (:meth:`score` pads; ``P = T / C`` patches). ``drop``
        (training): dropout on the global input (site 0), in the global stack (1), on the local
        input (2) and in the local stack (3)."""
        B, T = x_BxT.shape[:2]
        C, cfg, dt = self.patch_size, self.cfg, self.dtype
        if T % C:
            raise ValueError(
                f"MegaByte input length {T} must be a multiple of the patch size {C}; pad it first"
            )
        P = T // C
        # 1-2: concatenated byte embeddings per patch, shifted right by one patch
        patches_BxPxG = self.global_embed(x_BxT).reshape(B, P, C * cfg.embed_dim).astype(dt)
        pad_Bx1xG = jnp.broadcast_to(self.global_pad[...].astype(dt), (B, 1, cfg.global_.d_model))
        global_in_BxPxG = jnp.concatenate([pad_Bx1xG, patches_BxPxG[:, :-1]], axis=1)
        # 3-4: the global transformer over patches, its slices projected to the local width
        from_global_BxPxCxD, _ = self.global_model(global_in_BxPxG, drop=drop)
        # 5: local input = projection + embedding of the previous byte in the patch (pad first)
        local_emb_BxPxCxD = self.local_embed(x_BxT).reshape(B, P, C, cfg.local.d_model).astype(dt)
        pad_BxPx1xD = jnp.broadcast_to(self.local_pad[...].astype(dt), (B, P, 1, cfg.local.d_model))
        prev_BxPxCxD = jnp.concatenate([pad_BxPx1xD, local_emb_BxPxCxD[:, :, :-1]], axis=2)
        local_in_NxCxD = (from_global_BxPxCxD + prev_BxPxCxD).reshape(B * P, C, cfg.local.d_model)
        # 6: local transformer within each patch, then byte logits
        logits_NxCxV, _ = self.local_model(local_in_NxCxD, drop=drop)
        return logits_NxCxV.reshape(B, T, self.vocab_rows)

    def global_model(
        self,
        rows_BxNxG: jax.Array,
        *,
        cache: list[KVCache] | None = None,
        pos0=0,
        drop: Dropout | None = None,
    ) -> tuple[jax.Array, list[KVCache] | None]:
        """Steps 3-4 on global input rows (each the previous patch's vector; the pad for patch 0):
        every byte slot's projection to the local width, ``B x N x C x D``, and the caches. A whole
        window: ``cache`` None. Decoding: ``N`` new patches at positions ``pos0 ..`` after the cached
        ones. ``drop`` (training): dropout on the rows (site 0) and in the global stack (1)."""
        B, N, _ = rows_BxNxG.shape
        cfg, dt = self.cfg, self.dtype
        rows_BxNxG = apply_dropout(rows_BxNxG, drop_at(drop, 0))
        positions_BxN = None if cache is None else offset_positions(pos0, B, N)
        out_BxNxG, cache = self.global_stack.apply(
            rows_BxNxG, positions_BxT=positions_BxN, drop=drop_at(drop, 1), cache=cache
        )
        slices_BxNxCxE = self.global_norm(out_BxNxG).reshape(B, N, self.patch_size, cfg.embed_dim)
        return slices_BxNxCxE @ self.to_local[...].astype(dt), cache

    def local_model(
        self,
        local_in_BxNxD: jax.Array,
        *,
        cache: list[KVCache] | None = None,
        pos0=0,
        drop: Dropout | None = None,
    ) -> tuple[jax.Array, list[KVCache] | None]:
        """Step 6 on local inputs (a patch's positions, the rows of the batch each a patch): byte
        logits and the caches. A whole patch: ``cache`` None. Decoding: ``N`` new positions
        ``pos0 ..`` of the current patch after the cached ones. ``drop`` (training): dropout on the
        inputs (site 2) and in the local stack (3)."""
        B, N, _ = local_in_BxNxD.shape
        local_in_BxNxD = apply_dropout(local_in_BxNxD, drop_at(drop, 2))
        positions_BxN = None if cache is None else offset_positions(pos0, B, N)
        h_BxNxD, cache = self.local_stack.apply(
            local_in_BxNxD, positions_BxT=positions_BxN, drop=drop_at(drop, 3), cache=cache
        )
        return head_logits(self.local_norm(h_BxNxD), self.head[...], NUM_BYTE_IDS, self.dtype), cache

    def score(self, batch: dict, *, dropout_key: jax.Array | None = None) -> Scores:
        """``batch["ids"]`` is ``(B, T+1)`` as for the byte LM, ``[BOS, bytes...]``: MegaByte models the
        whole row (padded to whole patches), so the BOS conditions every byte, and scores the ``T``
        targets ``ids[:, 1:]`` (the BOS's own prediction is not a target). ``dropout_key`` (training
        only) turns on ``model.dropout``."""
        ids_BxT1 = batch["ids"]
        T1 = ids_BxT1.shape[1]
        x_BxTp = jnp.pad(ids_BxT1, ((0, 0), (0, self.cfg.padded_length(T1) - T1)), constant_values=PAD_ID)
        logits_BxTpxV = self(x_BxTp, drop=make_dropout(self.cfg.dropout, dropout_key))
        return next_id_scores(logits_BxTpxV[:, 1:T1], ids_BxT1[:, 1:])

    # -- decoding (bytelm.families.megabyte.decoder): the global model once per patch, the local model per
    # byte, through global_model and local_model
    def init_cache(self, batch: int, max_patches: int) -> dict[str, list[KVCache]]:
        """Empty caches: the global stack's over ``max_patches`` patch positions, the local stack's
        over one patch (it restarts with every patch)."""
        return {
            "global": self.global_stack.init_cache(batch, max_patches),
            "local": self.local_stack.init_cache(batch, self.patch_size),
        }

    def global_rows(self, prev_ids_BxNxC: jax.Array, pos0) -> jax.Array:
        """Global input rows for patches ``pos0 .. pos0 + N - 1`` (step 2): row ``n`` is the
        concatenated embeddings of the complete patch before it (``prev_ids[:, n]``), the learned
        pad for patch 0."""
        B, N, C = prev_ids_BxNxC.shape
        dt = self.dtype
        rows_BxNxG = self.global_embed(prev_ids_BxNxC).reshape(B, N, C * self.cfg.embed_dim).astype(dt)
        first_N = (pos0 + jnp.arange(N)) == 0
        return jnp.where(first_N[None, :, None], self.global_pad[...].astype(dt), rows_BxNxG)

    def local_inputs(self, from_global_BxNxD: jax.Array, prev_BxN: jax.Array) -> jax.Array:
        """Local inputs of positions of the current patch (step 5): each its global slot plus the
        embedding of the previous byte of the patch (``prev < 0``: the learned pad, at position 0)."""
        dt = self.dtype
        prev_BxNxD = self.local_embed(jnp.maximum(prev_BxN, 0)).astype(dt)
        prev_BxNxD = jnp.where((prev_BxN < 0)[..., None], self.local_pad[...].astype(dt), prev_BxNxD)
        return from_global_BxNxD.astype(dt) + prev_BxNxD
