"""Device meshes, and the placement of the train state on them (docs/architecture.md, Meshes and
sharding): parameters by their logical axes through the rules table of
:mod:`bytelm.models.partitioning` (re-exported here), the optimizer state with its parameters,
batches over ``data x fsdp``.
"""

from __future__ import annotations

import math

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bytelm.errors import UserError
from bytelm.models.partitioning import MESH_AXES, RULES, constrain, gathered, logical_to_spec

__all__ = ["MESH_AXES", "RULES", "constrain", "gathered", "logical_to_spec"]


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
    """The config's mesh over ``devices`` (default: all), laid out on the TPU topology (and across
    slices) by :func:`bytelm.training.topology.device_mesh`."""
    from bytelm.training.topology import device_mesh  # noqa: PLC0415

    devices = list(devices if devices is not None else jax.devices())
    shape = mesh_shape((train_cfg.mesh_data, train_cfg.mesh_fsdp, train_cfg.mesh_tensor), len(devices))
    return device_mesh(shape, devices, MESH_AXES)


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


def state_shardings(abstract_state, params) -> object:
    """Shardings for an optimizer state (``abstract_state``, e.g. ``jax.eval_shape(tx.init, params)``):
    a leaf that holds a parameter's statistics (its path ends with that parameter's path, and its
    shape is the parameter's: Adam's moments, Muon's momentum) is placed as the parameter is, so
    FSDP shards it too; anything else (step counts, scalars) is replicated. (Left to XLA, the state
    made by ``tx.init`` depends on no parameter's value and comes out replicated: each chip would
    hold every moment of the model.)"""
    placed = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        placed[jax.tree_util.keystr(path)] = (leaf.shape, leaf.sharding)
    mesh = next(iter(placed.values()))[1].mesh if placed else None

    def one(path, leaf):
        assert mesh is not None  # (a state with leaves holds a parameter's)
        key = jax.tree_util.keystr(path)
        for name, (shape, sharding) in placed.items():
            if key.endswith(name) and tuple(leaf.shape) == tuple(shape):
                return sharding
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree_util.tree_map_with_path(one, abstract_state)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Leading (batch) dimension over ``data`` and ``fsdp``; the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(RULES["batch"], *([None] * (ndim - 1))))
