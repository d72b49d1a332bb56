"""MegaByte's cached decoder (:class:`~bytelm.sampling.decoders.Decoder`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bytelm.constants import BOS_ID, NUM_BYTE_IDS, PAD_ID
from bytelm.sampling.decoders import Decoder, allowed_ids, byte_of_unit, byte_units, host_i32, jit_call


class MegaByteDecoder(Decoder):
    """MegaByte: ``[BOS, bytes...]`` in patches (the BOS is the first patch's first byte, as in
    training). One call per byte: the local model's step, or, at a patch boundary, the global
    model's step for the new patch fused with the local model's first position in it (its cache
    restarted)."""

    def __init__(self, model, context: int):
        self.model, self.C, self.context = model, model.patch_size, context
        self.width = model.cfg.padded_length(context + 1)  # the BOS and ``context`` bytes
        self.allowed_V = allowed_ids(NUM_BYTE_IDS)
        V, C = NUM_BYTE_IDS, self.C

        def prefill(m, prev_1xPxC, local_prev_1xN, caches):
            fg_1xPxCxD, global_cache = m.global_model(
                m.global_rows(prev_1xPxC, 0), cache=caches["global"], pos0=0
            )
            fg_1xCxD = fg_1xPxCxD[:, -1]
            N = local_prev_1xN.shape[1]
            logits, local_cache = m.local_model(
                m.local_inputs(fg_1xCxD[:, :N], local_prev_1xN), cache=caches["local"], pos0=0
            )
            return logits[0, -1, :V], fg_1xCxD, global_cache, local_cache

        def local_step(m, fg_1xCxD, unit_1x1, local_cache, c):
            slot_1x1xD = jax.lax.dynamic_slice_in_dim(fg_1xCxD, c, 1, axis=1)
            logits, local_cache = m.local_model(
                m.local_inputs(slot_1x1xD, unit_1x1), cache=local_cache, pos0=c
            )
            return logits[0, -1, :V], local_cache

        def next_patch(m, patch_1x1xC, global_cache, p):
            fg_1x1xCxD, global_cache = m.global_model(
                m.global_rows(patch_1x1xC, p), cache=global_cache, pos0=p
            )
            fg_1xCxD = fg_1x1xCxD[:, 0]
            fresh = m.local_stack.init_cache(1, C)  # the local model restarts with every patch
            pad_1x1 = jnp.full((1, 1), -1, jnp.int32)
            logits, local_cache = m.local_model(m.local_inputs(fg_1xCxD[:, :1], pad_1x1), cache=fresh, pos0=0)
            return logits[0, -1, :V], fg_1xCxD, global_cache, local_cache

        self._prefill = jit_call(prefill, model, donate=(2,))
        self._local_step = jit_call(local_step, model, donate=(2,))
        self._next_patch = jit_call(next_patch, model, donate=(1,))
        self._forward = jit_call(lambda m, ids: m(ids), model)
        self.global_calls = 0

    def start(self, prompt: bytes) -> np.ndarray:
        ids = [BOS_ID, *byte_units(prompt)]
        self._check_prompt(len(ids), self.context)
        C = self.C
        p = len(ids) // C
        prev = np.zeros((1, p + 1, C), np.int32)  # row q reads patch q - 1 (row 0: the pad)
        prev[0, 1:] = np.asarray(ids[: p * C], np.int32).reshape(p, C)
        self.current = ids[p * C :]
        local_prev = host_i32([[-1, *self.current]])  # the learned pad, then the patch's bytes so far
        logits, self.from_global, self.global_cache, self.local_cache = self._prefill(
            prev, local_prev, self.model.init_cache(1, self.width // C)
        )
        self.global_calls += 1
        self.patch = p
        return np.asarray(logits)

    def step(self, unit: int) -> np.ndarray:
        self.current.append(unit)
        c = len(self.current)
        if c == self.C:  # the patch is complete: the global step for the next one
            self.patch += 1
            logits, self.from_global, self.global_cache, self.local_cache = self._next_patch(
                host_i32([[self.current]]), self.global_cache, host_i32(self.patch)
            )
            self.global_calls += 1
            self.current = []
        else:
            logits, self.local_cache = self._local_step(
                self.from_global, host_i32([[unit]]), self.local_cache, host_i32(c)
            )
        return np.asarray(logits)

    def recompute(self, prompt: bytes, units: list[int]) -> np.ndarray:
        ids = [BOS_ID, *byte_units(prompt), *units]
        self._check_recompute(len(ids), self.context)
        row = np.full((1, self.width), PAD_ID, np.int32)
        row[0, : len(ids)] = ids
        return self._valid(self._forward(row)[0, len(ids)])

    def unit_bytes(self, unit: int) -> bytes:
        return byte_of_unit(unit)

    def stats(self) -> dict:
        return {"global_calls": self.global_calls, "patch_size": self.C}
