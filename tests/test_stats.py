"""The measuring instrument: evaluation protocol v2, the cluster bootstrap, paired differences."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bytelm.bpb import LN2, SegmentScores
from bytelm.data import load_corpus
from bytelm.data.split import fingerprint_segments, plan_segments, stratified_order
from bytelm.evaluation import stats
from bytelm.evaluation.report import build_report, write_scores
from bytelm.evaluation.results import EvalSet, ModelResult


# -- the bootstrap against a plain transcription ----------------------------------------------
def plain_bootstrap(bits, nbytes, resamples, seed):
    """The definition, written as a loop (docs/evaluation.md, "Intervals")."""
    rng = np.random.default_rng(seed)
    D = len(nbytes)
    Ks = [b.shape[0] for b in bits]
    out = np.empty((resamples, len(bits)))
    for r in range(resamples):
        docs = rng.integers(0, D, size=D)
        chosen_seeds = (
            [rng.integers(0, k, size=k) for k in Ks] if max(Ks) > 1 else [np.zeros(1, int)] * len(Ks)
        )
        for m, b in enumerate(bits):
            total_bits = sum(b[s, docs].sum() for s in chosen_seeds[m]) / len(chosen_seeds[m])
            out[r, m] = total_bits / nbytes[docs].sum()
    return out


@pytest.mark.parametrize("seeds", [(1, 1, 1), (3, 2, 1)])
def test_bootstrap_equals_its_plain_transcription(seeds):
    rng = np.random.default_rng(7)
    D = 57
    nbytes = rng.integers(1, 500, size=D)
    bits = [rng.gamma(2.0, 1.0, size=(k, D)) * nbytes for k in seeds]
    fast = stats.bootstrap(bits, nbytes, resamples=300, seed=11)
    slow = plain_bootstrap(bits, nbytes, 300, 11)
    np.testing.assert_allclose(fast, slow, rtol=1e-12)
    np.testing.assert_allclose(
        stats.percentile_interval(fast), np.percentile(slow, [2.5, 97.5], axis=0), rtol=1e-12
    )
    # another seed gives other resamples; the same seed the same ones
    assert not np.allclose(stats.bootstrap(bits, nbytes, resamples=300, seed=12), fast)
    np.testing.assert_array_equal(stats.bootstrap(bits, nbytes, resamples=300, seed=11), fast)


def test_bootstrap_chunks_give_the_same_samples(monkeypatch):
    rng = np.random.default_rng(3)
    nbytes = rng.integers(1, 100, size=40)
    bits = [rng.random((2, 40)) * nbytes, rng.random((1, 40)) * nbytes]
    whole = stats.bootstrap(bits, nbytes, resamples=50, seed=0)
    monkeypatch.setattr(stats, "_CHUNK_BYTES", 8 * 40 * 7)  # blocks of 7 resamples
    # (the same draws; sums of other block shapes may differ in their last bit)
    np.testing.assert_allclose(stats.bootstrap(bits, nbytes, resamples=50, seed=0), whole, rtol=1e-13)


def _corpus(rng, D, ratio=2.0):
    """Documents of lognormal length whose bits per byte scatter around ``ratio`` (the truth: the
    population's total bits over total bytes, as the rates are independent of the lengths)."""
    nbytes = np.maximum(1, rng.lognormal(6.0, 1.0, size=D).astype(np.int64))
    rate = ratio * rng.gamma(8.0, 1 / 8.0, size=D)
    return nbytes, rate * nbytes


def test_interval_covers_the_truth_about_95_percent_of_the_time():
    rng = np.random.default_rng(2024)
    covered = 0
    for trial in range(200):
        nbytes, bits = _corpus(rng, 150)
        lo, hi = stats.percentile_interval(stats.bootstrap([bits[None]], nbytes, resamples=1000, seed=trial))
        covered += lo[0] <= 2.0 <= hi[0]
    assert 180 <= covered <= 198, covered  # 90-99% of 200 corpora


def test_paired_difference_finds_a_planted_one_percent_and_rarely_a_null_one():
    rng = np.random.default_rng(5)
    flagged_null = 0
    for trial in range(100):
        nbytes, bits_a = _corpus(rng, 300)
        noise = rng.normal(0.0, 0.02, size=300)  # per-document disagreement of two equal models
        bits_null = bits_a * (1 + noise)
        samples = stats.bootstrap([bits_a[None], bits_null[None]], nbytes, resamples=1000, seed=trial)
        point = np.asarray([bits_a.sum(), bits_null.sum()]) / nbytes.sum()
        flagged_null += stats.paired(samples, point, 0, 1)["separable"]
    assert flagged_null <= 10, flagged_null

    detected = 0
    for trial in range(20):
        nbytes, bits_a = _corpus(rng, 300)
        bits_b = bits_a * 1.01 * (1 + rng.normal(0.0, 0.02, size=300))  # 1% worse
        samples = stats.bootstrap([bits_a[None], bits_b[None]], nbytes, resamples=1000, seed=trial)
        point = np.asarray([bits_a.sum(), bits_b.sum()]) / nbytes.sum()
        p = stats.paired(samples, point, 0, 1)
        detected += p["separable"] and p["diff"] < 0 and p["flip"] < 0.025
    assert detected >= 19, detected


def test_group_intervals_resample_within_each_group():
    rng = np.random.default_rng(9)
    nbytes = rng.integers(10, 100, size=60)
    labels = ["a"] * 30 + ["b"] * 29 + ["c"]
    rate = np.where(np.asarray(labels) == "a", 1.0, 3.0) + rng.random(60) * 0.1
    out = stats.group_intervals([(rate * nbytes)[None]], nbytes, labels, resamples=400)
    assert 1.0 <= out["a"][0, 0] < out["a"][0, 1] <= 1.1
    assert 3.0 <= out["b"][0, 0] < out["b"][0, 1] <= 3.1
    assert out["c"][0, 0] == out["c"][0, 1]  # one document: every resample is that document


# -- protocol v2 -------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 3000), min_size=1, max_size=60),
    n_groups=st.integers(1, 6),
    segment_bytes=st.integers(1, 700),
    extra=st.integers(0, 5000),
    seed=st.integers(0, 3),
)
def test_protocol_v2_reaches_every_document_when_the_cap_allows(
    lengths, n_groups, segment_bytes, extra, seed
):
    lengths_a = np.asarray(lengths, np.int64)
    real = np.flatnonzero(lengths_a > 0)
    if len(real) == 0:
        return
    lengths_a = lengths_a[real]
    names = [f"doc{i}" for i in range(len(real))]
    groups = [f"g{i % n_groups}" for i in range(len(real))]
    order = stratified_order(names, groups, seed)
    first = np.minimum(lengths_a, segment_bytes)
    cap = int(first.sum()) + extra  # room for one segment of every document
    plan = plan_segments(lengths_a, order, segment_bytes, cap)
    docs = {d for d, _, _ in plan}
    assert docs == set(range(len(real)))
    assert sum(n for _, _, n in plan) <= cap
    seen = set()
    for d, start, n in plan:
        assert 0 < n <= segment_bytes and start % segment_bytes == 0 and start + n <= lengths_a[d]
        assert (d, start) not in seen  # no piece scored twice
        seen.add((d, start))
    assert plan == sorted(plan)  # canonical order
    if cap >= lengths_a.sum():  # everything fits: every byte of every document, once
        assert sum(n for _, _, n in plan) == lengths_a.sum()


def test_protocol_v2_spreads_a_long_document_and_stratifies_a_short_cap():
    # one long document and many short ones: the long one gets its share spread over its length
    lengths = np.asarray([10_000] + [100] * 20)
    order = np.arange(21)
    plan = plan_segments(lengths, order, 100, 2_000 + 400)
    long_starts = [s for d, s, _ in plan if d == 0]
    assert len({d for d, _, _ in plan}) == 21
    assert long_starts[0] == 0 and max(long_starts) > 5_000  # not only its start
    # a cap for 6 of 12 documents in 3 groups of 4: two from each group
    names = [f"n{i}" for i in range(12)]
    groups = ["x"] * 4 + ["y"] * 4 + ["z"] * 4
    order = stratified_order(names, groups, 0)
    plan = plan_segments(np.full(12, 50), order, 50, 300)
    chosen = [groups[d] for d, _, _ in plan]
    assert sorted(chosen.count(g) for g in "xyz") == [2, 2, 2]
    # deterministic from the seed, and another seed picks other documents
    assert plan == plan_segments(np.full(12, 50), stratified_order(names, groups, 0), 50, 300)
    others = {
        tuple(d for d, _, _ in plan_segments(np.full(12, 50), stratified_order(names, groups, s), 50, 300))
        for s in range(6)
    }
    assert len(others) > 1


def test_fingerprint_names_the_protocol_version():
    segs = [b"abc", b"de"]
    assert fingerprint_segments(segs, protocol=1) != fingerprint_segments(segs, protocol=2)
    assert fingerprint_segments(segs, protocol=2) != fingerprint_segments(segs, protocol=3)
    assert fingerprint_segments(segs) == fingerprint_segments(segs, protocol=2)


# -- a report's statistics, recomputed from its scores file -------------------------------------
def test_report_figures_are_recomputable_from_scores_jsonl(tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(80):
        (root / f"{'ab'[i % 2]}{i}.txt").write_bytes(
            rng.integers(0, 256, size=int(rng.integers(20, 400))).astype(np.uint8).tobytes()
        )
    corpus = load_corpus(
        f"files:{root}",
        heldout_fraction=0.3,
        segment_bytes=64,
        max_eval_bytes=4096,
        cache_dir=tmp_path / "cache",
    )
    ev = EvalSet.from_corpus(corpus)
    n = len(ev.segments)
    results = []
    for k, name in enumerate(["m0", "m1"]):
        nb = np.asarray([len(d) for d in ev.data], np.int64)
        nats = [nb * (5.0 + k * 0.1 + rng.random(n)) * LN2 for _ in range(1 + k)]
        results.append(
            ModelResult(
                name,
                "byte",
                "run",
                ev.fingerprint,
                SegmentScores(nats[0], nb),
                seed_scores=[SegmentScores(x, nb) for x in nats[1:]] or None,
            )
        )
    report = build_report(ev, results, resamples=200, seed=3)
    path = tmp_path / "scores.jsonl"
    write_scores(path, ev, results)
    header, ds = stats.read_scores(path)
    assert header["fingerprint"] == report["fingerprint"] and header["protocol"] == 2
    assert [m["seeds"] for m in header["models"]] == [1, 2]
    again = stats.statistics(ds, ["m0", "m1"], resamples=200, seed=3)
    for m in report["models"]:
        i = ds.names.index(m["name"])
        assert m["bpb"] == pytest.approx(ds.bpb[i], rel=1e-12)
        assert m["bpb_ci95"] == pytest.approx(again["ci95"][m["name"]], rel=1e-12)
    assert report["statistics"]["pairs"] == json.loads(json.dumps(again["pairs"]))
    assert report["data"]["scored_documents"] == len(ds.docs)
    segment_lines = [json.loads(x) for x in path.read_text().splitlines()[1:] if '"segment"' in x[:30]]
    assert len(segment_lines) == 3 * n
