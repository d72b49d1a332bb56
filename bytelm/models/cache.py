"""Key/value caches for decoding: the data a layer's attention keeps between calls.

A :class:`KVCache` holds, per row, ``S`` slots of keys and values (rotated at their absolute
positions), the absolute position in each slot (-1: empty) and its document id. It is written and
read by the one forward path: :class:`~bytelm.models.core.Attention` (and through it every block,
stack and family model) takes ``cache=`` and the absolute positions of its new inputs, writes their
keys and values into slots ``position % S`` (:meth:`KVCache.write`) and attends from them over the
cache under the causal mask, the layer's sliding window and, where document ids are given, their
documents (:meth:`KVCache.visible`). So the cache is a ring buffer of the last ``S`` positions of
each row (the decoders size it to the training context): a sliding-window stack attends to its
window within it, and a stack with full attention becomes a sliding window of ``S`` once a
generation runs past that context.

A call of more than one new position (the prefill of a prompt) must fit the cache (``N <= S``)
and start on an empty one; decoding goes one position at a time. Rows may sit at different
positions (H-Net's batched decoder).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    """One attention layer's cache (the module docstring)."""

    k_BxSxHxK: jax.Array
    v_BxSxHxK: jax.Array
    pos_BxS: jax.Array  # int32 absolute position held by each slot; -1 = empty
    seg_BxS: jax.Array  # int32 document id of each slot's position (read where a call gives ids)

    @classmethod
    def empty(cls, batch: int, slots: int, heads: int, head_dim: int, dtype) -> KVCache:
        """A cache of ``slots`` empty slots per row."""
        shape = (batch, slots, heads, head_dim)
        return cls(
            jnp.zeros(shape, dtype),
            jnp.zeros(shape, dtype),
            jnp.full((batch, slots), -1, jnp.int32),
            jnp.zeros((batch, slots), jnp.int32),
        )

    def write(
        self,
        k_BxNxHxK: jax.Array,
        v_BxNxHxK: jax.Array,
        positions_BxN: jax.Array,
        segments_BxN: jax.Array | None = None,
    ) -> KVCache:
        """The cache with ``N`` new keys and values written into slots ``position % S`` of their rows."""
        B, S = self.pos_BxS.shape
        N = positions_BxN.shape[1]
        if N > S:  # (static) two positions of the call would share a slot
            raise ValueError(f"a call of {N} new positions does not fit a cache of {S} slots")
        rows_Bx1 = jnp.arange(B)[:, None]
        slot_BxN = positions_BxN % S
        seg_BxS = self.seg_BxS
        if segments_BxN is not None:
            seg_BxS = seg_BxS.at[rows_Bx1, slot_BxN].set(segments_BxN.astype(jnp.int32))
        return KVCache(
            self.k_BxSxHxK.at[rows_Bx1, slot_BxN].set(k_BxNxHxK.astype(self.k_BxSxHxK.dtype)),
            self.v_BxSxHxK.at[rows_Bx1, slot_BxN].set(v_BxNxHxK.astype(self.v_BxSxHxK.dtype)),
            self.pos_BxS.at[rows_Bx1, slot_BxN].set(positions_BxN.astype(jnp.int32)),
            seg_BxS,
        )

    def visible(
        self, positions_BxN: jax.Array, segments_BxN: jax.Array | None = None, window: int = 0
    ) -> jax.Array:
        """``B x N x S``: which slots the queries at ``positions`` may attend to: filled, not in their
        future, within the last ``window`` positions (> 0) and, with ``segments``, of their document."""
        slot_pos_Bx1xS, query_pos_BxNx1 = self.pos_BxS[:, None, :], positions_BxN[:, :, None]
        allowed_BxNxS = (slot_pos_Bx1xS >= 0) & (slot_pos_Bx1xS <= query_pos_BxNx1)
        if window > 0:
            allowed_BxNxS &= slot_pos_Bx1xS > query_pos_BxNx1 - window
        if segments_BxN is not None:
            allowed_BxNxS &= self.seg_BxS[:, None, :] == segments_BxN[:, :, None]
        return allowed_BxNxS


def offset_positions(pos0, batch: int, n: int) -> jax.Array:
    """``B x N`` absolute positions ``pos0 .. pos0 + n - 1`` of ``n`` new inputs (every row alike)."""
    positions_N = jnp.asarray(pos0, jnp.int32) + jnp.arange(n, dtype=jnp.int32)
    return jnp.broadcast_to(positions_N[None, :], (batch, n))
