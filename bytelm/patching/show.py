"""Patch a piece of text for inspection (``bytelm patch``): patch the text with an entropy model
and settings (a BLT run's, found by :mod:`bytelm.families.blt.source`), and render it with its
boundaries marked.

A text ``t`` becomes the row ``[BOS, t[0] + 4, t[1] + 4, ...]``; text byte ``j`` sits at row
position ``j + 1``, and its entropy (the model's uncertainty about it) is ``H[j]``, the entropy
after position ``j``. The BOS patch is not shown.
"""

from __future__ import annotations

import dataclasses
import logging
import unicodedata

import numpy as np

from bytelm.constants import BOS_ID, BYTE_OFFSET
from bytelm.errors import UserError
from bytelm.patching.calibrate import calibrate_threshold, mean_patch_length
from bytelm.patching.patchers import entropy_starts

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PatchedText:
    data: bytes
    entropies: np.ndarray  # float32[n]: entropies[j] = uncertainty about text byte j (H after row position j)
    starts: np.ndarray  # bool[n]: a patch starts at text byte j (starts[0] is always True)
    threshold: float | None
    monotonic_threshold: float | None
    max_patch_len: int | None
    calibrated: bool  # threshold calibrated on this text (target_len given)
    target_len: float | None
    mean_patch_len: float  # positions (BOS included) / patches (the BOS patch included)

    @property
    def n_patches(self) -> int:
        """Patches of the text (the BOS patch excluded)."""
        return int(self.starts.sum())

    @property
    def text_mean_patch_len(self) -> float:
        """Text bytes / text patches (the BOS patch excluded)."""
        return len(self.data) / max(self.n_patches, 1)

    def patches(self) -> list[bytes]:
        cuts = [*np.flatnonzero(self.starts).tolist(), len(self.data)]
        return [self.data[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def text_ids(data: bytes) -> np.ndarray:
    """``[BOS, b0 + 4, b1 + 4, ...]`` as int32."""
    return np.concatenate([[BOS_ID], np.frombuffer(data, np.uint8).astype(np.int32) + BYTE_OFFSET]).astype(
        np.int32
    )


def patch_text(
    model,
    data: bytes,
    *,
    threshold: float | None = None,
    monotonic_threshold: float | None = None,
    max_patch_len: int | None = None,
    target_len: float | None = None,
) -> PatchedText:
    """Entropy-patch ``data`` with ``model`` (an :class:`~bytelm.patching.EntropyModel`).

    With ``target_len`` the global threshold is calibrated on ``data`` itself (closest achievable
    mean when the text is too short to land within 2%); otherwise ``threshold`` and/or
    ``monotonic_threshold`` are used as given.
    """
    if not data:
        raise UserError("the text to patch is empty; give some text (--text or --file)")
    if threshold is None and monotonic_threshold is None and target_len is None:
        raise UserError(
            "an entropy-model run has no patching settings: give a threshold (--threshold T, nats) or a "
            "target mean patch length to calibrate on the text (--target-len L)"
        )
    ids = text_ids(data)
    h = model.entropies(ids[None])[0]
    if target_len is not None:
        threshold, _ = calibrate_threshold(
            h[None],
            ids[None],
            target_len,
            max_patch_len=max_patch_len,
            monotonic_threshold=monotonic_threshold,
            strict=False,
        )
        log.info("threshold %.6g calibrated on the %d-byte text itself", threshold, len(data))
    starts = entropy_starts(
        ids, h, threshold=threshold, monotonic_threshold=monotonic_threshold, max_patch_len=max_patch_len
    )
    return PatchedText(
        data=data,
        entropies=h[: len(data)],
        starts=starts[1:],
        threshold=threshold,
        monotonic_threshold=monotonic_threshold,
        max_patch_len=max_patch_len,
        calibrated=target_len is not None,
        target_len=target_len,
        mean_patch_len=mean_patch_length(starts, [len(ids)]),
    )


_NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}


def escape_bytes(data: bytes, *, sep: str = "|") -> str:
    r"""Printable text for ``data``: valid UTF-8 shown as is; ``\n \t \r \\`` and the separator
    (as ``\|``) escaped; other non-printable characters as ``\xNN`` / ``\uNNNN``; invalid or
    partial UTF-8 (a character split across patches) as ``\xNN`` per byte.

    >>> escape_bytes(b"a|b\n\xc3")
    'a\\|b\\n\\xc3'
    """
    out = []
    for ch in data.decode("utf-8", errors="surrogateescape"):
        code = ord(ch)
        if ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif ch == sep:
            out.append("\\" + sep)
        elif 0xDC80 <= code <= 0xDCFF:  # an undecodable byte
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch == " " or (ch.isprintable() and unicodedata.category(ch) not in ("Zl", "Zp")):
            out.append(ch)
        else:
            out.append(
                f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
            )
    return "".join(out)


def format_patches(patches: list[bytes], *, sep: str = "|") -> str:
    """The patches, each escaped (:func:`escape_bytes`), joined by ``sep``."""
    return sep.join(escape_bytes(p, sep=sep) for p in patches)
