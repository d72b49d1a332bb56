"""``model.remat``: each block recomputed in the backward pass (``block``: all of it; ``dots``: all
but the projections) gives the same loss and gradients as keeping every activation, for the
families whose stacks run blocks in their own loops (BLT's encoder and decoder) as well as through
``Transformer``; and the recomputation is really in the program.

Tolerance: the recomputed forward is the same arithmetic, but XLA may fuse it differently inside
the backward pass, so gradients agree to float32 rounding (observed: bitwise here); 1e-6.
"""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from helpers import FAMILIES, batch_for, loss_and_grads

from bytelm.config import load_config


def build(family, remat):
    cls, kw = FAMILIES[family]
    return cls(
        load_config(None, [f"model.{k}={v}" for k, v in {**kw, "remat": remat}.items()]).model,
        rngs=nnx.Rngs(0),
    )


def primitives(jaxpr) -> set[str]:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                names |= primitives(inner)
    return names


@pytest.mark.parametrize("family", ["byte", "blt", "mambabyte"])  # Transformer, BLT's loops, Mamba-2 layers
@pytest.mark.slow
def test_remat_changes_memory_not_results(family):
    batch = batch_for(family)
    base_loss, base_grads = loss_and_grads(build(family, "none"), batch)
    for remat in ("block", "dots"):
        model = build(family, remat)
        loss, grads = loss_and_grads(model, batch)
        assert loss == pytest.approx(base_loss, abs=1e-6)
        assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(grads, base_grads)) < 1e-6, remat
        graphdef, params = nnx.split(model, nnx.Param)
        jaxpr = jax.make_jaxpr(jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p).score(batch).nll_BxT)))(
            params
        )
        assert "remat2" in primitives(jaxpr.jaxpr), remat
    graphdef, params = nnx.split(build(family, "none"), nnx.Param)
    jaxpr = jax.make_jaxpr(jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p).score(batch).nll_BxT)))(params)
    assert "remat2" not in primitives(jaxpr.jaxpr)


def test_unknown_remat_policy_is_refused():
    with pytest.raises(ValueError, match="remat"):
        build("byte", "everything")
