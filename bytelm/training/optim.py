"""AdamW with linear warmup + cosine decay and global-norm clipping (optax)."""

from __future__ import annotations

import jax
import optax


def learning_rate_schedule(tcfg) -> optax.Schedule:
    """``learning_rate / warmup_steps`` -> ``learning_rate`` linearly over ``warmup_steps`` (so the first
    update is not wasted at 0), then cosine to ``learning_rate * min_lr_ratio`` at ``steps``."""
    warmup = min(tcfg.warmup_steps, max(tcfg.steps - 1, 0))
    return optax.warmup_cosine_decay_schedule(
        init_value=tcfg.learning_rate / max(warmup, 1),
        peak_value=tcfg.learning_rate,
        warmup_steps=warmup,
        decay_steps=max(tcfg.steps, warmup + 1),
        end_value=tcfg.learning_rate * tcfg.min_lr_ratio,
    )


def make_optimizer(tcfg) -> optax.GradientTransformation:
    """Clip (if ``grad_clip`` > 0), then AdamW; weight decay on matrices only (not norms)."""
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    parts = [optax.clip_by_global_norm(tcfg.grad_clip)] if tcfg.grad_clip > 0 else []
    parts.append(
        optax.adamw(
            learning_rate_schedule(tcfg),
            b1=tcfg.beta1,
            b2=tcfg.beta2,
            weight_decay=tcfg.weight_decay,
            mask=decay_mask,
        )
    )
    return optax.chain(*parts)
