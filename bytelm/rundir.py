"""A run directory: the one module that knows its files' names and formats.

::

    RUN_DIR/
      config.toml     the resolved config (TOML: bytelm.config.dump_config / load_config)
      run.json        what the run is and where it stands: family, fingerprints, parameter counts,
                      the compute ledger, status ("running", "finished", "stopped", "diverged",
                      "failed"), step; and a checksum of all that
      metrics.jsonl   one JSON object per line: train logs and periodic evaluations
      checkpoints/    orbax checkpoints (bytelm.training.checkpoint)
      .lock           held (an advisory lock) by the process that writes the run: see RunDir.lock
      damaged-checkpoints/  checkpoints that failed to restore, moved aside by a resumed training

``config.toml`` ends with the line :data:`CONFIG_END`: a config cut off at a line boundary still
parses, and without that line it would quietly take defaults for what was lost.

Everything else asks a :class:`RunDir`. It imports no config code (the config is TOML text
here; :mod:`bytelm.config` parses it), so every layer can read a run's record.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from bytelm.atomic import atomic_write_text
from bytelm.errors import UserError

log = logging.getLogger(__name__)

_CONFIG, _INFO, _METRICS, _CHECKPOINTS = "config.toml", "run.json", "metrics.jsonl", "checkpoints"
_LOCK, _DAMAGED = ".lock", "damaged-checkpoints"
CONFIG_END = "# end of the resolved config (bytelm)"
_CHECKSUM = "checksum"  # run.json: the SHA-256 (first 16 hex digits) of the rest of the record


def _checksum(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def _lock_file(fd: int) -> bool:
    """Take an exclusive advisory lock on ``fd`` without waiting; False when another holds it."""
    try:
        import fcntl
    except ImportError:  # (not POSIX: no lock, as before)
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


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

    @property
    def damaged_path(self) -> Path:
        return self.path / _DAMAGED

    # -- the writer's lock
    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the run's lock for the block: one writer at a time. A second writer stops at once
        with :class:`UserError` naming the holder (its pid, host and start time). The lock is the
        kernel's (``flock``), so a writer killed by any signal releases it; the file stays."""
        self.path.mkdir(parents=True, exist_ok=True)
        path = self.path / _LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            if not _lock_file(fd):
                try:
                    holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
                    who = f"pid {holder['pid']} on {holder['host']} (since {holder['since']})"
                except (ValueError, KeyError, TypeError):
                    who = "another process"
                raise UserError(
                    f"{self.path} is being written by {who}; wait for it to finish or stop it, or write "
                    "to another directory"
                )
            since = datetime.datetime.now().isoformat(timespec="seconds")
            record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since})
            os.ftruncate(fd, 0)
            os.pwrite(fd, record.encode(), 0)
            yield
        finally:
            os.close(fd)  # (releases the lock)

    # -- checkpoints
    def checkpoint_steps(self) -> list[int]:
        """The steps of the finalised checkpoints, in order (orbax names each one's folder by its step;
        a save cut off keeps a temporary name)."""
        if not self.checkpoints_path.is_dir():
            return []
        return sorted(int(p.name) for p in self.checkpoints_path.iterdir() if p.is_dir() and p.name.isdigit())

    def set_aside(self, step: int) -> Path:
        """Move checkpoint ``step`` (one that cannot be restored) to ``damaged-checkpoints/``, out of
        the way of the run's next saves; nothing is deleted."""
        self.damaged_path.mkdir(exist_ok=True)
        target = self.damaged_path / str(step)
        n = 1
        while target.exists():
            n += 1
            target = self.damaged_path / f"{step}.{n}"
        os.replace(self.checkpoints_path / str(step), target)
        return target

    def started(self) -> bool:
        """Something of a run is here (a config or checkpoints): a new run must not write over it."""
        return self.config_path.exists() or self.checkpoints_path.exists()

    # -- config.toml
    def has_config(self) -> bool:
        return self.config_path.is_file()

    def require_config(self) -> Path:
        """The config's path; :class:`UserError` when this is not a run directory, or when its config
        is not whole (it does not end with :data:`CONFIG_END`) or not text."""
        if not self.has_config():
            raise UserError(
                f"{self.path} is not a run directory (no {_CONFIG}); train one with 'bytelm train CONFIG "
                f"--out {self.path}'"
            )
        try:
            with open(self.config_path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 256))
                tail = f.read().decode("utf-8", errors="replace")
        except OSError as e:
            raise UserError(f"cannot read {self.config_path}: {e.strerror or e}") from None
        if CONFIG_END not in tail.rstrip().splitlines()[-1:]:
            raise UserError(
                f"{self.config_path} is incomplete: it does not end with the line {CONFIG_END!r} (cut "
                "off, or written by an older bytelm); restore the file or retrain the run"
            )
        return self.config_path

    def write_config(self, text: str) -> Path:
        """Write the resolved config's TOML text atomically, ending with :data:`CONFIG_END`."""
        atomic_write_text(self.config_path, text.rstrip("\n") + "\n\n" + CONFIG_END + "\n")
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
        checksum = record.pop(_CHECKSUM, None)
        if checksum is not None and checksum != _checksum(record):
            raise UserError(
                f"{self.info_path} does not match its checksum: the file was changed or damaged since the "
                "run wrote it; retrain the run (or restore the file)"
            )
        return record

    def info_or_empty(self) -> dict:
        """The run's record, or ``{}`` when there is none yet (a damaged one still raises)."""
        return self.info() if self.has_info() else {}

    def write_info(self, record: dict) -> None:
        """Write the run's record atomically, with a checksum of its content (a record damaged
        later, even into other valid JSON, is refused by :meth:`info` rather than misread)."""
        record = {k: v for k, v in record.items() if k != _CHECKSUM}
        atomic_write_text(self.info_path, json.dumps({**record, _CHECKSUM: _checksum(record)}, indent=1))

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
