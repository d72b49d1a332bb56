"""``model.dropout``: inverted dropout in training only, keyed by ``(train.seed, step)``.

- The mask: on random input the zeroed fraction is the rate (within 5 binomial standard
  deviations), survivors are scaled by ``1 / (1 - rate)``, the same key draws the same mask, and
  two sites draw different ones. Its bits (a keyed hash of row and column) show no structure:
  neighbours along either axis, and the corners of rectangles (the hash's inputs XOR to zero
  there), are dropped together as often as independent draws are.
- Every family: scoring without a key (evaluation, sampling) is the model without dropout; with a
  key the scores move, the same key moves them the same way, another key differently.
- A scanned stack draws the unrolled stack's masks (layer ``i`` folds in ``i`` either way).
- Recomputed blocks (``model.remat``) draw the masks of the stored ones.
- The trainer: a step's key depends on the seed and the step; a run stopped and resumed draws the
  uninterrupted run's masks (equal parameters); a run that accumulates gradients under dropout
  repeats itself.
- ``model.ngram_dropout`` (the byte LM, and BLT's encoder in both variants): each position's row
  of each n-gram table is kept (scaled by ``1 / (1 - rate)``) or dropped whole, at the rate, the
  tables independently, in training only; the config refuses a rate outside [0, 1) and a rate
  without n-gram tables.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import (  # noqa: F401  (corpus_dir: a fixture)
    LM,
    MEGABYTE,
    _byte_batch,
    blt_cfg,
    corpus_dir,
    random_lengths,
    tiny_overrides,
)

from bytelm.config import load_config
from bytelm.families.blt.model import BLT, REFERENCE_PRIMES, reference_ngram_hashes
from bytelm.families.byte.model import ByteLM
from bytelm.families.megabyte.model import MegaByte
from bytelm.models.core import Dropout, dropout_bits, ngram_hashes
from bytelm.training.loop import train
from bytelm.training.programs import dropout_key
from bytelm.training.restore import restore_scorer

jax.config.update("jax_numpy_rank_promotion", "raise")  # as the other model tests: no silent broadcasting


def test_dropout_zeroes_the_rate_and_rescales_the_rest():
    rate, n = 0.25, 200_000
    x = jax.random.normal(jax.random.key(7), (n,)) + 3.0  # no exact zeros in the input
    drop = Dropout(rate, jax.random.key(1))
    y = np.asarray(drop(x))
    zeroed = y == 0
    sd = (rate * (1 - rate) / n) ** 0.5
    assert abs(zeroed.mean() - rate) < 5 * sd
    np.testing.assert_allclose(y[~zeroed], np.asarray(x)[~zeroed] / (1 - rate), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(drop(x)), y)  # the same key, the same mask
    other = np.asarray(drop.at(1)(x)) == 0
    assert (
        0.5 * rate * rate < (other & zeroed).mean() < 2 * rate * rate
    )  # independent sites overlap as chance does


def test_dropout_bits_show_no_structure():
    """The four corners of a rectangle hash inputs that XOR to zero; a linear hash would fix their
    parity. Each statistic is within 5 standard deviations of independent draws at rate p."""
    for rate in (0.1, 0.5):
        threshold = jnp.uint32(round(rate * 2**32))
        for seed in range(3):
            d = np.asarray(dropout_bits(jax.random.key(seed), (384, 512)) < threshold)
            assert abs(d.mean() - rate) < 5 * (rate * (1 - rate) / d.size) ** 0.5
            pairs = {"rows": (d[:-1], d[1:]), "columns": (d[:, :-1], d[:, 1:])}
            for what, (a, b) in pairs.items():
                both = (a & b).mean()
                assert abs(both - rate**2) < 5 * (rate**2 * (1 - rate**2) / a.size) ** 0.5, (rate, seed, what)
            for a, b, c, e in (
                (d[0::2, 0::2], d[0::2, 1::2], d[1::2, 0::2], d[1::2, 1::2]),
                (d[:192, :256], d[:192, 256:], d[192:, :256], d[192:, 256:]),
            ):
                odd, odd_p = (a ^ b ^ c ^ e).mean(), (1 - (1 - 2 * rate) ** 4) / 2  # P(an odd number dropped)
                assert abs(odd - odd_p) < 5 * (odd_p * (1 - odd_p) / a.size) ** 0.5, (rate, seed)
                every, every_p = (a & b & c & e).mean(), rate**4
                assert abs(every - every_p) < 5 * (every_p * (1 - every_p) / a.size) ** 0.5 + 1 / a.size, (
                    rate,
                    seed,
                )
    three = np.asarray(dropout_bits(jax.random.key(0), (4, 6, 8)))
    np.testing.assert_array_equal(
        three.reshape(24, 8), np.asarray(dropout_bits(jax.random.key(0), (24, 8)))
    )  # rows: the leading axes' flat index


def test_config_refuses_a_rate_outside_zero_to_one():
    for bad in ("1.0", "-0.1"):
        with pytest.raises(ValueError, match="model.dropout"):
            load_config(None, [*LM, f"model.dropout={bad}"])


def _blt_batch() -> dict:
    """Two windows of 15 inputs with random patch lengths over their 16 ids."""
    rng = np.random.default_rng(3)
    batch = _byte_batch(T=15)
    batch["patch_lengths"] = jnp.asarray([random_lengths(rng, 16, 10), random_lengths(rng, 16, 10)])
    return batch


def _families(rate: float):
    """(name, model, batch) for the byte LM, MegaByte and BLT, dropout ``rate``, seed 0."""
    return [
        (
            "byte",
            ByteLM(
                load_config(None, [*LM, "model.n_layers=2", f"model.dropout={rate}"]).model, rngs=nnx.Rngs(0)
            ),
            _byte_batch(),
        ),
        (
            "megabyte",
            MegaByte(load_config(None, [*MEGABYTE, f"model.dropout={rate}"]).model, rngs=nnx.Rngs(0)),
            _byte_batch(T=23),
        ),
        ("blt", BLT(blt_cfg(dropout=rate), rngs=nnx.Rngs(0)), _blt_batch()),
    ]


def _nll(model, batch, key=None) -> np.ndarray:
    graphdef, state = nnx.split(model)
    if key is None:
        return np.asarray(jax.jit(lambda st: nnx.merge(graphdef, st).score(batch).nll_BxT)(state))
    return np.asarray(
        jax.jit(lambda st, k: nnx.merge(graphdef, st).score(batch, dropout_key=k).nll_BxT)(state, key)
    )


def _check_training_only(name, plain, dropped, batch, moves: float) -> np.ndarray:
    """Without a key (evaluation, sampling) ``dropped`` scores as ``plain`` (rate 0) does, and so
    does ``plain`` with one; with a key the scores move by more than ``moves`` on average, the same
    key the same way. Returns the scores under key 5."""
    base = _nll(plain, batch)
    np.testing.assert_allclose(
        _nll(dropped, batch), base, rtol=1e-6, atol=1e-6, err_msg=name
    )  # no key: no dropout
    np.testing.assert_allclose(
        _nll(plain, batch, jax.random.key(5)), base, rtol=1e-6, atol=1e-6, err_msg=name
    )  # rate 0
    a = _nll(dropped, batch, jax.random.key(5))
    assert np.abs(a - base).mean() > moves, name
    np.testing.assert_array_equal(_nll(dropped, batch, jax.random.key(5)), a, err_msg=name)
    return a


@pytest.mark.slow
def test_every_family_drops_in_training_only():
    for (name, plain, batch), (_, dropped, _) in zip(_families(0.0), _families(0.3)):
        a = _check_training_only(name, plain, dropped, batch, 1e-2)
        assert np.abs(_nll(dropped, batch, jax.random.key(6)) - a).mean() > 1e-2, name


NGRAMS = [*LM, "model.ngram_sizes=2,3", "model.hash_table_size=97"]


def _ngram_models(rate: float):
    """(name, model, its n-gram sum as a function of (ids, drop), its tables' rows as a function of
    ids) for the byte LM and BLT (both variants), each with two n-gram tables of 97 rows."""
    byte = ByteLM(load_config(None, [*NGRAMS, f"model.ngram_dropout={rate}"]).model, rngs=nnx.Rngs(0))
    out = [
        (
            "byte",
            byte,
            lambda ids, drop, m=byte: m.ngrams(ids, drop=drop),
            lambda ids, m=byte: [t(ngram_hashes(ids, n, 97)) for n, t in zip((2, 3), m.ngrams.tables)],
        )
    ]
    for variant in ("bytelm", "reference"):
        blt = BLT(
            blt_cfg(ngram_sizes="2,3", hash_table_size=97, ngram_dropout=rate, variant=variant),
            rngs=nnx.Rngs(0),
        )
        rows = (
            (lambda ids, m=blt: [t(ngram_hashes(ids, n, 97)) for n, t in zip((2, 3), m.encoder.ngram_embeds)])
            if variant == "bytelm"
            else (
                lambda ids, m=blt: [
                    t(reference_ngram_hashes(ids, n, 97, REFERENCE_PRIMES[0]))
                    for n, t in zip((2, 3), m.encoder.ngram_embeds)
                ]
            )
        )
        out.append(
            (
                f"blt-{variant}",
                blt,
                lambda ids, drop, m=blt: m.encoder.embed(ids, drop) - m.encoder.byte_embed(ids),
                rows,
            )
        )
    return out


def test_ngram_dropout_keeps_or_drops_whole_rows_at_the_rate():
    rate = 0.4
    ids = _byte_batch(B=8, T=255, seed=4)["ids"][:, :-1]
    for name, _, ngram_sum, table_rows in _ngram_models(rate):
        rows = [np.asarray(r) for r in table_rows(ids)]  # (B, T, D) each
        out = np.asarray(ngram_sum(ids, Dropout(rate, jax.random.key(3))))
        # every position's sum is one of the four keep/drop combinations of its two rows
        combos = [a * rows[0] + b * rows[1] for a in (0.0, 1 / (1 - rate)) for b in (0.0, 1 / (1 - rate))]
        err = np.stack([np.abs(out - c).max(-1) for c in combos])  # (4, B, T)
        assert err.min(0).max() < 1e-5, name
        which = err.argmin(0)
        n = which.size
        for table, dropped in enumerate(
            ((which // 2) == 0, (which % 2) == 0)
        ):  # combo index = 2 * first kept + second kept
            assert abs(dropped.mean() - rate) < 5 * (rate * (1 - rate) / n) ** 0.5, (name, table)
        both = (((which // 2) == 0) & ((which % 2) == 0)).mean()
        assert abs(both - rate * rate) < 5 * (rate * rate / n) ** 0.5, name  # the tables drop independently
        np.testing.assert_allclose(
            np.asarray(ngram_sum(ids, None)), rows[0] + rows[1], rtol=1e-5, atol=1e-5, err_msg=name
        )  # no drop: the sum


@pytest.mark.slow
def test_ngram_dropout_applies_in_training_only():
    for (name, plain, _, _), (_, dropped, _, _) in zip(_ngram_models(0.0), _ngram_models(0.5)):
        _check_training_only(
            name, plain, dropped, _blt_batch() if name.startswith("blt") else _byte_batch(), 1e-3
        )
    for bad in ("1.0", "-0.1"):
        with pytest.raises(ValueError, match=r"model.ngram_dropout must be in \[0, 1\)"):
            load_config(None, [*NGRAMS, f"model.ngram_dropout={bad}"])
        with pytest.raises(ValueError, match=r"model.ngram_dropout must be in \[0, 1\)"):
            blt_cfg(ngram_dropout=bad)
    with pytest.raises(ValueError, match="model.ngram_sizes is empty"):
        load_config(None, [*LM, "model.ngram_dropout=0.1"])
    with pytest.raises(ValueError, match="model.ngram_sizes is empty"):
        blt_cfg(ngram_sizes="[]", ngram_dropout=0.1)


@pytest.mark.slow
def test_scanned_stack_draws_the_unrolled_masks():
    key = jax.random.key(11)
    for build, overrides, batch in (
        (ByteLM, [*LM, "model.n_layers=3"], _byte_batch()),
        (MegaByte, MEGABYTE, _byte_batch(T=23)),
    ):
        unrolled, scanned = (
            build(
                load_config(None, [*overrides, "model.dropout=0.2", f"model.scan_layers={s}"]).model,
                rngs=nnx.Rngs(0),
            )
            for s in ("false", "true")
        )
        np.testing.assert_allclose(
            _nll(scanned, batch, key), _nll(unrolled, batch, key), rtol=1e-5, atol=1e-5
        )


@pytest.mark.slow
def test_recomputed_blocks_draw_the_stored_masks():
    """``model.remat`` recomputes a block in the backward pass: the same masks, so the same loss and
    gradients as without it."""
    batch, key = _byte_batch(), jax.random.key(4)

    def loss_and_grads(remat: str):
        model = ByteLM(
            load_config(None, [*LM, "model.n_layers=2", "model.dropout=0.3", f"model.remat={remat}"]).model,
            rngs=nnx.Rngs(0),
        )
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        fn = jax.jit(
            jax.value_and_grad(
                lambda p: nnx.merge(graphdef, p, rest).score(batch, dropout_key=key).nll_BxT.sum()
            )
        )
        value, grads = fn(params)
        return float(value), [np.asarray(g) for g in jax.tree.leaves(grads)]

    base_loss, base_grads = loss_and_grads("none")
    for remat in ("block", "dots"):
        value, grads = loss_and_grads(remat)
        assert value == pytest.approx(base_loss, rel=1e-5), remat
        for a, b in zip(grads, base_grads):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=remat)


def test_step_keys_differ_by_step_and_seed():
    def data(seed, step):
        return np.asarray(jax.random.key_data(dropout_key(np.asarray([seed, step], np.uint32)))).tolist()

    keys = [data(seed, step) for seed in (0, 1) for step in (0, 1, 2)]
    assert len({str(k) for k in keys}) == len(keys)


@pytest.mark.slow
def test_gradient_accumulation_with_dropout_repeats_itself(corpus_dir, tmp_path):  # noqa: F811
    over = {"train.steps": 3, "train.grad_accum": 2, "eval.every": 0}
    cfg = load_config(None, tiny_overrides(corpus_dir, **over, **{"model.dropout": 0.2}))
    for name in ("a", "b"):
        train(cfg, tmp_path / name)
    train(load_config(None, tiny_overrides(corpus_dir, **over)), tmp_path / "plain")
    params = {name: jax.tree.leaves(restore_scorer(tmp_path / name).params) for name in ("a", "b", "plain")}
    for x, y in zip(params["a"], params["b"]):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert any(
        np.abs(np.asarray(x) - np.asarray(y)).max() > 1e-4 for x, y in zip(params["a"], params["plain"])
    )


@pytest.mark.slow
def test_resumed_run_draws_the_uninterrupted_masks(corpus_dir, tmp_path):  # noqa: F811
    cfg = load_config(
        None, tiny_overrides(corpus_dir, **{"train.steps": 8, "model.dropout": 0.2, "eval.every": 0})
    )
    train(cfg, tmp_path / "resumed", stop_after=4)
    train(cfg, tmp_path / "resumed")
    train(cfg, tmp_path / "straight")
    plain = load_config(None, tiny_overrides(corpus_dir, **{"train.steps": 8, "eval.every": 0}))
    train(plain, tmp_path / "plain")
    params = {
        name: jax.tree.leaves(restore_scorer(tmp_path / name).params)
        for name in ("resumed", "straight", "plain")
    }
    for a, b in zip(params["resumed"], params["straight"]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(
        np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-4
        for a, b in zip(params["straight"], params["plain"])
    )
