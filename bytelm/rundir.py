"""A run directory: the one module that knows its files' names and formats.

::

    RUN_DIR/
      config.toml     the resolved config (TOML: bytelm.config.dump_config / load_config)
      run.json        what the run is and where it stands: family, fingerprints, parameter counts,
                      the compute ledger, status ("running", "finished", "diverged"), step
      metrics.jsonl   one JSON object per line: train logs and periodic evaluations
      checkpoints/    orbax checkpoints (bytelm.training.checkpoint)

Everything else asks a :class:`RunDir`. It imports no config code (the config is TOML text
here; :mod:`bytelm.config` parses it), so every layer can read a run's record.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from bytelm.atomic import atomic_write_text
from bytelm.errors import UserError

log = logging.getLogger(__name__)

_CONFIG, _INFO, _METRICS, _CHECKPOINTS = "config.toml", "run.json", "metrics.jsonl", "checkpoints"


class RunDir:
    """The files of one run directory (see the module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __str__(self) -> str:
        return str(self.path)

    # -- paths
    @property
    def config_path(self) -> Path:
        return self.path / _CONFIG

    @property
    def info_path(self) -> Path:
        return self.path / _INFO

    @property
    def metrics_path(self) -> Path:
        return self.path / _METRICS

    @property
    def checkpoints_path(self) -> Path:
        return self.path / _CHECKPOINTS

    def started(self) -> bool:
        """Something of a run is here (a config or checkpoints): a new run must not write over it."""
        return self.config_path.exists() or self.checkpoints_path.exists()

    # -- config.toml
    def has_config(self) -> bool:
        return self.config_path.is_file()

    def require_config(self) -> Path:
        """The config's path; :class:`UserError` when this is not a run directory."""
        if not self.has_config():
            raise UserError(
                f"{self.path} is not a run directory (no {_CONFIG}); train one with 'bytelm train CONFIG "
                f"--out {self.path}'"
            )
        return self.config_path

    def write_config(self, text: str) -> Path:
        """Write the resolved config's TOML text atomically."""
        atomic_write_text(self.config_path, text)
        return self.config_path

    # -- run.json
    def has_info(self) -> bool:
        return self.info_path.is_file()

    def info(self, *, what: str = "a trained run directory", how: str = "") -> dict:
        """The run's record. :class:`UserError` when it is missing (``what`` the directory should have
        been, ``how`` to make one) or cannot be read."""
        if not self.has_info():
            how = how or f"train one with 'bytelm train CONFIG --out {self.path}'"
            raise UserError(f"{self.path} is not {what} (no {_INFO}); {how}")
        try:
            record = json.loads(self.info_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UserError(
                f"cannot read {self.info_path}: {e}; the run directory is damaged, retrain it"
            ) from None
        if not isinstance(record, dict):
            raise UserError(
                f"{self.info_path} holds no run record (a JSON object); the run directory is damaged, "
                "retrain it"
            )
        return record

    def info_or_empty(self) -> dict:
        """The run's record, or ``{}`` when there is none yet (a damaged one still raises)."""
        return self.info() if self.has_info() else {}

    def write_info(self, record: dict) -> None:
        atomic_write_text(self.info_path, json.dumps(record, indent=1))

    def finished(self, steps: int | None = None) -> bool:
        """The run's record says it finished (at ``steps``, when given)."""
        info = self.info_or_empty()
        return info.get("status") == "finished" and (steps is None or info.get("step") == steps)

    def converted(self) -> bool:
        """The run was converted from another library's checkpoint, not trained here."""
        return "converted_from" in self.info_or_empty()

    # -- metrics.jsonl
    def metrics(self) -> list[dict]:
        """Every record of ``metrics.jsonl``, in order. A torn last line (a crash mid-write) is left
        out with a warning; a damaged line elsewhere raises :class:`UserError`."""
        if not self.metrics_path.is_file():
            return []
        lines = self.metrics_path.read_text(errors="replace").splitlines()
        out = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    log.warning(
                        "%s: its last line is incomplete (a write was cut off); it is left out",
                        self.metrics_path,
                    )
                    break
                raise UserError(
                    f"{self.metrics_path}: line {i + 1} is not JSON; the run directory is damaged"
                ) from None
        return out
