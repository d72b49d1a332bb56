"""The logical-axis -> mesh-axis rules table, and the placement of activations and weights inside a
model by their logical axes (docs/architecture.md, Meshes and sharding).

Models tag weights with logical axes (``embed``, ``mlp``, ``heads``, ``kv``, ``vocab``) and place
activations by them (``batch``, ``length``, ``embed``, ``mlp``); this module alone maps them to mesh
axes (``data``, ``fsdp``, ``tensor``), a dimension only where its size divides evenly. It sits
with the models, which use it inside their computations; :mod:`bytelm.training.sharding` builds
meshes and places the state with the same table.
"""

from __future__ import annotations

import math

import jax
from flax import nnx
from jax.sharding import PartitionSpec

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


def _axis_size(mesh, axis) -> int:
    if axis is None:
        return 1
    if isinstance(axis, tuple):
        return math.prod(mesh.shape[a] for a in axis)
    return mesh.shape[axis]


def logical_to_spec(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh) -> PartitionSpec:
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


def constrain(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
    """``x`` (an activation) placed by its logical ``axes`` (``batch``, ``length``, ``embed``, ``mlp``,
    ``heads``...) under the context mesh (``jax.set_mesh``), as the rules table maps them; unchanged
    without one. XLA then all-gathers an FSDP-sharded weight where it is used, rather than resharding
    the activation to the weight's layout (which it can only do by replicating it first: its
    "involuntary full rematerialization")."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or all(size == 1 for size in mesh.shape.values()):
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, x.shape, mesh))


def gathered(variable: nnx.Variable) -> jax.Array:
    """A weight's value where it is used, its FSDP shards gathered (an all-gather per use: FSDP's
    contract) and its tensor-parallel axes kept, under the context mesh; the plain value without
    one. Left to itself, XLA may instead shard the activation the weight multiplies along the weight's
    FSDP axis, and to get there from the batch sharding it has to replicate the activation first
    (its "involuntary full rematerialization")."""
    value = variable[...]
    mesh = jax.sharding.get_abstract_mesh()
    axes = variable.get_metadata().get("logical_axes")
    if mesh.empty or not axes or all(size == 1 for size in mesh.shape.values()):
        return value
    spec = []
    for entry in logical_to_spec(axes, value.shape, mesh):
        members = entry if isinstance(entry, tuple) else (entry,)
        kept = tuple(a for a in members if a is not None and a != "fsdp")
        spec.append(kept if len(kept) > 1 else (kept[0] if kept else None))
    return jax.lax.with_sharding_constraint(value, PartitionSpec(*spec))
