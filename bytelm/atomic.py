"""Atomic file and directory writes: write to a temporary sibling, then rename over the target.

A reader never sees a half-written file, and a crash leaves at worst a stray temporary file
(named ``.NAME.tmp-*``) next to the target, never a truncated target. The targets get the modes a
plain ``open`` or ``mkdir`` would give them under the process's umask (0644 and 0755 by default),
not the private 0600 / 0700 of the temporary files they start as: colleagues on a shared file
system can read them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def umask() -> int:
    """The process's umask (read without changing it where Linux allows: ``/proc/self/status``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (a moment's race with other threads' creates)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (fsync, then rename over any old file)."""
    with atomic_file(path) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file to write that becomes ``path`` (fsync, then rename) when the block finishes
    without error; for outputs too large to hold in memory at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``path`` when the block finishes without error.

    If ``path`` appeared meanwhile (another process built the same thing), the temporary
    directory is discarded and the existing one is kept: both are complete by construction.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~umask())
        yield tmp
        try:
            os.rename(tmp, path)
        except OSError:
            if not path.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
