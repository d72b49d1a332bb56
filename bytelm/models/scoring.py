"""The scoring interface shared by every family: per-position NLL, mask, and bytes covered.

Training loss and the evaluator both reduce the same :class:`Scores`:
``loss = sum(nll * mask) / sum(mask)`` and ``BPB = sum(nll * mask) / (sum(nbytes * mask) * ln 2)``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Scores(NamedTuple):
    nll_BxT: jax.Array  # float32 nats of each scored position (0 where masked)
    mask_BxT: jax.Array  # float32 1 = scored
    nbytes_BxT: jax.Array  # float32 bytes of text each position covers (1 per byte, token length per token)


def token_nll(logits_BxTxV: jax.Array, targets_BxT: jax.Array) -> jax.Array:
    """``-log softmax(logits)[target]`` in float32."""
    logits = logits_BxTxV.astype(jnp.float32)
    lse_BxT = jax.nn.logsumexp(logits, axis=-1)
    picked_BxT = jnp.take_along_axis(logits, targets_BxT[..., None], axis=-1)[..., 0]
    return lse_BxT - picked_BxT


def mask_invalid_logits(logits_BxTxV: jax.Array, n_valid: int) -> jax.Array:
    """Padding rows of the vocabulary can never be predicted (finite, so no NaN downstream)."""
    if n_valid >= logits_BxTxV.shape[-1]:
        return logits_BxTxV
    valid_V = jnp.arange(logits_BxTxV.shape[-1]) < n_valid
    valid_V = valid_V.reshape((1,) * (logits_BxTxV.ndim - 1) + (-1,))
    return jnp.where(valid_V, logits_BxTxV, jnp.asarray(-1e9, logits_BxTxV.dtype))


def mean_loss(scores: Scores) -> jax.Array:
    return jnp.sum(scores.nll_BxT) / jnp.maximum(jnp.sum(scores.mask_BxT), 1.0)
