"""Output paths checked before any work starts: a file the command will write, or a directory it
will fill. Each check raises :class:`~bytelm.errors.UserError` naming the option, the path and
what is in the way, so that a long run never ends in a traceback over a path typed wrong."""

from __future__ import annotations

import os
import re
from pathlib import Path

from bytelm.errors import UserError


def _check_parents(path: Path, what: str) -> None:
    """The nearest existing ancestor of ``path`` is a directory this process may write in."""
    for ancestor in path.absolute().parents:  # nearest first
        if ancestor.exists():
            if not ancestor.is_dir():
                raise UserError(f"{what} {path} lies under {ancestor}, which is a file, not a directory")
            if not os.access(ancestor, os.W_OK | os.X_OK):
                raise UserError(f"{what} {path} cannot be written: no permission to write in {ancestor}")
            return


def check_output_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a file to write (``what``: its option, e.g. "--json"): not a directory, not under
    a file, in a directory this process may write to (missing directories are made later)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} {path} is a directory; give the path of a file to write")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{what} {path} cannot be written: no permission to replace it")
    _check_parents(path, what)
    return path


def _refuse_url(path, what: str) -> None:
    text = str(path)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text) and not text.startswith("file://"):
        raise UserError(
            f"{what} {text} is a URL; this command writes to a file system: give a local path (run "
            "directories can be URLs: 'bytelm train CONFIG --out gs://BUCKET/RUN')"
        )


def check_output_dir(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a directory to write into: not a file, not under a file, writable (and not a URL:
    only run directories may be in an object store, see :mod:`bytelm.rundir`)."""
    _refuse_url(path, what)
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{what} {path} is a file; give a directory")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path} cannot be written: no permission to write in it")
    _check_parents(path, what)
    return path
