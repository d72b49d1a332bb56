"""Patch a piece of text for inspection (``bytelm patch``): find the entropy model and settings
of a run directory, patch the text, and render it with its boundaries marked.

A text ``t`` becomes the row ``[BOS, t[0] + 4, t[1] + 4, ...]``; text byte ``j`` sits at row
position ``j + 1``, and its entropy (the model's uncertainty about it) is ``H[j]``, the entropy
after position ``j``. The BOS patch is not shown.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import unicodedata
from pathlib import Path

import numpy as np

from bytelm.constants import BOS_ID, BYTE_OFFSET
from bytelm.errors import UserError
from bytelm.patching.calibrate import calibrate_threshold, mean_patch_length
from bytelm.patching.patchers import entropy_starts

log = logging.getLogger(__name__)

ENTROPY_FAMILY = "byte"
BLT_FAMILY = "blt"


@dataclasses.dataclass(frozen=True)
class PatchSource:
    """Where ``bytelm patch`` gets its entropy model and (for a BLT run) its patching settings."""

    run_dir: Path
    family: str  # "blt" or "byte"
    entropy_run: Path  # the entropy model's run directory (== run_dir for a "byte" run)
    settings: dict | None  # a BLT run's "patching" record; None for an entropy-model run

    def patch_kwargs(self, *, threshold: float | None = None, target_len: float | None = None) -> dict:
        """Keyword arguments for :func:`patch_text`: a BLT run's settings, with its global threshold
        replaced by ``threshold`` or by calibration to ``target_len`` when either is given."""
        if threshold is not None and target_len is not None:
            raise UserError("give either a threshold or a target mean patch length, not both")
        if target_len is not None and not target_len >= 1:
            raise UserError(f"target mean patch length {target_len} is below 1: a patch holds at least one byte; use a target >= 1")
        settings = self.settings or {}
        kwargs = {
            "threshold": threshold if threshold is not None or target_len is not None else settings.get("threshold"),
            "monotonic_threshold": settings.get("monotonic_threshold"),
            "max_patch_len": settings.get("max_patch_len"),
            "target_len": target_len,
        }
        if kwargs["threshold"] is None and kwargs["monotonic_threshold"] is None and target_len is None:
            raise UserError(
                f"{self.run_dir} is an entropy-model run with no patching settings: give a threshold (--threshold T, "
                f"nats) or a target mean patch length to calibrate on the text (--target-len L)"
            )
        return kwargs

    def check_fingerprint(self, fingerprint: str) -> None:
        """A BLT run that recorded its entropy model's fingerprint must get that very model."""
        recorded = (self.settings or {}).get("entropy_fingerprint")
        if recorded and recorded != fingerprint:
            raise UserError(
                f"the entropy model in {self.entropy_run} (fingerprint {fingerprint[:16]}...) is not the one the BLT "
                f"run {self.run_dir} was trained with (fingerprint {recorded[:16]}...); restore the original entropy "
                f"run or point run.json's entropy_run at it"
            )


def _read_run_json(run_dir: Path) -> dict:
    path = run_dir / "run.json"
    if not path.is_file():
        raise UserError(
            f"{run_dir} is not a run directory (no run.json); give a BLT run or an entropy-model run "
            f"trained with 'bytelm train CONFIG --out RUN_DIR'"
        )
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}; re-run the training that wrote it") from None


def read_patch_source(run_dir: str | Path) -> PatchSource:
    """Resolve ``run_dir`` (a BLT run or an entropy-model run) to its entropy run and settings."""
    run_dir = Path(run_dir)
    info = _read_run_json(run_dir)
    family = info.get("family")
    if family == ENTROPY_FAMILY:
        return PatchSource(run_dir, family, run_dir, None)
    if family != BLT_FAMILY:
        raise UserError(
            f"{run_dir} is a {family!r} run; 'bytelm patch' needs a BLT run (family 'blt') or an entropy-model "
            f"run (family 'byte', e.g. trained from configs/tiny/entropy.toml)"
        )
    entropy_run = info.get("entropy_run")
    settings = info.get("patching")
    if not entropy_run or not isinstance(settings, dict) or settings.get("threshold") is None and settings.get(
        "monotonic_threshold"
    ) is None:
        raise UserError(
            f"{run_dir / 'run.json'} is a BLT run without 'entropy_run' and a 'patching' record holding a threshold; "
            f"was its training interrupted before patching was set up? Re-run 'bytelm train' on it"
        )
    entropy_path = Path(entropy_run)
    if not entropy_path.is_absolute() and not entropy_path.is_dir() and (run_dir / entropy_path).is_dir():
        entropy_path = run_dir / entropy_path
    if not entropy_path.is_dir():
        raise UserError(
            f"the entropy model run {entropy_run} recorded by {run_dir} does not exist; restore it or edit "
            f"'entropy_run' in {run_dir / 'run.json'}"
        )
    entropy_family = _read_run_json(entropy_path).get("family")
    if entropy_family != ENTROPY_FAMILY:
        raise UserError(
            f"the entropy model run {entropy_path} recorded by {run_dir} is a {entropy_family!r} run, not a byte LM "
            f"(family 'byte'); point 'entropy_run' in {run_dir / 'run.json'} at the entropy model's run"
        )
    return PatchSource(run_dir, family, entropy_path, settings)


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
    return np.concatenate([[BOS_ID], np.frombuffer(data, np.uint8).astype(np.int32) + BYTE_OFFSET]).astype(np.int32)


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
            "an entropy-model run has no patching settings: give a threshold (--threshold T, nats) or a target "
            "mean patch length to calibrate on the text (--target-len L)"
        )
    ids = text_ids(data)
    h = model.entropies(ids[None])[0]
    if target_len is not None:
        threshold, _ = calibrate_threshold(
            h[None], ids[None], target_len, max_patch_len=max_patch_len, monotonic_threshold=monotonic_threshold, strict=False
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
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def format_patches(patches: list[bytes], *, sep: str = "|") -> str:
    """The patches, each escaped (:func:`escape_bytes`), joined by ``sep``."""
    return sep.join(escape_bytes(p, sep=sep) for p in patches)
