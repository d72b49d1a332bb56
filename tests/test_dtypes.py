"""``model.dtype = "bfloat16"``: float32 master weights, bfloat16 matmuls, float32 logits and loss,
for every family, against the same model in float32.

Tolerances: bfloat16 keeps 8 significant bits (relative rounding 2^-9 ~ 2e-3 per product input),
so a loss of about 6 nats differs by 1e-4 to 1e-3 at these sizes (measured 8e-5 to 7e-4); 1e-2 is the bound.
The gradient as one vector differs by a few percent in norm (measured 0.9-3.4%); 0.1 is the bound. The
test also requires that most matmuls really run in bfloat16, so it cannot pass on a model that
ignores the setting.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bytelm.config import load_config
from bytelm.families.blt.model import BLT
from bytelm.families.bpe.model import TokenLM
from bytelm.families.byte.model import ByteLM
from bytelm.families.megabyte.model import MegaByte

FAMILIES = {
    "byte": (ByteLM, dict(family="byte", d_model=64, n_layers=2, n_heads=2, mlp_dim=128)),
    "bpe": (
        lambda cfg, rngs: TokenLM(cfg, 500, rngs=rngs),
        dict(family="bpe", d_model=64, n_layers=2, n_heads=2, mlp_dim=128),
    ),
    "megabyte": (
        MegaByte,
        dict(
            family="megabyte",
            patch_size=4,
            embed_dim=16,
            global_d_model=64,
            global_layers=2,
            global_heads=2,
            global_mlp_dim=128,
            local_d_model=32,
            local_layers=1,
            local_heads=2,
            local_mlp_dim=64,
        ),
    ),
    "blt": (
        BLT,
        dict(
            family="blt",
            local_d_model=32,
            local_heads=2,
            local_mlp_dim=64,
            local_window=16,
            global_d_model=64,
            global_heads=2,
            global_mlp_dim=128,
            global_layers=1,
            hash_table_size=64,
            ngram_sizes="3,4",
        ),
    ),
}


def build(family, dtype):
    cls, kw = FAMILIES[family]
    cfg = load_config(None, [f"model.{k}={v}" for k, v in {**kw, "dtype": dtype}.items()]).model
    return cls(cfg, rngs=nnx.Rngs(0))


def batch_for(family):
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 500 if family == "bpe" else 260, size=(4, 65)).astype(np.int32)
    ids[:, 0] = 1
    batch = {"ids": jnp.asarray(ids)}
    if family == "bpe":
        batch["nbytes"] = jnp.asarray(rng.integers(1, 5, size=(4, 64)).astype(np.int32))
    if family == "blt":
        lengths = np.zeros((4, 40), np.int32)
        lengths[:, 0], lengths[:, 1:17] = 1, 4
        batch["patch_lengths"] = jnp.asarray(lengths)
    return batch


def loss_and_grads(model, batch):
    graphdef, state = nnx.split(model, nnx.Param)

    def loss(params):
        s = nnx.merge(graphdef, params).score(batch)
        return jnp.sum(s.nll_BxT) / jnp.sum(s.mask_BxT)

    value, grads = jax.jit(jax.value_and_grad(loss))(state)
    return float(value), jax.tree.leaves(grads)


@pytest.mark.parametrize("family", list(FAMILIES))
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
    bf16 = [line for line in dots if line.rstrip().endswith("bf16>")]
    assert dots and len(bf16) / len(dots) > 0.8, (len(bf16), len(dots))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(jax.eval_shape(scored, state)))
