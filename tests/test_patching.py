"""Patchers (static, space, entropy), patch layouts, threshold calibration, the entropy model and
`bytelm patch`. Golden boundaries below are computed by hand from the rules in
bytelm/patching/patchers.py, not by running the code."""

import json
import shutil

import jax
import numpy as np
import pytest
from conftest import WORDS
from flax import nnx
from helpers import corpus_dir, tiny_overrides  # noqa: F401  (corpus_dir is a fixture)
from hypothesis import given, settings
from hypothesis import strategies as st

from bytelm import cli
from bytelm.config import load_run_config
from bytelm.constants import BOS_ID, BYTE_OFFSET, EOS_ID, PAD_ID
from bytelm.errors import UserError
from bytelm.families.blt.source import read_patch_source
from bytelm.patching import (
    EntropyModel,
    EntropyPatcher,
    PatchOverflowError,
    apply_max_len,
    calibrate_threshold,
    cap_starts,
    entropy_starts,
    format_patches,
    lengths_to_patch_ids,
    mean_patch_length,
    real_lengths,
    space_starts,
    starts_to_lengths,
    static_starts,
    text_ids,
)

jax.config.update("jax_numpy_rank_promotion", "raise")


def at(L, *positions):
    """A bool[L] starts array with True at ``positions``."""
    s = np.zeros(L, bool)
    s[list(positions)] = True
    return s


def starts_of_patches(patches):
    """Starts over ``b"".join(patches)`` from a hand-written patch list."""
    s = np.zeros(sum(map(len, patches)), bool)
    s[np.cumsum([0] + [len(p) for p in patches[:-1]])] = True
    return s


# -- golden boundaries for fixed entropy arrays ----------------------------------------------------
IDS10 = np.array([BOS_ID] + [ord(c) + BYTE_OFFSET for c in "abcdefghi"])
H10 = np.array([1.0, 1.6, 1.4, 2.2, 0.3, 0.6, 3.1, 2.0, 2.5, 0.1], np.float32)
# global 2.1: H > 2.1 at i = 3, 6, 8 -> starts 4, 7, 9.
# monotonic 0.5: H[i] - H[i-1] = .6 -.2 .8 -1.9 .3 2.5 -1.1 .5 -2.4 for i = 1..9; > 0.5 at i = 1, 3, 6
#   (i = 8 is a tie, 0.5 exactly, so no boundary) -> starts 2, 4, 7.
# BOS at 0 -> starts 0 and 1 always.


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"threshold": 2.1}, (0, 1, 4, 7, 9)),
        ({"monotonic_threshold": 0.5}, (0, 1, 2, 4, 7)),
        ({"threshold": 2.1, "monotonic_threshold": 0.5}, (0, 1, 2, 4, 7, 9)),
        # patches [0] [1 2 3] [4 5 6] [7 8] [9] -> split at length 2: [1 2][3] [4 5][6]
        ({"threshold": 2.1, "max_patch_len": 2}, (0, 1, 3, 4, 6, 7, 9)),
        # no entropy boundary at all: BOS patch, then forced every 3 positions from 1
        ({"threshold": 10.0, "max_patch_len": 3}, (0, 1, 4, 7)),
        ({"threshold": -1.0}, tuple(range(10))),
    ],
)
def test_entropy_golden(kwargs, expected):
    np.testing.assert_array_equal(entropy_starts(IDS10, H10, **kwargs), at(10, *expected))


def test_entropy_needs_a_rule_and_finite_entropies():
    with pytest.raises(ValueError, match="threshold"):
        entropy_starts(IDS10, H10)
    bad = H10.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match="finite"):
        entropy_starts(IDS10, bad, threshold=1.0)


def test_bos_rule_and_padding():
    a, b, c, d = (ord(ch) + BYTE_OFFSET for ch in "abcd")
    ids = np.array([a, b, EOS_ID, BOS_ID, c, d, EOS_ID, BOS_ID, PAD_ID, PAD_ID])
    low = np.zeros(10, np.float32)
    # training-window row: starts 0 and 1 (the first position is a patch of its own), the BOS at 3
    # and 7 and the positions after them (8 is padding)
    np.testing.assert_array_equal(entropy_starts(ids, low, threshold=1.0), at(10, 0, 1, 3, 4, 7))
    np.testing.assert_array_equal(static_starts(ids, 4), at(10, 0, 1, 3, 4, 7))
    # space: EOS and BOS are control ids (space-like), so patches start after them as well
    np.testing.assert_array_equal(space_starts(ids), at(10, 0, 1, 3, 4, 7))
    assert real_lengths(ids) == 8
    # eval row: BOS alone, then bytes; trailing PAD belongs to no patch
    ids = np.array([BOS_ID, a, b, c, PAD_ID, PAD_ID])
    np.testing.assert_array_equal(
        entropy_starts(ids, np.full(6, 9.0, np.float32), threshold=1.0), at(6, 0, 1, 2, 3)
    )
    np.testing.assert_array_equal(static_starts(ids, 2), at(6, 0, 1, 2))
    np.testing.assert_array_equal(
        entropy_starts(np.zeros(4, int), np.zeros(4), threshold=0.0), np.zeros(4, bool)
    )


def test_apply_max_len_matches_a_left_to_right_scan():
    rng = np.random.default_rng(0)
    for _ in range(200):
        L, m = int(rng.integers(1, 30)), int(rng.integers(1, 6))
        starts = rng.random(L) < 0.15
        starts[0] = True
        ref, run = starts.copy(), 0
        for i in range(L):
            if ref[i]:
                run = 0
            elif run == m:
                ref[i], run = True, 0
            run += 1
        np.testing.assert_array_equal(apply_max_len(starts, m), ref)


# -- space patching on multilingual text ----------------------------------------------------------
# Hand-split: a patch starts after every byte that is not [0-9A-Za-z] and not 0x80-0xBF, so it also
# starts after every UTF-8 lead byte (0xC0-0xFF): non-ASCII characters are split as in SpaceByte.
MULTILINGUAL = [
    ("Hi, you 2!", [b"Hi,", b" ", b"you ", b"2!"]),
    # G r \xc3\xbc \xc3\x9f e ' ' a u s ' ' K \xc3\xb6 l n .
    ("Grüße aus Köln.", [b"Gr\xc3", b"\xbc\xc3", b"\x9fe ", b"aus ", b"K\xc3", b"\xb6ln."]),
    # Γ=ce 93 ε=ce b5 ι=ce b9 ά=ce ac ' ' σ=cf 83 ο=ce bf υ=cf 85
    (
        "Γειά σου",
        [
            b"\xce",
            b"\x93\xce",
            b"\xb5\xce",
            b"\xb9\xce",
            b"\xac ",
            b"\xcf",
            b"\x83\xce",
            b"\xbf\xcf",
            b"\x85",
        ],
    ),
    # 你=e4 bd a0 好=e5 a5 bd ，=ef bc 8c 世=e4 b8 96 界=e7 95 8c
    (
        "你好，世界",
        [b"\xe4", b"\xbd\xa0\xe5", b"\xa5\xbd\xef", b"\xbc\x8c\xe4", b"\xb8\x96\xe7", b"\x95\x8c"],
    ),
    # Ж=d0 96 ' ' 1 9 - x _ y \t
    ("Ж 19-x_y\t", [b"\xd0", b"\x96 ", b"19-", b"x_", b"y\t"]),
]


@pytest.mark.parametrize("text, patches", MULTILINGUAL)
def test_space_patching_multilingual(text, patches):
    data = text.encode()
    assert b"".join(patches) == data
    ids = text_ids(data)  # [BOS, bytes...]: the BOS patch, then the text from position 1
    np.testing.assert_array_equal(space_starts(ids), np.concatenate([[True], starts_of_patches(patches)]))


def test_space_patching_one_batch_of_rows():
    rows = [text_ids(t.encode()) for t, _ in MULTILINGUAL]
    L = max(map(len, rows))
    ids = np.stack([np.pad(r, (0, L - len(r))) for r in rows])
    starts = space_starts(ids)
    for b, (_, patches) in enumerate(MULTILINGUAL):
        n = len(rows[b])
        np.testing.assert_array_equal(starts[b, 1:n], starts_of_patches(patches))
        assert not starts[b, n:].any()


# -- prefix stability (causality of boundaries) ---------------------------------------------------
row_ids = st.lists(st.sampled_from([BOS_ID, EOS_ID, *range(BYTE_OFFSET, 260, 7)]), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    ids=row_ids,
    data=st.data(),
    threshold=st.one_of(st.none(), st.floats(0.0, 6.0, width=32)),
    mono=st.one_of(st.none(), st.floats(-1.0, 3.0, width=32)),
    max_len=st.one_of(st.none(), st.integers(1, 6)),
    patch_size=st.integers(1, 5),
)
def test_boundaries_are_prefix_stable(ids, data, threshold, mono, max_len, patch_size):
    ids = np.array(ids)
    L = len(ids)
    h = np.array(data.draw(st.lists(st.floats(0.0, 6.0, width=32), min_size=L, max_size=L)), np.float32)
    k = data.draw(st.integers(1, L))
    if threshold is None and mono is None:
        threshold = 2.0
    full = entropy_starts(ids, h, threshold=threshold, monotonic_threshold=mono, max_patch_len=max_len)
    prefix = entropy_starts(
        ids[:k], h[:k], threshold=threshold, monotonic_threshold=mono, max_patch_len=max_len
    )
    np.testing.assert_array_equal(prefix, full[:k])
    np.testing.assert_array_equal(space_starts(ids[:k]), space_starts(ids)[:k])
    np.testing.assert_array_equal(static_starts(ids[:k], patch_size), static_starts(ids, patch_size)[:k])
    # padding x[:k] to the full width (whatever the padded entropies are) changes nothing
    padded = np.concatenate([ids[:k], np.zeros(L - k, int)])
    junk = np.concatenate([h[:k], np.full(L - k, 5.5, np.float32)])
    got = entropy_starts(padded, junk, threshold=threshold, monotonic_threshold=mono, max_patch_len=max_len)
    np.testing.assert_array_equal(got, np.concatenate([full[:k], np.zeros(L - k, bool)]))
    assert full[0] and all(full[i + 1] for i in range(L - 1) if ids[i] == BOS_ID)


# -- layouts: lengths and patch ids ---------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(st.data())
def test_lengths_and_patch_ids_invariants(data):
    B, L = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 24))
    n = np.array([data.draw(st.integers(0, L)) for _ in range(B)])
    starts = np.array([[data.draw(st.booleans()) for _ in range(L)] for _ in range(B)]).reshape(B, L)
    starts[:, 0] = True
    needed = np.array([starts[b, : n[b]].sum() for b in range(B)])
    P = int(needed.max()) + data.draw(st.integers(0, 3)) or 1
    lengths = starts_to_lengths(starts, n, P)
    assert lengths.shape == (B, P) and lengths.dtype == np.int32
    np.testing.assert_array_equal(lengths.sum(axis=1), n)  # every real position, exactly once
    np.testing.assert_array_equal((lengths > 0).sum(axis=1), needed)
    for b in range(B):
        assert (lengths[b, : needed[b]] > 0).all() and (lengths[b, needed[b] :] == 0).all()
    # the valid-mask form gives the same lengths
    mask = np.arange(L)[None, :] < n[:, None]
    np.testing.assert_array_equal(starts_to_lengths(starts, mask, P), lengths)
    pid = lengths_to_patch_ids(lengths, L)
    assert pid.shape == (B, L) and pid.dtype == np.int32
    for b in range(B):
        real = pid[b, : n[b]]
        if n[b]:
            assert real[0] == 0
            np.testing.assert_array_equal(np.diff(real) == 1, starts[b, 1 : n[b]])  # +1 exactly at starts
            np.testing.assert_array_equal(np.diff(real) <= 1, True)
            np.testing.assert_array_equal(np.bincount(real, minlength=P), lengths[b])
        np.testing.assert_array_equal(pid[b, n[b] :], needed[b])  # the tail: number of real patches
    np.testing.assert_array_equal(lengths_to_patch_ids(lengths, L, fill=-1)[~mask], -1)


def test_layout_examples_and_bad_input():
    starts = np.array([[1, 1, 0, 0, 1, 0, 0], [1, 0, 1, 0, 0, 0, 0]], bool)
    lengths = starts_to_lengths(starts, [5, 3], 4)
    np.testing.assert_array_equal(lengths, [[1, 3, 1, 0], [2, 1, 0, 0]])
    np.testing.assert_array_equal(
        lengths_to_patch_ids(lengths, 7), [[0, 1, 1, 1, 2, 3, 3], [0, 0, 1, 2, 2, 2, 2]]
    )
    with pytest.raises(ValueError, match="position 0"):
        starts_to_lengths(np.array([[0, 1, 0]], bool), [3], 3)
    with pytest.raises(ValueError, match="zero-padded"):
        lengths_to_patch_ids(np.array([[2, 0, 1]]), 5)
    with pytest.raises(ValueError, match="more than L"):
        lengths_to_patch_ids(np.array([[4, 3]]), 5)


def test_overflow_is_an_error_naming_row_and_fix():
    starts = np.ones((3, 12), bool)
    starts[0, 1:] = False
    with pytest.raises(PatchOverflowError) as e:
        starts_to_lengths(starts, [12, 12, 9], 8)
    err = e.value
    assert isinstance(err, UserError) and (err.row, err.needed, err.max_patches) == (1, 12, 8)
    msg = str(err)
    assert "row 1 needs 12 patches" in msg and "max_patches = 8" in msg and "2 rows" in msg
    assert "raise model.max_patches" in msg and "target mean patch length" in msg


# -- calibration ------------------------------------------------------------------------------------
def synthetic_gamma(seed=0):
    rng = np.random.default_rng(seed)
    h = rng.gamma(2.0, 0.8, size=(8, 300)).astype(np.float32)
    ids = rng.integers(BYTE_OFFSET, 260, size=(8, 300))
    ids[:, 0] = BOS_ID
    ids[3, 250:] = PAD_ID  # a padded row
    return h, ids


def synthetic_words(seed=1):
    """Low entropy inside words, a spike after each word end: a bimodal distribution."""
    rng = np.random.default_rng(seed)
    rows_h, rows_ids = [], []
    for _ in range(6):
        h, ids = [2.0], [BOS_ID]
        while len(ids) < 400:
            w = int(rng.integers(1, 9))
            h += list(rng.uniform(0.1, 1.5, size=w - 1)) + [rng.uniform(2.5, 4.0)]
            ids += [ord("a") + BYTE_OFFSET] * (w - 1) + [ord(" ") + BYTE_OFFSET]
        rows_h.append(np.array(h[:400], np.float32))
        rows_ids.append(np.array(ids[:400]))
    return rows_h, rows_ids  # lists of rows


@pytest.mark.parametrize("make", [synthetic_gamma, synthetic_words])
@pytest.mark.parametrize(
    "target, kwargs",
    [(2.0, {}), (4.0, {}), (6.0, {"max_patch_len": 12}), (4.0, {"monotonic_threshold": 2.5})],
)
def test_calibration_hits_target_on_synthetic_distributions(make, target, kwargs):
    h, ids = make()
    theta, achieved = calibrate_threshold(h, ids, target, **kwargs)
    assert abs(achieved - target) <= 0.02 * target
    assert np.float32(theta) == theta  # float32-exact: float32 and float64 comparisons agree
    # recompute independently from the returned threshold
    L = max(len(r) for r in ids)
    ids2 = np.stack([np.pad(np.asarray(r), (0, L - len(r))) for r in ids])
    h2 = np.stack([np.pad(np.asarray(r), (0, L - len(r))) for r in h]).astype(np.float32)
    starts = entropy_starts(ids2, h2, threshold=theta, **kwargs)
    n = real_lengths(ids2)
    assert mean_patch_length(starts, n) == pytest.approx(achieved)
    assert n.sum() / starts.sum() == pytest.approx(achieved)


def test_calibration_errors():
    h, ids = synthetic_gamma()
    with pytest.raises(UserError, match="below 1"):
        calibrate_threshold(h, ids, 0.5)
    with pytest.raises(UserError, match=r"reachable range is \[1\.000, 3\.943\]"):
        calibrate_threshold(h, ids, 50.0, max_patch_len=4)
    # a two-row sample too coarse to land within 2%
    tiny_h = np.array([[0.0, 1.0, 2.0, 3.0, 4.0]], np.float32)
    tiny_ids = np.array([[BOS_ID, 9, 9, 9, 9]])
    with pytest.raises(UserError, match="larger"):
        calibrate_threshold(tiny_h, tiny_ids, 2.1)
    theta, achieved = calibrate_threshold(tiny_h, tiny_ids, 2.1, strict=False)
    assert achieved in (5 / 3, 5 / 2)


# -- the entropy model (a tiny trained ByteLM run, shared with the CLI tests) ---------------------
@pytest.fixture(scope="module")
def entropy_run(corpus_dir, tmp_path_factory):  # noqa: F811
    from bytelm.config import load_config  # noqa: PLC0415
    from bytelm.training.loop import train  # noqa: PLC0415

    run = tmp_path_factory.mktemp("entropy") / "run"
    overrides = tiny_overrides(
        corpus_dir, **{"train.steps": 4, "train.checkpoint_every": 4, "eval.every": 0, "model.window": 16}
    )
    train(load_config(None, overrides), run)
    return run


@pytest.fixture(scope="module")
def tiny_byte_lm(entropy_run):
    """The trained tiny entropy model (a ByteLM with a 16-position sliding window) as a module."""
    from bytelm.training.restore import restore_scorer  # noqa: PLC0415

    trainer = restore_scorer(entropy_run)
    return nnx.merge(trainer.graphdef, trainer.params)


@pytest.fixture(scope="module")
def trained_model(tiny_byte_lm):
    return EntropyModel(tiny_byte_lm)


def test_entropy_model_matches_numpy_reference_and_compiles_once(tiny_byte_lm):
    em = EntropyModel(tiny_byte_lm)
    rng = np.random.default_rng(0)
    ids = rng.integers(BYTE_OFFSET, 260, size=(3, 24))
    ids[:, 0] = BOS_ID
    ids[2, 20:] = PAD_ID
    h = em.entropies(ids)
    assert h.shape == (3, 24) and h.dtype == np.float32
    logits = np.asarray(nnx.jit(lambda m, x: m(x))(tiny_byte_lm, ids), np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    ref = -(np.exp(logp) * logp).sum(-1)
    np.testing.assert_allclose(h[:2], ref[:2], atol=1e-4)
    np.testing.assert_allclose(h[2, :20], ref[2, :20], atol=1e-4)
    assert (h[2, 20:] == 0).all()  # the padding tail
    assert (h[:, :20] > 0).all() and (h <= np.log(260) + 1e-4).all()
    em.entropies(ids + 1)
    em.entropies(ids[:1])
    assert em._fn._cache_size() == len(jax.local_devices())  # one single-row program (per device)


def test_entropies_are_batch_invariant_by_construction(tiny_byte_lm):
    """Every row runs alone through one compiled single-row program at the model's fixed width, so
    its entropies are bitwise the same whatever it is batched with (the same program on the same
    row: an exact contract, not a tolerance). Different batch sizes, orders and companions."""
    em = EntropyModel(tiny_byte_lm, width=40)
    rng = np.random.default_rng(3)
    ids = rng.integers(BYTE_OFFSET, 260, size=(7, 30))
    ids[:, 0] = BOS_ID
    ids[4, 11:] = PAD_ID
    h = em.entropies(ids)
    for order in (rng.permutation(7), np.array([5, 1]), np.array([4])):
        np.testing.assert_array_equal(em.entropies(ids[order]), h[order])
    np.testing.assert_array_equal(em.entropies(ids[2]), h[2])
    wider = np.concatenate([ids, np.zeros((7, 10), ids.dtype)], axis=1)  # the same rows at the full width
    np.testing.assert_array_equal(em.entropies(wider)[:, :30], h)
    with pytest.raises(ValueError, match="fixed width 40"):
        em.entropies(np.ones((1, 41), np.int32))


def test_entropy_fingerprint(tiny_byte_lm):
    a, b = EntropyModel(tiny_byte_lm), EntropyModel(tiny_byte_lm)
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    graphdef, state = nnx.split(tiny_byte_lm)
    other = nnx.merge(graphdef, jax.tree.map(lambda x: x * 1.0001, state))
    assert EntropyModel(other).fingerprint != a.fingerprint


def test_prefix_stability_with_the_entropy_model_on_real_bytes(tiny_byte_lm):
    """Entropies of x[:k] and of x at one padded width agree exactly on x[:k], and so do the boundaries."""
    em = EntropyModel(tiny_byte_lm)
    text = "Über 3 Brücken: the entropy model sees only the past. 你好!".encode()
    x = text_ids(text)
    W = 96
    rows = [x] + [x[:k] for k in (1, 2, 9, 17, 40, len(x) - 1)]
    batch = np.stack([np.pad(r, (0, W - len(r))) for r in rows])
    h = em.entropies(batch)
    theta = float(np.median(h[0, : len(x)]))  # about half the positions end a patch
    for kw in (
        {"threshold": theta},
        {"threshold": theta + 0.2, "monotonic_threshold": 0.1, "max_patch_len": 5},
    ):
        starts = entropy_starts(batch, h, **kw)
        assert 4 < starts[0].sum() < len(x) - 4  # not a trivial patching
        for b, r in enumerate(rows[1:], start=1):
            k = len(r)
            np.testing.assert_array_equal(h[b, :k], h[0, :k])
            np.testing.assert_array_equal(starts[b, :k], starts[0, :k])
            assert not starts[b, k:].any()


def test_entropy_patcher_lengths_and_overflow(tiny_byte_lm):
    em = EntropyModel(tiny_byte_lm)
    ids = np.stack([text_ids(b"hello there, patches" * 2)] * 2)
    patcher, achieved = EntropyPatcher.calibrated(em, ids, 4.0, max_patch_len=8, tol=0.1)
    lengths = patcher.lengths(ids, 32)
    assert (lengths.sum(1) == ids.shape[1]).all() and lengths.max() <= 8 and lengths[0, 0] == 1
    assert ids.shape[1] / (lengths[0] > 0).sum() == pytest.approx(achieved)
    rec = patcher.record()
    assert rec["threshold"] == patcher.threshold and rec["entropy_fingerprint"] == em.fingerprint
    assert EntropyPatcher.from_settings(em, rec).settings() == patcher.settings()
    # every position a boundary, 16 slots: the slot rule caps each row causally and counts the rest
    layout = EntropyPatcher(em, threshold=-1.0).layout(ids, 16)
    np.testing.assert_array_equal(
        layout.lengths_BxP, np.broadcast_to([1] * 15 + [ids.shape[1] - 15], (2, 16))
    )
    assert layout.stats() == {
        "windows": 2,
        "overflow_windows": 2,
        "positions": 2 * ids.shape[1],
        "overflow_positions": 2 * (ids.shape[1] - 16),
    }


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_slot_rule_is_causal_and_counts_what_it_merges(data):
    """cap_starts against a left-to-right reference: the first P starts are kept, and the starts of
    a prefix do not depend on what follows it."""
    B, L = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 30))
    n = np.array([data.draw(st.integers(0, L)) for _ in range(B)])
    starts = np.array([[data.draw(st.booleans()) for _ in range(L)] for _ in range(B)]).reshape(B, L)
    starts &= np.arange(L)[None, :] < n[:, None]
    starts[n > 0, 0] = True
    P = data.draw(st.integers(1, 8))
    capped, over = cap_starts(starts, n, P)
    for b in range(B):
        kept, first_dropped = 0, n[b]
        for i in range(n[b]):
            if starts[b, i]:
                if kept < P:
                    kept += 1
                    assert capped[b, i]
                else:
                    first_dropped = min(first_dropped, i)
                    assert not capped[b, i]
        assert over[b] == n[b] - first_dropped
        k = data.draw(st.integers(0, L))  # a prefix, the rest replaced by anything
        other = starts[b].copy()
        other[k:] = data.draw(st.lists(st.booleans(), min_size=L - k, max_size=L - k))
        np.testing.assert_array_equal(cap_starts(other[None], [L], P)[0][0, :k], capped[b, :k])
    lengths = starts_to_lengths(capped, n, P)  # always fits now
    np.testing.assert_array_equal(lengths.sum(axis=1), n)


def test_format_patches_escapes():
    assert format_patches([b"ab", b" |\\", b"\n\xc3", b"\xa9t\x00"]) == "ab| \\|\\\\|\\n\\xc3|\\xa9t\\x00"
    assert format_patches(["caf".encode(), "é ok".encode()]) == "caf|é ok"


# -- the CLI on a tiny trained entropy run -----------------------------------------------------------
GERMAN = "der die und zwölf Boxkämpfer jagen Viktor quer über den Sylter Deich 1984 2025 Straße".split()


@pytest.mark.parametrize("words", [WORDS, GERMAN], ids=["english-words", "german-digits"])
def test_calibration_hits_target_with_a_trained_model(trained_model, words):
    rng = np.random.default_rng(len(words))
    rows = [text_ids(" ".join(rng.choice(words, size=60)).encode()[:200]) for _ in range(6)]
    ids = np.stack([np.pad(r, (0, 200 - len(r) + 1)) for r in rows])
    h = trained_model.entropies(ids)
    for target in (3.0, 5.0):
        theta, achieved = calibrate_threshold(h, ids, target)
        assert abs(achieved - target) <= 0.02 * target
        assert mean_patch_length(entropy_starts(ids, h, threshold=theta), real_lengths(ids)) == pytest.approx(
            achieved
        )


def test_cli_prints_marked_text_and_writes_png(entropy_run, trained_model, tmp_path, capsys):
    text = "the of and to in, is that 12?"
    png = tmp_path / "patches.png"
    assert cli.main(["patch", str(entropy_run), "--text", text, "--threshold", "5.0", "--png", str(png)]) == 0
    out = capsys.readouterr().out.splitlines()
    ids = text_ids(text.encode())
    starts = entropy_starts(ids, trained_model.entropies(ids), threshold=5.0)[1:]
    cuts = [*np.flatnonzero(starts), len(text)]
    expected = [text.encode()[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    assert out[0] == format_patches(expected)
    assert out[0].replace("|", "") == text
    assert any(
        line.startswith("mean patch len") and f"{len(text) / len(expected):.3f}" in line for line in out
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    assert cli.main(["patch", str(entropy_run), "--text", text * 3, "--target-len", "4"]) == 0
    out = capsys.readouterr().out
    width = load_run_config(entropy_run).train.seq_len + 1
    windows = -(-(len(text) * 3 + 1) // width)  # BOS + text, per window
    assert windows > 1 and f"calibrated on the first {windows} window(s) of this text" in out
    assert f"{windows} of {width} positions" in out


def test_cli_on_a_blt_run(entropy_run, trained_model, tmp_path, capsys):
    blt = tmp_path / "blt"
    blt.mkdir()
    patching = {"threshold": 100.0, "monotonic_threshold": None, "max_patch_len": 3}
    (blt / "run.json").write_text(
        json.dumps({"family": "blt", "entropy_run": str(entropy_run), "patching": patching})
    )
    shutil.copy(entropy_run / "config.toml", blt / "config.toml")  # (its train.seq_len: the windows)
    (tmp_path / "t.txt").write_bytes("abcdefgh\nij\xe9".encode())
    assert cli.main(["patch", str(blt), "--file", str(tmp_path / "t.txt")]) == 0
    out = capsys.readouterr().out.splitlines()
    # no entropy exceeds 100 nats: only max_patch_len splits the text (the \xc3\xa9 of é is cut)
    assert out[0] == "abc|def|gh\\n|ij\\xc3|\\xa9"
    assert any(line.startswith("threshold") and "from the BLT run" in line for line in out)
    assert any(line.startswith("max patch len") and line.endswith(" 3") for line in out)
    assert read_patch_source(blt).entropy_run == entropy_run
    # a recorded fingerprint must match the entropy model
    patching["entropy_fingerprint"] = "0" * 64
    (blt / "run.json").write_text(
        json.dumps({"family": "blt", "entropy_run": str(entropy_run), "patching": patching})
    )
    assert cli.main(["patch", str(blt), "--text", "abc"]) == 2
    assert "not the one the BLT run" in capsys.readouterr().err


def test_cli_bad_run_dirs(entropy_run, tmp_path, capsys):
    def fails(run, *extra, match):
        assert cli.main(["patch", str(run), "--text", "abc", *extra]) == 2
        assert match in capsys.readouterr().err

    fails(tmp_path / "missing", match="not a run directory")
    fails(entropy_run, match="--threshold")  # an entropy run has no settings of its own
    other = tmp_path / "mb"
    other.mkdir()
    (other / "run.json").write_text(json.dumps({"family": "megabyte"}))
    fails(other, match="'megabyte' run")
    blt = tmp_path / "blt"
    blt.mkdir()
    for info, match in [
        ({"entropy_run": str(tmp_path / "gone"), "patching": {"threshold": 1.0}}, "does not exist"),
        ({"entropy_run": str(other), "patching": {"threshold": 1.0}}, "not a byte LM"),
        ({"entropy_run": str(entropy_run)}, "without 'entropy_run'"),
    ]:
        (blt / "run.json").write_text(json.dumps({"family": "blt", **info}))
        fails(blt, match=match)
    fails(entropy_run, "--target-len", "0.5", match="below 1")


def test_space_patcher_layout_follows_the_space_rule_and_covers_every_byte():
    """BLT's space patching (model.patching = "space"): starts after every space-like byte, split at
    max_patch_len, and the layout's lengths tile each row's real positions."""
    from bytelm.patching import (  # noqa: PLC0415
        SpacePatcher,
        apply_max_len,
        real_lengths,
        starts_to_lengths,
        valid_mask,
    )

    text = [b"def f(x):  return x + 1\n", b"aaaaaaaaaaaaaaaaaaaaaaaaa b", "zwölf Boxkämpfer".encode()]
    ids = np.full((3, 32), PAD_ID, np.int32)
    for r, t in enumerate(text):
        row = np.concatenate([[BOS_ID], np.frombuffer(t, np.uint8).astype(np.int32) + BYTE_OFFSET])
        ids[r, : len(row)] = row
    patcher = SpacePatcher(max_patch_len=8)
    starts = patcher.starts(ids)
    np.testing.assert_array_equal(starts, apply_max_len(space_starts(ids), 8, valid=valid_mask(ids)))
    layout = patcher.layout(ids, max_patches=32)
    n = real_lengths(ids)
    np.testing.assert_array_equal(layout.lengths_BxP.sum(axis=1), n)
    np.testing.assert_array_equal(layout.lengths_BxP, starts_to_lengths(starts, n, 32))
    assert layout.lengths_BxP.max() <= 8 and not layout.overflow_B.any()
    assert patcher.record() == {"rule": "space", "max_patch_len": 8}


def test_patch_streams_a_long_file_window_by_window(entropy_run, tiny_byte_lm, tmp_path, capsys):
    """A file of many windows: the printed patches are those of each window patched by itself, one row
    at a time (the first [BOS, width - 1 bytes], then width bytes each), and the windows are read lazily
    (an endless source yields its first patches)."""
    import io  # noqa: PLC0415
    import itertools  # noqa: PLC0415

    from bytelm.patching import patch_windows, read_windows  # noqa: PLC0415

    width = load_run_config(entropy_run).train.seq_len + 1
    rng = np.random.default_rng(3)
    data = " ".join(rng.choice(WORDS, size=2500)).encode() + bytes(rng.integers(0, 256, 300, dtype=np.uint8))
    path = tmp_path / "long.txt"
    path.write_bytes(data)
    assert cli.main(["patch", str(entropy_run), "--file", str(path), "--threshold", "2.5"]) == 0
    printed = capsys.readouterr().out.splitlines()[0]

    model = EntropyModel(tiny_byte_lm, width=width)
    cuts = [0, width - 1, *range(width - 1 + width, len(data), width), len(data)]
    patches = []
    for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        chunk = data[a:b]
        row = text_ids(chunk) if k == 0 else np.frombuffer(chunk, np.uint8).astype(np.int32) + BYTE_OFFSET
        padded = np.pad(row, (0, width - len(row)))
        starts = entropy_starts(padded, model.entropies(padded), threshold=2.5)[: len(row)]
        starts = starts[1:] if k == 0 else starts
        assert starts[0] and (k == 0 or starts[1]), k  # a window's first two positions start patches
        edges = [*np.flatnonzero(starts), len(chunk)]
        patches += [chunk[x:y] for x, y in zip(edges[:-1], edges[1:])]
    assert len(cuts) - 1 > 20 and printed == format_patches(patches)

    class Endless:  # a stream that never ends, recording what is asked of it
        asked: list[int] = []

        def read(self, n: int) -> bytes:
            self.asked.append(n)
            return (b"the of and " * (n // 11 + 1))[:n]

    windows = read_windows(Endless(), width)
    first = list(itertools.islice(patch_windows(model, windows, width=width, threshold=2.5), 3))
    assert [len(p.data) for p in first] == [width - 1, width, width] and np.isnan(first[1].entropies[0])
    assert max(Endless.asked) == width and len(Endless.asked) <= 16  # (one call's rows at most)
    assert [len(w) for w in read_windows(io.BytesIO(data[: 2 * width + 5]), width)] == [width - 1, width, 6]
