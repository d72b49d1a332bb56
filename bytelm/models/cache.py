"""Key/value caches for decoding: a stack run a few positions at a time over what came before.

A :class:`KVCache` holds ``S`` slots of keys and values (rotated at their absolute positions) and
the absolute position in each slot (-1: empty). :func:`stack_extend` runs a chunk of ``N`` new
positions through a :class:`~bytelm.models.core.Transformer`: each layer writes the chunk's keys and
values into slots ``position % S`` and attends from the chunk over the cache, under the causal
mask and the stack's sliding window. So the cache is a ring buffer of the last ``S`` positions
(the decoders size it to the training context): a sliding-window stack attends to its window
within it, and a stack with full attention becomes a sliding window of ``S`` once a generation
runs past that context.

A chunk of more than one position (the prefill of a prompt) must start on an empty cache and fit
it (``N <= S``); decoding goes one position at a time. The attention runs through
:func:`~bytelm.models.attention.attend` with an explicit mask (the XLA path).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from bytelm.models.attention import attend
from bytelm.models.core import Attention, Block, Transformer, apply_rotary, rotary_tables


class KVCache(NamedTuple):
    k_BxSxHxK: jax.Array
    v_BxSxHxK: jax.Array
    pos_S: jax.Array  # int32 absolute position held by each slot; -1 = empty


def empty_cache(attn: Attention, batch: int, slots: int) -> KVCache:
    shape = (batch, slots, attn.n_heads, attn.head_dim)
    return KVCache(
        jnp.zeros(shape, attn.dtype), jnp.zeros(shape, attn.dtype), jnp.full((slots,), -1, jnp.int32)
    )


def stack_cache(stack: Transformer, batch: int, slots: int) -> list[KVCache]:
    """One empty cache of ``slots`` positions per layer of ``stack``."""
    return [empty_cache(block.attn, batch, slots) for block in stack.layer_blocks()]


def attention_extend(
    attn: Attention, x_BxNxD: jax.Array, cache: KVCache, pos0: jax.Array, window: int
) -> tuple[jax.Array, KVCache]:
    """Causal self-attention of ``N`` new positions (absolute ``pos0 .. pos0 + N - 1``) over the
    cache and themselves; returns the output and the cache with the chunk written in."""
    dt = attn.dtype
    B, N, _ = x_BxNxD.shape
    x = x_BxNxD.astype(dt)
    q_BxNxHxK, k_BxNxHxK, v_BxNxHxK = attn.project(x, x)
    pos_N = pos0 + jnp.arange(N, dtype=jnp.int32)
    cos, sin = rotary_tables(pos_N[None, :], N, attn.head_dim, attn.rope_base)
    q_BxNxHxK = apply_rotary(q_BxNxHxK, cos[:, :, None], sin[:, :, None])
    k_BxNxHxK = apply_rotary(k_BxNxHxK, cos[:, :, None], sin[:, :, None])
    S = cache.pos_S.shape[0]
    if N > S:  # (static) two positions of the chunk would share a slot
        raise ValueError(f"a chunk of {N} positions does not fit a cache of {S} slots")
    slot_N = pos_N % S
    k_cache = cache.k_BxSxHxK.at[:, slot_N].set(k_BxNxHxK.astype(cache.k_BxSxHxK.dtype))
    v_cache = cache.v_BxSxHxK.at[:, slot_N].set(v_BxNxHxK.astype(cache.v_BxSxHxK.dtype))
    pos_S = cache.pos_S.at[slot_N].set(pos_N)
    allowed_NxS = (pos_S[None, :] >= 0) & (pos_S[None, :] <= pos_N[:, None])
    if window > 0:
        allowed_NxS &= pos_S[None, :] > pos_N[:, None] - window
    mask_BxNxS = jnp.broadcast_to(allowed_NxS[None], (B, N, S))
    out_BxNxHxK = attend(
        q_BxNxHxK, k_cache, v_cache, causal=False, mask_BxTxS=mask_BxNxS, implementation="xla"
    )
    return jnp.einsum("bthk,hkd->btd", out_BxNxHxK, attn.wo[...].astype(dt)), KVCache(k_cache, v_cache, pos_S)


def block_extend(
    block: Block, x_BxNxD: jax.Array, cache: KVCache, pos0: jax.Array, window: int
) -> tuple[jax.Array, KVCache]:
    attn_out, cache = attention_extend(block.attn, block.attn_norm(x_BxNxD), cache, pos0, window)
    h = x_BxNxD + attn_out.astype(x_BxNxD.dtype)
    return h + block.mlp(block.mlp_norm(h)).astype(h.dtype), cache


def stack_extend(
    stack: Transformer, x_BxNxD: jax.Array, caches: list[KVCache], pos0: jax.Array
) -> tuple[jax.Array, list[KVCache]]:
    """:meth:`Transformer.__call__` for ``N`` new positions after the cached ones."""
    new = []
    for block, cache in zip(stack.layer_blocks(), caches):
        x_BxNxD, cache = block_extend(block, x_BxNxD, cache, pos0, stack.window)
        new.append(cache)
    return x_BxNxD, new
