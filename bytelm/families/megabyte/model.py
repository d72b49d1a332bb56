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
from bytelm.models.cache import KVCache, stack_cache, stack_extend
from bytelm.models.core import (
    COMPUTE_DTYPES,
    Dropout,
    Embed,
    RMSNorm,
    Transformer,
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


class MegaByte(nnx.Module):
    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.patch_size = cfg.patch_size
        dtype = COMPUTE_DTYPES[cfg.dtype]
        self.dtype = dtype
        kernels = resolve_kernels(cfg.attention, cfg.mlp, dtype=cfg.dtype, remat=cfg.remat)
        self.vocab_rows = pad_vocab(NUM_BYTE_IDS, cfg.vocab_multiple)
        self.global_embed = Embed(self.vocab_rows, cfg.embed_dim, rngs=rngs)
        self.global_pad = param(rngs, (cfg.global_d_model,), ("embed",), std=1.0)
        self.global_stack = Transformer(
            cfg.global_d_model,
            cfg.global_layers,
            cfg.global_heads,
            cfg.global_mlp_dim,
            rngs=rngs,
            kernels=kernels,
            rope_base=cfg.rope_base,
            dtype=dtype,
            scan=cfg.scan_layers,
            norm_eps=cfg.norm_eps,
        )
        self.global_norm = RMSNorm(cfg.global_d_model, eps=cfg.norm_eps)
        self.to_local = param(rngs, (cfg.embed_dim, cfg.local_d_model), (None, "embed"))
        self.local_embed = Embed(self.vocab_rows, cfg.local_d_model, rngs=rngs)
        self.local_pad = param(rngs, (cfg.local_d_model,), ("embed",), std=1.0)
        self.local_stack = Transformer(
            cfg.local_d_model,
            cfg.local_layers,
            cfg.local_heads,
            cfg.local_mlp_dim,
            rngs=rngs,
            kernels=kernels,
            rope_base=cfg.rope_base,
            dtype=dtype,
            scan=cfg.scan_layers,
            norm_eps=cfg.norm_eps,
        )
        self.local_norm = RMSNorm(cfg.local_d_model, eps=cfg.norm_eps)
        self.head = head_param(rngs, cfg.local_d_model, NUM_BYTE_IDS, cfg.vocab_multiple)

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
        pad_Bx1xG = jnp.broadcast_to(self.global_pad[...].astype(dt), (B, 1, cfg.global_d_model))
        global_in_BxPxG = jnp.concatenate([pad_Bx1xG, patches_BxPxG[:, :-1]], axis=1)
        # 3: global transformer over patches
        global_in_BxPxG = apply_dropout(global_in_BxPxG, drop_at(drop, 0))
        global_out_BxPxG = self.global_norm(self.global_stack(global_in_BxPxG, drop=drop_at(drop, 1)))
        # 4: per-byte slices projected d_G -> d_L by one shared matrix
        slices_BxPxCxE = global_out_BxPxG.reshape(B, P, C, cfg.embed_dim)
        from_global_BxPxCxD = slices_BxPxCxE @ self.to_local[...].astype(dt)
        # 5: local input = projection + embedding of the previous byte in the patch (pad first)
        local_emb_BxPxCxD = self.local_embed(x_BxT).reshape(B, P, C, cfg.local_d_model).astype(dt)
        pad_BxPx1xD = jnp.broadcast_to(self.local_pad[...].astype(dt), (B, P, 1, cfg.local_d_model))
        prev_BxPxCxD = jnp.concatenate([pad_BxPx1xD, local_emb_BxPxCxD[:, :, :-1]], axis=2)
        local_in_NxCxD = (from_global_BxPxCxD + prev_BxPxCxD).reshape(B * P, C, cfg.local_d_model)
        # 6: local transformer within each patch, then byte logits
        local_in_NxCxD = apply_dropout(local_in_NxCxD, drop_at(drop, 2))
        local_out_NxCxD = self.local_norm(self.local_stack(local_in_NxCxD, drop=drop_at(drop, 3)))
        return head_logits(local_out_NxCxD, self.head[...], NUM_BYTE_IDS, dt).reshape(B, T, self.vocab_rows)

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

    # -- decoding (bytelm.sampling): the global model once per patch, the local model per byte ---
    def init_cache(self, batch: int, max_patches: int) -> dict[str, list[KVCache]]:
        """Empty caches: the global stack's over ``max_patches`` patch positions, the local stack's
        over one patch (it restarts with every patch)."""
        return {
            "global": stack_cache(self.global_stack, batch, max_patches),
            "local": stack_cache(self.local_stack, batch, self.patch_size),
        }

    def global_extend(
        self, prev_ids_BxNxC: jax.Array, caches: list[KVCache], pos0: jax.Array
    ) -> tuple[jax.Array, list[KVCache]]:
        """The global step for patches ``pos0 .. pos0 + N - 1``: row ``n`` reads the complete patch
        before it (``prev_ids[:, n]``; the learned pad for patch 0). Returns every byte slot's
        projection to the local width, ``B x N x C x D``."""
        B, N, C = prev_ids_BxNxC.shape
        cfg, dt = self.cfg, self.dtype
        rows_BxNxG = self.global_embed(prev_ids_BxNxC).reshape(B, N, C * cfg.embed_dim).astype(dt)
        first_N = (pos0 + jnp.arange(N)) == 0
        rows_BxNxG = jnp.where(first_N[None, :, None], self.global_pad[...].astype(dt), rows_BxNxG)
        out_BxNxG, caches = stack_extend(self.global_stack, rows_BxNxG, caches, pos0)
        slices_BxNxCxE = self.global_norm(out_BxNxG).reshape(B, N, C, cfg.embed_dim)
        return slices_BxNxCxE @ self.to_local[...].astype(dt), caches

    def local_extend(
        self, from_global_BxNxD: jax.Array, prev_BxN: jax.Array, caches: list[KVCache], pos0: jax.Array
    ) -> tuple[jax.Array, list[KVCache]]:
        """Logits for positions ``pos0 ..`` of the current patch: each reads its global slot and the
        previous byte of the patch (``prev < 0``: the learned pad, at position 0)."""
        dt = self.dtype
        prev_BxNxD = self.local_embed(jnp.maximum(prev_BxN, 0)).astype(dt)
        prev_BxNxD = jnp.where((prev_BxN < 0)[..., None], self.local_pad[...].astype(dt), prev_BxNxD)
        h_BxNxD, caches = stack_extend(
            self.local_stack, from_global_BxNxD.astype(dt) + prev_BxNxD, caches, pos0
        )
        return head_logits(self.local_norm(h_BxNxD), self.head[...], NUM_BYTE_IDS, dt), caches
