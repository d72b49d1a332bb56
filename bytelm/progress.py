"""A small console progress bar for the CLI (stderr; throttled; quiet when not a terminal).

Library code never prints: it takes a ``progress(done, total)`` callback, and the CLI passes
``ProgressBar(...).update``.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def format_seconds(s: float) -> str:
    s = max(0, int(round(s)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


class ProgressBar:
    """``label [#####.....] done/total  rate  ETA``, redrawn at most every ``interval`` seconds.

    On a non-terminal stream it prints a plain line at most every ``plain_interval`` seconds, so
    logs of long jobs still show progress without carriage-return noise.
    """

    quiet = False  # set by the CLI's -q: no bar is drawn

    def __init__(
        self,
        label: str,
        *,
        unit: str = "",
        stream: TextIO | None = None,
        interval: float = 0.2,
        plain_interval: float = 10.0,
        width: int = 24,
    ) -> None:
        self.label = label
        self.unit = unit
        self.stream = stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.interval = interval if self.tty else plain_interval
        self.width = width
        self.start = time.perf_counter()
        self.last = 0.0
        self.drawn = False
        self.suffix = ""

    def update(self, done: int, total: int | None = None, suffix: str = "") -> None:
        if ProgressBar.quiet:
            return
        now = time.perf_counter()
        self.suffix = suffix or self.suffix
        finished = total is not None and done >= total
        if not finished and now - self.last < self.interval:
            return
        if not self.drawn and now - self.start < 0.5:
            return  # stay silent for jobs that end quickly
        self.last = now
        self._draw(done, total, now)

    def _draw(self, done: int, total: int | None, now: float) -> None:
        elapsed = now - self.start
        rate = done / elapsed if elapsed > 0 else 0.0
        parts = [self.label]
        if total:
            frac = min(1.0, done / total)
            filled = int(frac * self.width)
            parts.append("[" + "#" * filled + "." * (self.width - filled) + "]")
            parts.append(f"{done}/{total}{self.unit}")
            eta = (total - done) / rate if rate > 0 else 0.0
            parts.append(
                f"{rate:.1f}{self.unit}/s elapsed {format_seconds(elapsed)} ETA {format_seconds(eta)}"
            )
        else:
            parts.append(f"{done}{self.unit} {rate:.1f}{self.unit}/s elapsed {format_seconds(elapsed)}")
        if self.suffix:
            parts.append(self.suffix)
        line = " ".join(parts)
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn and self.tty:
            self.stream.write("\n")
            self.stream.flush()
