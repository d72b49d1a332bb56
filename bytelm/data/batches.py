"""Batches every family shares: random training windows of a flat id stream, deterministic in
``(seed, step)``, and evaluation rows of encoded segments at one fixed width.

Batch ``step`` is a pure function of ``(seed, step)``: resuming at step ``k`` is constructing the
iterator with ``step=k`` (nothing is replayed). Each host draws the same global start offsets and
gathers only its own rows, so the hosts' slices are disjoint and together make the global batch.
The hot path is numpy only: one small RNG draw and one gather per batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np

from bytelm.constants import PAD_ID
from bytelm.errors import UserError


class DerivedStream(Protocol):
    """An id stream that is not stored but derived, and gathers its own rows (the corpus's
    :class:`~bytelm.data.corpus.TrainStream`)."""

    def __len__(self) -> int: ...

    def windows(self, starts: np.ndarray, width: int) -> np.ndarray: ...


Stream = np.ndarray | DerivedStream


class WindowBatches:
    """Iterator over ``int32`` arrays of shape ``(batch_size // process_count, window)``.

    ``stream`` is any 1-D integer array (a ``uint16`` memmap of BPE ids), or a stream that gathers
    its own rows (``windows(starts, width)``: the corpus's derived byte-id stream); each row
    is ``stream[s : s + window]`` for a start ``s`` drawn uniformly from the valid range. For a
    language model use ``window = T + 1`` (inputs ``row[:-1]``, targets ``row[1:]``). The host
    layout (``process_index`` of ``process_count``, e.g. ``jax.process_index()``) is always given:
    a default would silently hand every host the same rows.
    """

    def __init__(
        self,
        stream: Stream,
        *,
        batch_size: int,
        window: int,
        seed: int = 0,
        step: int = 0,
        process_index: int,
        process_count: int,
    ) -> None:
        if getattr(stream, "ndim", 1) != 1:
            raise ValueError(f"stream must be 1-D, got shape {getattr(stream, 'shape', None)}")
        if window < 1 or batch_size < 1:
            raise UserError(f"batch_size ({batch_size}) and window ({window}) must be >= 1")
        if len(stream) < window:
            raise UserError(
                f"the training stream has {len(stream)} ids, fewer than one window of {window}: "
                "use a shorter train.seq_len or a larger corpus"
            )
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index {process_index} must lie in [0, process_count {process_count})")
        self.process_index, self.process_count = process_index, process_count
        if batch_size % self.process_count:
            raise UserError(
                f"train.batch_size {batch_size} is not divisible by the number of hosts {self.process_count}"
            )
        self.stream = stream
        self.batch_size = batch_size
        self.window = window
        self.seed = seed
        self.step = step
        self.local_batch = batch_size // self.process_count
        # a stream that derives its ids (the corpus's TrainStream) gathers rows itself
        self._gather = getattr(stream, "windows", None)
        self._rows = (
            None if self._gather else np.lib.stride_tricks.sliding_window_view(np.asarray(stream), window)
        )
        self._n_starts = len(stream) - window + 1

    def starts(self, step: int) -> np.ndarray:
        """The global batch's start offsets for ``step`` (identical on every host)."""
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, self._n_starts, size=self.batch_size, dtype=np.int64)

    def batch(self, step: int) -> np.ndarray:
        """This host's rows of the global batch ``step``."""
        lo = self.process_index * self.local_batch
        starts = self.starts(step)[lo : lo + self.local_batch]
        if self._gather is not None:
            return self._gather(starts, self.window)
        assert self._rows is not None
        return self._rows[starts].astype(np.int32)

    def state(self) -> dict:
        """What a checkpoint must store to resume: the next step (and the seed, to check it)."""
        return {"step": self.step, "seed": self.seed}

    def __iter__(self) -> WindowBatches:
        return self

    def __next__(self) -> np.ndarray:
        out = self.batch(self.step)
        self.step += 1
        return out


def segment_rows(
    encoded: Sequence[tuple[np.ndarray, np.ndarray | None]], *, width: int, batch_size: int, with_nbytes: bool
) -> Iterator[tuple[dict, int]]:
    """Evaluation batches of encoded segments (``(ids, nbytes)``: ids from BOS; each target's byte
    length, or None for one byte each): ``(batch, n_real_rows)`` with ``batch["ids"]`` of shape
    ``(batch_size, width)``, PAD after each segment and in the rows past the last one, and with
    ``with_nbytes`` the ``(batch_size, width - 1)`` byte lengths of the targets (0 on padding).

    One row width for every batch (the caller's training window), not the longest segment of a
    call: a segment's program, and so its score, must not depend on the segments it is scored with."""
    for lo in range(0, len(encoded), batch_size):
        chunk = encoded[lo : lo + batch_size]
        ids = np.full((batch_size, width), PAD_ID, np.int32)
        nbytes = np.zeros((batch_size, width - 1), np.int32)
        for r, (row_ids, row_nbytes) in enumerate(chunk):
            ids[r, : len(row_ids)] = row_ids
            nbytes[r, : len(row_ids) - 1] = 1 if row_nbytes is None else row_nbytes
        yield ({"ids": ids, "nbytes": nbytes} if with_nbytes else {"ids": ids}), len(chunk)
