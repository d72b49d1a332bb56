"""Patching for BLT: where patches start, their static-shape layout, and the entropy model.

Representation and conventions (see :mod:`bytelm.patching.patchers` for details):

- Rows are model ids (``byte + 4``; ``PAD=0, BOS=1, EOS=2, SEP=3``), one row ``(L,)`` or a batch
  ``(B, L)``. Trailing PADs are padding: a row's real length is its last non-PAD index + 1.
- Patchers return boolean ``starts`` of the same shape: ``starts[i]`` = a patch starts at ``i``;
  ``starts[0]`` is True for a non-empty row; padding positions are False and belong to no patch.
  BOS rule: where ``ids[i] == BOS``, ``starts[i]`` and ``starts[i + 1]`` are True; positions 0 and
  1 always start a patch.
- Entropies ``H[i]`` (nats) are those of the next-id distribution after position ``i``; global rule:
  a start at ``i + 1`` when ``H[i] > threshold``; monotonic rule: when ``H[i] - H[i-1] >
  monotonic_threshold`` (``i >= 1``); ``max_patch_len`` splits long patches left to right.
- ``cap_starts``: the causal slot rule (once ``P`` patches are used, the rest of the row joins the
  last one); ``starts_to_lengths`` -> ``int32[B, P]`` lengths, zero-padded, summing to the real
  length (``PatchOverflowError`` instead of ever dropping bytes); ``lengths_to_patch_ids`` -> ``int32[B,
  L]`` patch index per position, the padding tail getting the row's number of real patches.
- Everything is causal: boundaries inside ``x[:k]`` never depend on ``x[k:]``.
"""

from bytelm.patching.calibrate import calibrate_threshold, mean_patch_length
from bytelm.patching.entropy import (
    EntropyModel,
    EntropyPatcher,
    PatchLayout,
    SpacePatcher,
    params_fingerprint,
)
from bytelm.patching.lengths import (
    PatchOverflowError,
    cap_starts,
    lengths_to_patch_ids,
    patch_counts,
    starts_to_lengths,
)
from bytelm.patching.patchers import (
    apply_max_len,
    entropy_starts,
    real_lengths,
    space_like,
    space_starts,
    static_starts,
    valid_mask,
)
from bytelm.patching.show import (
    PatchedText,
    format_patches,
    patch_text,
    patch_windows,
    read_windows,
    text_ids,
)

__all__ = [
    "EntropyModel",
    "EntropyPatcher",
    "PatchLayout",
    "PatchOverflowError",
    "SpacePatcher",
    "PatchedText",
    "apply_max_len",
    "calibrate_threshold",
    "cap_starts",
    "entropy_starts",
    "format_patches",
    "lengths_to_patch_ids",
    "mean_patch_length",
    "params_fingerprint",
    "patch_counts",
    "patch_text",
    "patch_windows",
    "read_windows",
    "real_lengths",
    "space_like",
    "space_starts",
    "starts_to_lengths",
    "static_starts",
    "text_ids",
    "valid_mask",
]
