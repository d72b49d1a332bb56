"""Run one function over a few shards in worker processes (pre-tokenization, batch encoding).

The workers are started by a fork server where the platform has one (Linux, macOS), else spawned:
never forked from this process, whose JAX may be running threads. What all shards share (a
tokenizer) is pickled once per worker, by the pool's initializer; a shard (its documents) is pickled
once, with the task that takes it; only the (small) results travel back. Workers run pure
Python/numpy code. As a spawned process does, a worker imports the main module: a script that runs
these with several workers needs the ``if __name__ == "__main__":`` idiom (without it, the workers
cannot start and the pool stops with ``BrokenProcessPool``).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext
from typing import Any, TypeVar

from bytelm.errors import UserError

# Imported once by the fork server, so that each worker starts with what it needs (see the module)
_PRELOAD = ["bytelm.baselines.bpe._worker"]

S = TypeVar("S")
P = TypeVar("P")
R = TypeVar("R")

_WORK: tuple[Callable, Any] | None = None  # (func, shared), in a worker


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_workers(num_workers: int | None) -> int:
    """``None`` -> all available CPUs; otherwise a positive int."""
    if num_workers is None:
        return available_cpus()
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise UserError(
            f"the number of workers must be a positive integer (or None: all CPUs), got {num_workers!r}"
        )
    return num_workers


def _context() -> BaseContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)  # (no effect once this process's fork server runs)
        return context
    return multiprocessing.get_context("spawn")


def _set_work(func: Callable, shared: Any) -> None:
    global _WORK
    _WORK = (func, shared)


def _run(part: Any) -> Any:
    assert _WORK is not None
    func, shared = _WORK
    return func(shared, part)


def shard_map(func: Callable[[S, P], R], shared: S, parts: Sequence[P], workers: int) -> list[R]:
    """``[func(shared, part) for part in parts]``, computed by up to ``workers`` processes.

    ``func`` must be a module-level function, and ``shared`` and the parts picklable. With one
    worker (or one part) it runs in-process.
    """
    if workers <= 1 or len(parts) <= 1:
        return [func(shared, part) for part in parts]
    # (a process pool executor rather than multiprocessing.Pool: a worker that cannot start, as in a
    # script without the main-module idiom, breaks the pool with an error where Pool restarts it forever)
    with concurrent.futures.ProcessPoolExecutor(
        min(workers, len(parts)), mp_context=_context(), initializer=_set_work, initargs=(func, shared)
    ) as pool:
        return list(pool.map(_run, parts))


def balanced_shards(sizes: list[int], n_shards: int) -> list[tuple[int, int]]:
    """Cut ``range(len(sizes))`` into at most ``n_shards`` contiguous ``(start, stop)`` ranges of
    about equal total size (empty ranges dropped).

    >>> balanced_shards([5, 5, 5, 5], 2)
    [(0, 2), (2, 4)]
    """
    total = sum(sizes)
    if not sizes:
        return []
    n_shards = max(1, min(n_shards, len(sizes)))
    out: list[tuple[int, int]] = []
    start, acc, k = 0, 0, 1
    for i, s in enumerate(sizes):
        acc += s
        if k < n_shards and acc >= total * k / n_shards and i + 1 < len(sizes):
            out.append((start, i + 1))
            start, k = i + 1, k + 1
    out.append((start, len(sizes)))
    return [r for r in out if r[1] > r[0]]
