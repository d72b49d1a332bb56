"""The patch rule decided one position at a time, for generation (``bytelm sample``).

:class:`OnlineStarts` gives, for position ``i + 1``, the same decision as the batch rule of
training and evaluation: :func:`~bytelm.patching.patchers.entropy_starts` (forced starts at 0 and
1, the global and monotonic entropy rules, ``max_patch_len``) followed by the causal slot rule
:func:`~bytelm.patching.lengths.cap_starts`. Each decision looks only at the entropies up to
position ``i``, which is what lets a generator decide before it has sampled byte ``i + 1``; a test
checks the two against each other on random entropies. Rows are taken to hold BOS at position 0
only (generation never emits BOS).
"""

from __future__ import annotations

import numpy as np


class OnlineStarts:
    """Patch starts, one position at a time. ``max_patches`` None: no slot limit (what generation
    uses past the training window, where no training rule exists)."""

    def __init__(
        self,
        threshold: float | None,
        monotonic_threshold: float | None,
        max_patch_len: int | None,
        max_patches: int | None,
    ):
        if threshold is None and monotonic_threshold is None:
            raise ValueError("an online patch rule needs threshold, monotonic_threshold, or both")
        # compared in float32, as entropy_starts compares the entropy model's float32 entropies
        self.threshold = None if threshold is None else np.float32(threshold)
        self.monotonic = None if monotonic_threshold is None else np.float32(monotonic_threshold)
        self.max_patch_len, self.max_patches = max_patch_len, max_patches
        self.position = -1  # the last position decided
        self.patches = 0  # patches started so far
        self.run = 0  # positions since the last start
        self.prev_h: np.float32 | None = None

    def start_at_zero(self) -> bool:
        """Position 0 always starts the first patch (a new row: nothing before it counts)."""
        self.position, self.patches, self.run, self.prev_h = 0, 1, 1, None
        return True

    def next(self, h: float) -> bool:
        """Whether a patch starts at the next position, given the entropy after the current one."""
        i, h32 = self.position, np.float32(h)
        wanted = i == 0  # forced start at 1: the first position is a patch of its own
        if self.threshold is not None and h32 > self.threshold:
            wanted = True
        if self.monotonic is not None and self.prev_h is not None and h32 - self.prev_h > self.monotonic:
            wanted = True
        # (>=: a patch that grew past the limit under the slot cap is split as soon as the cap lifts)
        if self.max_patch_len is not None and self.run >= self.max_patch_len:
            wanted = True
        if wanted and self.max_patches is not None and self.patches >= self.max_patches:
            wanted = False  # the slots are used: the rest joins the last patch
        self.prev_h = h32
        self.position += 1
        if wanted:
            self.patches += 1
            self.run = 1
        else:
            self.run += 1
        return wanted

    def lift_slot_limit(self) -> None:
        """Past the training window: patches open again whatever the slots used so far."""
        self.max_patches = None
