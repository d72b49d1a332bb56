"""AdamW with linear warmup + cosine decay and global-norm clipping (optax).

The schedule's horizon (the step at which the cosine ends), its peak learning rate and its warmup
are arguments of every update (:func:`schedule_plan`), not constants of the compiled step: a run
with a time budget (``train.time_budget_s``) fixes the horizon only after timing its first steps,
without compiling the step again, and runs that differ only in learning rate or length (a
learning-rate sweep, the budgets of ``bytelm ablate``) share one compiled step through JAX's
compilation cache. For a run counted in steps the horizon is ``train.steps``. The optimizer state is the same tree as ``optax.adamw``'s (checkpoints written
before the horizon became an argument restore).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax



def schedule_plan(tcfg, horizon) -> dict:
    """The schedule's run-time arguments: ``horizon``, ``peak`` (``train.learning_rate``) and
    ``warmup`` (``train.warmup_steps``), float32 scalars."""
    return {"horizon": np.float32(horizon), "peak": np.float32(tcfg.learning_rate), "warmup": np.float32(tcfg.warmup_steps)}


def learning_rate_schedule(tcfg):
    """``schedule(count, horizon, peak=None, warmup=None)``: ``peak / warmup`` -> ``peak``
    linearly over ``warmup = min(warmup, horizon - 1)`` steps (so the first update is not wasted at
    0), then cosine to ``peak * min_lr_ratio`` at ``horizon``, held there after it. ``peak`` and
    ``warmup`` default to ``train.learning_rate`` and ``train.warmup_steps``."""
    ratio = float(tcfg.min_lr_ratio)

    def schedule(count, horizon, peak=None, warmup=None):
        count = jnp.asarray(count, jnp.float32)
        horizon = jnp.asarray(horizon, jnp.float32)
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
        step_size = -schedule(state.count, plan["horizon"], plan["peak"], plan["warmup"])
        updates = jax.tree.map(lambda g: jnp.asarray(step_size, g.dtype) * g, updates)
        return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

    return optax.GradientTransformationExtraArgs(init, update)


def make_optimizer(tcfg) -> optax.GradientTransformationExtraArgs:
    """Clip (if ``grad_clip`` > 0), then AdamW; weight decay on matrices only (not norms).
    ``update(grads, state, params, plan=schedule_plan(tcfg, horizon))``."""
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    parts = [optax.clip_by_global_norm(tcfg.grad_clip)] if tcfg.grad_clip > 0 else []
    adamw = optax.chain(  # optax.adamw's three parts, its schedule taking the horizon
        optax.scale_by_adam(b1=tcfg.beta1, b2=tcfg.beta2),
        optax.add_decayed_weights(tcfg.weight_decay, decay_mask),
        _scale_by_schedule_at_horizon(learning_rate_schedule(tcfg)),
    )
    parts.append(adamw)
    return optax.chain(*parts)
