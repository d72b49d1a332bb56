"""A decoder for any model that maps ids to logits: every unit by the full forward pass over the
prefix, no cache. What a family gets before it keeps caches of its own (slower per unit, and the
same logits by construction)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bytelm.constants import BOS_ID, PAD_ID
from bytelm.sampling.decoders import Decoder, allowed_ids, jit_call


class RecomputeDecoder(Decoder):
    """``model(ids_1xT) -> logits_1xTxV`` over ``[BOS, units...]``, recomputed for every unit on one
    padded width (``context`` positions: one compiled program). Past the context, the prefix slides:
    the model sees its last ``context`` ids, as a cached model's ring buffer does."""

    def __init__(
        self, model, context: int, encode: Callable[[bytes], list[int]], unit_bytes: Callable[[int], bytes]
    ):
        self.context, self.encode, self._unit_bytes = context, encode, unit_bytes
        n_valid = getattr(model, "n_valid", None)
        if not isinstance(n_valid, int):
            raise TypeError(
                f"{type(model).__name__} needs an int n_valid (its ids, the padding rows not counted)"
            )
        self.allowed_V = allowed_ids(n_valid)
        self._forward = jit_call(lambda m, ids: m(ids), model)
        self.ids: list[int] = []

    def _logits(self, ids: list[int]) -> np.ndarray:
        row = np.full((1, self.context), PAD_ID, np.int32)
        row[0, : len(ids)] = ids
        return self._valid(self._forward(row)[0, len(ids) - 1])

    def start(self, prompt: bytes) -> np.ndarray:
        self.ids = [BOS_ID, *self.encode(prompt)]
        self._check_prompt(len(self.ids), self.context)
        return self._logits(self.ids)

    def step(self, unit: int) -> np.ndarray:
        self.ids.append(unit)
        self.ids = self.ids[-self.context :]
        return self._logits(self.ids)

    def recompute(self, prompt: bytes, units: list[int]) -> np.ndarray:
        ids = [BOS_ID, *self.encode(prompt), *units]
        self._check_recompute(len(ids), self.context)
        return self._logits(ids)

    def unit_bytes(self, unit: int) -> bytes:
        return self._unit_bytes(unit)
