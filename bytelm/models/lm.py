"""A decoder-only LM over a flat id sequence: the core stack with an embedding and a head.

Both the ByT5-style byte LM (ids = byte + 4) and the BPE-token LM (ids = token + 4) are this
model; they differ in vocabulary and in the bytes each position covers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from bytelm.constants import BYTE_OFFSET, PAD_ID
from bytelm.models.core import Embed, RMSNorm, Transformer, pad_vocab, param
from bytelm.models.scoring import Scores, mask_invalid_logits, token_nll

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class DecoderLM(nnx.Module):
    """``ids_BxT -> logits_BxTxV`` with ``V = n_valid`` rounded up to ``cfg.vocab_multiple``."""

    def __init__(self, cfg, n_valid: int, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.n_valid = n_valid
        self.vocab_rows = pad_vocab(n_valid, cfg.vocab_multiple)
        dtype = DTYPES[cfg.dtype]
        self.dtype = dtype
        self.embed = Embed(self.vocab_rows, cfg.d_model, rngs=rngs)
        self.stack = Transformer(
            cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.mlp_dim, rngs=rngs, window=cfg.window, rope_base=cfg.rope_base, dtype=dtype
        )
        self.norm = RMSNorm(cfg.d_model)
        self.head = param(rngs, (cfg.d_model, self.vocab_rows), ("embed", "vocab"))

    def __call__(self, ids_BxT: jax.Array) -> jax.Array:
        h_BxTxD = self.embed(ids_BxT).astype(self.dtype)
        h_BxTxD = self.norm(self.stack(h_BxTxD))
        logits_BxTxV = (h_BxTxD @ self.head[...].astype(self.dtype)).astype(jnp.float32)
        return mask_invalid_logits(logits_BxTxV, self.n_valid)

    def score(self, batch: dict) -> Scores:
        """``batch["ids"]`` is ``(B, T+1)``: inputs ``[:, :-1]`` predict targets ``[:, 1:]``.

        Positions whose target is a control id (PAD, BOS, EOS, SEP) are not scored. Bytes per
        position come from ``batch["nbytes"]`` when given (tokens), else 1 per scored position.
        """
        ids = batch["ids"]
        inputs_BxT, targets_BxT = ids[:, :-1], ids[:, 1:]
        mask_BxT = (targets_BxT >= BYTE_OFFSET).astype(jnp.float32)
        nll_BxT = token_nll(self(inputs_BxT), jnp.where(targets_BxT == PAD_ID, 0, targets_BxT)) * mask_BxT
        nbytes_BxT = batch["nbytes"].astype(jnp.float32) * mask_BxT if "nbytes" in batch else mask_BxT
        return Scores(nll_BxT, mask_BxT, nbytes_BxT)
