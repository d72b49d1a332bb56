"""SpaceByte's cached decoding, batched: every row its own position, caches and global count.

One call per byte runs, for each row, the local encoder's step (its key/value cache), the spacelike
rule against the row's previous byte, and, **only when some row reaches a global position**
(``jax.lax.cond``), the global stack's step for the rows that do (their global caches; the others'
are written at their current slot and overwritten by their next real global step before it is read);
then the add-back, the local decoder's step and the head. A prompt is fed by the same step under
``jax.lax.scan`` (one call), so the prefill and each later byte follow one rule, the full pass's:
:meth:`SpaceByteDecoder.recompute` is the reference the cache must equal
(``tests/test_spacebyte.py``). Within the training context a row gets at most its window's global
slots (the causal slot rule of training); past it the caches slide and the slot limit is lifted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bytelm.constants import BOS_ID, NUM_BYTE_IDS
from bytelm.families.spacebyte.model import SpaceByte, spacelike
from bytelm.models.core import head_logits
from bytelm.sampling.batched import BatchedSampler, ByteBatchedDecoder


def init_state(model: SpaceByte, batch: int, context: int) -> dict:
    """Empty per-row state: the local caches (the context's positions), the global cache (its slots),
    each row's position, global count and whether its previous byte was spacelike."""
    return {
        "enc": model.encoder.init_cache(batch, context),
        "dec": model.decoder.init_cache(batch, context),
        "glob": model.global_stack.init_cache(batch, model.cfg.slots_for(context)),
        "pos": jnp.zeros((batch,), jnp.int32),
        "count": jnp.zeros((batch,), jnp.int32),
        "prev_space": jnp.ones((batch,), bool),  # (before the first byte: as after a BOS)
    }


def model_step(model: SpaceByte, ids_B, active_B, state, context: int):
    """One byte per active row: the logits of the next (``B x V``) and the new state."""
    d, G = model.cfg.local.d_model, model.cfg.global_.d_model
    pos = state["pos"]
    x = model.embed(ids_B[:, None]).astype(model.dtype)
    h, enc = model.encoder(x, positions_BxT=pos[:, None], cache=state["enc"])
    space_B = spacelike(ids_B[:, None])[:, 0]
    wanted_B = (space_B & ~state["prev_space"]) | (pos == 0) | (ids_B == BOS_ID)
    within_B = pos < context
    take_B = wanted_B & active_B & ((state["count"] < model.cfg.slots_for(context)) | ~within_B)

    def run(glob):
        xg = jnp.concatenate([jnp.zeros((h.shape[0], 1, G - d), h.dtype), h], axis=-1)
        y, glob = model.global_stack(xg, positions_BxT=state["count"][:, None], cache=glob)
        return model.global_norm(y)[..., G - d :].astype(h.dtype), glob

    def skip(glob):
        return jnp.zeros_like(h), glob

    y, glob = jax.lax.cond(jnp.any(take_B), run, skip, state["glob"])
    h = h + jnp.where(take_B[:, None, None], y, 0.0).astype(h.dtype)
    out, dec = model.decoder(h, positions_BxT=pos[:, None], cache=state["dec"])
    logits = head_logits(model.norm(out), model.head[...], NUM_BYTE_IDS, model.dtype)[:, 0]
    act = active_B.astype(jnp.int32)
    return logits, {
        "enc": enc,
        "dec": dec,
        "glob": glob,
        "pos": pos + act,
        "count": state["count"] + take_B.astype(jnp.int32),
        "prev_space": jnp.where(active_B, space_B, state["prev_space"]),
    }


class SpaceByteSampler(BatchedSampler):
    """Batched cached decoding of a SpaceByte (:class:`~bytelm.sampling.batched.BatchedSampler`)."""

    def __init__(self, model: SpaceByte, context: int):
        super().__init__(model, context, init_state, model_step)

    def globals_so_far(self) -> np.ndarray:
        """Each row's global positions so far (the global stack's steps)."""
        return np.asarray(self.state["count"])


class SpaceByteDecoder(ByteBatchedDecoder):
    """SpaceByte: ``[BOS, bytes...]``; the batched sampler with one row."""

    def __init__(self, model: SpaceByte, context: int):
        self.sampler: SpaceByteSampler
        super().__init__(model, context, SpaceByteSampler(model, context))

    @property
    def global_calls(self) -> int:  # type: ignore[override]
        """The global stack's steps so far (one per global position)."""
        return int(self.sampler.globals_so_far()[0]) if hasattr(self.sampler, "state") else 0

    def stats(self) -> dict:
        return {"global_positions": self.global_calls}
