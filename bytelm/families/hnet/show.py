"""An H-Net's learned chunks on a piece of text (``bytelm chunks``): the text as the row
``[BOS, t[0] + 4, ...]`` through the model, each stage's chunk starts mapped to text bytes (text
byte ``j`` sits at row position ``j + 1``; the chunk that starts at the BOS and runs into the text
is shown as starting at the text), and stage 1's router probabilities per byte."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from bytelm.errors import UserError
from bytelm.families.hnet.model import HNet
from bytelm.patching.show import text_ids


@dataclasses.dataclass(frozen=True)
class ChunkedText:
    data: bytes
    starts: list[np.ndarray]  # per stage (outside in), bool[n]: a chunk of that stage starts at byte j
    probs: np.ndarray  # float[n]: stage 1's router probability at text byte j

    def chunks(self, stage: int) -> list[bytes]:
        cuts = [*np.flatnonzero(self.starts[stage]).tolist(), len(self.data)]
        return [self.data[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]

    def mean_chunk_len(self, stage: int) -> float:
        """Text bytes per chunk of ``stage`` on this text."""
        return len(self.data) / max(int(self.starts[stage].sum()), 1)


def chunk_text(model: HNet, data: bytes, context: int) -> ChunkedText:
    """The chunks ``model`` makes of ``data`` (at most ``context - 1`` bytes: the BOS and the text
    within the training context, where the chunk slots are the training window's)."""
    if not data:
        raise UserError("the text to chunk is empty; give some text (--text or --file)")
    if len(data) + 1 > context:
        raise UserError(
            f"the text is {len(data)} bytes but the model's context holds {context - 1} after the BOS "
            "(train.seq_len); give a shorter text"
        )
    row = np.zeros((1, context), np.int32)  # (PAD after the text: one program for every text)
    ids = text_ids(data)
    row[0, : len(ids)] = ids
    starts, p = jax.jit(model.byte_boundaries)(row)
    n = len(data)
    per_stage = []
    for marks in starts:
        s = np.asarray(marks)[0, 1 : n + 1].copy()
        s[0] = True
        per_stage.append(s)
    return ChunkedText(data, per_stage, np.asarray(p)[0, 1 : n + 1])
