"""``model.logit_softcap``: the byte and subword LMs' logits squashed into ``(-c, c)`` by
``c * tanh(logit / c)`` (the cached decoding path's equality with a full pass is checked with a
cap in tests/test_sampling.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bytelm.config import load_config
from bytelm.constants import NUM_BYTE_IDS
from bytelm.errors import UserError
from bytelm.families.byte.model import ByteLM
from bytelm.models.core import head_logits

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.mark.parametrize("cap", [0.0, 0.5, 3.0])
def test_head_logits_caps_the_valid_ids_and_masks_the_padding(cap):
    rng = np.random.default_rng(0)
    h = rng.normal(size=(2, 5, 8)).astype(np.float32)
    head = (4 * rng.normal(size=(8, 16))).astype(np.float32)  # raw logits of tens: the cap binds
    out = np.asarray(head_logits(jnp.asarray(h), jnp.asarray(head), 13, jnp.float32, cap))
    raw = h.astype(np.float64) @ head.astype(np.float64)
    want = cap * np.tanh(raw / cap) if cap else raw
    np.testing.assert_allclose(out[..., :13], want[..., :13], rtol=1e-5, atol=1e-5)
    assert (out[..., 13:] == -1e9).all()  # the padding rows stay impossible under the cap
    if cap:
        assert np.abs(out[..., :13]).max() <= cap and np.abs(raw).max() > 10 * cap


def byte_model(cap: float) -> ByteLM:
    cfg = load_config(
        None,
        [
            "model.family=byte",
            "model.d_model=32",
            "model.n_layers=2",
            "model.n_heads=2",
            "model.mlp_dim=64",
            f"model.logit_softcap={cap}",
        ],
    ).model
    return ByteLM(cfg, rngs=nnx.Rngs(3))


def test_a_capped_byte_lm_bounds_every_loss():
    """With a cap c no valid id is more than e^(2c) times likelier than another, so every
    position's loss lies in [-log(1 + (n - 1) e^(-2c)), log(1 + (n - 1) e^(2c))] for n valid ids,
    however large the head makes the raw logits; without the cap the same model exceeds it."""
    cap, n = 0.25, NUM_BYTE_IDS
    hi, lo = np.log1p((n - 1) * np.exp(2 * cap)), np.log1p((n - 1) * np.exp(-2 * cap))
    ids = np.random.default_rng(1).integers(0, n, size=(3, 33)).astype(np.int32)
    losses = {}
    for c in (cap, 0.0):
        model = byte_model(c)
        model.head[...] = 50.0 * model.head[...]
        logits = np.asarray(model(jnp.asarray(ids[:, :-1])), np.float64)[..., :n]
        logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        losses[c] = logz - np.take_along_axis(logits, ids[:, 1:, None], -1)[..., 0]
    assert (losses[cap] <= hi + 1e-6).all() and (losses[cap] >= lo - 1e-6).all()
    assert losses[0.0].max() > hi


@pytest.mark.parametrize("value", ["-1", "inf", "nan"])
def test_bad_caps_are_refused(value):
    with pytest.raises(UserError, match="model.logit_softcap"):
        load_config(None, ["model.family=byte", f"model.logit_softcap={value}"])
