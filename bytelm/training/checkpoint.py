"""Orbax checkpoints of the train state: params, optimizer state, step, data-iterator state.

Saves are finalised atomically by orbax (a checkpoint killed mid-write is never listed), the
manager keeps the last ``keep`` steps, and restore targets carry the live shardings so a
checkpoint restores directly onto the mesh. A checkpoint damaged afterwards (a truncated or
emptied file) is reported with its step and reason, and the newest one before it that restores
is used (:meth:`Checkpointer.restore_newest`).

**Digests.** Orbax checks a checkpoint's structure, not its array bytes: a bit flipped inside a
weight restores without complaint (and a resumed training then diverges, as if its learning rate
were wrong). So once a local checkpoint is finalised (at the next save, or when the run closes),
process 0 writes :data:`DIGEST_FILE` into its directory: the BLAKE2b-128 of every file in it. A
restore first checks every file against it; a file that differs, or is missing, makes the
checkpoint unreadable, so the newest one before it is used (and a resumed training moves the
damaged one aside), naming the file. A checkpoint without the file (killed between its
finalisation and its digest, or written before digests existed) restores unchecked; checkpoints
in an object store (``gs://``) are not digested (the store keeps its own CRC32C of every object).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import jax
import orbax.checkpoint as ocp

from bytelm.errors import UserError
from bytelm.rundir import is_url, run_path, store_errors

log = logging.getLogger(__name__)
R = TypeVar("R")
DIGEST_FILE = "bytelm-digests.json"
_DIGEST = "blake2b-128"


def file_digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_files(step_dir: Path) -> list[Path]:
    """Every file of a checkpoint directory but its digest record, in a fixed order."""
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != DIGEST_FILE)


def write_digests(step_dir: Path) -> None:
    """Record the digest of every file of a finalised checkpoint (:data:`DIGEST_FILE`, atomically)."""
    from bytelm.atomic import atomic_write_text  # noqa: PLC0415

    files = {p.relative_to(step_dir).as_posix(): file_digest(p) for p in checkpoint_files(step_dir)}
    atomic_write_text(step_dir / DIGEST_FILE, json.dumps({"algorithm": _DIGEST, "files": files}, indent=0))


def verify_digests(step_dir: Path) -> str | None:
    """None when every file of the checkpoint matches its recorded digest (or nothing is recorded),
    else why not, naming the file."""
    record_path = step_dir / DIGEST_FILE
    if not record_path.is_file():
        return None
    try:
        record = json.loads(record_path.read_text())
        files = record["files"]
        if record.get("algorithm") != _DIGEST or not isinstance(files, dict):
            raise ValueError(f"algorithm {record.get('algorithm')!r}")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        return f"its digest record {record_path} is damaged ({type(e).__name__})"
    for rel, want in files.items():
        path = step_dir / rel
        if not path.is_file():
            return f"{path} is missing"
        if file_digest(path) != want:
            return f"{path} does not match the digest written with the checkpoint (a damaged or changed file)"
    return None


class CheckpointUnreadable(UserError):
    """A checkpoint that orbax could not restore: damaged, or not of the model asked for."""

    def __init__(self, step: int, directory: Path, reason: str):
        super().__init__(f"checkpoint {step} in {directory} cannot be restored ({reason})")
        self.step, self.reason = step, reason


def _is_restore_noise(unraisable) -> bool:
    """An unraisable exception left behind by an abandoned orbax restore (see below)."""
    exc = unraisable.exc_value
    if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
        return True
    code = getattr(unraisable.object, "cr_code", None)  # a read's coroutine, closed when collected
    return code is not None and "orbax" in code.co_filename


def _quiet_restore_noise() -> None:
    """When orbax gives up on a damaged checkpoint, the reads tensorstore still has in flight finish
    into the event loop orbax has closed, and each reports ``RuntimeError('Event loop is closed')``
    as an unraisable exception (a bare traceback on stderr, at random, often at exit); the reads'
    coroutines and tasks, collected unawaited, add "Exception ignored in <coroutine ...>" tracebacks,
    asyncio's "Task (or Future) exception was never retrieved" and "never awaited" warnings. That is
    noise about a failure already reported: those alone are dropped, everything else goes on as
    before. (Installed at the first restore, since a restore can fail at any time; again if something
    replaced the hook since.)"""
    previous = sys.unraisablehook
    if getattr(previous, "bytelm_restore_noise", False):
        return

    def hook(unraisable):
        if not _is_restore_noise(unraisable):
            previous(unraisable)

    hook.bytelm_restore_noise = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
    # (the same error can also reach the hooks below rather than the unraisable one)
    previous_excepthook = sys.excepthook

    def excepthook(kind, value, tb):
        if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"):
            previous_excepthook(kind, value, tb)

    sys.excepthook = excepthook
    previous_thread_hook = threading.excepthook

    def thread_hook(args):
        if not (isinstance(args.exc_value, RuntimeError) and str(args.exc_value) == "Event loop is closed"):
            previous_thread_hook(args)

    threading.excepthook = thread_hook
    logging.getLogger("asyncio").addFilter(_asyncio_noise)
    warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited", category=RuntimeWarning)


def _asyncio_noise(record: logging.LogRecord) -> bool:
    """False (drop) for asyncio's report of an abandoned orbax read (see :func:`_quiet_restore_noise`)."""
    message = record.getMessage()
    text = message
    if record.exc_info and record.exc_info[1] is not None:  # (where the read failed: orbax's files)
        text += "".join(traceback.format_exception(*record.exc_info))
    return not (
        "exception was never retrieved" in message  # (Task, Future, _GatheringFuture)
        and any(mark in text for mark in ("orbax", "tensorstore", "OCDBT"))
    )


_PATH_IN_ERROR = re.compile(r"""["']path["']\s*:\s*["']([^"']+)["']""")


def restore_reason(e: BaseException) -> str:
    """One readable line for a failed restore: the error's first line, or, where tensorstore put the
    repr of one of its objects there (``<bound method ... of TensorStore({...``), the file it names."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    if "<bound method" in first or "TensorStore(" in first or len(first) > 300:
        found = _PATH_IN_ERROR.search(text)
        where = f" ({found.group(1)})" if found else ""
        return f"{type(e).__name__}: a file of the checkpoint cannot be read{where}"
    return f"{type(e).__name__}: {first}"


class Checkpointer:
    def __init__(self, directory: Path, *, keep: int):
        path = run_path(directory)  # (a URL: orbax writes to the object store, finalising with a marker)
        self.local = not is_url(path)
        self.directory = path if not self.local else path.absolute()
        self.unsealed: list[int] = []  # steps saved whose digests are not written yet
        with store_errors(self.directory, "open the checkpoints in"):
            self.manager = ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
            )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def steps(self) -> list[int]:
        """The steps of the checkpoints here, oldest first."""
        return sorted(self.manager.all_steps())

    def reload(self) -> None:
        """Read the list of checkpoints again (after some were moved away)."""
        self.manager.reload()

    def restore_newest(
        self, restore: Callable[[int], R], step: int | None = None
    ) -> tuple[int, R, list[int]]:
        """``(step, restore(step), skipped)`` for ``step``, or else for the newest checkpoint that
        restores: each newer one that does not (``skipped``) is reported with its step and reason as a
        warning. :class:`UserError` when ``step`` does not exist (naming those that do) or none restores."""
        steps = self.steps()
        if step is not None:
            if step not in steps:
                have = ", ".join(map(str, steps)) if steps else "none yet"
                raise UserError(
                    f"{self.directory} has no checkpoint of step {step} (its checkpoints: {have})"
                )
            return step, restore(step), []
        if not steps:
            raise UserError(f"{self.directory} holds no checkpoint yet")
        failed: list[CheckpointUnreadable] = []
        for s in reversed(steps):
            try:
                out = restore(s)
            except CheckpointUnreadable as error:
                failed.append(error)
                continue
            for f in failed:
                log.warning("%s; using checkpoint %d, the newest that restores", f, s)
            return s, out, [f.step for f in failed]
        reasons = "; ".join(f"step {f.step}: {f.reason}" for f in failed)
        raise UserError(
            f"no checkpoint in {self.directory} restores onto the model built from the run's config "
            f"({reasons}): the config.toml next to them was changed or belongs to another run, or they are "
            "damaged"
        )

    def seal(self) -> None:
        """Wait for the saves in flight, then write the digests of the checkpoints they finalised
        (process 0, local checkpoints only; see the module docstring)."""
        if not self.unsealed:
            return
        self.manager.wait_until_finished()
        if self.local and jax.process_index() == 0:
            for step in self.unsealed:
                step_dir = Path(self.directory) / str(step)
                if step_dir.is_dir():  # (a checkpoint already rotated out by keep_checkpoints has none)
                    write_digests(step_dir)
        self.unsealed = []

    def save(self, step: int, state: dict, meta: dict) -> None:
        """Save ``state`` (a pytree of arrays) and ``meta`` (JSON) as checkpoint ``step`` (its digests
        are written once it is finalised: at the next save, or :meth:`close`)."""
        self.seal()
        self.unsealed.append(step)
        self.manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=True,
        )

    def restore(self, step: int, target: dict) -> tuple[dict, dict]:
        """Restore checkpoint ``step`` onto the structure, shapes and shardings of ``target``."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        out = self._restore(step, ocp.args.StandardRestore(abstract))
        return out["state"], out["meta"]

    def restore_params(self, step: int, params: dict, key: str = "params") -> tuple[dict, dict]:
        """Only the parameters of checkpoint ``step`` (or another tree of their structure saved
        beside them, ``key``: the weight average, "ema"), onto the shapes, dtypes and shardings of
        ``params`` (abstract arrays are enough); an optimizer state in the checkpoint is neither
        read nor allocated (a third of a full restore's memory under Adam), and a checkpoint may
        hold none (``bytelm convert`` writes parameters only)."""
        restore_args = jax.tree.map(
            lambda x: ocp.ArrayRestoreArgs(
                sharding=x.sharding, global_shape=x.shape, dtype=x.dtype, strict=True
            ),
            params,
        )
        out = self._restore(
            step,
            ocp.args.PyTreeRestore({key: params}, restore_args={key: restore_args}, partial_restore=True),
        )
        return out["state"][key], out["meta"]

    def _restore(self, step: int, state_args) -> dict:
        # (before the restore, not after it fails: a read tensorstore still has in flight can finish
        # into the closed loop while the failure is still on its way up here; that race put a bare
        # traceback on stderr in one CI run of tests/test_robustness.py)
        _quiet_restore_noise()
        if self.local:
            damaged = verify_digests(Path(self.directory) / str(step))
            if damaged is not None:
                raise CheckpointUnreadable(step, self.directory, damaged)
        try:
            out = self.manager.restore(
                step, args=ocp.args.Composite(state=state_args, meta=ocp.args.JsonRestore())
            )
            if not isinstance(out["meta"], dict) or out["meta"].get("step") != step:
                raise ValueError(f"its meta record is {out['meta']!r}, not step {step}'s")
            return out
        except Exception as e:  # (orbax and tensorstore raise many kinds: each means "not restorable")
            raise CheckpointUnreadable(step, self.directory, restore_reason(e)) from None

    def wait(self) -> None:
        self.manager.wait_until_finished()
        self.seal()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.seal()
        self.manager.close()
