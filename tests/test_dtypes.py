"""``model.dtype = "bfloat16"``: float32 master weights, bfloat16 matmuls, float32 logits and loss,
for every family, against the same model in float32.

Tolerances: bfloat16 keeps 8 significant bits (relative rounding 2^-9 ~ 2e-3 per product input),
so a loss of about 6 nats differs by 1e-4 to 1e-3 at these sizes (measured 8e-5 to 7e-4); 1e-2 is the bound.
The gradient as one vector differs by a few percent in norm (measured 0.9-3.4%); 0.1 is the bound. The
test also requires that most matmuls really run in bfloat16, so it cannot pass on a model that
ignores the setting.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import FAMILIES, batch_for, loss_and_grads

from bytelm.config import load_config


def build(family, dtype):
    cls, kw = FAMILIES[family]
    cfg = load_config(None, [f"model.{k}={v}" for k, v in {**kw, "dtype": dtype}.items()]).model
    return cls(cfg, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.slow
def test_bfloat16_against_float32(family):
    batch = batch_for(family)
    m32, m16 = build(family, "float32"), build(family, "bfloat16")
    params = jax.tree.leaves(nnx.state(m16, nnx.Param))
    assert all(p.dtype == jnp.float32 for p in params)  # master weights stay float32
    l32, g32 = loss_and_grads(m32, batch)
    l16, g16 = loss_and_grads(m16, batch)
    assert all(g.dtype == jnp.float32 for g in g16)
    assert abs(l16 - l32) < 1e-2, (l16, l32)
    diff = np.sqrt(sum(float(jnp.sum((a - b) ** 2)) for a, b in zip(g16, g32)))
    norm = np.sqrt(sum(float(jnp.sum(a**2)) for a in g32))
    assert diff / norm < 0.1, diff / norm
    # the matmuls run in bfloat16 and the scores come out in float32
    graphdef, state = nnx.split(m16)
    scored = jax.jit(lambda st: nnx.merge(graphdef, st).score(batch))
    hlo = scored.lower(state).as_text()
    dots = [line for line in hlo.splitlines() if "stablehlo.dot_general" in line]
    # (operands in bfloat16; the product may accumulate into float32, as the SSD's do)
    bf16 = [line for line in dots if re.search(r": \(tensor<[^>]*xbf16>, tensor<[^>]*xbf16>\)", line)]
    assert dots and len(bf16) / len(dots) > 0.8, (len(bf16), len(dots))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(jax.eval_shape(scored, state)))
