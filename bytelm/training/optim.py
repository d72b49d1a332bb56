"""AdamW with linear warmup + cosine decay and global-norm clipping (optax).

The schedule's horizon (the step at which the cosine ends) is an argument of every update, not a
constant of the compiled step: a run with a time budget (``train.time_budget_s``) fixes it only
after timing its first steps, without compiling the step again. For a run counted in steps it is
``train.steps``. The optimizer state is the same tree as ``optax.adamw``'s (checkpoints written
before the horizon became an argument restore).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax



def learning_rate_schedule(tcfg):
    """``schedule(count, horizon)``: ``learning_rate / warmup`` -> ``learning_rate`` linearly over
    ``warmup = min(warmup_steps, horizon - 1)`` steps (so the first update is not wasted at 0), then
    cosine to ``learning_rate * min_lr_ratio`` at ``horizon``, held there after it."""
    peak, end = float(tcfg.learning_rate), float(tcfg.learning_rate * tcfg.min_lr_ratio)

    def schedule(count, horizon):
        count = jnp.asarray(count, jnp.float32)
        horizon = jnp.asarray(horizon, jnp.float32)
        warmup = jnp.minimum(float(tcfg.warmup_steps), jnp.maximum(horizon - 1.0, 0.0))
        steps_up = jnp.maximum(warmup, 1.0)
        init = peak / steps_up
        rising = init + (peak - init) * jnp.minimum(count, steps_up) / steps_up
        decay_steps = jnp.maximum(horizon, warmup + 1.0) - warmup
        t = jnp.clip(count - warmup, 0.0, decay_steps)
        falling = end + (peak - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * t / decay_steps))
        return jnp.where(count < warmup, rising, falling)

    return schedule


def _scale_by_schedule_at_horizon(schedule) -> optax.GradientTransformationExtraArgs:
    """``optax.scale_by_learning_rate`` for ``schedule(count, horizon)``, with ``horizon`` given to
    every ``update`` (an extra argument); the same state as optax's (a step count)."""

    def init(params):
        del params
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update(updates, state, params=None, *, horizon, **extra):
        del params, extra
        step_size = -schedule(state.count, horizon)
        updates = jax.tree.map(lambda g: jnp.asarray(step_size, g.dtype) * g, updates)
        return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

    return optax.GradientTransformationExtraArgs(init, update)


def make_optimizer(tcfg) -> optax.GradientTransformationExtraArgs:
    """Clip (if ``grad_clip`` > 0), then AdamW; weight decay on matrices only (not norms).
    ``update(grads, state, params, horizon=H)``."""
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    parts = [optax.clip_by_global_norm(tcfg.grad_clip)] if tcfg.grad_clip > 0 else []
    adamw = optax.chain(  # optax.adamw's three parts, its schedule taking the horizon
        optax.scale_by_adam(b1=tcfg.beta1, b2=tcfg.beta2),
        optax.add_decayed_weights(tcfg.weight_decay, decay_mask),
        _scale_by_schedule_at_horizon(learning_rate_schedule(tcfg)),
    )
    parts.append(adamw)
    return optax.chain(*parts)
