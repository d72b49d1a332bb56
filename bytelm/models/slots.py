"""Marked positions gathered into a static number of slots per row: H-Net's chunks, SpaceByte's
global positions. A row with more marks than slots keeps its first ones (a causal rule: whether
position ``t`` gets a slot depends on the marks at ``<= t`` only)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def keep_boundaries(b_BxT: jax.Array, slots: int) -> jax.Array:
    """The boundaries that get a slot: the first ``slots`` of each row (the causal slot rule)."""
    rank_BxT = jnp.cumsum(b_BxT.astype(jnp.int32), axis=1) - 1
    return b_BxT & (rank_BxT < slots)


def chunk_positions(keep_BxT: jax.Array, slots: int) -> tuple[jax.Array, jax.Array]:
    """``(position_BxM, n_chunks_B)``: the position of each slot's boundary (0 for empty slots) and
    how many slots are filled."""
    B, T = keep_BxT.shape
    index_BxT = jnp.cumsum(keep_BxT.astype(jnp.int32), axis=1) - 1
    slot_BxT = jnp.where(keep_BxT, index_BxT, slots)  # not a boundary: out of range, dropped
    rows_BxT = jnp.broadcast_to(jnp.arange(B)[:, None], (B, T))
    t_BxT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None, :], (B, T))
    position_BxM = jnp.zeros((B, slots), jnp.int32).at[rows_BxT, slot_BxT].set(t_BxT, mode="drop")
    return position_BxM, jnp.sum(keep_BxT, axis=1, dtype=jnp.int32)
