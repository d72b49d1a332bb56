"""H-Net (bytelm/families/hnet): the paper's equations against a numpy transcription, a whole stage
against numpy, causality with overflowing windows, the cached (batched) decoder against the full
pass, the router's gradients and the per-stage learning rates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bytelm.config import TrainConfig
from bytelm.constants import BOS_ID, NUM_BYTE_IDS, PAD_ID
from bytelm.families.hnet.config import HNetConfig
from bytelm.families.hnet.decoder import HNetSampler
from bytelm.families.hnet.model import (
    HNet,
    chunk_positions,
    ema_scan,
    keep_boundaries,
    ratio_loss,
    router_probs,
)
from bytelm.models.configs import replace_fields
from bytelm.training.optim import make_optimizer, schedule_plan
from bytelm.training.programs import StepSpec

RNG = np.random.default_rng(7)


def tiny(stages=1, outer="m", **kw):
    """``outer``: the stages' layer kind, ``m`` (Mamba-2, the released layouts; a second stage
    ``T1m1`` / ``m1T1``) or ``T`` (attention blocks)."""
    mamba = outer == "m"
    base = dict(
        stages=stages,
        **{
            "local.d_model": 32,
            "local.heads": 2,
            "local.mlp_dim": 64,
            "local.encoder": f"{outer}1",
            "local.decoder": f"{outer}1",
            "local.window": 8,
            "middle.d_model": 40,
            "middle.heads": 2,
            "middle.mlp_dim": 64,
            "middle.encoder": "T1m1" if mamba else "T1",
            "middle.decoder": "m1T1" if mamba else "T1",
            "middle.window": 4,
            "ssm.d_state": 8,
            "ssm.head_dim": 8,
            "ssm.chunk": 8,
            "global.d_model": 48,
            "global.layers": 1,
            "global.heads": 2,
            "global.mlp_dim": 64,
        },
        target_chunk_len=3.0,
        inner_target_chunk_len=2.0,
        chunk_slots=1.0,  # few slots: windows overflow
    )
    return replace_fields(HNetConfig(), {**base, **kw})


def scrambled(cfg, seed=0):
    """A model whose routers are random (identity routers mark few boundaries at initialisation)."""
    m = HNet(cfg, rngs=nnx.Rngs(seed))
    for i, stage in enumerate(m.stages()):
        stage.wq[...] = jax.random.normal(jax.random.key(seed + 10 + i), stage.wq.shape)
        stage.residual[...] = 0.1 * jax.random.normal(jax.random.key(seed + 20 + i), stage.residual.shape)
    return m


def random_ids(B, T, seed=0):
    ids = np.random.default_rng(seed).integers(4, NUM_BYTE_IDS, (B, T)).astype(np.int32)
    ids[:, 0] = BOS_ID
    return ids


# -- the equations -------------------------------------------------------------------------------
def np_router(q, k, starts):
    B, T, _ = q.shape
    p = np.ones((B, T))
    for b in range(B):
        for t in range(1, T):
            cos = q[b, t - 1] @ k[b, t] / (np.linalg.norm(q[b, t - 1]) * np.linalg.norm(k[b, t]))
            p[b, t] = min(max((1 - cos) / 2, 0.0), 1.0)
    p[starts] = 1.0
    return p


def np_ratio_loss(b, p, valid, N):
    F = b[valid].mean()
    G = p[valid].mean()
    return N / (N - 1) * ((N - 1) * F * G + (1 - F) * (1 - G))


def np_chunks(b, slots):
    return [[t for t in np.flatnonzero(row)][:slots] for row in b]


def np_ema(zhat, p, restart):
    P = np.clip(p, 1e-4, 1 - 1e-4)
    z = np.zeros_like(zhat)
    for b in range(zhat.shape[0]):
        prev = np.zeros(zhat.shape[-1])
        for j in range(zhat.shape[1]):
            prev = P[b, j] * zhat[b, j] + (0.0 if restart[b, j] else 1 - P[b, j]) * prev
            z[b, j] = prev
    return z


@pytest.mark.slow
def test_router_ratio_loss_chunks_and_ema_equal_the_paper_in_numpy():
    B, T, D = 3, 20, 8
    q, k = RNG.normal(size=(B, T, D)), RNG.normal(size=(B, T, D))
    starts = RNG.random((B, T)) < 0.1
    p = np.asarray(router_probs(jnp.asarray(q), jnp.asarray(k), jnp.asarray(starts)))
    np.testing.assert_allclose(p, np_router(q, k, starts), atol=1e-6)
    assert (p[:, 0] == 1).all()
    b = p > 0.5
    valid = RNG.random((B, T)) < 0.8
    for N in (2.0, 6.0):
        got, F, G = ratio_loss(jnp.asarray(b), jnp.asarray(p, jnp.float32), jnp.asarray(valid), N)
        np.testing.assert_allclose(float(got), np_ratio_loss(b, p, valid, N), rtol=1e-6)
    # the loss is 1 at F = G = 1/N and larger elsewhere (its minimum, the paper's motivation)
    N = 4.0
    at = lambda F, G: N / (N - 1) * ((N - 1) * F * G + (1 - F) * (1 - G))  # noqa: E731
    assert abs(at(1 / N, 1 / N) - 1) < 1e-12 and at(0.5, 0.5) > 1 and at(0.1, 0.1) > 1
    slots = 5
    keep = np.asarray(keep_boundaries(jnp.asarray(b), slots))
    pos, n = chunk_positions(jnp.asarray(keep), slots)
    want = np_chunks(b, slots)
    for row in range(B):
        assert np.flatnonzero(keep[row]).tolist() == want[row]
        assert int(n[row]) == len(want[row])
        assert np.asarray(pos[row, : len(want[row])]).tolist() == want[row]
    zhat = RNG.normal(size=(B, 7, D))
    pj = RNG.random((B, 7))
    pj[:, 0] = 1.0
    restart = RNG.random((B, 7)) < 0.3
    got = np.asarray(ema_scan(jnp.asarray(zhat), jnp.asarray(pj), jnp.asarray(restart)))
    np.testing.assert_allclose(got, np_ema(zhat, pj, restart), atol=1e-6)


def np_rms(x, scale, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


@pytest.mark.slow
def test_a_stage_with_empty_stacks_equals_its_numpy_transcription():
    """Encoder, main network and decoder of zero layers (each then just its RMSNorm) leave the
    stage's own parts: padding, router, slot rule, gather, EMA, plug-back, straight-through factor,
    residual, slice. The whole forward pass in numpy, position by position."""
    cfg = tiny(
        **{
            "local.encoder": "",
            "local.decoder": "",
            "global.layers": 0,
            "local.window": 0,
        },
        chunk_slots=1.5,
        document_mask=True,
    )
    m = scrambled(cfg, seed=3)
    stage, main = m.stage, m.stage.inner
    B, T = 2, 24
    x = RNG.normal(size=(B, T, cfg.local.d_model)).astype(np.float32)
    starts = np.zeros((B, T), bool)
    starts[:, 0] = True
    starts[1, 9] = True
    out = stage(jnp.asarray(x), jnp.asarray(starts), jnp.ones((B, T), bool), None, None)
    eps = cfg.norm_eps
    wq, wk, wr = (np.asarray(a[...], np.float64) for a in (stage.wq, stage.wk, stage.residual))
    pad = np.asarray(main.pad[...])
    gscale = np.asarray(main.norm.scale[...])
    h = np_rms(x.astype(np.float64), np.asarray(stage.encoder_norm.scale[...]), eps)
    p = np_router(h @ wq, h @ wk, starts)
    slots = cfg.slots_for(T, cfg.target_chunk_len)
    want = np.zeros((B, T, cfg.local.d_model))
    for b in range(B):
        kept = np_chunks(p[b : b + 1] > 0.5, slots)[0]
        chunk = h[b, kept]
        widened = np.concatenate([chunk, np.broadcast_to(pad, (len(kept), pad.size))], axis=1)
        zhat = np_rms(widened, gscale, eps)[:, : cfg.local.d_model]
        z = np_ema(zhat[None], p[b, kept][None], starts[b, kept][None])[0]
        for t in range(T):
            j = sum(1 for s in kept if s <= t) - 1
            c = p[b, t] if t in kept else 1 - p[b, t]
            pre = z[j] * (c + (1 - c)) + h[b, t] @ wr
            want[b, t] = np_rms(pre, np.asarray(stage.decoder_norm.scale[...]), eps)
    np.testing.assert_allclose(np.asarray(out.y_BxTxD), want, atol=2e-5)
    assert int(np.asarray(out.chunk_positions[0][1]).max()) >= 2  # several chunks per row


# -- causality, the cache, batches ---------------------------------------------------------------
@pytest.mark.parametrize("stages, outer", [(1, "m"), (2, "m"), (1, "T"), (2, "T")])
@pytest.mark.slow
def test_bytes_after_t_change_no_log_probability_up_to_t(stages, outer):
    m = scrambled(tiny(stages, outer))
    B, T = 2, 32
    ids = random_ids(B, T, seed=stages)
    full = np.asarray(m(jnp.asarray(ids)))
    s = m.score({"ids": jnp.asarray(np.concatenate([ids, ids[:, :1]], axis=1))})
    assert float(s.stats["s1_overflow_windows"]) > 0  # the slot rule is at work in these windows
    for t in (3, 11, 20):
        changed = ids.copy()
        changed[:, t + 1 :] = np.random.default_rng(t).integers(4, NUM_BYTE_IDS, (B, T - t - 1))
        got = np.asarray(m(jnp.asarray(changed)))
        np.testing.assert_allclose(got[:, : t + 1], full[:, : t + 1], atol=1e-6)
        assert np.abs(got[:, t + 1 :] - full[:, t + 1 :]).max() > 1e-3  # (the later ones do move)


@pytest.mark.parametrize("stages", [1, 2])
def test_a_document_whose_start_lost_its_slot_reads_nothing_of_the_one_before(stages):
    """``model.document_mask`` in windows whose router marks more boundaries than there are slots:
    where the second document's start gets no slot, still no output of it depends on the first
    document's bytes (its positions read no chunk of the first document)."""
    m = scrambled(tiny(stages, "T", document_mask=True))
    B, T, second = 2, 32, 22
    ids = random_ids(B, T, seed=9)
    ids[:, second] = BOS_ID
    starts, _ = m.byte_boundaries(jnp.asarray(ids))
    lost = ~np.asarray(starts[0])[:, second]  # the rows where the start lost its slot
    assert lost.any()
    full = np.asarray(m(jnp.asarray(ids)))
    changed = ids.copy()
    changed[:, 1:second] = np.random.default_rng(3).integers(4, NUM_BYTE_IDS, (B, second - 1))
    got = np.asarray(m(jnp.asarray(changed)))
    np.testing.assert_allclose(got[lost, second:], full[lost, second:], atol=1e-6)
    assert np.abs(got[:, :second] - full[:, :second]).max() > 1e-3  # (the first document's do move)


@pytest.mark.parametrize(
    "stages, outer, documents",
    [(1, "m", False), (2, "m", False), (1, "T", False), (1, "T", True), (2, "T", True)],
)
@pytest.mark.slow
def test_the_batched_cache_equals_the_full_pass_at_every_step(stages, outer, documents):
    """Rows with prompts of different lengths (a document start inside one: with
    ``model.document_mask`` attention and the moving average restart there), fed byte by byte after
    the prefill: every step's logits equal the full pass over the same prefix (1e-4), overflowing
    windows included, and the inner stages ran only at chunk ends."""
    m = scrambled(tiny(stages, outer, document_mask=documents), seed=1)
    T = 28
    ids = random_ids(3, T, seed=5)
    ids[2, 6] = BOS_ID  # a second document in a row's prompt: the router and the average restart
    lengths = [1, 4, 9]
    sampler = HNetSampler(m, T)
    forward = jax.jit(lambda x: m(x))

    def reference(row, n):
        x = np.full((1, T), PAD_ID, np.int32)
        x[0, :n] = ids[row, :n]
        return np.asarray(forward(x))[0, n - 1]

    logits = sampler.prefill([ids[i, :n].tolist() for i, n in enumerate(lengths)])
    worst = 0.0
    for step in range(T - max(lengths)):
        for i, n in enumerate(lengths):
            worst = max(worst, float(np.abs(logits[i] - reference(i, n + step)).max()))
        logits = sampler.step([int(ids[i, n + step]) for i, n in enumerate(lengths)])
    assert worst < 1e-4
    chunks = sampler.chunks()
    slots = m.cfg.slot_plan(T)
    assert (chunks[0] <= slots[0]).all() and chunks[0].max() == slots[0]  # the slot rule held
    main_pos = np.asarray(sampler.state["main"]["pos"])
    np.testing.assert_array_equal(main_pos, chunks[-1])  # the main network ran once per innermost chunk


# -- training ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_router_learns_through_the_straight_through_factor_and_the_ratio_loss():
    m = scrambled(tiny())
    ids = jnp.asarray(np.concatenate([random_ids(2, 32), np.full((2, 1), 10, np.int32)], axis=1))
    graphdef, params = nnx.split(m, nnx.Param)

    def loss(params, weight):
        model = nnx.merge(graphdef, params)
        s = model.score({"ids": ids})
        return jnp.sum(s.nll_BxT) / jnp.sum(s.mask_BxT) + weight * s.aux

    for weight in (0.0, 1.0):
        g = jax.grad(loss)(params, weight)
        assert float(jnp.abs(g["stage"]["wq"][...]).max()) > 0  # through c + sg(1 - c) (and the loss)
        assert float(jnp.abs(g["stage"]["residual"][...]).max()) > 0
    g0, g1 = (jax.grad(loss)(params, w)["stage"]["wk"][...] for w in (0.0, 1.0))
    assert float(jnp.abs(g1 - g0).max()) > 0  # the ratio loss moves the router too


@pytest.mark.slow
def test_per_stage_learning_rates_scale_each_stage_s_adam_step():
    m = HNet(tiny(lr_scales=(3.0, 1.0)), rngs=nnx.Rngs(0))
    params = nnx.state(m, nnx.Param)
    train = TrainConfig(learning_rate=1e-3, weight_decay=0.0, grad_clip=0.0, warmup_steps=0)
    tx = make_optimizer(StepSpec.of(train))
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params, plan=schedule_plan(train, 100))
    flat = {k: float(jnp.abs(v.get_value()).max()) for k, v in nnx.to_flat_state(updates)}
    outer, inner = flat[("stage", "wq")], flat[("stage", "inner", "norm", "scale")]
    assert outer == pytest.approx(3.0 * inner, rel=1e-5)  # Adam's first step has the same size everywhere
    assert flat[("embed", "table")] == pytest.approx(outer, rel=1e-5)


def test_the_paper_s_learning_rate_rule_gives_its_multipliers():
    """Eq. 11 of the paper (App. C) by hand: 1stage_L (N = 6; widths 1024, 1536) and 2stage_L
    (N = 3, 3; widths 1024, 1024, 1536), the main network's N_S = 1, N_GPT = 4.6."""
    one = tiny(**{"local.d_model": 1024, "global.d_model": 1536, "global.heads": 16}, target_chunk_len=6.0)
    assert one.lr_rule_scales() == pytest.approx([(4.6 * 1.5) ** 0.5, (4.6 / 6) ** 0.5])
    assert one.lr_rule_scales() == pytest.approx([2.627, 0.8756], abs=1e-3)
    two = tiny(
        2,
        **{"local.d_model": 1024, "middle.d_model": 1024, "global.d_model": 1536, "global.heads": 16},
        target_chunk_len=3.0,
        inner_target_chunk_len=3.0,
    )
    # stage 1: every position of its own (prod_{i>=0} N_i / prod N_i = 1); stage 2: 3 of 9; main: 1 of 9
    assert two.lr_rule_scales() == pytest.approx(
        [(4.6 * 1.5) ** 0.5, (4.6 * 1.5 / 3) ** 0.5, (4.6 / 9) ** 0.5]
    )
    assert [s.lr_scale for s in two.stage_specs()] == pytest.approx(two.lr_rule_scales()[:2])
    assert two.main_lr_scale() == pytest.approx(two.lr_rule_scales()[2])
    hand = tiny(lr_scales=(3.0, 1.0))  # set by hand, the rule is not used
    assert [s.lr_scale for s in hand.stage_specs()] == [3.0] and hand.main_lr_scale() == 1.0
    assert hand.layout() == ["m1", ["T1"], "m1"]
    assert tiny(2).layout() == ["m1", ["T1m1", ["T1"], "m1T1"], "m1"]


def test_bad_configs_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="model.stages"):
        tiny(stages=3)
    with pytest.raises(ValueError, match="model.global.d_model"):
        tiny(**{"global.d_model": 16}, **{"global.heads": 2})
    with pytest.raises(ValueError, match="model.lr_scales"):
        tiny(lr_scales=(1.0,))
    with pytest.raises(ValueError, match="target_chunk_len"):
        tiny(target_chunk_len=1.0)
    with pytest.raises(ValueError, match="layer pattern 'm4x'"):
        tiny(**{"local.encoder": "m4x"})
    with pytest.raises(ValueError, match="model.local: ssm.expand x d_model"):
        tiny(**{"ssm.head_dim": 48})
    with pytest.raises(ValueError, match="model.document_mask: the Mamba-2 layers of model.local"):
        tiny(document_mask=True)


# -- the family end to end: train, evaluate, chunks, sample, size rule ---------------------------
TINY_RUN = {
    "model.family": "hnet",
    "model.local.d_model": 32,
    "model.local.heads": 2,
    "model.local.mlp_dim": 64,
    "model.local.encoder": "m1",
    "model.local.decoder": "m1",
    "model.local.window": 16,
    "model.ssm.d_state": 8,
    "model.ssm.head_dim": 16,
    "model.ssm.chunk": 16,
    "model.global.d_model": 48,
    "model.global.layers": 1,
    "model.global.heads": 2,
    "model.global.mlp_dim": 64,
    "model.target_chunk_len": 4.0,
    "data.segment_bytes": 48,
    "data.max_eval_bytes": 2400,
    "data.heldout_fraction": 0.2,
    "train.batch_size": 4,
    "train.seq_len": 64,
    "train.steps": 3,
    "train.warmup_steps": 1,
    "train.log_every": 1,
    "train.checkpoint_every": 100,
    "train.peak_flops": 1e11,
    "eval.every": 0,
    "eval.batch_size": 4,
}


@pytest.fixture(scope="module")
def hnet_run(tmp_path_factory):
    from conftest import word_corpus

    from bytelm.config import load_config
    from bytelm.training.loop import train

    root = tmp_path_factory.mktemp("hnet")
    corpus = word_corpus(root / "corpus", n_docs=40, words_per_doc=120, two_dirs=True)
    overrides = [f"{k}={v}" for k, v in {"data.source": f"files:{corpus}", **TINY_RUN}.items()]
    train(load_config(None, overrides), root / "run")
    return root / "run"


@pytest.mark.slow
def test_a_run_logs_its_chunk_rates_and_its_evaluation_counts_the_model_s_chunks(hnet_run, tmp_path):
    import json

    from bytelm import cli

    info = json.loads((hnet_run / "run.json").read_text())
    assert 1.0 < info["s1_mean_chunk_len"] < 64 and 0 <= info["s1_overflow_windows"] <= 1
    train_records = [json.loads(x) for x in (hnet_run / "metrics.jsonl").read_text().splitlines()]
    assert all(
        "s1_mean_chunk_len" in r and "s1_ratio_loss" in r for r in train_records if r["kind"] == "train"
    )
    assert cli.main(["eval", str(hnet_run), "--json", str(tmp_path / "r.json")]) == 0
    (model,) = json.loads((tmp_path / "r.json").read_text())["models"]
    assert model["family"] == "hnet" and model["note"].startswith("train chunks")
    assert len(model["dirs"]) == 2
    for group in model["dirs"].values():  # per directory: bytes per innermost chunk, counted by the model
        assert group["global_steps"] >= group["segments"]  # (every segment is at least one chunk)
        assert group["mean_bytes_per_global_step"] == pytest.approx(group["bytes"] / group["global_steps"])
    assert model["mean_bytes_per_global_step"] == pytest.approx(
        model["bytes"] / sum(g["global_steps"] for g in model["dirs"].values())
    )


def test_bytelm_chunks_shows_each_stage_s_chunks_and_refuses_other_families(hnet_run, tmp_path, capsys):
    from bytelm import cli

    text = "the quick brown fox jumps over the lazy dog"
    assert cli.main(["chunks", str(hnet_run), "--text", text, "--png", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("stage 1: "))
    assert line[len("stage 1: ") :].replace("|", "") == text  # the chunks cover the text exactly
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert cli.main(["chunks", str(hnet_run), "--text", "x" * 200]) == 2  # longer than the context
    assert "context" in capsys.readouterr().err


@pytest.mark.slow
def test_sampling_an_h_net_run_streams_bytes(hnet_run, capsys):
    import json

    from bytelm import cli

    assert (
        cli.main(["sample", str(hnet_run), "--prompt", "the", "--max-bytes", "12", "--greedy", "--stats"])
        == 0
    )
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert stats["family"] == "hnet" and stats["generated_bytes"] <= 12 and stats["chunks_per_stage"][0] >= 1


@pytest.mark.parametrize("stages", [1, 2])
def test_the_size_rule_builds_valid_configs_at_every_budget(stages):
    from bytelm.experiments.spec import SizeRule
    from bytelm.families.hnet import HNetTask

    rule = SizeRule()
    for budget in (5e11, 2e12, 1e15, 1e20):
        trunk = rule.sizes(budget)
        cfg = HNetTask.sized(tiny(stages), trunk, {"target_chunk_len": 8.0})
        assert cfg.global_.d_model == trunk.main.d_model and cfg.local.d_model == trunk.local.d_model
        assert cfg.target_chunk_len == 8.0 and cfg.local.encoder_layers == 1  # depths stay
