"""The MFU denominator: the best observed FLOP/s of a matmul on the default device."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp


def measure_matmul_peak(n: int = 2048, repeats: int = 5, dtype=None) -> float:
    """Best observed FLOP/s of an ``n x n`` matmul on the default device (the MFU denominator)."""
    dtype = dtype or jnp.float32
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best
