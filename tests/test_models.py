"""The shared core and the byte LM: attention vs a numpy reference, causality, jit parity, FLOPs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bytelm.config import load_config
from bytelm.constants import BYTE_OFFSET
from bytelm.families.byte.model import ByteLM
from bytelm.models import flops
from bytelm.models.attention import attend, halving_causal_attention
from bytelm.models.core import Attention, rotary, swiglu_mlp
from bytelm.models.kernels import resolve_kernels
from bytelm.models.stack import Transformer

jax.config.update("jax_numpy_rank_promotion", "raise")


def np_attention(q, k, v, mask):
    """q (B,T,H,K), k/v (B,S,H,K), mask (B,T,S) bool -> (B,T,H,K), plain numpy."""
    scores = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(mask[:, None], scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    w = np.exp(scores)
    w /= w.sum(-1, keepdims=True)
    return np.einsum("bhts,bshk->bthk", w, v)


def np_rotary(x, pos, base):
    half = x.shape[-1] // 2
    inv = base ** (-np.arange(half) / half)
    ang = pos[..., None] * inv
    sin, cos = np.sin(ang)[:, :, None], np.cos(ang)[:, :, None]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def run_attention(attn, x, **kw):
    return np.asarray(attn(jnp.asarray(x), **kw))


def reference_self_attention(attn, x, mask):
    wq, wk, wv, wo = (np.asarray(getattr(attn, n)[...]) for n in ("wq", "wk", "wv", "wo"))
    pos = np.broadcast_to(np.arange(x.shape[1]), x.shape[:2]).astype(np.float64)
    q, k = np.einsum("btd,dhk->bthk", x, wq), np.einsum("btd,dhk->bthk", x, wk)
    if attn.q_norm is not None:  # QK-norm: unit root mean square over each head's dimensions, times the gain
        q = q / np.sqrt(np.mean(q * q, -1, keepdims=True) + 1e-6) * np.asarray(attn.q_norm.scale[...])
        k = k / np.sqrt(np.mean(k * k, -1, keepdims=True) + 1e-6) * np.asarray(attn.k_norm.scale[...])
    q, k = np_rotary(q, pos, attn.rope_base), np_rotary(k, pos, attn.rope_base)
    v = np.einsum("btd,dhk->bthk", x, wv)
    return np.einsum("bthk,hkd->btd", np_attention(q, k, v, mask), wo)


@pytest.fixture(scope="module")
def attn():
    return Attention(32, 4, rngs=nnx.Rngs(0))


def test_causal_attention_matches_numpy(attn):
    x = np.random.default_rng(0).normal(size=(2, 9, 32)).astype(np.float32)
    mask = np.broadcast_to(np.tril(np.ones((9, 9), bool)), (2, 9, 9))
    np.testing.assert_allclose(
        run_attention(attn, x), reference_self_attention(attn, x, mask), rtol=2e-4, atol=2e-5
    )


@pytest.mark.parametrize("T, window", [(16, 0), (24, 0), (13, 0), (16, 3), (23, 6)])
@pytest.mark.slow
def test_long_sequence_attention_paths_match_numpy(T, window):
    """From 2 blocks on, the halving kernel takes the halving path (no window) or the
    query-blocked path (window): both must equal dense masked attention."""
    q, k, v = np.random.default_rng(T).normal(size=(3, 2, T, 4, 8)).astype(np.float32)
    i, j = np.indices((T, T))
    mask = np.broadcast_to((j <= i) & ((i - j < window) if window else True), (2, T, T))
    out = attend(q, k, v, causal=True, window=window, implementation="halving", block=4)
    np.testing.assert_allclose(np.asarray(out), np_attention(q, k, v, mask), rtol=2e-4, atol=2e-5)


def test_halving_attention_gradients_equal_dense():
    rng = np.random.default_rng(3)
    q, k, v, w = (jnp.asarray(rng.normal(size=(2, 32, 2, 8)), jnp.float32) for _ in range(4))

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v) * w)

    # jitted: one program each (eager differentiation compiles every op on its own)
    halving = jax.jit(
        jax.grad(loss(lambda q, k, v: halving_causal_attention(q, k, v, block=4)), argnums=(0, 1, 2))
    )(q, k, v)
    dense = jax.jit(
        jax.grad(
            loss(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True)), argnums=(0, 1, 2)
        )
    )(q, k, v)
    for a, b in zip(halving, dense):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_deep_halving_recursion_equals_dense():
    """Seven levels of halving (T=256 down to leaves of 2): values and gradients equal dense
    attention. Operands of rank 8 or more made XLA CPU abort (a YNNPACK check), so the recursion
    folds each level into the batch; this fails (the process aborts) if that is undone."""
    rng = np.random.default_rng(5)
    q, k, v, w = (jnp.asarray(rng.normal(size=(2, 256, 2, 8)), jnp.float32) for _ in range(4))

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v) * w)

    halving = jax.jit(
        jax.value_and_grad(
            loss(lambda q, k, v: halving_causal_attention(q, k, v, block=2)), argnums=(0, 1, 2)
        )
    )
    dense = jax.value_and_grad(
        loss(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True)), argnums=(0, 1, 2)
    )
    (h_val, h_grads), (d_val, d_grads) = halving(q, k, v), dense(q, k, v)
    # two differently shaped programs summing 8192 float32 terms: reassociation error ~1e-6 relative,
    # and an atol because a weighted sum of random terms can land near 0
    np.testing.assert_allclose(h_val, d_val, rtol=1e-5, atol=1e-4)
    for a, b in zip(h_grads, d_grads):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_swiglu_mlp_backward_equals_autodiff():
    """The hand-written MLP backward against autodiff of the plain formula (random shapes, a
    nonlinear loss so that every output gets a different cotangent)."""
    rng = np.random.default_rng(3)
    x, wg, wu, wd = (
        jnp.asarray(rng.standard_normal(s), jnp.float32) for s in [(10, 6), (6, 9), (6, 9), (9, 6)]
    )
    plain = lambda x, wg, wu, wd: jnp.sum(jnp.sin((jax.nn.silu(x @ wg) * (x @ wu)) @ wd))  # noqa: E731
    ours = lambda x, wg, wu, wd: jnp.sum(jnp.sin(swiglu_mlp(x, wg, wu, wd)))  # noqa: E731
    np.testing.assert_allclose(ours(x, wg, wu, wd), plain(x, wg, wu, wd), rtol=1e-5)
    for a, b in zip(
        jax.grad(ours, argnums=(0, 1, 2, 3))(x, wg, wu, wd),
        jax.grad(plain, argnums=(0, 1, 2, 3))(x, wg, wu, wd),
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("window", [1, 3, 5])
def test_sliding_window_attention_matches_numpy(attn, window):
    x = np.random.default_rng(1).normal(size=(2, 11, 32)).astype(np.float32)
    i, j = np.indices((11, 11))
    mask = np.broadcast_to((j <= i) & (i - j < window), (2, 11, 11))
    np.testing.assert_allclose(
        run_attention(attn, x, window=window), reference_self_attention(attn, x, mask), rtol=2e-4, atol=2e-5
    )


def test_qk_norm_attention_matches_numpy_and_ignores_the_scale_of_queries_and_keys():
    """QK-norm (random gains): numpy's normalise-then-rotate attention; and scaling the query and
    key projections leaves the output as it was (without QK-norm it does not)."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 11, 32)).astype(np.float32)
    causal = np.broadcast_to(np.tril(np.ones((11, 11), bool)), (2, 11, 11))
    outs = {}
    for qk_norm in (True, False):
        attn = Attention(32, 4, rngs=nnx.Rngs(0), qk_norm=qk_norm)
        if qk_norm:
            attn.q_norm.scale[...] = jnp.asarray(rng.uniform(0.5, 2.0, size=8), jnp.float32)
            attn.k_norm.scale[...] = jnp.asarray(rng.uniform(0.5, 2.0, size=8), jnp.float32)
            np.testing.assert_allclose(
                run_attention(attn, x), reference_self_attention(attn, x, causal), rtol=2e-4, atol=2e-5
            )
        before = run_attention(attn, x)
        attn.wq[...], attn.wk[...] = 7.0 * attn.wq[...], 0.3 * attn.wk[...]
        outs[qk_norm] = before, run_attention(attn, x)
    np.testing.assert_allclose(*outs[True], rtol=1e-4, atol=1e-5)
    assert np.abs(outs[False][0] - outs[False][1]).max() > 1e-2


def test_cross_attention_with_mask_matches_numpy():
    attn = Attention(32, 4, d_kv=24, rngs=nnx.Rngs(1))
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 5, 32)).astype(np.float32)
    kv = rng.normal(size=(2, 7, 24)).astype(np.float32)
    mask = rng.random((2, 5, 7)) < 0.5
    mask[:, :, 0] = True  # every query sees something
    out = run_attention(attn, x, kv_BxSxD=jnp.asarray(kv), mask_BxTxS=jnp.asarray(mask))
    wq, wk, wv, wo = (np.asarray(getattr(attn, n)[...]) for n in ("wq", "wk", "wv", "wo"))
    q = np.einsum("btd,dhk->bthk", x, wq)
    k = np.einsum("bsd,dhk->bshk", kv, wk)
    v = np.einsum("bsd,dhk->bshk", kv, wv)
    ref = np.einsum("bthk,hkd->btd", np_attention(q, k, v, mask), wo)
    np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-5)


def test_rotary_is_relative():
    """<rot(q, i), rot(k, j)> depends only on i - j."""
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32)

    def dot(i, j):
        return float(jnp.sum(rotary(q, jnp.array([[i]]), 10000.0) * rotary(k, jnp.array([[j]]), 10000.0)))

    assert dot(5, 2) == pytest.approx(dot(13, 10), rel=1e-5)
    assert dot(5, 2) != pytest.approx(dot(5, 3), rel=1e-3)


@pytest.mark.parametrize("window", [0, 4])
@pytest.mark.slow
def test_a_stack_over_its_caches_equals_the_full_pass(window):
    """The one forward path: a stack run over a prefix at once, then a position at a time over its
    caches, gives the full pass's outputs, under a sliding window and with documents (row 1 starts a
    new one mid-way). Rows sit at different positions: row 1 steps one position behind row 0 (its
    first step feeds the prefix's last position again, which rewrites the same keys and values)."""
    kernels = resolve_kernels("xla", "autodiff", dtype="float32", remat="none")
    stack = Transformer(32, 2, 4, 64, rngs=nnx.Rngs(0), kernels=kernels, window=window, qk_norm=True)
    T, P = 12, 5
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, T, 32)), jnp.float32)
    segments = jnp.asarray([[0] * T, [0] * 7 + [1] * (T - 7)], jnp.int32)
    full = np.asarray(stack(x, segments_BxT=segments))
    out, caches = stack(x[:, :P], segments_BxT=segments[:, :P], cache=stack.init_cache(2, 16))
    np.testing.assert_allclose(np.asarray(out), full[:, :P], rtol=1e-5, atol=1e-5)
    for t in range(P, T):
        at = jnp.asarray([[t], [t - 1]], jnp.int32)
        rows = jnp.arange(2)[:, None]
        out, caches = stack(x[rows, at], positions_BxT=at, segments_BxT=segments[rows, at], cache=caches)
        np.testing.assert_allclose(np.asarray(out)[:, 0], full[[0, 1], [t, t - 1]], rtol=1e-5, atol=1e-5)


def tiny_cfg(**kw):
    overrides = [
        "model.family=byte",
        "model.d_model=32",
        "model.n_layers=2",
        "model.n_heads=2",
        "model.mlp_dim=64",
    ]
    return load_config(None, overrides + [f"model.{k}={v}" for k, v in kw.items()]).model


@pytest.fixture(scope="module")
def byte_model():
    return ByteLM(tiny_cfg(), rngs=nnx.Rngs(0))


def random_ids(b, t, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(BYTE_OFFSET, 260, size=(b, t)), jnp.int32)


@pytest.mark.parametrize("window", [0, 4])
def test_byte_lm_causality_by_gradient(window):
    model = ByteLM(tiny_cfg(window=window), rngs=nnx.Rngs(0))
    ids = random_ids(1, 12)
    emb = model.embed(ids)

    def nll_at(e, t):
        h = model.norm(model.stack(e))
        logits = h @ model.head[...]
        return jax.nn.log_softmax(logits)[0, t, 7]

    grad = jax.jit(jax.grad(nll_at), static_argnums=1)
    for t in (0, 5, 11):
        g = np.asarray(grad(emb, t))
        assert np.all(g[0, t + 1 :] == 0), f"position {t} depends on the future"
        assert np.any(g[0, t] != 0)
        if window:  # two windowed layers see back 2 * (window - 1) positions, no further
            reach = 2 * (window - 1)
            assert np.all(g[0, : max(0, t - reach)] == 0), "position sees past its receptive field"
            if t - reach >= 0:
                assert np.any(g[0, t - reach] != 0)


def test_padding_vocab_is_masked(byte_model):
    logits = byte_model(random_ids(2, 5))
    assert logits.shape == (2, 5, 384)
    probs = jax.nn.softmax(logits)
    assert float(probs[..., 260:].max()) < 1e-30
    assert np.isfinite(np.asarray(logits)).all()


def test_jit_and_no_jit_agree(byte_model):
    batch = {"ids": random_ids(2, 17, seed=4)}
    eager = byte_model.score(batch)
    graphdef, state = nnx.split(byte_model)
    jitted = jax.jit(lambda s, b: nnx.merge(graphdef, s).score(b))(state, batch)
    np.testing.assert_allclose(np.asarray(eager.nll_BxT), np.asarray(jitted.nll_BxT), rtol=1e-5, atol=1e-5)


def test_scores_mask_control_targets(byte_model):
    ids = np.array(random_ids(1, 8))
    ids[0, 0] = 1  # BOS input
    ids[0, 4] = 2  # EOS as a target (position 3) is not scored
    ids[0, 6:] = 0  # padding
    s = byte_model.score({"ids": jnp.asarray(ids)})
    np.testing.assert_array_equal(np.asarray(s.mask_BxT)[0], [1, 1, 1, 0, 1, 0, 0])
    assert float(s.nll_BxT[0, 3]) == 0.0 and float(s.nbytes_BxT.sum()) == 4.0


@pytest.mark.parametrize("seq_len", [64, 256])
def test_flops_formula_matches_xla_cost_analysis(seq_len):
    cfg = load_config(
        None,
        [
            "model.family=byte",
            "model.d_model=128",
            "model.n_layers=2",
            "model.n_heads=4",
            "model.mlp_dim=384",
        ],
    ).model
    model = ByteLM(cfg, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    ids = jnp.zeros((2, seq_len), jnp.int32)
    compiled = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)).lower(state, ids).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    xla_per_position = cost["flops"] / (2 * seq_len)
    analytic = flops.decoder_lm_forward_flops_per_position(cfg, 260, seq_len)
    assert analytic == pytest.approx(xla_per_position, rel=0.10)


# -- hashed n-gram embeddings (model.ngram_sizes) ------------------------------------------------
def py_ngram_row(ids: list[int], i: int, n: int, rows: int) -> int:
    """The table row of the n-gram ending at position ``i``, in plain Python integers: a rolling
    polynomial hash modulo 2^32 (multiplier 1_000_000_007, seeded with ``n``, each id plus one),
    with PAD (0) before the start."""
    h = n
    for j in range(i - n + 1, i + 1):
        h = (h * 1_000_000_007 + (int(ids[j]) if j >= 0 else 0) + 1) % 2**32
    return h % rows


def test_ngram_embedding_sums_the_rows_of_each_ngram():
    from bytelm.models.core import NgramEmbed

    rows, sizes = 97, (2, 3, 5)
    emb = NgramEmbed(sizes, rows, 8, rngs=nnx.Rngs(0))
    ids = np.random.default_rng(0).integers(0, 260, size=(2, 11)).astype(np.int32)
    got = np.asarray(emb(jnp.asarray(ids)))
    tables = [np.asarray(t.table[...]) for t in emb.tables]
    for b in range(2):
        for i in range(11):
            want = sum(table[py_ngram_row(list(ids[b]), i, n, rows)] for n, table in zip(sizes, tables))
            np.testing.assert_allclose(got[b, i], want, rtol=1e-6, atol=1e-6)
    # a continuation with its context equals the tail of the whole sequence
    tail = np.asarray(emb(jnp.asarray(ids[:, 7:]), jnp.asarray(ids[:, 7 - emb.n_context : 7])))
    np.testing.assert_allclose(tail, got[:, 7:], rtol=1e-6, atol=1e-6)


def test_byte_lm_with_ngrams_is_causal_and_reads_them():
    cfg = load_config(
        None,
        [
            "model.family=byte",
            "model.d_model=32",
            "model.n_layers=2",
            "model.n_heads=2",
            "model.mlp_dim=64",
            "model.ngram_sizes=2,4",
            "model.hash_table_size=101",
        ],
    ).model
    model = ByteLM(cfg, rngs=nnx.Rngs(0))
    assert [t.table.shape for t in model.ngrams.tables] == [(101, 32), (101, 32)]
    ids = np.random.default_rng(1).integers(BYTE_OFFSET, 260, size=(1, 16)).astype(np.int32)
    base = np.asarray(model(jnp.asarray(ids)))
    k = 9
    changed = ids.copy()
    changed[0, k] = BYTE_OFFSET + (changed[0, k] - BYTE_OFFSET + 1) % 256
    out = np.asarray(model(jnp.asarray(changed)))
    np.testing.assert_allclose(
        out[:, :k], base[:, :k], rtol=1e-5, atol=1e-5
    )  # the past never sees position k
    assert np.abs(out[:, k] - base[:, k]).max() > 1e-3
    # the same weights without the tables' rows give other logits: the n-grams are read
    for t in model.ngrams.tables:
        t.table[...] = jnp.zeros_like(t.table[...])
    assert np.abs(np.asarray(model(jnp.asarray(ids))) - base).max() > 1e-3


@pytest.mark.parametrize("family", ["byte", "blt", "blt-reference"])
@pytest.mark.parametrize(
    "bad, match",
    [
        ("model.ngram_sizes=0,2", "ngram_sizes"),
        ("model.ngram_sizes=3,3", "ngram_sizes"),
        ("model.ngram_sizes=2,65", "ngram_sizes"),
        ("model.hash_table_size=0", "hash_table_size"),
        (f"model.hash_table_size={2**24}", "hash_table_size"),
    ],
)
def test_ngram_config_is_checked(family, bad, match):
    """The byte LM and both BLT variants take one rule for their hashed n-gram tables (the
    reference hash is exact only for n <= 64 and tables under 2^24 rows), and a config without
    n-gram tables is valid for each (the reference variant's check once failed on an empty list)."""
    base = {
        "byte": ["model.family=byte"],
        "blt": ["model.family=blt"],
        "blt-reference": [
            "model.family=blt",
            "model.variant=reference",
            "model.encoder_cross_all_layers=false",
        ],
    }[family]
    load_config(None, [*base, "model.ngram_sizes=[]"])
    with pytest.raises(ValueError, match=match):
        load_config(None, [*base, "model.ngram_sizes=2", bad] if "hash" in bad else [*base, bad])
