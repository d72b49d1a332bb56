"""BLT: causality across patches (hash n-grams and both cross-attentions included), the one-byte-
per-patch reduction to a flat byte transformer, padding safety, jit parity."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import blt_cfg, random_lengths

from bytelm.config import load_config
from bytelm.constants import BOS_ID, BYTE_OFFSET, PAD_ID
from bytelm.errors import UserError
from bytelm.families.blt.model import BLT, ngram_hashes, patch_ids_from_lengths
from bytelm.families.byte.model import ByteLM
from bytelm.patching import EntropyModel, EntropyPatcher

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(scope="module")
def entropy_patcher():
    """Entropy patching with a (freshly initialised) small windowed byte LM, threshold at the median."""
    lm_cfg = load_config(
        None,
        [
            "model.family=byte",
            "model.d_model=16",
            "model.n_layers=1",
            "model.n_heads=2",
            "model.mlp_dim=32",
            "model.window=8",
        ],
    ).model
    model = EntropyModel(ByteLM(lm_cfg, rngs=nnx.Rngs(5)))
    return model, lambda ids, theta: EntropyPatcher(model, theta, None, 6).lengths(ids, 16)


@pytest.mark.parametrize(
    "kw, slots",
    [
        ({"cross_attention": True}, 16),
        ({"cross_attention": True, "encoder_cross_all_layers": True, "local.encoder_layers": 2}, 16),
        ({"cross_attention": True, "decoder_cross_all_layers": False}, 16),
        ({"cross_attention": False}, 16),
        ({"cross_attention": True, "max_patch_len": 3}, 5),  # a window that runs out of slots
    ],
)
@pytest.mark.slow
def test_causality_by_gradient_across_patches(kw, slots, entropy_patcher):
    model = BLT(blt_cfg(**kw), rngs=nnx.Rngs(0))
    rng = np.random.default_rng(1)
    T = 20
    ids = rng.integers(BYTE_OFFSET, 260, size=(1, T + 1))  # random text
    ids[0, 0] = BOS_ID
    entropy_model, _ = entropy_patcher
    theta = float(np.median(entropy_model.entropies(ids)[0, 1:]))
    layout = EntropyPatcher(entropy_model, theta, None, model.cfg.max_patch_len).layout(ids, slots)
    lengths = jnp.asarray(layout.lengths_BxP)
    n_patches = int((lengths > 0).sum())
    assert 4 <= n_patches < T, f"entropy patching should give several multi-byte patches: {lengths}"
    if slots == 5:  # the slot rule merged the rest of the window into the last patch, past max_patch_len
        assert layout.overflow_B[0] > 0 and int(lengths[0, -1]) > model.cfg.max_patch_len
    inputs = jnp.asarray(ids[:, :T])
    emb = model.encoder.embed(inputs)  # byte + hashed n-gram embeddings of every position
    targets = ids[0, 1:]

    def nll(e):
        logp = jax.nn.log_softmax(model(inputs, lengths, embeddings_BxTxD=e))
        return -jnp.take_along_axis(logp[0], jnp.asarray(targets)[:, None], axis=1)[:, 0]

    dep = np.abs(np.asarray(jax.jit(jax.jacrev(nll))(emb))).sum(-1)[:, 0, :]  # dep[t, s]
    for t in range(T):
        assert np.all(dep[t, t + 1 :] == 0), (
            f"NLL at {t} depends on later positions {np.flatnonzero(dep[t, t + 1 :]) + t + 1}"
        )
        assert dep[t, t] > 0


def test_ngram_hashes_look_only_backwards():
    rng = np.random.default_rng(2)
    ids = jnp.asarray(rng.integers(0, 260, size=(2, 30)))
    for n in (3, 8):
        base = np.asarray(ngram_hashes(ids, n, 1000))
        for k in (0, 7, 29):
            changed = np.asarray(ngram_hashes(ids.at[:, k].set((ids[:, k] + 1) % 260), n, 1000))
            assert np.array_equal(changed[:, :k], base[:, :k]), "a hash looked at a later id"
            assert not np.array_equal(changed[:, k : k + n], base[:, k : k + n])
    # n-grams that differ only in their oldest id hash differently (it is part of the n-gram)
    a = np.asarray(ngram_hashes(jnp.asarray([[10, 20, 30]]), 3, 10**6))[0, 2]
    b = np.asarray(ngram_hashes(jnp.asarray([[11, 20, 30]]), 3, 10**6))[0, 2]
    assert a != b


def test_patch_ids_from_lengths():
    lengths = jnp.asarray([[1, 3, 2, 0], [2, 2, 0, 0]])
    np.testing.assert_array_equal(
        np.asarray(patch_ids_from_lengths(lengths, 7)), [[0, 1, 1, 1, 2, 2, 4], [0, 0, 1, 1, 4, 4, 4]]
    )


def test_one_byte_per_patch_reduces_to_flat_byte_transformer():
    """Documented reduction: cross_attention=False, one byte per patch, no encoder/decoder layers, no
    n-grams, identity projections (k=1): logits_i = head(norm(e_i + G(e)_i)) with G the flat byte
    transformer (the byte LM's stack + final norm) over the embeddings e. Reading G at i (not i+1 or
    i-1) is exactly the decoder's "patch before the target's patch" alignment."""
    d = 32
    lm = ByteLM(
        load_config(
            None,
            [
                "model.family=byte",
                f"model.d_model={d}",
                "model.n_layers=2",
                "model.n_heads=2",
                "model.mlp_dim=64",
            ],
        ).model,
        rngs=nnx.Rngs(0),
    )
    cfg = blt_cfg(
        cross_attention=False,
        **{
            "local.encoder_layers": 0,
            "local.decoder_layers": 0,
            "global.layers": 2,
            "global.d_model": d,
            "local.d_model": d,
            "global.mlp_dim": 64,
        },
        queries_per_patch=1,
        ngram_sizes="",
    )
    blt = BLT(cfg, rngs=nnx.Rngs(1))
    blt.encoder.byte_embed = lm.embed
    blt.latent.stack = lm.stack
    blt.decoder.head = lm.head
    for part in (blt.encoder.to_queries, blt.encoder.to_global, blt.latent.from_global):
        part.set_value(jnp.eye(d))
    T = 12
    ids = jnp.asarray(np.random.default_rng(3).integers(BYTE_OFFSET, 260, size=(2, T))).at[:, 0].set(BOS_ID)
    lengths = jnp.ones((2, T + 1), jnp.int32)
    e = lm.embed(ids)
    flat = lm.norm(lm.stack(e))
    h = e + flat
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)  # unit-scale RMSNorm
    expected = np.asarray(h @ lm.head[...])[..., :260]
    np.testing.assert_allclose(np.asarray(blt(ids, lengths))[..., :260], expected, rtol=2e-4, atol=2e-4)
    # and shifting the alignment by one patch breaks the equality (the test can fail)
    shifted = np.asarray(jnp.concatenate([flat[:, :1], flat[:, :-1]], axis=1) + e)
    assert not np.allclose(
        np.asarray(blt(ids, lengths))[..., :260],
        (shifted / np.sqrt((shifted**2).mean(-1, keepdims=True))) @ np.asarray(lm.head[...])[:, :260],
        atol=1e-2,
    )


def _dense_cross_attention(module, q_BxMxQxD, src_BxSxD, allowed_BxMxS):
    """The same cross-attention as PatchCrossAttention, over every source row under a dense
    boolean mask (the formulation the gathered one replaces): a reference for values and gradients."""
    q = jnp.einsum("bmqd,dhk->bmqhk", module.norm_q(q_BxMxQxD), module.wq[...])
    src = module.norm_kv(src_BxSxD)
    k = jnp.einsum("bsd,dhk->bshk", src, module.wk[...])
    v = jnp.einsum("bsd,dhk->bshk", src, module.wv[...])
    scores = jnp.einsum("bmqhk,bshk->bmqhs", q, k) / np.sqrt(q.shape[-1])
    scores = jnp.where(allowed_BxMxS[:, :, None, None, :], scores, -jnp.inf)
    w = jax.nn.softmax(jnp.where(allowed_BxMxS.any(-1)[:, :, None, None, None], scores, 0.0), axis=-1)
    out = jnp.einsum("bmqhs,bshk,hkd->bmqd", w, v, module.wo[...])
    return jnp.where(allowed_BxMxS.any(-1)[:, :, None, None], out, 0.0)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
@pytest.mark.slow
def test_gathered_cross_attention_equals_dense_masks(side):
    """Encoder: each patch's k queries over the bytes of its own patch (gathered, at most
    max_patch_len); decoder: each byte over the k slots of its source patch. Values and gradients
    against dense masks over every source row, on random patch lengths (empty patches included)."""
    from bytelm.families.blt.model import PatchCrossAttention

    rng = np.random.default_rng(7)
    B, T, D, k, S_max = 2, 23, 16, 2, 5
    module = PatchCrossAttention(D, 2, rngs=nnx.Rngs(3), dtype=jnp.float32, implementation="xla")
    # row 0 starts with a patch of 3 bytes (its first targets have no source patch), row 1 with BOS alone
    lengths = np.asarray([random_lengths(rng, T + 1, 14, max_len=S_max, first=f) for f in (3, 1)])
    pid = np.asarray(patch_ids_from_lengths(jnp.asarray(lengths), T + 1))
    P = lengths.shape[1]
    if side == "encoder":
        starts = np.cumsum(lengths, 1) - lengths
        index = starts[:, :, None] + np.arange(S_max)
        valid = (np.arange(S_max) < lengths[:, :, None]) & (index < T)
        index = np.minimum(index, T - 1)
        q = jnp.asarray(rng.normal(size=(B, P, k, D)), jnp.float32)
        src = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
        allowed = pid[:, None, :T] == np.arange(P)[None, :, None]  # B x P x T
    else:
        src_pid = pid[:, 1:] - 1
        index = np.clip(src_pid, 0, P - 1)[:, :, None] * k + np.arange(k)
        valid = np.broadcast_to((src_pid >= 0)[:, :, None], index.shape)
        q = jnp.asarray(rng.normal(size=(B, T, 1, D)), jnp.float32)
        src = jnp.asarray(rng.normal(size=(B, P * k, D)), jnp.float32)
        allowed = (np.arange(P * k)[None, None, :] // k == src_pid[:, :, None]) & (src_pid >= 0)[
            :, :, None
        ]  # B x T x Pk
    w = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
    gathered = lambda q, s: jnp.sum(w * module(q, s, jnp.asarray(index), jnp.asarray(valid)))  # noqa: E731
    dense = lambda q, s: jnp.sum(w * _dense_cross_attention(module, q, s, jnp.asarray(allowed)))  # noqa: E731
    np.testing.assert_allclose(gathered(q, src), dense(q, src), rtol=1e-4, atol=1e-4)
    # the gradients jitted: one program each, where eager differentiation compiles every op on its own
    for a, b in zip(
        jax.jit(jax.grad(gathered, argnums=(0, 1)))(q, src), jax.jit(jax.grad(dense, argnums=(0, 1)))(q, src)
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    assert not np.all(valid) and np.any(valid)  # some empty rows and some full: both paths exercised


def test_embeddings_start_at_the_reference_scale():
    """Byte and hash n-gram tables: a normal of std local.d_model ** -0.5 cut at 3 std (the
    reference's init_weights), not N(0, 1) tables that would drown the byte embedding."""
    model = BLT(blt_cfg(**{"local.d_model": 64}, hash_table_size=4093), rngs=nnx.Rngs(0))
    for table in [model.encoder.byte_embed.table, *(e.table for e in model.encoder.ngram_embeds)]:
        t = np.asarray(table[...])
        assert abs(t.std() / 64**-0.5 - 0.986) < 0.02 and np.abs(t).max() <= 3 * 64**-0.5 + 1e-6


def test_padding_rows_and_empty_patches_are_finite():
    model = BLT(blt_cfg(), rngs=nnx.Rngs(0))
    ids = np.full((2, 17), PAD_ID, np.int32)
    ids[0, :9] = np.r_[BOS_ID, np.arange(8) + 40]
    lengths = np.zeros((2, 8), np.int32)
    lengths[0, :4] = [1, 3, 4, 1]  # row 1: all padding, no patches at all
    batch = {"ids": jnp.asarray(ids), "patch_lengths": jnp.asarray(lengths)}
    graphdef, state = nnx.split(model)
    # jitted (one program each; eager execution compiles every op on its own): finite either way
    s = jax.jit(lambda st: nnx.merge(graphdef, st).score(batch))(state)
    assert np.isfinite(np.asarray(s.nll_BxT)).all() and float(s.mask_BxT[1].sum()) == 0
    grads = jax.jit(jax.grad(lambda st: nnx.merge(graphdef, st).score(batch).nll_BxT.sum()))(state)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


def test_bad_config():
    with pytest.raises(UserError, match="target_patch_len must be >= 1 byte, got 0.5"):
        blt_cfg(target_patch_len=0.5)


# -- training task ------------------------------------------------------------------------
from helpers import corpus_dir, metrics, tiny_overrides  # noqa: E402, F401  (module fixture)

from bytelm.training.loop import train  # noqa: E402

_LM_KEYS = ("model.d_model", "model.n_layers", "model.n_heads", "model.mlp_dim", "model.window")


@pytest.fixture(scope="module")
def entropy_run(corpus_dir, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("entropy") / "run"
    train(
        load_config(
            None, tiny_overrides(corpus_dir, **{"model.window": 16, "train.steps": 20, "eval.every": 0})
        ),
        out,
    )
    return out


def blt_train_cfg(corpus_dir, entropy_run, **extra):  # noqa: F811
    over = {
        "model.family": "blt",
        "model.entropy_run": str(entropy_run),
        "model.target_patch_len": 3.0,
        "model.local.d_model": 32,
        "model.local.heads": 2,
        "model.local.mlp_dim": 64,
        "model.local.window": 16,
        "model.global.d_model": 64,
        "model.global.heads": 2,
        "model.global.mlp_dim": 128,
        "model.global.layers": 1,
        "model.hash_table_size": 512,
        "train.steps": 2,
        "eval.every": 0,
        **extra,
    }
    return load_config(
        None, [o for o in tiny_overrides(corpus_dir, **over) if o.split("=")[0] not in _LM_KEYS]
    )


@pytest.mark.slow
def test_golden_one_step_loss_and_calibration(corpus_dir, entropy_run, tmp_path):  # noqa: F811
    """Golden values for seed 0 on the fixed corpus and entropy run. Update only for an intended change
    of initialisation, data order, patching or numerics (and say so in the commit message)."""
    train(blt_train_cfg(corpus_dir, entropy_run), tmp_path / "run")
    losses = [m["loss"] for m in metrics(tmp_path / "run")]
    run = __import__("json").loads((tmp_path / "run" / "run.json").read_text())
    patching = run["patching"]
    assert abs(patching["achieved_mean_patch_len"] / 3.0 - 1) <= 0.02
    assert run["mean_bytes_per_global_step"] == patching["achieved_mean_patch_len"]
    assert patching["entropy_fingerprint"] == run["entropy_fingerprint"]
    assert losses == pytest.approx(GOLDEN_BLT_LOSSES, abs=2e-3), losses


GOLDEN_BLT_LOSSES = [5.95986, 5.22011]


def test_missing_and_mismatched_entropy_run(corpus_dir, entropy_run, tmp_path):  # noqa: F811
    from bytelm.data import load_corpus
    from bytelm.training.restore import make_task

    corpus = load_corpus(f"files:{corpus_dir}")
    with pytest.raises(UserError, match="model.entropy_run is empty"):
        make_task(blt_train_cfg(corpus_dir, ""), corpus)
    with pytest.raises(UserError, match="is not a finished run directory"):
        make_task(blt_train_cfg(corpus_dir, tmp_path / "nothing"), corpus)
    blt_run = tmp_path / "blt"
    train(blt_train_cfg(corpus_dir, entropy_run), blt_run)
    with pytest.raises(UserError, match="is a 'blt' run; the entropy model must be a byte LM"):
        make_task(blt_train_cfg(corpus_dir, blt_run), corpus)


@pytest.mark.slow
def test_patch_overflow_is_capped_causally_and_logged(corpus_dir, entropy_run, tmp_path):  # noqa: F811
    """Every position a boundary, 8 slots for 65-position windows: training runs (no error, no byte
    dropped) and the overflow rate (windows and bytes affected) lands in metrics.jsonl and run.json."""
    cfg = blt_train_cfg(corpus_dir, entropy_run, **{"model.threshold": 1e-6, "model.max_patches": 8})
    train(cfg, tmp_path / "run")
    rows = metrics(tmp_path / "run")
    assert rows and all(r["patch_overflow_windows"] == 1.0 for r in rows)
    assert all(abs(r["patch_overflow_bytes"] - (65 - 8) / 65) < 1e-9 for r in rows)
    run = __import__("json").loads((tmp_path / "run" / "run.json").read_text())
    assert run["patch_overflow_windows"] == 1.0 and run["status"] == "finished"


def test_a_fixed_threshold_measures_its_mean_patch_length_for_the_flops(corpus_dir, entropy_run):  # noqa: F811
    """With model.threshold set nothing is calibrated, yet the FLOPs use the mean patch length that
    threshold gives on the calibration sample (the same measurement calibration makes), not the target."""
    from bytelm.data import load_corpus
    from bytelm.families.blt import flops as blt_flops
    from bytelm.patching import mean_patch_length, real_lengths
    from bytelm.training.restore import make_task

    cfg = blt_train_cfg(corpus_dir, entropy_run, **{"model.threshold": 1.5, "model.target_patch_len": 9.0})
    task = make_task(cfg, load_corpus(f"files:{corpus_dir}"))
    sample = task._calibration_sample()
    measured = mean_patch_length(task.patcher.starts(sample), real_lengths(sample))
    assert task.patcher.threshold == 1.5 and task.achieved == measured and abs(measured - 9.0) > 0.5
    assert task.forward_flops_per_position() == blt_flops.forward_flops_per_byte(
        cfg.model, cfg.train.seq_len, measured
    )
    assert task.run_info()["patching"]["achieved_mean_patch_len"] == measured
