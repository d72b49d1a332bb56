"""AdamW or Muon with linear warmup + cosine decay and global-norm clipping (optax).

The schedule's horizon (the step at which the cosine ends), its peak learning rate and its warmup
are arguments of every update (:func:`schedule_plan`), not constants of the compiled step: a run
with a time budget (``train.time_budget_s``) fixes the horizon only after timing its first steps,
without compiling the step again, and runs that differ only in learning rate or length (a
learning-rate sweep, the budgets of ``bytelm ablate``) share one compiled step through JAX's
compilation cache. For a run counted in steps the horizon is ``train.steps``. With AdamW the
optimizer state is the same tree as ``optax.adamw``'s (checkpoints written before the horizon
became an argument restore).

``train.optimizer = "muon"`` keeps everything but the direction of the update: every hidden
weight matrix (:func:`muon_dimensions`) takes optax's Muon step (Nesterov momentum
``train.muon_momentum``, orthogonalised by Newton-Schulz iterations; Jordan et al. 2024,
modded-nanogpt), rescaled to the root-mean-square of an AdamW update (``0.2 * sqrt(max(fan_in,
fan_out))``, Liu et al. 2025, "Muon is Scalable for LLM Training", arXiv:2502.16982) so the same
learning rate, schedule, weight decay and clipping apply; embeddings, output heads, norms and
other vectors keep Adam (``beta1``, ``beta2``).

``train.embedding_lr_scale`` multiplies the step of the lookup tables (embeddings and hashed
n-gram tables, whose rows see a gradient only where their id occurs) under either optimizer; their
weight decay scales with it, as AdamW's does with its learning rate. A parameter whose variable
carries the metadata ``lr_scale`` (a model's own multiplier: H-Net's per-stage rates) takes its
step times that (in the schedule's scaling: no optimizer state of its own).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from optax.contrib import MuonDimensionNumbers, scale_by_muon

from bytelm.models.core import EMBEDDING_AXIS, LAYER_AXIS, is_lookup_table

MUON_RMS = 0.2  # Muon's update RMS, matched to AdamW's (Liu et al. 2025, section 2.2)
_HEAD_AXES = ("heads", "kv")  # an attention projection's per-head output (or input) axes


def schedule_plan(tcfg, horizon, start: int = 0) -> dict:
    """The schedule's run-time arguments: ``horizon``, ``peak`` (``train.learning_rate``),
    ``warmup`` (``train.warmup_steps``) and ``start``, the step its current segment began at (0; an
    extended run's: the step it was extended at, docs/architecture.md), float32 scalars."""
    return {
        "horizon": np.float32(horizon),
        "peak": np.float32(tcfg.learning_rate),
        "warmup": np.float32(tcfg.warmup_steps),
        "start": np.float32(start),
    }


def learning_rate_schedule(tcfg):
    """``schedule(count, horizon, peak=None, warmup=None, start=0)``: ``peak / warmup`` -> ``peak``
    linearly over ``warmup = min(warmup, horizon - 1)`` steps (so the first update is not wasted at
    0), then cosine to ``peak * min_lr_ratio`` at ``horizon``, held there after it. ``peak`` and
    ``warmup`` default to ``train.learning_rate`` and ``train.warmup_steps``. With ``start`` > 0 (an
    extended run's segment) the same shape runs from step ``start`` to ``horizon``: warmup again,
    then cosine to the floor at the new horizon."""
    ratio = float(tcfg.min_lr_ratio)

    def schedule(count, horizon, peak=None, warmup=None, start=0.0):
        start = jnp.asarray(start, jnp.float32)
        count = jnp.asarray(count, jnp.float32) - start
        horizon = jnp.asarray(horizon, jnp.float32) - start
        peak = jnp.asarray(tcfg.learning_rate if peak is None else peak, jnp.float32)
        warmup = jnp.asarray(tcfg.warmup_steps if warmup is None else warmup, jnp.float32)
        end = peak * ratio
        warmup = jnp.minimum(warmup, jnp.maximum(horizon - 1.0, 0.0))
        steps_up = jnp.maximum(warmup, 1.0)
        init = peak / steps_up
        rising = init + (peak - init) * jnp.minimum(count, steps_up) / steps_up
        decay_steps = jnp.maximum(horizon, warmup + 1.0) - warmup
        t = jnp.clip(count - warmup, 0.0, decay_steps)
        falling = end + (peak - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * t / decay_steps))
        return jnp.where(count < warmup, rising, falling)

    return schedule


def _scale_by_schedule_at_horizon(schedule) -> optax.GradientTransformationExtraArgs:
    """``optax.scale_by_learning_rate`` for ``schedule``, with its :func:`schedule_plan` given to
    every ``update`` (an extra argument, ``plan``); the same state as optax's (a step count)."""

    def init(params):
        del params
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update(updates, state, params=None, *, plan, **extra):
        del params, extra
        step_size = -schedule(state.count, plan["horizon"], plan["peak"], plan["warmup"], plan["start"])

        def scaled(g):
            # a parameter's own multiplier (metadata "lr_scale": H-Net's per-stage rates), else 1
            scale = g.get_metadata().get("lr_scale", 1.0) if _is_variable(g) else 1.0
            value = g.get_value() if _is_variable(g) else g
            out = jnp.asarray(step_size * scale, value.dtype) * value
            return g.replace(out) if _is_variable(g) else out

        updates = jax.tree.map(scaled, updates, is_leaf=_is_variable)
        return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

    return optax.GradientTransformationExtraArgs(init, update)


def muon_dimensions(axes: tuple[str | None, ...] | None, ndim: int) -> MuonDimensionNumbers | None:
    """How Muon sees a weight with logical ``axes`` as a matrix ``x @ W``: its reduction (input) and
    output axes, any :data:`LAYER_AXIS` a batch of matrices; None where the weight keeps Adam (fewer
    than two axes, or a ``vocab`` axis: embeddings, n-gram tables and output heads). The output is
    the trailing ``heads, kv`` pair of a query/key/value projection, else the last axis; the input
    is every other axis (so an output projection's ``heads, kv`` are its input)."""
    if axes is None or len(axes) != ndim:
        return None
    matrix = [i for i, name in enumerate(axes) if name != LAYER_AXIS]
    if len(matrix) < 2 or EMBEDDING_AXIS in axes:
        return None
    n_out = 2 if len(matrix) > 2 and tuple(axes[i] for i in matrix[-2:]) == _HEAD_AXES else 1
    return MuonDimensionNumbers(reduction_axis=tuple(matrix[:-n_out]), output_axis=tuple(matrix[-n_out:]))


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


def _variable_dimensions(v) -> MuonDimensionNumbers | None:
    value = v.get_value()
    if not hasattr(value, "ndim"):
        return None
    return muon_dimensions(v.get_metadata().get("logical_axes"), value.ndim)


def _decays(v) -> bool:
    """Weight decay on matrices only: not on norms' gains, also where a scanned stack holds them as
    one row per layer (a :data:`LAYER_AXIS` is not a matrix axis), so a scanned stack trains as the
    unrolled one."""
    value = v.get_value() if _is_variable(v) else v
    axes = v.get_metadata().get("logical_axes") if _is_variable(v) else None
    layer_axes = tuple(axes).count(LAYER_AXIS) if axes is not None and len(axes) == value.ndim else 0
    return value.ndim - layer_axes >= 2


def _muon_labels(params):
    """``"muon"`` or ``"adam"`` per leaf of a parameter tree (an ``nnx.State``: the logical axes
    are the variables' metadata; a bare array keeps Adam)."""
    return jax.tree.map(
        lambda v: v.replace("muon" if _variable_dimensions(v) else "adam") if _is_variable(v) else "adam",
        params,
        is_leaf=_is_variable,
    )


def _muon_dimension_tree(updates):
    """The dimension numbers of the Muon group's leaves (the others arrive as optax's
    ``MaskedNode`` and stay so)."""

    def one(v):
        if not _is_variable(v):
            return optax.MaskedNode() if isinstance(v, optax.MaskedNode) else None
        if isinstance(v.get_value(), optax.MaskedNode):
            return v
        return v.replace(_variable_dimensions(v))

    return jax.tree.map(one, updates, is_leaf=lambda x: _is_variable(x) or isinstance(x, optax.MaskedNode))


def _scale_to_adamw_rms() -> optax.GradientTransformation:
    """Multiply each orthogonalised Muon step by ``MUON_RMS * sqrt(max(fan_in, fan_out))`` (fans
    over its matrix axes): an orthogonal ``m x n`` matrix has RMS ``1 / sqrt(max(m, n))``, so the
    step's RMS becomes AdamW's typical ``MUON_RMS``."""

    def update(updates, state, params=None):
        del params

        def one(u, dims):
            if not isinstance(dims, MuonDimensionNumbers):
                return u
            fans = [
                int(np.prod([u.shape[a] for a in axes])) for axes in (dims.reduction_axis, dims.output_axis)
            ]
            return u * jnp.asarray(MUON_RMS * max(fans) ** 0.5, u.dtype)

        return jax.tree.map(
            one, updates, _muon_dimension_tree(updates), is_leaf=lambda x: isinstance(x, optax.MaskedNode)
        ), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def data_parallel_size() -> int:
    """The number of data-parallel devices of the mesh the step is traced under (``jax.set_mesh``;
    the trainer sets its own), when that mesh is purely data-parallel (``fsdp = tensor = 1``);
    else 1 (no mesh, one device, or a mesh whose parameter sharding already splits the work)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or "data" not in mesh.axis_names:
        return 1
    others = [size for name, size in mesh.shape.items() if name != "data"]
    return mesh.shape["data"] if all(size == 1 for size in others) else 1


def split_axis(shape: tuple[int, ...], dims: MuonDimensionNumbers, n: int) -> int | None:
    """The axis of a Muon weight along which ``n`` data-parallel devices share its Newton-Schulz
    work: its :data:`LAYER_AXIS` (each device orthogonalises whole layers, no communication inside
    the iterations), else its longest matrix axis (the wide side of ``X X^T``: one small all-reduce
    per iteration); None when no such axis divides by ``n``."""
    matrix = [*np.atleast_1d(dims.reduction_axis), *np.atleast_1d(dims.output_axis)]
    batch = [a for a in range(len(shape)) if a not in matrix]
    for a in batch:
        if shape[a] % n == 0:
            return a
    fits = [a for a in matrix if shape[a] % n == 0]
    return max(fits, key=lambda a: shape[a]) if fits else None


def _split_newton_schulz(muon: optax.GradientTransformation) -> optax.GradientTransformation:
    """``muon`` with its Newton-Schulz work shared by the data-parallel devices: under a purely
    data-parallel mesh every device holds the whole (all-reduced) gradient, and would otherwise
    repeat every matrix's orthogonalisation. Each Muon update enters sharded along
    :func:`split_axis` (XLA partitions the iterations), and the step and the momentum leave
    replicated again, as the parameters and the optimizer state are."""

    def update(updates, state, params=None):
        n = data_parallel_size()
        if n == 1:
            return muon.update(updates, state, params)
        P = jax.sharding.PartitionSpec

        def spread(u, dims):
            if not isinstance(dims, MuonDimensionNumbers):
                return u
            axis = split_axis(u.shape, dims, n)
            if axis is None:
                return u
            return jax.lax.with_sharding_constraint(
                u, P(*["data" if a == axis else None for a in range(u.ndim)])
            )

        dims = _muon_dimension_tree(updates)
        updates = jax.tree.map(spread, updates, dims, is_leaf=lambda x: isinstance(x, optax.MaskedNode))
        out, state = muon.update(updates, state, params)
        replicate = lambda x: jax.lax.with_sharding_constraint(x, P()) if isinstance(x, jax.Array) else x  # noqa: E731
        return jax.tree.map(replicate, out), jax.tree.map(replicate, state)

    return optax.GradientTransformation(muon.init, update)


def _scale_embeddings(scale: float) -> optax.GradientTransformation:
    """Multiply the updates of lookup tables (:func:`is_lookup_table`: embeddings, n-gram hash
    tables) by ``scale``; the rest pass."""

    def update(updates, state, params=None):
        del params

        def scaled(u):
            return (
                u.replace(u.get_value() * jnp.asarray(scale, u.get_value().dtype))
                if is_lookup_table(u)
                else u
            )

        return jax.tree.map(scaled, updates, is_leaf=_is_variable), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(tcfg) -> optax.GradientTransformationExtraArgs:
    """Clip (if ``grad_clip`` > 0), then AdamW (``train.optimizer = "adamw"``) or Muon on the hidden
    matrices and Adam on the rest (``"muon"``); weight decay on matrices only (not norms); lookup
    tables' steps times ``embedding_lr_scale``.
    ``update(grads, state, params, plan=schedule_plan(tcfg, horizon))``."""
    decay_mask = lambda params: jax.tree.map(  # noqa: E731
        lambda v: v.replace(_decays(v)) if _is_variable(v) else _decays(v), params, is_leaf=_is_variable
    )
    parts = [optax.clip_by_global_norm(tcfg.grad_clip)] if tcfg.grad_clip > 0 else []
    adam = optax.scale_by_adam(b1=tcfg.beta1, b2=tcfg.beta2)
    if tcfg.optimizer == "muon":
        muon = optax.chain(
            _split_newton_schulz(
                scale_by_muon(beta=tcfg.muon_momentum, weight_dimension_numbers=_muon_dimension_tree)
            ),
            _scale_to_adamw_rms(),
        )
        direction = optax.partition({"muon": muon, "adam": adam}, _muon_labels)
    else:
        direction = adam
    parts.append(  # optax.adamw's three parts, its schedule taking the horizon
        optax.chain(
            direction,
            optax.add_decayed_weights(tcfg.weight_decay, decay_mask),
            _scale_by_schedule_at_horizon(learning_rate_schedule(tcfg)),
        )
    )
    if tcfg.embedding_lr_scale != 1:  # only then: the optimizer state of every other run keeps its tree
        parts.append(_scale_embeddings(tcfg.embedding_lr_scale))
    return optax.chain(*parts)
