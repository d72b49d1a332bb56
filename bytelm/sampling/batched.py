"""Batched cached decoding for a model stepped one id per row: every row its own position and state
(H-Net's chunks, SpaceByte's global positions), so prompts of different lengths decode together.
A family gives two functions, ``init_state(model, batch, context) -> state`` and
``model_step(model, ids_B, active_B, state, context) -> (logits_BxV, state)`` (a row that is not
``active`` keeps its state); the prompt is fed by the same step under ``jax.lax.scan`` (one call),
so the prefill and each later id follow one rule."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from bytelm.constants import BOS_ID, NUM_BYTE_IDS, PAD_ID
from bytelm.sampling.decoders import Decoder, allowed_ids, byte_of_unit, byte_units, host_i32, jit_call


class BatchedSampler:
    """:meth:`prefill` a batch of prompts (id lists of any lengths), then :meth:`step` one id per row;
    both return each row's next-id logits (``B x V``). :attr:`state` is the rows' state after them."""

    def __init__(self, model, context: int, init_state: Callable, model_step: Callable):
        self.model, self.context, self._init_state = model, context, init_state

        def prefill(m, ids_BxL, lengths_B, state):
            def body(carry, t):
                state, last = carry
                active = t < lengths_B
                logits, state = model_step(m, ids_BxL[:, t], active, state, context)
                return (state, jnp.where(active[:, None], logits, last)), None

            last0 = jnp.zeros((ids_BxL.shape[0], m.vocab_rows), jnp.float32)
            (state, last), _ = jax.lax.scan(body, (state, last0), jnp.arange(ids_BxL.shape[1]))
            return last, state

        def step(m, ids_B, state):
            return model_step(m, ids_B, jnp.ones(ids_B.shape, bool), state, context)

        self._prefill = jit_call(prefill, model, donate=(2,))
        self._step = jit_call(step, model, donate=(1,))

    def prefill(self, prompts: list[list[int]]) -> np.ndarray:
        B, longest = len(prompts), max(len(p) for p in prompts)
        L = -(-longest // 32) * 32  # (a few prefill shapes, not one per prompt length)
        ids = np.full((B, L), PAD_ID, np.int32)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = p
        logits, self.state = self._prefill(
            ids, host_i32([len(p) for p in prompts]), self._init_state(self.model, B, self.context)
        )
        return np.asarray(logits)

    def step(self, ids: list[int]) -> np.ndarray:
        logits, self.state = self._step(host_i32(ids), self.state)
        return np.asarray(logits)


class ByteBatchedDecoder(Decoder):
    """A byte model's :class:`~bytelm.sampling.decoders.Decoder` over ``[BOS, bytes...]``: ``sampler``
    (a :class:`BatchedSampler`) with one row; :meth:`recompute`, the reference, the full pass over
    the prefix on one padded width."""

    def __init__(self, model, context: int, sampler: BatchedSampler):
        self.model, self.context, self.sampler = model, context, sampler
        self.allowed_V = allowed_ids(NUM_BYTE_IDS)
        self._forward = jit_call(lambda m, ids: m(ids), model)

    def start(self, prompt: bytes) -> np.ndarray:
        ids = [BOS_ID, *byte_units(prompt)]
        self._check_prompt(len(ids), self.context)
        return self._valid(self.sampler.prefill([ids])[0])

    def step(self, unit: int) -> np.ndarray:
        return self._valid(self.sampler.step([unit])[0])

    def recompute(self, prompt: bytes, units: list[int]) -> np.ndarray:
        ids = [BOS_ID, *byte_units(prompt), *units]
        self._check_recompute(len(ids), self.context)
        row = np.full((1, self.context), PAD_ID, np.int32)
        row[0, : len(ids)] = ids
        return self._valid(self._forward(row)[0, len(ids) - 1])

    def unit_bytes(self, unit: int) -> bytes:
        return byte_of_unit(unit)
