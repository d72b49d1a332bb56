"""Host-side JAX setup that must happen before JAX starts its backends.

On a CPU host, XLA runs each device's fused element-wise kernels on one thread; exposing one
virtual CPU device per core and training data-parallel across them keeps every core busy (the
matmuls already use all cores through the shared thread pool). Measured on a 2-core machine:
see ``benchmarks/RESULTS.md`` at 3372114. Accelerator hosts are unaffected: the flag only shapes the CPU
platform, and JAX picks the GPU/TPU devices when they exist.
"""

from __future__ import annotations

import os
import platform

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


# -- huge pages for XLA's per-step buffers ------------------------------------------------------
HUGE_PAGE_TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT = "BYTELM_NO_HUGEPAGE_MALLOC"


def huge_page_malloc_env(environ: dict[str, str] | None = None) -> dict[str, str] | None:
    """The environment under which glibc's ``malloc`` backs large blocks with transparent huge
    pages, or ``None`` where that does not apply (not glibc >= 2.35 on Linux, already set, or
    opted out with ``BYTELM_NO_HUGEPAGE_MALLOC=1``).

    Why: XLA's CPU runtime allocates each step's temporary buffer afresh (about 1 GB per device
    for the 6-layer benchmark model). glibc serves a block that large with ``mmap``, so every
    step faults the buffer in again, 4 KiB at a time; with 2 MiB pages that is 512 times fewer
    faults, and the train step runs about 20% faster (``benchmarks/RESULTS.md`` at 3372114). The tunable
    only takes effect when the kernel's transparent huge pages are in ``madvise`` or ``always``
    mode, and glibc reads it at process start, so a process must be started with it.
    """
    environ = dict(os.environ if environ is None else environ)
    if environ.get(OPT_OUT) or "glibc.malloc.hugetlb" in environ.get("GLIBC_TUNABLES", ""):
        return None
    libc, version = platform.libc_ver()
    if platform.system() != "Linux" or libc != "glibc":
        return None
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < (2, 35):
        return None
    tunables = environ.get("GLIBC_TUNABLES")
    environ["GLIBC_TUNABLES"] = f"{tunables}:{HUGE_PAGE_TUNABLE}" if tunables else HUGE_PAGE_TUNABLE
    return environ


def enable_compilation_cache() -> None:
    """Reuse compiled XLA programs across runs (resumes, evals, compare stages), in the cache directory
    (:func:`bytelm.data.default_cache_dir`), unless the user configured JAX's cache themselves."""
    import jax  # noqa: PLC0415

    from bytelm.data import default_cache_dir  # noqa: PLC0415

    if "JAX_COMPILATION_CACHE_DIR" in os.environ or getattr(jax.config, "jax_compilation_cache_dir", None):
        return
    jax.config.update("jax_compilation_cache_dir", str(default_cache_dir() / "jax"))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


# -- libtpu on a machine without a TPU ----------------------------------------------------------
def accelerator_present() -> bool:
    """A TPU (``/dev/accel*``, ``/dev/vfio/N``) or an NVIDIA GPU (``/dev/nvidia0``) on this machine."""
    import glob  # noqa: PLC0415

    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*") or os.path.exists("/dev/nvidia0"))


def libtpu_installed() -> bool:
    import importlib.util  # noqa: PLC0415

    return importlib.util.find_spec("libtpu") is not None


def keep_jax_off_absent_tpu() -> None:
    """With libtpu installed (``.[tpu]``, which ``bytelm compile`` needs) on a machine with no
    accelerator, JAX would try a TPU first at every start, and libtpu print its complaints: take the
    CPU directly. A ``JAX_PLATFORMS`` the user set wins. Before JAX starts its backends."""
    if os.environ.get("JAX_PLATFORMS") or accelerator_present() or not libtpu_installed():
        return
    import jax  # noqa: PLC0415

    jax.config.update("jax_platforms", "cpu")


# what libtpu asks of a TPU VM's metadata server; on a machine without a TPU (compiling ahead of time
# for a described topology, which they do not change) placeholders keep it from printing errors; and
# its one-process lock (/tmp/libtpu_lockfile), which guards a real TPU, would keep two compilations
# (two test workers) from running at once
_NO_TPU_HOST = {
    "TPU_ACCELERATOR_TYPE": "v5litepod-4",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_SKIP_MDS_QUERY": "1",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


def quiet_libtpu_without_tpu() -> None:
    """Before libtpu first loads, on a machine without a TPU: see :data:`_NO_TPU_HOST`."""
    if accelerator_present():
        return
    for key, value in _NO_TPU_HOST.items():
        os.environ.setdefault(key, value)
