"""SpaceByte (Slagle 2024, "SpaceByte: Towards Deleting Tokenization from Large Language Modeling",
arXiv 2404.14408), written here on the shared transformer core.

1. **Local encoder**: byte embeddings, ``local.encoder_layers`` sliding-window blocks.
2. **Global positions** (:func:`global_starts`): position ``t`` is global when its byte is
   *spacelike* and the byte before it is not (a spacelike byte is neither an ASCII letter or digit
   nor a UTF-8 continuation byte, 0x80-0xBF; control ids, BOS among them, are spacelike); the first
   position and every BOS are global. So a global block runs at the first space (or punctuation)
   after a word, and its output is there to predict the next word's first byte.
3. **Slots**: the global positions, in order, into ``ceil(T / bytes_per_slot)`` static slots; a
   window with more keeps its first ones (:mod:`bytelm.models.slots`; the overflow is counted).
4. **Global stack**: the local features at those positions zero-padded to ``global.d_model`` (the
   local features in the last dimensions, as the reference), full causal attention over the slots
   (rotary positions by slot), an RMSNorm.
5. **Add back**: the global output's last ``local.d_model`` dimensions added to the byte stream at
   the global positions it came from.
6. **Local decoder**: ``local.decoder_layers`` sliding-window blocks, an RMSNorm, the head.

Everything is causal: a position's global status depends on its byte and the one before, a slot on
the statuses up to it. Departures from the reference: rotary positions only (it adds learned
position embeddings and normalises queries and keys); the training loss scores every byte (the
reference ignores the targets after a window's last global slot; here they are predicted without
the later global positions, as in evaluation).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bytelm.constants import BOS_ID, BYTE_OFFSET, NUM_BYTE_IDS, PAD_ID
from bytelm.models.core import (
    COMPUTE_DTYPES,
    Embed,
    RMSNorm,
    apply_dropout,
    drop_at,
    head_logits,
    head_param,
    make_dropout,
    pad_vocab,
)
from bytelm.models.kernels import resolve_kernels
from bytelm.models.scoring import Scores, next_id_scores
from bytelm.models.slots import chunk_positions, keep_boundaries
from bytelm.models.stack import Transformer

# spacelike bytes: everything but ASCII letters, digits and UTF-8 continuation bytes
_SPACELIKE = np.ones(256, bool)
for _lo, _hi in ((0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A), (0x80, 0xBF)):
    _SPACELIKE[_lo : _hi + 1] = False


def spacelike(ids_BxT: jax.Array) -> jax.Array:
    """Whether each id is spacelike (the module docstring); control ids (BOS, EOS, PAD) are."""
    byte = jnp.clip(ids_BxT - BYTE_OFFSET, 0, 255)
    return (ids_BxT < BYTE_OFFSET) | jnp.asarray(_SPACELIKE)[byte]


def global_starts(ids_BxT: jax.Array) -> jax.Array:
    """``B x T`` bool: the global positions of byte-id windows (the module docstring, step 2)."""
    s = spacelike(ids_BxT)
    after_word = s & ~jnp.concatenate([jnp.ones_like(s[:, :1]), s[:, :-1]], axis=1)
    first = jnp.arange(ids_BxT.shape[1])[None, :] == 0
    return (after_word | first | (ids_BxT == BOS_ID)) & (ids_BxT != PAD_ID)


class SpaceByte(nnx.Module):
    """Byte ids -> logits over byte ids (the module docstring)."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.dtype = COMPUTE_DTYPES[cfg.dtype]
        kernels = resolve_kernels(cfg.attention, cfg.mlp, dtype=cfg.dtype, remat=cfg.remat)
        self.n_valid = NUM_BYTE_IDS
        self.vocab_rows = pad_vocab(NUM_BYTE_IDS, cfg.vocab_multiple)
        loc, g = cfg.local, cfg.global_
        self.embed = Embed(self.vocab_rows, loc.d_model, rngs=rngs)

        def local(layers: int) -> Transformer:
            return Transformer(
                loc.d_model,
                layers,
                loc.heads,
                loc.mlp_dim,
                rngs=rngs,
                kernels=kernels,
                window=loc.window,
                rope_base=cfg.rope_base,
                dtype=self.dtype,
                norm_eps=cfg.norm_eps,
            )

        self.encoder = local(loc.encoder_layers)
        self.global_stack = Transformer(
            g.d_model,
            g.layers,
            g.heads,
            g.mlp_dim,
            rngs=rngs,
            kernels=kernels,
            rope_base=cfg.rope_base,
            dtype=self.dtype,
            scan=cfg.scan_layers,
            norm_eps=cfg.norm_eps,
        )
        self.global_norm = RMSNorm(g.d_model, eps=cfg.norm_eps)
        self.decoder = local(loc.decoder_layers)
        self.norm = RMSNorm(loc.d_model, eps=cfg.norm_eps)
        self.head = head_param(rngs, loc.d_model, NUM_BYTE_IDS, cfg.vocab_multiple)

    def forward(self, ids_BxT: jax.Array, *, drop=None):
        """``(logits, keep_BxT, wanted_BxT, positions_BxM, filled_B)``: the logits, the global
        positions that got a slot, all the global positions, each slot's position and the filled
        slots per row."""
        B, T = ids_BxT.shape
        d, G = self.cfg.local.d_model, self.cfg.global_.d_model
        M = self.cfg.slots_for(T)
        h = apply_dropout(self.embed(ids_BxT).astype(self.dtype), drop_at(drop, 0))
        h = self.encoder(h, drop=drop_at(drop, 1))
        wanted = global_starts(ids_BxT)
        keep = keep_boundaries(wanted, M)
        pos_BxM, n_B = chunk_positions(keep, M)
        filled_BxM = jnp.arange(M)[None, :] < n_B[:, None]
        x = jnp.take_along_axis(h, pos_BxM[..., None], axis=1)  # B x M x d
        x = jnp.concatenate([jnp.zeros((B, M, G - d), x.dtype), x], axis=-1)
        y = self.global_norm(self.global_stack(x, drop=drop_at(drop, 2)))[..., G - d :]
        y = jnp.where(filled_BxM[..., None], y, 0.0).astype(h.dtype)
        rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, M))
        # (an empty slot's position is 0 and its value 0: adding it changes nothing)
        h = h.at[rows, pos_BxM].add(y)
        h = self.norm(self.decoder(h, drop=drop_at(drop, 3)))
        logits = head_logits(h, self.head[...], NUM_BYTE_IDS, self.dtype)
        return logits, keep, wanted, pos_BxM, n_B

    def __call__(self, ids_BxT: jax.Array) -> jax.Array:
        return self.forward(ids_BxT)[0]

    def score(self, batch: dict, *, dropout_key: jax.Array | None = None) -> Scores:
        """``batch["ids"]`` is ``(B, T+1)``, ``[BOS, bytes...]`` windows as for the byte LM. The scores
        carry the global positions' counts (``positions``, ``globals`` kept, ``dropped``,
        ``overflow_windows``, ``windows``) and each row's global positions over its real inputs."""
        ids = batch["ids"]
        inputs = ids[:, :-1]
        logits, keep, wanted, _, _ = self.forward(inputs, drop=make_dropout(self.cfg.dropout, dropout_key))
        valid = inputs != PAD_ID
        kept_B = jnp.sum(keep & valid, axis=1)
        stats = {
            "positions": jnp.sum(valid, dtype=jnp.float32),
            "globals": jnp.sum(kept_B, dtype=jnp.float32),
            "dropped": jnp.sum(wanted & ~keep & valid, dtype=jnp.float32),
            "overflow_windows": jnp.sum(jnp.sum(wanted & valid, axis=1) > kept_B, dtype=jnp.float32),
            "windows": jnp.asarray(inputs.shape[0], jnp.float32),
        }
        return next_id_scores(logits, ids[:, 1:])._replace(stats=stats, steps_B=kept_B.astype(jnp.float32))
