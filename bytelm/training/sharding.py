"""Device mesh and the logical-axis -> mesh-axis rules table (docs/architecture.md, Meshes and sharding).

Models tag weights with logical axes (``embed``, ``mlp``, ``heads``, ``kv``, ``vocab``); this
module alone knows mesh axes (``data``, ``fsdp``, ``tensor``). A dimension is sharded over a mesh
axis only when its size divides evenly; otherwise it stays replicated.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bytelm.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of mesh axes); None = replicated
RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "embed": "fsdp",
    "mlp": "tensor",
    "heads": "tensor",
    "kv": None,
    "vocab": "tensor",
    "layers": None,  # the layer axis of a scanned stack (model.scan_layers)
}


def mesh_shape(sizes: tuple[int, int, int], n_devices: int) -> tuple[int, int, int]:
    """Resolve one ``-1`` in ``sizes`` so the product is ``n_devices``."""
    sizes = (int(sizes[0]), int(sizes[1]), int(sizes[2]))
    if sizes.count(-1) > 1:
        raise UserError(f"at most one mesh axis may be -1 (fill), got train.mesh_data/fsdp/tensor = {sizes}")
    if any(s == 0 or s < -1 for s in sizes):
        raise UserError(f"mesh axis sizes must be >= 1 or -1, got {sizes}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if n_devices % known:
            raise UserError(
                f"{n_devices} devices cannot be split into a mesh {sizes} (product of fixed axes {known})"
            )
        d, f, t = (n_devices // known if s == -1 else s for s in sizes)
        sizes = (d, f, t)
    if math.prod(sizes) != n_devices:
        raise UserError(
            f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices but {n_devices} are "
            "available: set train.mesh_data=-1 to fill"
        )
    return sizes


def make_mesh(train_cfg, devices=None) -> Mesh:
    devices = list(devices if devices is not None else jax.devices())
    shape = mesh_shape((train_cfg.mesh_data, train_cfg.mesh_fsdp, train_cfg.mesh_tensor), len(devices))
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def _axis_size(mesh: Mesh, axis) -> int:
    if axis is None:
        return 1
    if isinstance(axis, tuple):
        return math.prod(mesh.shape[a] for a in axis)
    return mesh.shape[axis]


def logical_to_spec(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    out: list[str | tuple[str, ...] | None] = []
    used: set[str] = set()
    for name, dim in zip(axes, shape):
        axis = RULES.get(name) if name else None
        members = {a for a in (axis if isinstance(axis, tuple) else (axis,)) if a is not None}
        if axis is None or dim % _axis_size(mesh, axis) or members & used or _axis_size(mesh, axis) == 1:
            out.append(None)
        else:
            out.append(axis)
            used |= members
    return PartitionSpec(*out)


def param_shardings(abstract_state: nnx.State, mesh: Mesh):
    """A pytree of ``NamedSharding`` matching ``abstract_state`` (an ``nnx.State`` of Params)."""

    def one(v):
        if not isinstance(v, nnx.Variable):
            return NamedSharding(mesh, PartitionSpec())
        axes = v.get_metadata().get("logical_axes")
        shape = v.get_value().shape
        spec = logical_to_spec(axes, shape, mesh) if axes else PartitionSpec()
        return v.replace(NamedSharding(mesh, spec))

    return jax.tree.map(one, abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Leading (batch) dimension over ``data`` and ``fsdp``; the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(RULES["batch"], *([None] * (ndim - 1))))
