"""The scoring interface shared by every family: per-position NLL, mask, and bytes covered.

Training loss and the evaluator both reduce the same :class:`Scores`:
``loss = sum(nll * mask) / sum(mask)`` and ``BPB = sum(nll * mask) / (sum(nbytes * mask) * ln 2)``
(docs/evaluation.md). Every family's ``score(batch)`` ends in :func:`next_id_scores`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from bytelm.constants import BYTE_OFFSET


class Scores(NamedTuple):
    nll_BxT: jax.Array  # float32 nats of each scored position (0 where masked)
    mask_BxT: jax.Array  # float32 1 = scored
    nbytes_BxT: jax.Array  # float32 bytes of text each position covers (1 per byte, token length per token)
    # training only: a scalar added to the mean NLL that training minimises (a family's regulariser,
    # H-Net's ratio loss); never part of BPB
    aux: jax.Array | None = None
    # scalar sums a family reports in the training log (summed over micro-batches and log intervals;
    # its task's stats_record turns them into rates)
    stats: dict | None = None
    # per row: the positions of the model's main (most expensive) network, where the model decides
    # them itself (H-Net's innermost chunks); None: the task counts them from the batch
    steps_B: jax.Array | None = None


def token_nll(logits_BxTxV: jax.Array, targets_BxT: jax.Array) -> jax.Array:
    """``-log softmax(logits)[target]`` in float32."""
    logits = logits_BxTxV.astype(jnp.float32)
    lse_BxT = jax.nn.logsumexp(logits, axis=-1)
    picked_BxT = jnp.take_along_axis(logits, targets_BxT[..., None], axis=-1)[..., 0]
    return lse_BxT - picked_BxT


def next_id_scores(
    logits_BxTxV: jax.Array, targets_BxT: jax.Array, nbytes_BxT: jax.Array | None = None
) -> Scores:
    """The :class:`Scores` of predicting ``targets`` with ``logits``. Positions whose target is a
    control id (PAD, BOS, EOS, SEP) are not scored; each scored position covers ``nbytes`` bytes
    (a token's length) or, when None, one byte."""
    mask_BxT = (targets_BxT >= BYTE_OFFSET).astype(jnp.float32)
    nll_BxT = token_nll(logits_BxTxV, targets_BxT) * mask_BxT
    nbytes_BxT = mask_BxT if nbytes_BxT is None else nbytes_BxT.astype(jnp.float32) * mask_BxT
    return Scores(nll_BxT, mask_BxT, nbytes_BxT)


def mean_loss(scores: Scores) -> jax.Array:
    return jnp.sum(scores.nll_BxT) / jnp.maximum(jnp.sum(scores.mask_BxT), 1.0)
