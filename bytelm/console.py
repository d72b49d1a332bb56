"""The console side of every ``bytelm`` command, in one place: how a command is run (its exit status
for bad input, its signal handling), how it shows progress, and how it prints its summary.

A command is a function ``cmd(args) -> int`` declared on its parser with :func:`command`; the
command line (:func:`bytelm.cli.main`) hands the parsed arguments to :func:`run`, which:

- prints a :class:`~bytelm.errors.UserError` as one line on stderr (``bytelm: error: ...``) and
  exits with status 2 (:data:`EXIT_USER_ERROR`), without a traceback;
- for a long command (``command(..., long=True)``), turns SIGTERM (a scheduler's preemption notice)
  into a clean stop, exit status 0 (:data:`EXIT_TERMINATED`); SIGINT (Ctrl-C) stops any command
  with exit status 130 (:data:`EXIT_SIGNAL`). Training saves a checkpoint first (its own handler,
  :mod:`bytelm.training.loop`); a job whose training stopped that way raises :class:`Stopped`;
  every other stage leaves only finished, atomically written files;
- ends quietly when the reader of stdout goes away (``bytelm sample RUN | head -c1``).

Progress goes to stderr (:func:`progress_bar`, :func:`stages`), results to stdout
(:func:`print_rows`, :func:`print_json`). This module sits below the training layer, so that a
family's own commands (:meth:`bytelm.families.Task.add_commands`) use it too; they open run
directories through :class:`RunTools` (``args.runs``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from bytelm.atomic import atomic_write_text
from bytelm.errors import UserError
from bytelm.progress import ProgressBar

EXIT_USER_ERROR = 2
EXIT_SIGNAL = 130  # (128 + SIGINT, as shells report an interrupted command)
EXIT_TERMINATED = 0  # SIGTERM to a long command: a clean stop, which the same command resumes

Command = Callable[[argparse.Namespace], int]
Progress = Callable[..., None]  # (stage, done, total, suffix="")


class Terminated(BaseException):
    """SIGTERM outside a training step (which has its own handler, bytelm.training.loop): raised
    where the main thread is, like KeyboardInterrupt for SIGINT."""


class Stopped(RuntimeError):
    """A job whose training stopped before its last step by a signal (its checkpoint saved; the
    same command resumes it); ``signum``: the signal."""

    def __init__(self, message: str, signum: int | None = None):
        super().__init__(message)
        self.signum = signum


def terminate(signum, frame):
    """The SIGTERM handler of a long command: :class:`Terminated` where the main thread is."""
    raise Terminated()


@dataclasses.dataclass(frozen=True)
class RunTools:
    """How a command opens a run directory: functions of :mod:`bytelm.training.restore` and
    :mod:`bytelm.config`, set on every command's arguments as ``args.runs`` by
    :func:`bytelm.cli.build_parser`, for commands in packages that the training layer and the config
    depend on (a family's own), which cannot import them."""

    ensure_record: Callable[[str | Path], None]  # rebuild a damaged run.json (a readable one stays)
    model: Callable[..., Any]  # (run_dir, *, step=None) -> the run's model, its latest (or step) weights
    config: Callable[[str | Path], Any]  # run_dir -> the run's Config


def command(parser: argparse.ArgumentParser, func: Command, *, long: bool = False) -> None:
    """Make ``func`` the command of ``parser``; ``long``: SIGTERM stops it cleanly (exit status 0)."""
    parser.set_defaults(func=func, long_command=long)


def run(args: argparse.Namespace) -> int:
    """Run the command of ``args`` (:func:`command`) and return its exit status (module docstring)."""
    func: Command = args.func
    previous = signal.signal(signal.SIGTERM, terminate) if getattr(args, "long_command", False) else None
    try:
        return func(args)
    except UserError as e:
        print(f"bytelm: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Stopped as e:  # a job's training stopped by a signal: checkpoint saved
        print(f"bytelm: {e}", file=sys.stderr)
        return EXIT_TERMINATED if e.signum == signal.SIGTERM else EXIT_SIGNAL
    except Terminated:
        print(
            "bytelm: stopped by SIGTERM (what was finished is kept); run the same command again to resume",
            file=sys.stderr,
        )
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print("bytelm: interrupted", file=sys.stderr)
        return EXIT_SIGNAL
    except BrokenPipeError:  # the reader went away (`bytelm sample RUN | head -c1`): a normal end
        _silence_stdout()
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of what the closed pipe did
    not take raises nothing more."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # (a test's captured stream)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


# -- progress -----------------------------------------------------------------------------------
@contextlib.contextmanager
def progress_bar(label: str, *, unit: str = "") -> Iterator[ProgressBar]:
    """A progress bar on stderr, closed when the block ends (however it ends)."""
    bar = ProgressBar(label, unit=unit)
    try:
        yield bar
    finally:
        bar.close()


@contextlib.contextmanager
def stages(
    enabled: bool = True, *, units: Mapping[str, str] | None = None
) -> Iterator[tuple[Progress | None, Callable[[str], None]]]:
    """``(progress, note)`` for a library function of several stages: ``progress(stage, done, total,
    suffix)`` draws one bar per stage (counting in ``units[stage]``, when given), ``note(message)``
    prints a line on stderr below a closed bar. Not ``enabled`` (a process other than a job's
    first): no progress, notes dropped."""
    if not enabled:
        yield None, lambda message: None
        return
    current: dict = {}

    def close() -> None:
        if current.get("bar") is not None:
            current["bar"].close()
        current.clear()

    def progress(stage: str, done: int, total: int | None, suffix: str = "") -> None:
        if current.get("stage") != stage:
            close()
            current["stage"], current["bar"] = stage, ProgressBar(stage, unit=(units or {}).get(stage, ""))
        current["bar"].update(done, total, suffix)

    def note(message: str) -> None:
        close()
        print(message, file=sys.stderr, flush=True)

    try:
        yield progress, note
    finally:
        close()


# -- results ------------------------------------------------------------------------------------
def print_rows(rows: list[tuple[str, str]]) -> None:
    """A summary: one ``key  value`` line per row, the values aligned."""
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def print_json(record: Any, *, stderr: bool = False) -> None:
    """``record`` as one JSON line (on stdout, or stderr)."""
    print(json.dumps(record), file=sys.stderr if stderr else sys.stdout)


def write_json(path: str | Path, record: Any) -> None:
    """``record`` as indented JSON in the file ``path`` (written atomically)."""
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")


def note(message: str) -> None:
    """A line on stderr, beside the results on stdout."""
    print(message, file=sys.stderr)


def warn(message: str) -> None:
    """A line on stderr, ``bytelm: MESSAGE``."""
    note(f"bytelm: {message}")


# -- logging ------------------------------------------------------------------------------------
class _StderrHandler(logging.StreamHandler):
    """Log records to ``sys.stderr`` as it is when each record comes, not as it was when logging
    was set up (a caller that swaps the stream, as a test's capture does, and closes it later)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging(verbose: bool, quiet: bool) -> None:
    """bytelm's log format and level on stderr, and whether progress bars are drawn (not with
    ``quiet``). absl (imported by orbax) configures the root logger at import
    (``logging.basicConfig()``: a plain stream handler, ``LEVEL:name:message``), which would keep
    bytelm's own set-up from taking effect: plain stream handlers on the root (absl's, or an earlier
    call's) are replaced; others (a test runner's capture) stay."""
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    root = logging.getLogger()
    for handler in list(root.handlers):
        if type(handler) in (logging.StreamHandler, _StderrHandler):
            root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("absl", "jax", "orbax"):
        logging.getLogger(noisy).setLevel(logging.NOTSET if verbose else logging.WARNING)
    ProgressBar.quiet = quiet
