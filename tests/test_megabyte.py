"""MegaByte: causality across patch boundaries, the P=1 reduction, padding, golden step, bad config."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bytelm.config import load_config
from bytelm.constants import BOS_ID, BYTE_OFFSET, PAD_ID
from bytelm.errors import UserError
from bytelm.families.byte.model import ByteLM
from bytelm.families.megabyte.model import MegaByte

jax.config.update("jax_numpy_rank_promotion", "raise")


def mb_cfg(P, **kw):
    d_g = 8
    base = {
        "model.family": "megabyte",
        "model.patch_size": P,
        "model.embed_dim": d_g,
        "model.global.d_model": P * d_g,
        "model.global.heads": 2,
        "model.global.mlp_dim": 32,
        "model.global.layers": 1,
        "model.local.d_model": 16,
        "model.local.heads": 2,
        "model.local.mlp_dim": 32,
        "model.local.layers": 1,
    }
    base.update({f"model.{k}": v for k, v in kw.items()})
    return load_config(None, [f"{k}={v}" for k, v in base.items()]).model


def onehot(ids, v):
    return jax.nn.one_hot(jnp.asarray(ids), v, dtype=jnp.float32)


@pytest.mark.parametrize("P", [2, 4, 8])
@pytest.mark.parametrize("T", [16, 13])  # 13: padded to a multiple of P
@pytest.mark.slow
def test_causality_by_gradient_across_patches(P, T):
    model = MegaByte(mb_cfg(P), rngs=nnx.Rngs(P))
    rng = np.random.default_rng(T)
    ids = rng.integers(BYTE_OFFSET, 260, size=(1, T))
    Tp = model.cfg.padded_length(T)
    padded = np.pad(ids, ((0, 0), (0, Tp - T)), constant_values=PAD_ID)
    x = onehot(padded, model.vocab_rows)
    # dep[t, s] = sum_v |d NLL_t / d x[s, v]| for every position pair, from one Jacobian
    jac = jax.jit(jax.jacrev(lambda x: jax.nn.log_softmax(model(x))[0, :T, 9]))(x)
    dep = np.abs(np.asarray(jac)).sum(-1)[:, 0, :T]
    for t in range(T):  # patch starts, middles and ends alike
        assert np.all(dep[t, t:] == 0), (
            f"P={P} T={T}: NLL at byte {t} depends on bytes {np.flatnonzero(dep[t, t:]) + t}"
        )
        if t > 0:
            assert dep[t, t - 1] > 0 and dep[t, 0] > 0, f"P={P}: byte {t} ignores its past"


@pytest.mark.slow
def test_p1_reduces_to_plain_byte_transformer():
    """With P=1, no local layers, an identity projection and a zero local pad, MegaByte is a flat byte
    transformer whose first input is the global pad patch: it must equal ByteLM fed [BOS, x0..x_{T-2}]
    when the pad patch is ByteLM's BOS embedding. This pins the one-patch shift down."""
    d = 16
    lm_cfg = load_config(
        None,
        [
            "model.family=byte",
            f"model.d_model={d}",
            "model.n_layers=2",
            "model.n_heads=2",
            "model.mlp_dim=32",
        ],
    ).model
    lm = ByteLM(lm_cfg, rngs=nnx.Rngs(0))
    cfg = mb_cfg(
        1,
        embed_dim=d,
        **{"global.d_model": d},
        **{"global.layers": 2},
        **{"global.mlp_dim": 32},
        **{"local.d_model": d},
        **{"local.layers": 0},
    )
    mb = MegaByte(cfg, rngs=nnx.Rngs(1))
    mb.global_embed = lm.embed
    mb.global_stack = lm.stack
    mb.head = lm.head
    mb.global_pad.set_value(lm.embed.table[...][BOS_ID])
    mb.to_local.set_value(jnp.eye(d))
    mb.local_pad.set_value(jnp.zeros(d))
    x = jnp.asarray(np.random.default_rng(0).integers(BYTE_OFFSET, 260, size=(2, 10)))
    lm_inputs = jnp.concatenate([jnp.full((2, 1), BOS_ID), x[:, :-1]], axis=1)
    np.testing.assert_allclose(np.asarray(mb(x)), np.asarray(lm(lm_inputs)), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_every_byte_is_conditioned_on_the_bos_as_in_every_family():
    """The BOS is the first position of the first patch: the first byte's score depends on it (a
    document's start differs from a window cut mid-document), and the BOS itself is not a target."""
    model = MegaByte(mb_cfg(4), rngs=nnx.Rngs(3))
    row = np.random.default_rng(0).integers(BYTE_OFFSET, 260, size=(1, 10))
    start, other = np.concatenate([[[BOS_ID]], row], 1), np.concatenate([[[BOS_ID + 2]], row], 1)
    s_start, s_other = model.score({"ids": jnp.asarray(start)}), model.score({"ids": jnp.asarray(other)})
    assert s_start.nll_BxT.shape == (1, 10) and int(np.asarray(s_start.mask_BxT).sum()) == 10
    assert not np.allclose(np.asarray(s_start.nll_BxT)[0, 0], np.asarray(s_other.nll_BxT)[0, 0])
    # by gradient: the first byte's NLL depends on position 0's input (the BOS), in the same patch
    x = onehot(start, model.vocab_rows)
    x = jnp.pad(x, ((0, 0), (0, model.cfg.padded_length(11) - 11), (0, 0)))
    grad = jax.grad(lambda x: -jax.nn.log_softmax(model(x))[0, 1, int(start[0, 1])])(x)
    assert float(jnp.abs(grad[0, 0]).sum()) > 0 and float(jnp.abs(grad[0, 2:]).sum()) == 0


@pytest.mark.slow
def test_scores_any_length_and_nul_is_a_byte():
    model = MegaByte(mb_cfg(4), rngs=nnx.Rngs(0))
    ids = np.full((2, 12), BYTE_OFFSET, np.int32)  # every target is byte 0x00 (id 4)
    ids[:, 0] = BOS_ID
    ids[1, 8:] = PAD_ID  # second row: 7 real bytes then padding
    s = model.score({"ids": jnp.asarray(ids)})
    assert s.nll_BxT.shape == (2, 11)  # 11 targets, internally padded to 12
    np.testing.assert_array_equal(np.asarray(s.mask_BxT).sum(1), [11, 7])
    assert np.isfinite(np.asarray(s.nll_BxT)).all()
    # padding beyond the sequence never changes the scores of real bytes
    longer = np.concatenate([ids, np.full((2, 5), PAD_ID, np.int32)], axis=1)
    s2 = model.score({"ids": jnp.asarray(longer)})
    np.testing.assert_allclose(np.asarray(s2.nll_BxT)[:, :11], np.asarray(s.nll_BxT), rtol=1e-5, atol=1e-6)


def test_jit_and_no_jit_agree():
    model = MegaByte(mb_cfg(4), rngs=nnx.Rngs(0))
    batch = {"ids": jnp.asarray(np.random.default_rng(1).integers(BYTE_OFFSET, 260, size=(2, 15)))}
    eager = model.score(batch).nll_BxT
    g, s = nnx.split(model)
    jitted = jax.jit(lambda s, b: nnx.merge(g, s).score(b).nll_BxT)(s, batch)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), rtol=1e-5, atol=1e-5)


def test_no_padding_mode_requires_divisible_length():
    model = MegaByte(mb_cfg(4, pad_to_patch=False), rngs=nnx.Rngs(0))
    with pytest.raises(
        ValueError, match="not a multiple of model.patch_size 4 and model.pad_to_patch is false"
    ):
        model.score({"ids": jnp.ones((1, 13), jnp.int32) * 9})  # the BOS and 12 bytes: 13 positions
    assert model.score({"ids": jnp.ones((1, 12), jnp.int32) * 9}).nll_BxT.shape == (1, 11)


def test_bad_configs_are_clear():
    with pytest.raises(
        UserError, match=r"global.d_model 100 must equal model.patch_size 4 x model.embed_dim 8 = 32"
    ):
        mb_cfg(4, **{"global.d_model": 100})
    with pytest.raises(UserError, match="patch_size must be >= 1"):
        mb_cfg(0, **{"global.d_model": 16})


def test_task_rejects_indivisible_context_without_padding(tmp_path):
    from conftest import write_files

    from bytelm.training.restore import make_task

    root = write_files(tmp_path / "c", {f"{i}.txt": b"abc " * 50 for i in range(40)})
    cfg = load_config(
        None,
        [
            f"data.source=files:{root}",
            "train.seq_len=30",
            *(
                f"{k}={v}"
                for k, v in {
                    "model.family": "megabyte",
                    "model.patch_size": 4,
                    "model.embed_dim": 8,
                    "model.global.d_model": 32,
                    "model.global.heads": 2,
                    "model.pad_to_patch": "false",
                }.items()
            ),
        ],
    )
    with pytest.raises(
        UserError,
        match=r"a window \(the BOS and train.seq_len bytes\) of 31 is not a multiple of model.patch_size 4",
    ):
        make_task(cfg, corpus=None)


def test_golden_one_step_loss(tmp_path):
    """Golden values for seed 0 on a fixed generated corpus through the trainer. Update them only when
    a change is *meant* to alter initialisation, the data order or the numerics (say so in the commit)."""
    import json

    from conftest import word_corpus
    from helpers import tiny_overrides

    from bytelm.training.loop import train

    root = word_corpus(tmp_path / "c")
    mb = {
        "model.family": "megabyte",
        "model.patch_size": 4,
        "model.embed_dim": 8,
        "model.global.d_model": 32,
        "model.global.heads": 2,
        "model.global.mlp_dim": 64,
        "model.global.layers": 1,
        "model.local.d_model": 16,
        "model.local.heads": 2,
        "model.local.mlp_dim": 32,
        "model.local.layers": 1,
        "train.steps": 2,
        "eval.every": 0,
    }
    lm_keys = ("model.d_model", "model.n_layers", "model.n_heads", "model.mlp_dim")
    cfg = load_config(None, [o for o in tiny_overrides(root, **mb) if o.split("=")[0] not in lm_keys])
    train(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert losses == pytest.approx(GOLDEN_MEGABYTE_LOSSES, abs=2e-3), losses


GOLDEN_MEGABYTE_LOSSES = [5.91704, 5.68057]  # since MegaByte models the BOS (its first patch holds it)
