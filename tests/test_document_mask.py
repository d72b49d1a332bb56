"""``model.document_mask``: a training window's documents (each from its BOS) are scored as if each
were alone, which is how evaluation scores a held-out segment."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bytelm.config import load_config
from bytelm.constants import BOS_ID, BYTE_OFFSET, EOS_ID
from bytelm.families.byte.model import ByteLM
from bytelm.models.attention import attend
from bytelm.models.core import document_spans, ngram_hashes

# As in the other model tests: an implicit rank promotion is a bug (and, set by any module, the
# setting holds for the whole worker, so code that relies on promotion fails order-dependently).
jax.config.update("jax_numpy_rank_promotion", "raise")


def np_segment_attention(q, k, v, seg):
    """Causal attention within documents, plain numpy: q/k/v (B,T,H,K), seg (B,T) ints."""
    T = q.shape[1]
    mask = np.tril(np.ones((T, T), bool))[None] & (seg[:, :, None] == seg[:, None, :])
    scores = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(mask[:, None], scores, -np.inf)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bhts,bshk->bthk", w / w.sum(-1, keepdims=True), v)


def random_segments(rng, B, T, n_starts):
    """Document ids from random document starts (a start at 0 in some rows, not in others)."""
    starts = np.zeros((B, T), bool)
    for b in range(B):
        starts[b, rng.choice(np.arange(1, T), size=n_starts, replace=False)] = True
        starts[b, 0] = b % 2 == 0
    return np.cumsum(starts, axis=1).astype(np.int32)


@pytest.mark.parametrize("implementation, block", [("halving", 4), ("halving", 2), ("xla", 4)])
@pytest.mark.slow
def test_segment_attention_matches_numpy(implementation, block):
    """Every path (the halving recursion to leaves of 4 and 2 positions, dense XLA) equals masked
    numpy attention, documents that start inside a leaf or a half included."""
    rng = np.random.default_rng(block)
    q, k, v = rng.normal(size=(3, 2, 32, 2, 8)).astype(np.float32)
    seg = random_segments(rng, 2, 32, n_starts=5)
    out = attend(
        q, k, v, causal=True, segments_BxT=jnp.asarray(seg), implementation=implementation, block=block
    )
    np.testing.assert_allclose(np.asarray(out), np_segment_attention(q, k, v, seg), rtol=2e-4, atol=2e-5)


def test_segment_attention_gradients_equal_dense():
    """The halving path's gradients under document masking equal dense masked attention's (no
    NaN from a part where a query sees no key of its document)."""
    rng = np.random.default_rng(7)
    q, k, v, w = (jnp.asarray(rng.normal(size=(2, 32, 2, 8)), jnp.float32) for _ in range(4))
    seg = jnp.asarray(random_segments(rng, 2, 32, n_starts=4))

    def grads(implementation):
        def loss(q, k, v):
            return jnp.sum(
                attend(q, k, v, causal=True, segments_BxT=seg, implementation=implementation, block=4) * w
            )

        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

    for a, b in zip(grads("halving"), grads("xla")):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_document_spans():
    ids = jnp.asarray(
        [[7, 8, EOS_ID, BOS_ID, 9, 10, EOS_ID, BOS_ID, 11], [BOS_ID, 5, 6, 7, 8, 9, 10, 11, 12]]
    )
    seg, reach = document_spans(ids)
    np.testing.assert_array_equal(seg, [[0, 0, 0, 1, 1, 1, 1, 2, 2], [1] * 9])
    np.testing.assert_array_equal(reach, [[0, 1, 2, 0, 1, 2, 3, 0, 1], list(range(9))])


def test_ngram_reach_reads_pad_before_a_document():
    """An n-gram that would reach past its document's BOS hashes as at a sequence's start."""
    doc = jnp.asarray([[BOS_ID, 20, 30, 40]])
    window = jnp.asarray([[50, 60, EOS_ID, BOS_ID, 20, 30, 40]])
    _, reach = document_spans(window)
    for n in (2, 3, 4):
        np.testing.assert_array_equal(ngram_hashes(window, n, 1000, reach)[:, 3:], ngram_hashes(doc, n, 1000))
        # without the reach the first document's ids change the second's n-grams
        assert not np.array_equal(ngram_hashes(window, n, 1000)[:, 3:], ngram_hashes(doc, n, 1000))


def byte_cfg(**kw):
    overrides = [
        "model.family=byte",
        "model.d_model=32",
        "model.n_layers=2",
        "model.n_heads=2",
        "model.mlp_dim=64",
        "model.ngram_sizes=[2,3]",
        "model.hash_table_size=97",
    ]
    return load_config(None, overrides + [f"model.{k}={v}" for k, v in kw.items()]).model


def doc_ids(rng, n):
    return np.concatenate([[BOS_ID], rng.integers(BYTE_OFFSET, 260, size=n), [EOS_ID]]).astype(np.int32)


@pytest.mark.parametrize("attention, T", [("halving", 256), ("xla", 40)])
@pytest.mark.slow
def test_each_document_scores_as_if_alone(attention, T):
    """With the mask, a window of several documents gives each document the logits it gets alone
    (from its BOS, as an evaluation segment is scored); without it, the first document changes
    the second's. T=256 runs the halving recursion over two blocks of 128."""
    rng = np.random.default_rng(T)
    a, b = doc_ids(rng, T // 3), doc_ids(rng, T // 4)
    tail = T - len(a) - len(b)
    c = doc_ids(rng, tail)[:tail]  # a document cut by the window's end
    window = jnp.asarray(np.concatenate([a, b, c])[None])
    masked = ByteLM(byte_cfg(attention=attention, document_mask="true"), rngs=nnx.Rngs(0))
    plain = ByteLM(byte_cfg(attention=attention), rngs=nnx.Rngs(0))
    together = np.asarray(jax.jit(masked)(window))[0]
    spans = [(0, len(a)), (len(a), len(a) + len(b)), (len(a) + len(b), T)]
    for lo, hi in spans:
        alone = np.asarray(masked(window[:, lo:hi]))[0]
        np.testing.assert_allclose(together[lo:hi], alone, rtol=1e-4, atol=1e-4)
        # the same weights without the mask score a document alone the same way
        np.testing.assert_allclose(np.asarray(plain(window[:, lo:hi]))[0], alone, rtol=1e-4, atol=1e-4)
    unmasked = np.asarray(jax.jit(plain)(window))[0]
    lo, hi = spans[1]
    assert np.abs(unmasked[lo:hi] - together[lo:hi]).max() > 1e-2
