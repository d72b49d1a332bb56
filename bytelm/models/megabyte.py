"""MegaByte (Yu et al. 2023, "MEGABYTE: Predicting Million-byte Sequences with Multiscale Transformers").

For a byte sequence ``x`` of length ``T`` (padded to a multiple of ``P``; ``K = T / P`` patches):

1. Global embeddings: each byte gets a ``d_G``-wide embedding; the ``P`` embeddings of a patch are
   concatenated into one patch vector of width ``P * d_G`` (no LayerNorm/Linear patch embedder).
2. The global input is shifted right by one patch: patch ``k`` sees the vector of patch ``k - 1``
   and patch 0 a learned pad patch, so the global output for patch ``k`` depends on bytes
   ``< kP`` only.
3. A causal global transformer of width ``P * d_G`` over the ``K`` patches. Positions enter as
   rotary embeddings of the patch index inside attention (the shared core's positions), where the
   paper adds learned absolute position embeddings; rotary keeps any sequence length valid.
4. The global output is reshaped to ``(K, P, d_G)`` and each slice projected ``d_G -> d_L`` by one
   shared matrix.
5. Local input at position ``p`` of patch ``k``: that projection plus the local embedding of the
   previous byte in the patch, ``[pad, x_kP, ..., x_kP+P-2]`` (a learned pad at ``p = 0``).
6. A causal local transformer of length ``P`` runs as a batch of ``B * K`` sequences, then logits
   over byte ids.

There is no extra start token: the pads play that role, and the sequence modelled is exactly the
target bytes. Byte 0x00 (id 4) is a byte like any other; only PAD (id 0) is masked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from bytelm.constants import BYTE_OFFSET, NUM_BYTE_IDS, PAD_ID
from bytelm.models.core import Embed, RMSNorm, Transformer, pad_vocab, param
from bytelm.models.lm import DTYPES
from bytelm.models.scoring import Scores, mask_invalid_logits, token_nll


class MegaByte(nnx.Module):
    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.P = cfg.patch_size
        self.n_valid = NUM_BYTE_IDS
        self.vocab_rows = pad_vocab(NUM_BYTE_IDS, cfg.vocab_multiple)
        dtype = DTYPES[cfg.dtype]
        self.dtype = dtype
        self.global_embed = Embed(self.vocab_rows, cfg.embed_dim, rngs=rngs)
        self.global_pad = param(rngs, (cfg.global_d_model,), ("embed",), std=1.0)
        self.global_stack = Transformer(
            cfg.global_d_model, cfg.global_layers, cfg.global_heads, cfg.global_mlp_dim, rngs=rngs, rope_base=cfg.rope_base, dtype=dtype
        )
        self.global_norm = RMSNorm(cfg.global_d_model)
        self.to_local = param(rngs, (cfg.embed_dim, cfg.local_d_model), (None, "embed"))
        self.local_embed = Embed(self.vocab_rows, cfg.local_d_model, rngs=rngs)
        self.local_pad = param(rngs, (cfg.local_d_model,), ("embed",), std=1.0)
        self.local_stack = Transformer(
            cfg.local_d_model, cfg.local_layers, cfg.local_heads, cfg.local_mlp_dim, rngs=rngs, rope_base=cfg.rope_base, dtype=dtype
        )
        self.local_norm = RMSNorm(cfg.local_d_model)
        self.head = param(rngs, (cfg.local_d_model, self.vocab_rows), ("embed", "vocab"))

    def padded_length(self, t: int) -> int:
        if t % self.P and not self.cfg.pad_to_patch:
            raise ValueError(
                f"sequence length {t} is not a multiple of model.patch_size {self.P} and model.pad_to_patch is "
                "false: set model.pad_to_patch = true or use a length divisible by the patch size"
            )
        return -(-t // self.P) * self.P

    def __call__(self, x_BxT: jax.Array) -> jax.Array:
        """Logits for every byte of ``x`` (ids, or one-hot floats ``(B, T, V)``); ``T % P == 0``."""
        B, T = x_BxT.shape[:2]
        P, cfg, dt = self.P, self.cfg, self.dtype
        if T % P:
            raise ValueError(f"MegaByte input length {T} must be a multiple of the patch size {P}; pad it first")
        K = T // P
        # 1-2: concatenated byte embeddings per patch, shifted right by one patch
        patches_BxKxG = self.global_embed(x_BxT).reshape(B, K, P * cfg.embed_dim).astype(dt)
        pad_Bx1xG = jnp.broadcast_to(self.global_pad[...].astype(dt), (B, 1, cfg.global_d_model))
        global_in_BxKxG = jnp.concatenate([pad_Bx1xG, patches_BxKxG[:, :-1]], axis=1)
        # 3: global transformer over patches
        global_out_BxKxG = self.global_norm(self.global_stack(global_in_BxKxG))
        # 4: per-byte slices projected d_G -> d_L by one shared matrix
        slices_BxKxPxE = global_out_BxKxG.reshape(B, K, P, cfg.embed_dim)
        from_global_BxKxPxL = slices_BxKxPxE @ self.to_local[...].astype(dt)
        # 5: local input = projection + embedding of the previous byte in the patch (pad first)
        local_emb_BxKxPxL = self.local_embed(x_BxT).reshape(B, K, P, cfg.local_d_model).astype(dt)
        pad_BxKx1xL = jnp.broadcast_to(self.local_pad[...].astype(dt), (B, K, 1, cfg.local_d_model))
        prev_BxKxPxL = jnp.concatenate([pad_BxKx1xL, local_emb_BxKxPxL[:, :, :-1]], axis=2)
        local_in = (from_global_BxKxPxL + prev_BxKxPxL).reshape(B * K, P, cfg.local_d_model)
        # 6: local transformer within each patch, then byte logits
        local_out = self.local_norm(self.local_stack(local_in))
        logits = (local_out @ self.head[...].astype(dt)).astype(jnp.float32).reshape(B, T, self.vocab_rows)
        return mask_invalid_logits(logits, self.n_valid)

    def score(self, batch: dict) -> Scores:
        """``batch["ids"]`` is ``(B, T+1)`` as for the byte LM; MegaByte models the ``T`` targets
        ``ids[:, 1:]`` themselves (its pads replace the BOS input), padded to a multiple of P."""
        targets_BxT = batch["ids"][:, 1:]
        T = targets_BxT.shape[1]
        Tp = self.padded_length(T)
        x_BxTp = jnp.pad(targets_BxT, ((0, 0), (0, Tp - T)), constant_values=PAD_ID)
        logits = self(x_BxTp)[:, :T]
        mask_BxT = (targets_BxT >= BYTE_OFFSET).astype(jnp.float32)
        nll_BxT = token_nll(logits, targets_BxT) * mask_BxT
        return Scores(nll_BxT, mask_BxT, mask_BxT)
