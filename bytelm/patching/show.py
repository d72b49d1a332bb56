"""Patch a text for inspection (``bytelm patch``): patch the text with an entropy model and
settings (a BLT run's, found by :mod:`bytelm.families.blt.source`), and render it with its
boundaries marked.

A text of any length is patched as a BLT run patches the stream it trains on: cut into windows of
``width`` positions (the run's ``train.seq_len + 1``), the first holding ``[BOS, t[0] + 4, ...]``
(``width - 1`` text bytes) and each later one the next ``width`` bytes, each window patched by
itself (its own row of the entropy model, the boundary rules of
:func:`~bytelm.patching.patchers.entropy_starts`, which start a patch at a window's first two
positions). Windows are read from the file as they are needed (:func:`read_windows`,
:func:`patch_windows`), so memory does not grow with the text. In the first window text byte ``j``
sits at row position ``j + 1`` and its entropy (the model's uncertainty about it) is ``H[j]``, the
entropy after position ``j``; in a later window byte ``j`` sits at ``j`` and its entropy is
``H[j - 1]`` (none for the window's first byte, which its row does not predict: NaN). The BOS patch
is not shown.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import logging
import os
import sys
import unicodedata
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import numpy as np

from bytelm.constants import BOS_ID, BYTE_OFFSET
from bytelm.errors import UserError
from bytelm.patching.calibrate import calibrate_threshold, mean_patch_length
from bytelm.patching.patchers import entropy_starts

log = logging.getLogger(__name__)

#: windows a threshold is calibrated on (``--target-len``): the first 256 of the text
CALIBRATION_WINDOWS = 256


@dataclasses.dataclass(frozen=True)
class PatchedText:
    data: bytes
    entropies: np.ndarray  # float32[n]: entropies[j] = uncertainty about text byte j (module docstring)
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


def read_windows(stream: BinaryIO, width: int) -> Iterator[bytes]:
    """The text of each window, read as needed: ``width - 1`` bytes for the first (its row starts
    with BOS), then ``width`` at a time (module docstring); memory holds one window."""
    if width < 2:
        raise ValueError(f"a window needs at least 2 positions, got width {width}")
    size = width - 1
    while chunk := stream.read(size):
        yield chunk
        size = width


def open_text(text: str | None = None, file: str | os.PathLike | None = None) -> tuple[BinaryIO, int]:
    """The bytes to show, as a stream to read windows from, and their length: the file ``file``'s,
    else the string ``text``'s (its own bytes, as the command line gave them)."""
    if file is None:
        data = os.fsencode(text or "")
        return io.BytesIO(data), len(data)
    try:
        stream = open(file, "rb")  # noqa: SIM115 (the caller closes it)
    except OSError as e:
        raise UserError(f"cannot read --file {file}: {e.strerror}; give a readable file") from None
    try:
        return stream, os.fstat(stream.fileno()).st_size
    except OSError as e:
        stream.close()
        raise UserError(f"cannot read --file {file}: {e.strerror}; give a readable file") from None


def read_text(text: str | None = None, file: str | os.PathLike | None = None) -> bytes:
    """All the bytes :func:`open_text` opens."""
    stream, _ = open_text(text, file)
    with stream:
        try:
            return stream.read()
        except OSError as e:
            raise UserError(f"cannot read --file {file}: {e.strerror}; give a readable file") from None


@dataclasses.dataclass
class PatchTally:
    """What the windows of a text came to, window by window (:meth:`add`): the first window (the
    one drawn, whose settings a calibration chose), and the windows, bytes and patches so far."""

    first: PatchedText | None = None
    n_windows: int = 0
    n_bytes: int = 0
    n_patches: int = 0  # the BOS patch excluded

    def add(self, part: PatchedText) -> None:
        self.first = self.first or part
        self.n_windows += 1
        self.n_bytes += len(part.data)
        self.n_patches += part.n_patches

    @property
    def mean_patch_len(self) -> float:
        """Text bytes per patch."""
        return self.n_bytes / max(self.n_patches, 1)

    @property
    def mean_patch_len_with_bos(self) -> float:
        """Bytes per patch counting the BOS patch, as calibration does."""
        return (self.n_bytes + 1) / (self.n_patches + 1)


def _window_row(chunk: bytes, first: bool) -> np.ndarray:
    ids = np.frombuffer(chunk, np.uint8).astype(np.int32) + BYTE_OFFSET
    return np.concatenate([[BOS_ID], ids]).astype(np.int32) if first else ids


def patch_windows(
    model,
    windows: Iterable[bytes],
    *,
    width: int,
    threshold: float | None = None,
    monotonic_threshold: float | None = None,
    max_patch_len: int | None = None,
    target_len: float | None = None,
    calibration_windows: int = CALIBRATION_WINDOWS,
    rows_per_call: int = 16,
) -> Iterator[PatchedText]:
    """Entropy-patch a text window by window (:func:`read_windows`), one :class:`PatchedText` per
    window, each patched by itself in a row of ``width`` positions (module docstring).

    With ``target_len`` the global threshold is calibrated on the first ``calibration_windows``
    windows (all of a shorter text; the closest achievable mean when they are too few to land within
    2%); otherwise ``threshold`` and/or ``monotonic_threshold`` are used as given."""
    if threshold is None and monotonic_threshold is None and target_len is None:
        raise UserError(
            "an entropy-model run has no patching settings: give a threshold (--threshold T, nats) or a "
            "target mean patch length to calibrate on the text (--target-len L)"
        )
    it = iter(windows)
    first = True

    def rows_of(chunks: list[bytes]) -> np.ndarray:
        nonlocal first
        rows = np.zeros((len(chunks), width), np.int32)  # PAD after a short (last) window
        for r, chunk in enumerate(chunks):
            row = _window_row(chunk, first)
            rows[r, : len(row)] = row
            first = False
        return rows

    calibrated = False
    if target_len is not None:
        chunks = list(itertools.islice(it, calibration_windows))
        if not chunks:
            raise UserError("the text to patch is empty; give some text (--text or --file)")
        rows = rows_of(chunks)
        h = model.entropies(rows)
        threshold, _ = calibrate_threshold(
            h,
            rows,
            target_len,
            strict=False,
            monotonic_threshold=monotonic_threshold,
            max_patch_len=max_patch_len,
        )
        calibrated = True
        log.info("threshold %.6g calibrated on the first %d window(s) of the text", threshold, len(chunks))
        pending = [(chunks, rows, h)]
    else:
        pending = []
    while True:
        if pending:
            chunks, rows, h = pending.pop()
        else:
            chunks = list(itertools.islice(it, rows_per_call))
            if not chunks:
                return
            rows = rows_of(chunks)
            h = model.entropies(rows)
        starts = entropy_starts(
            rows, h, threshold=threshold, monotonic_threshold=monotonic_threshold, max_patch_len=max_patch_len
        )
        for r, chunk in enumerate(chunks):
            n = len(chunk)
            bos = int(rows[r, 0] == BOS_ID)  # (the first window's row; a text byte is never BOS)
            # the uncertainty about text byte j is the entropy after the position before it
            about = np.full(n, np.nan, np.float32)
            if bos:
                about[:] = h[r, :n]
            else:
                about[1:] = h[r, : n - 1]
            yield PatchedText(
                data=chunk,
                entropies=about,
                starts=starts[r, bos : bos + n],
                threshold=threshold,
                monotonic_threshold=monotonic_threshold,
                max_patch_len=max_patch_len,
                calibrated=calibrated,
                target_len=target_len,
                mean_patch_len=mean_patch_length(starts[r], [n + bos]),
            )


def patch_text(
    model,
    data: bytes,
    *,
    threshold: float | None = None,
    monotonic_threshold: float | None = None,
    max_patch_len: int | None = None,
    target_len: float | None = None,
    width: int | None = None,
) -> PatchedText:
    """Entropy-patch ``data`` with ``model`` (an :class:`~bytelm.patching.EntropyModel`): in windows of
    ``width`` positions (:func:`patch_windows`), or as one row ``[BOS, data]`` when ``width`` is None.

    With ``target_len`` the global threshold is calibrated on ``data`` itself (closest achievable
    mean when the text is too short to land within 2%); otherwise ``threshold`` and/or
    ``monotonic_threshold`` are used as given.
    """
    if not data:
        raise UserError("the text to patch is empty; give some text (--text or --file)")
    width = width or len(data) + 1
    parts = list(
        patch_windows(
            model,
            read_windows(io.BytesIO(data), width),
            width=width,
            threshold=threshold,
            monotonic_threshold=monotonic_threshold,
            max_patch_len=max_patch_len,
            target_len=target_len,
            calibration_windows=sys.maxsize,
        )
    )
    starts = np.concatenate([p.starts for p in parts])
    return dataclasses.replace(
        parts[0],
        data=data,
        entropies=np.concatenate([p.entropies for p in parts]),
        starts=starts,
        mean_patch_len=(len(data) + 1) / (int(starts.sum()) + 1),
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
