"""Host-side JAX setup that must happen before JAX starts its backends.

On a CPU host, XLA runs each device's fused element-wise kernels on one thread; exposing one
virtual CPU device per core and training data-parallel across them keeps every core busy (the
matmuls already use all cores through the shared thread pool). Measured on a 2-core machine:
see ``benchmarks/RESULTS.md``. Accelerator hosts are unaffected: the flag only shapes the CPU
platform, and JAX picks the GPU/TPU devices when they exist.
"""

from __future__ import annotations

import os

_FLAG = "--xla_force_host_platform_device_count"


def configure_cpu_devices(n: int | None = None) -> int | None:
    """Ask for ``n`` (default: the usable cores) virtual CPU devices unless XLA_FLAGS already
    chooses a count. Must run before the first JAX computation; returns the count set, or None."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _FLAG in flags:
        return None
    if n is None:
        try:
            n = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            n = os.cpu_count() or 1
    os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={n}".strip()
    return n
