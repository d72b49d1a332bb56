"""Run one function over a few shards in worker processes (pre-tokenization, batch encoding).

On Linux the workers are forked, so the shared ``payload`` (documents, a tokenizer) reaches them
without being pickled; elsewhere it is pickled once per worker. Only the (small) results travel
back. Workers run pure Python/numpy code (no JAX), which is what makes forking safe here.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Callable
from typing import Any

from bytelm.errors import UserError

_PAYLOAD: Any = None


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


def _set_payload(payload: Any) -> None:
    global _PAYLOAD
    _PAYLOAD = payload


def _run(task: tuple[Callable[[Any, int], Any], int]) -> Any:
    func, i = task
    return func(_PAYLOAD, i)


def shard_map(func: Callable[[Any, int], Any], payload: Any, n_shards: int, workers: int) -> list[Any]:
    """``[func(payload, i) for i in range(n_shards)]``, computed by ``workers`` processes.

    ``func`` must be a module-level function. With one worker (or one shard) it runs in-process.
    """
    if workers <= 1 or n_shards <= 1:
        return [func(payload, i) for i in range(n_shards)]
    methods = multiprocessing.get_all_start_methods()
    tasks = [(func, i) for i in range(n_shards)]
    if "fork" in methods:
        ctx = multiprocessing.get_context("fork")
        _set_payload(payload)
        # Objects that exist before the fork are left out of the workers' garbage collections,
        # which would otherwise walk (and copy on write) the whole inherited heap.
        gc.freeze()
        try:
            with ctx.Pool(min(workers, n_shards)) as pool:
                return pool.map(_run, tasks, chunksize=1)
        finally:
            gc.unfreeze()
            _set_payload(None)
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(min(workers, n_shards), initializer=_set_payload, initargs=(payload,)) as pool:
        return pool.map(_run, tasks, chunksize=1)


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
