"""Where ``bytelm patch`` finds its entropy model and settings: a BLT run (its recorded entropy run
and patching record) or an entropy-model run itself."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from bytelm.errors import UserError
from bytelm.rundir import RunDir, run_path

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
        if threshold is not None and not (threshold >= 0 and math.isfinite(threshold)):
            raise UserError(f"the entropy threshold must be a finite number of nats >= 0, got {threshold}")
        if target_len is not None and not (target_len >= 1 and math.isfinite(target_len)):
            raise UserError(
                f"target mean patch length {target_len} is below 1: a patch holds at least one byte; use a "
                "target >= 1"
            )
        settings = self.settings or {}
        kwargs = {
            "threshold": threshold
            if threshold is not None or target_len is not None
            else settings.get("threshold"),
            "monotonic_threshold": settings.get("monotonic_threshold"),
            "max_patch_len": settings.get("max_patch_len"),
            "target_len": target_len,
        }
        if kwargs["threshold"] is None and kwargs["monotonic_threshold"] is None and target_len is None:
            raise UserError(
                f"{self.run_dir} is an entropy-model run with no patching settings: give a threshold "
                "(--threshold T, nats) or a target mean patch length to calibrate on the text (--target-len "
                "L)"
            )
        return kwargs

    def check_fingerprint(self, fingerprint: str) -> None:
        """A BLT run that recorded its entropy model's fingerprint must get that very model."""
        recorded = (self.settings or {}).get("entropy_fingerprint")
        if recorded and recorded != fingerprint:
            raise UserError(
                f"the entropy model in {self.entropy_run} (fingerprint {fingerprint[:16]}...) is not the one "
                f"the BLT run {self.run_dir} was trained with (fingerprint {recorded[:16]}...); restore the "
                "original entropy run or point run.json's entropy_run at it"
            )


def _read_run_json(run_dir: Path) -> dict:
    return RunDir(run_dir).info(
        what="a run directory",
        how="give a BLT run or an entropy-model run trained with 'bytelm train CONFIG --out RUN_DIR'",
    )


def read_patch_source(run_dir: str | Path) -> PatchSource:
    """Resolve ``run_dir`` (a BLT run or an entropy-model run) to its entropy run and settings."""
    run_dir = run_path(run_dir)
    info = _read_run_json(run_dir)
    family = info.get("family")
    if family == ENTROPY_FAMILY:
        return PatchSource(run_dir, family, run_dir, None)
    if family != BLT_FAMILY:
        raise UserError(
            f"{run_dir} is a {family!r} run; 'bytelm patch' needs a BLT run (family 'blt') or an "
            "entropy-model run (family 'byte', e.g. trained from configs/tiny/entropy.toml)"
        )
    entropy_run = info.get("entropy_run")
    settings = info.get("patching")
    if (
        not entropy_run
        or not isinstance(settings, dict)
        or settings.get("threshold") is None
        and settings.get("monotonic_threshold") is None
    ):
        raise UserError(
            f"{RunDir(run_dir).info_path} is a BLT run without 'entropy_run' and a 'patching' record holding "
            "a threshold; was its training interrupted before patching was set up? Re-run 'bytelm train' on "
            "it"
        )
    entropy_path = run_path(entropy_run)
    if not entropy_path.is_absolute() and not entropy_path.is_dir() and (run_dir / entropy_path).is_dir():
        entropy_path = run_dir / entropy_path
    if not entropy_path.is_dir():
        raise UserError(
            f"the entropy model run {entropy_run} recorded by {run_dir} does not exist; restore it or edit "
            f"'entropy_run' in {RunDir(run_dir).info_path}"
        )
    entropy_family = _read_run_json(entropy_path).get("family")
    if entropy_family != ENTROPY_FAMILY:
        raise UserError(
            f"the entropy model run {entropy_path} recorded by {run_dir} is a {entropy_family!r} run, not a "
            f"byte LM (family 'byte'); point 'entropy_run' in {RunDir(run_dir).info_path} at the entropy "
            "model's run"
        )
    return PatchSource(run_dir, family, entropy_path, settings)
