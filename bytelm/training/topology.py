"""TPU topologies by name, their chips' datasheet figures, and meshes laid out on them.

A slice is named as Cloud TPU names it (``v5e-256``, ``v6e-256``: chips; ``v4-64``, ``v5p-128``:
TensorCores, two per chip) or by its physical shape (``v5e:16x16``, ``v5p:4x4x4``).
:func:`topology_devices` gives the abstract devices of such a slice (or of ``slices`` of them, joined
by the data-centre network) from libtpu, on any machine: ``jax.experimental.topologies`` needs no
TPU, only ``pip install -e '.[tpu]'``. :func:`device_mesh` lays a config's mesh on devices with
``mesh_utils`` (neighbouring chips on the fast axes; several slices: the ``data`` axis across them).
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

from bytelm.errors import UserError

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU generation's chip, from Google Cloud's TPU system-architecture pages (cloud.google.com/
    tpu/docs/v4, v5e, v5p, v6e; read 2026-12). Bandwidths in bytes per second per chip."""

    name: str  # as in slice names: "v5e"
    device_kind: str  # jax's Device.device_kind
    hbm_bytes: int  # high-bandwidth memory per chip
    counts_cores: bool  # slice names count TensorCores (2 per chip), not chips
    dims: int  # 2: a 2-D torus of chips (v5e, v6e); 3: a 3-D torus (v4, v5p)
    hbm_bandwidth: float
    # what one chip's collectives move per second over ICI: half the bidirectional ICI bandwidth per
    # chip (v5e: 400 GB/s bidirectional, and its pod's all-reduce bandwidth, 51.2 TB/s / 256 chips, is
    # 200 GB/s); v4 gives the pod's all-reduce bandwidth only: 1.1 PB/s / 4096 chips
    ici_bandwidth: float
    dcn_bandwidth: float | None  # the data-centre network per chip; None where the page gives none


CHIPS = {
    "v4": Chip("v4", "TPU v4", 32 * GIB, True, 3, 1200e9, 1.1e15 / 4096, None),
    # v5e: 2 x 100 Gbps per host of 8 chips; the pod's 6.4 Tbps over 256 chips is the same 25 Gbps
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GIB, False, 2, 819e9, 400e9 / 2, 25e9 / 8),
    "v5p": Chip("v5p", "TPU v5", 95 * GIB, True, 3, 2765e9, 1200e9 / 2, 50e9 / 8),
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GIB, False, 2, 1638e9, 800e9 / 2, None),
}


@dataclasses.dataclass(frozen=True)
class Topology:
    chip: Chip
    shape: tuple[int, ...]  # chips along each torus axis
    name: str  # what the user gave

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def libtpu_name(self) -> str:
        return f"{self.chip.name}:{'x'.join(map(str, self.shape))}"


def _torus(chips: int, dims: int) -> tuple[int, ...]:
    """The usual physical shape of a slice of ``chips`` chips (powers of two, as square as can be)."""
    if chips < 1 or chips & (chips - 1):
        raise ValueError(chips)
    shape = [1] * dims
    k = 0
    while math.prod(shape) < chips:  # double the axes in turn: 2x2, 2x4, 4x4, ... / 2x2x1, 2x2x2, 2x2x4...
        shape[k % dims] *= 2
        k += 1
    ordered = sorted(shape)  # ascending, as Cloud TPU writes shapes (16x16, 4x4x8), a flat axis last (2x2x1)
    return tuple([s for s in ordered if s > 1] + [s for s in ordered if s == 1])


def parse_topology(name: str) -> Topology:
    """``v5e-256``, ``v5p-128``, ``v4-64``, ``v6e-256`` or a shape ``v5e:16x16``; :class:`UserError`
    naming what is accepted otherwise."""
    known = ", ".join(CHIPS)
    m = re.fullmatch(r"(v\d+[a-z]?)([-:])([0-9x]+)", name.strip().lower())
    if m is None or m.group(1) not in CHIPS:
        raise UserError(
            f"--topology {name!r} is not a TPU slice: give GENERATION-SIZE (v5e-256, v5p-128, v4-64, "
            f"v6e-256) or GENERATION:SHAPE (v5e:16x16, v5p:4x4x4); generations: {known}"
        )
    chip = CHIPS[m.group(1)]
    if m.group(2) == ":":
        try:
            shape = tuple(int(x) for x in m.group(3).split("x"))
        except ValueError:
            raise UserError(f"--topology {name!r}: the shape must be numbers joined by 'x'") from None
        if len(shape) not in (2, 3) or any(s < 1 for s in shape):
            raise UserError(f"--topology {name!r}: the shape has 2 or 3 axes of at least 1 chip")
        return Topology(chip, shape, name)
    size = int(m.group(3))
    chips = size // 2 if chip.counts_cores else size
    try:
        if chip.counts_cores and size % 2:
            raise ValueError(size)
        shape = _torus(chips, chip.dims)
    except ValueError:
        unit = "TensorCores (2 per chip)" if chip.counts_cores else "chips"
        raise UserError(
            f"--topology {name!r}: {chip.name} slices are named by their {unit}, a power of two; "
            f"e.g. {chip.name}-{256 if not chip.counts_cores else 128}"
        ) from None
    return Topology(chip, shape, name)


def topology_devices(topology: Topology, *, slices: int = 1, chips_per_host: int = 4) -> list:
    """The abstract devices of ``slices`` slices of ``topology`` (libtpu's description; one device
    per chip), ``chips_per_host`` chips on each host (4: a 2x2 board; 8: 2x4)."""
    import importlib.util  # noqa: PLC0415

    from jax.experimental import topologies  # noqa: PLC0415

    if importlib.util.find_spec("libtpu") is None:
        raise UserError(
            f"compiling for {topology.name} needs libtpu, which describes TPU slices on any machine (no TPU "
            "is used): pip install -e '.[tpu]'"
        )
    if chips_per_host not in (1, 4, 8):
        raise UserError(f"--chips-per-host must be 1, 4 or 8, got {chips_per_host}")
    if slices < 1:
        raise UserError(f"--slices must be >= 1, got {slices}")
    bounds = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}[min(chips_per_host, topology.chips)]
    try:
        desc = topologies.get_topology_desc(
            platform="tpu",
            topology_name=topology.libtpu_name,
            chip_config_name="megacore" if topology.chip.counts_cores else "default",
            chips_per_host_bounds=bounds,
            num_slices=slices,
        )
    except Exception as e:  # (a shape libtpu refuses, or libtpu held by another process)
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "lockfile" in text:
            raise UserError(
                f"libtpu is in use by another process ({text[:200]}); wait for it, or set "
                "ALLOW_MULTIPLE_LIBTPU_LOAD=1 where no TPU is attached"
            ) from None
        raise UserError(
            f"libtpu cannot describe the slice {topology.libtpu_name} x {slices}: {text}"
        ) from None
    return list(desc.devices)


def device_mesh(sizes: tuple[int, int, int], devices: list, axes: tuple[str, ...]) -> Mesh:
    """A ``data x fsdp x tensor`` mesh of ``devices`` (``sizes`` resolved), laid out by
    ``mesh_utils``: on TPUs the fast axes over neighbouring chips, and with several slices the
    ``data`` axis over the slices (only data parallelism crosses the data-centre network); elsewhere
    the devices in order."""
    slices = len({getattr(d, "slice_index", 0) for d in devices})
    tpu = getattr(devices[0], "platform", "") == "tpu"
    if slices > 1:
        if sizes[0] % slices:
            raise UserError(
                f"{slices} slices need the data axis ({sizes[0]}) to be a multiple of {slices}: "
                "set train.mesh_data=-1 or a multiple"
            )
        per_slice = (sizes[0] // slices, sizes[1], sizes[2])
        grid = mesh_utils.create_hybrid_device_mesh(
            per_slice, (slices, 1, 1), devices, allow_split_physical_axes=True
        )
    elif tpu:
        grid = mesh_utils.create_device_mesh(sizes, devices, allow_split_physical_axes=True)
    else:
        grid = np.asarray(devices).reshape(sizes)
    return Mesh(grid, axes)
