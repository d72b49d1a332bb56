"""Background prefetch: an iterator run ahead in a worker thread, so the training step never waits
on the host while the host is faster than the step.

The batches are the wrapped iterator's, in its order (batch ``s`` stays a pure function of
``(seed, s)``; a resume constructs the iterator at its step, as before). The worker does the
reading, the gathers and the family's decoration (BLT's entropy model and patcher: JAX dispatch and
numpy's gathers release the GIL), so that work overlaps the device's step. An exception in the
worker is raised by ``next`` in the consumer, after the items made before it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
_END = object()


class Prefetch(Iterator[T], Generic[T]):
    """``it``'s items, made up to ``depth`` ahead by a daemon thread. ``waited_s`` is the time the
    consumer spent waiting in ``next`` (0 when the pipeline keeps ahead of the step)."""

    def __init__(self, it: Iterator[T], depth: int = 2, *, name: str = "bytelm-prefetch") -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._it = it
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self.waited_s = 0.0
        self._done = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        try:
            for item in self._it:
                if not self._put((True, item)):
                    return
        except BaseException as e:  # handed to the consumer
            self._put((False, e))
            return
        self._put((True, _END))

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        t0 = time.perf_counter()
        ok, item = self._queue.get()
        self.waited_s += time.perf_counter() - t0
        if not ok:
            self._done = True
            raise item
        if item is _END:
            self._done = True
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop the worker (it finishes the item in hand, then exits) and drop what it made."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=10)
        self._done = True

    def __enter__(self) -> Prefetch[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
