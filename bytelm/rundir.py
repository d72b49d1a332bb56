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

A run directory may be a URL (``gs://BUCKET/PATH``, or any fsspec URL: ``pip install -e '.[gcs]'``
for ``gs://``), for TPU VMs that share no file system. Its paths are then :class:`etils.epath.Path`
objects (what orbax uses for the checkpoints); a record is written as one object (an upload is
atomic: a reader sees the old object or the new one, never part of one); there is no lock (an
object store has no ``flock``: one job per run URL is the user's to keep); and what is appended
locally (``metrics.jsonl``, TensorBoard events) is staged and uploaded whole at each checkpoint and
at the end (:class:`bytelm.training.metrics.Metrics`).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import re
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from bytelm.atomic import atomic_write_text
from bytelm.errors import UserError

log = logging.getLogger(__name__)

_CONFIG, _INFO, _METRICS, _CHECKPOINTS = "config.toml", "run.json", "metrics.jsonl", "checkpoints"
_LOCK, _DAMAGED = ".lock", "damaged-checkpoints"
CONFIG_END = "# end of the resolved config (bytelm)"
_CHECKSUM = "checksum"  # run.json: the SHA-256 (first 16 hex digits) of the rest of the record


class RunRecordDamaged(UserError):
    """``run.json`` cannot be trusted; :func:`bytelm.training.restore.ensure_run_record` rebuilds it
    from ``config.toml``, the checkpoints and ``metrics.jsonl``."""

    def __init__(self, path, why: str):
        super().__init__(
            f"{path} {why}; the run directory's record is damaged: it is rebuilt from config.toml and the "
            "checkpoints when bytelm next uses the run (bytelm run check RUN does it now)"
        )
        self.path, self.why = path, why


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: Any) -> bool:
    """``path`` names an object store (``gs://...``), not a file on this machine."""
    text = str(path)
    return bool(_URL.match(text)) and not text.startswith("file://")


def _emulator_environment() -> None:
    """With ``STORAGE_EMULATOR_HOST`` set (a local GCS emulator, which gcsfs honours), point
    tensorstore (orbax's array writer) at it too, and keep gcsfs off the gRPC bucket-type lookup
    that only the real service answers."""
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    if host:
        os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", host)
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    # gcsfs logs an ERROR of its own when it gives up; bytelm reports the failure itself, in one line
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)


def _check_reachable(url: Any) -> None:
    """Connect to the store's endpoint (a few seconds at most), so that a store that cannot be reached
    is said at once, not after a client's minute of retries. Only ``gs://`` (its endpoint is known)."""
    if not str(url).startswith(("gs://", "gcs://")):
        return
    endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"
    parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname or "", port), timeout=10).close()
    except OSError as e:
        raise UserError(
            f"cannot reach {url}: no connection to {parsed.hostname}:{port} ({e.strerror or e}); check the "
            "network, or STORAGE_EMULATOR_HOST for an emulator"
        ) from None


def run_path(path: Any) -> Path:
    """``path`` as a path object: a :class:`pathlib.Path` for a local path, an
    :class:`etils.epath.Path` for a URL (both have the pathlib methods the run code uses: typed as
    a Path)."""
    if isinstance(path, RunDir):
        return path.path
    if is_url(path):
        _emulator_environment()
        from etils import epath  # noqa: PLC0415 (orbax's path type; only runs in buckets need it)

        return cast(Path, epath.Path(str(path)))
    return Path(path)


def store_error(url: Any, e: BaseException, doing: str = "reach") -> UserError:
    """One line for an object store's failure (connection, permission, missing bucket) at ``url``."""
    detail = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
    text = str(e).lower()
    if "403" in text or "permission" in text or "forbidden" in text or isinstance(e, PermissionError):
        fix = "grant this account access to the bucket (roles/storage.objectAdmin), or choose another place"
    elif "bucket" in text and ("not exist" in text or "404" in text or "not found" in text):
        bucket = str(url).split("://", 1)[-1].split("/", 1)[0]
        fix = f"create the bucket (gcloud storage buckets create gs://{bucket}) or fix the URL"
    else:
        fix = (
            "check the URL, the network and the credentials (gcloud auth application-default login, or "
            "GOOGLE_APPLICATION_CREDENTIALS), or STORAGE_EMULATOR_HOST for an emulator"
        )
    return UserError(f"cannot {doing} {url} ({detail}); {fix}")


@contextlib.contextmanager
def store_errors(url: Any, doing: str = "reach") -> Iterator[None]:
    """Turn an object store's errors inside the block into one :class:`UserError` line naming ``url``
    (a missing file stays :class:`FileNotFoundError`, which callers handle; local paths pass through)."""
    if not is_url(url):
        yield
        return
    try:
        yield
    except (UserError, FileNotFoundError):
        raise
    except Exception as e:  # (fsspec, gcsfs, aiohttp and google-auth raise many kinds)
        raise store_error(url, e, doing) from None


def check_output_url(url: Any, what: str) -> None:
    """Before any work: the bucket of ``url`` exists and this process may write there (a probe object
    is written and deleted); :class:`UserError` naming ``url`` and the fix otherwise."""
    _emulator_environment()
    _check_reachable(url)
    bucket = str(url).split("://", 1)[1].split("/", 1)[0]
    try:
        import fsspec  # noqa: PLC0415

        fs, root = fsspec.core.url_to_fs(str(url))
    except (ImportError, ValueError) as e:
        protocol = str(url).split("://", 1)[0]
        hint = (
            "pip install -e '.[gcs]' (gcsfs)"
            if protocol in ("gs", "gcs")
            else f"the fsspec driver for {protocol}://"
        )
        raise UserError(f"{what} {url} is a URL that needs {hint} ({e})") from None
    with store_errors(url, "write to"):
        try:
            fs.info(bucket)
        except FileNotFoundError:
            raise UserError(
                f"{what} {url}: the bucket {bucket} does not exist; create it (gcloud storage buckets create "
                f"gs://{bucket}) or fix the URL"
            ) from None
        probe = f"{root.rstrip('/')}/.bytelm-write-check-{os.getpid()}"
        fs.pipe_file(probe, b"")
        fs.rm_file(probe)


def write_text(path, text: str) -> None:
    """``text`` to ``path`` atomically: a temporary file renamed over it on disk, one upload to a
    store (where an object appears whole or not at all)."""
    if is_url(path):
        with store_errors(path, "write"):
            path.write_text(text)
    else:
        atomic_write_text(path, text)


def upload_directory(local: Path, target) -> None:
    """Copy every file under the local directory ``local`` to the same names under the URL ``target``
    (each file one upload; files already there are replaced)."""
    import fsspec  # noqa: PLC0415

    with store_errors(target, "write to"):
        fs, root = fsspec.core.url_to_fs(str(target))
        for path in sorted(p for p in Path(local).rglob("*") if p.is_file()):
            fs.put_file(str(path), f"{root.rstrip('/')}/{path.relative_to(local).as_posix()}")


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

    def __init__(self, path: Any):
        self.path = run_path(path)
        self.remote = is_url(self.path)

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
        kernel's (``flock``), so a writer killed by any signal releases it; the file stays. A run in
        an object store has no lock (see the module docstring)."""
        if self.remote:
            yield
            return
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
        a save cut off keeps a temporary name; in an object store, where orbax cannot rename, a
        finished save holds ``commit_success.txt``)."""
        with store_errors(self.checkpoints_path, "list"):
            if not self.checkpoints_path.is_dir():
                return []

            def complete(p) -> bool:
                return (p / "commit_success.txt").exists() if self.remote else p.is_dir()

            return sorted(
                int(p.name) for p in self.checkpoints_path.iterdir() if p.name.isdigit() and complete(p)
            )

    def set_aside(self, step: int) -> Path:
        """Move checkpoint ``step`` (one that cannot be restored) to ``damaged-checkpoints/``, out of
        the way of the run's next saves; nothing is deleted."""
        with store_errors(self.path, "move a checkpoint in"):
            self.damaged_path.mkdir(exist_ok=True)
            target = self.damaged_path / str(step)
            n = 1
            while target.exists():
                n += 1
                target = self.damaged_path / f"{step}.{n}"
            if self.remote:  # (no rename in a store: a copy, then the deletion)
                import fsspec  # noqa: PLC0415

                fs, source = fsspec.core.url_to_fs(str(self.checkpoints_path / str(step)))
                fs.mv(source, fsspec.core.url_to_fs(str(target))[1], recursive=True)
            else:
                os.replace(self.checkpoints_path / str(step), target)
        return target

    def started(self) -> bool:
        """Something of a run is here (a config or checkpoints): a new run must not write over it."""
        with store_errors(self.path, "read"):
            return self.config_path.exists() or self.checkpoints_path.exists()

    # -- config.toml
    def has_config(self) -> bool:
        with store_errors(self.path, "read"):
            return self.config_path.is_file()

    def require_config(self) -> Path:
        """The config's path; :class:`UserError` when this is not a run directory, or when its config
        is not whole (it does not end with :data:`CONFIG_END`) or not text."""
        if not self.has_config():
            raise UserError(
                f"{self.path} is not a run directory (no {_CONFIG}); train one with 'bytelm train CONFIG "
                f"--out {self.path}'"
            )
        tail = self.config_text()[-256:]
        if CONFIG_END not in tail.rstrip().splitlines()[-1:]:
            raise UserError(
                f"{self.config_path} is incomplete: it does not end with the line {CONFIG_END!r} (cut "
                "off, or written by an older bytelm); restore the file or retrain the run"
            )
        return self.config_path

    def config_text(self) -> str:
        """The text of ``config.toml`` (:meth:`require_config` checks that it is whole)."""
        try:
            with store_errors(self.config_path, "read"):
                return self.config_path.read_bytes().decode("utf-8", errors="replace")
        except OSError as e:
            raise UserError(f"cannot read {self.config_path}: {e.strerror or e}") from None

    def write_config(self, text: str):
        """Write the resolved config's TOML text atomically, ending with :data:`CONFIG_END`."""
        write_text(self.config_path, text.rstrip("\n") + "\n\n" + CONFIG_END + "\n")
        return self.config_path

    # -- run.json
    def has_info(self) -> bool:
        with store_errors(self.path, "read"):
            return self.info_path.is_file()

    def info(self, *, what: str = "a trained run directory", how: str = "") -> dict:
        """The run's record. :class:`UserError` when it is missing (``what`` the directory should have
        been, ``how`` to make one) or cannot be read."""
        if not self.has_info():
            how = how or f"train one with 'bytelm train CONFIG --out {self.path}'"
            raise UserError(f"{self.path} is not {what} (no {_INFO}); {how}")
        try:
            with store_errors(self.info_path, "read"):
                record = json.loads(self.info_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RunRecordDamaged(self.info_path, f"cannot be read ({e})") from None
        if not isinstance(record, dict):
            raise RunRecordDamaged(self.info_path, "holds no run record (a JSON object)")
        checksum = record.pop(_CHECKSUM, None)
        if checksum is not None and checksum != _checksum(record):
            raise RunRecordDamaged(
                self.info_path, "does not match its checksum (changed or damaged since the run wrote it)"
            )
        return record

    def progress_note(self, step: int | None = None) -> str | None:
        """``"step 211 of 4000, stopped"`` for a run that has not finished (``step``: the checkpoint
        used, when it is not the run's last), None for a finished run or one without a record."""
        info = self.info_or_empty()
        if not info:
            return None
        planned = info.get("planned_steps")
        at = info.get("step") if step is None else step
        if info.get("status") == "finished" and (step is None or step == info.get("step")):
            return None
        of = f" of {planned}" if planned else ""
        return f"step {at}{of}, {info.get('status', 'unknown')}" + (
            f" (the run is at step {info.get('step')})"
            if step is not None and step != info.get("step")
            else ""
        )

    def info_or_empty(self) -> dict:
        """The run's record, or ``{}`` when there is none yet (a damaged one still raises)."""
        return self.info() if self.has_info() else {}

    def write_info(self, record: dict) -> None:
        """Write the run's record atomically, with a checksum of its content (a record damaged
        later, even into other valid JSON, is refused by :meth:`info` rather than misread)."""
        record = {k: v for k, v in record.items() if k != _CHECKSUM}
        write_text(self.info_path, json.dumps({**record, _CHECKSUM: _checksum(record)}, indent=1))

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
        with store_errors(self.metrics_path, "read"):
            if not self.metrics_path.is_file():
                return []
            lines = self.metrics_path.read_bytes().decode("utf-8", errors="replace").splitlines()
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
