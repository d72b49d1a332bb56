"""The MFU denominator: a device's peak FLOP/s.

On an accelerator the default is the datasheet's dense bf16 peak of its device kind (the table
below; no sparsity), the convention MFU is reported in (PaLM, MaxText): a matmul timed at start-up
would run in TF32 or float32 on a GPU and make MFU read several times too high. On the CPU, which
has no datasheet peak, there is no MFU unless ``train.peak_flops`` gives one (:func:`device_peak`).
``train.peak_flops`` overrides both. Where an accelerator's kind is not in the table, a measured
matmul peak is used, with a warning. MFU's numerator is bytelm's FLOP convention (docs/architecture.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

log = logging.getLogger(__name__)

# dense bf16 peak FLOP/s per device (datasheets; no sparsity): NVIDIA H100/H200 SXM 989.4e12,
# H100 PCIe 756e12, A100 312e12, L4 121e12; Google TPU v4 275e12, v5e 197e12, v5p 459e12, v6e 918e12
DATASHEET_BF16_PEAK = {
    "H100 80GB HBM3": 989.4e12,
    "NVIDIA H100 80GB HBM3": 989.4e12,
    "H100 SXM": 989.4e12,
    "NVIDIA H200": 989.4e12,
    "H100 PCIe": 756e12,
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA L4": 121e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,  # (v5e's device kind)
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,  # (v5p's device kind)
    "TPU v6 lite": 918e12,  # (v6e's device kind)
    "TPU v6e": 918e12,
}


def datasheet_peak(kind: str) -> float | None:
    """The dense bf16 peak of a device kind (``jax.devices()[0].device_kind``), or None: the exact
    name, else the longest table name the kind starts with or contains (e.g. "NVIDIA H200 NVL")."""
    if kind in DATASHEET_BF16_PEAK:
        return DATASHEET_BF16_PEAK[kind]
    matches = [name for name in DATASHEET_BF16_PEAK if kind.startswith(name) or name in kind]
    return DATASHEET_BF16_PEAK[max(matches, key=len)] if matches else None


def measure_matmul_peak(n: int = 2048, repeats: int = 5, dtype=None) -> float:
    """Best observed FLOP/s of an ``n x n`` matmul on the default device."""
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


def device_peak(
    backend: str, kind: str, configured: float = 0.0, measure: Callable[[], float] = measure_matmul_peak
) -> tuple[float | None, str]:
    """One device's peak FLOP/s and where it came from ("config", "datasheet" or "measured"); on a
    CPU without ``train.peak_flops``: ``(None, "none")``, no MFU at all. A CPU has no datasheet
    peak, and a matmul timed at start-up measured 43 to 152 GFLOP/s on one machine depending on
    what else ran (it shares the cores with the other processes of a job, and with anything else),
    so an MFU against it swings 3x from its denominator alone and reads above 1."""
    if configured > 0:
        return configured, "config"
    if backend == "cpu":
        return None, "none"
    sheet = datasheet_peak(kind)
    if sheet is not None:
        return sheet, "datasheet"
    log.warning(
        "device kind %r is not in the datasheet table (bytelm/training/peak.py): MFU is against a "
        "measured matmul peak, which reads high where the matmul runs in TF32; set train.peak_flops",
        kind,
    )
    return measure(), "measured"
