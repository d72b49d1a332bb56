"""Probes: BLT's noises, conditional scoring for every family, probe sets, oracle and uniform models."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_COMMON as INVARIANCE
from conftest import TINY_FAMILIES as FAMILIES
from conftest import tiny_family, word_corpus, write_files
from flax import nnx

from bytelm.bpb import LN2
from bytelm.config import load_config
from bytelm.data import load_corpus, load_corpus_from_config
from bytelm.evaluation import probes
from bytelm.evaluation.noise import NOISES, characters, noise
from bytelm.evaluation.probe_tables import probe_lines
from bytelm.evaluation.results import EvalSet
from bytelm.training.restore import make_task
from bytelm.training.trainer import Trainer


class Fixed:
    """A stand-in for numpy's Generator with given draws (hand-computed examples)."""

    def __init__(self, uniforms, ints=()):
        self.uniforms, self.ints = list(uniforms), list(ints)

    def random(self, n):
        out, self.uniforms = self.uniforms[:n], self.uniforms[n:]
        return np.asarray(out)

    def integers(self, lo, hi):
        value = self.ints.pop(0)
        assert lo <= value < hi
        return value


# -- the noises --------------------------------------------------------------------------------
def test_each_noise_on_a_hand_computed_example():
    assert noise("uppercase", "Straße ok".encode(), Fixed([])) == "STRASSE OK".encode()
    assert noise("antspeak", b"ab c", Fixed([])) == b"A B   C"
    assert noise("drop", b"abcd", Fixed([0.05, 0.5, 0.09, 0.95])) == b"bd"
    assert noise("randomcase", b"abCD", Fixed([0.4, 0.6, 0.1, 0.9])) == b"AbCd"
    # 'a' repeated with 3 more copies (4 in all), 'b' kept, 'c' with 1 more
    assert noise("repeat", b"abc", Fixed([0.1, 0.5, 0.19], [3, 1])) == b"aaaabcc"
    # invalid UTF-8 bytes are characters of their own, kept as they are
    assert noise("uppercase", b"a\xffb", Fixed([])) == b"A\xffB"
    assert noise("antspeak", b"\xff\xfe", Fixed([])) == b"\xff \xfe"
    # a script without case: the case noises change nothing
    thai = "ภาษาไทย".encode()
    assert noise("uppercase", thai, Fixed([])) == thai
    assert noise("randomcase", thai, np.random.default_rng(0)) == thai
    with pytest.raises(ValueError, match="unknown noise"):
        noise("shout", b"x", Fixed([]))


def test_noises_keep_their_stated_rates_on_random_text():
    rng = np.random.default_rng(11)
    n = 20000
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
    # no two equal neighbours, so the repeats can be counted from the runs
    text = letters[(np.cumsum(rng.integers(1, 26, size=n)) % 26)].tobytes()
    dropped = 1 - len(noise("drop", text, np.random.default_rng(1))) / n
    assert abs(dropped - 0.1) < 3 * math.sqrt(0.1 * 0.9 / n)
    upper = sum(c.isupper() for c in characters(noise("randomcase", text, np.random.default_rng(2)))) / n
    assert abs(upper - 0.5) < 3 * math.sqrt(0.25 / n)
    out = noise("repeat", text, np.random.default_rng(3))
    runs = [len(m) for m in __import__("re").findall(rb"((.)\2*)", out) for m in [m[0]]]
    repeated = sum(r > 1 for r in runs) / n
    assert len(runs) == n and max(runs) <= 4
    assert abs(repeated - 0.2) < 3 * math.sqrt(0.2 * 0.8 / n)
    extra = (len(out) - n) / n  # 1, 2 or 3 more copies: 0.2 x 2 on average
    assert abs(extra - 0.4) < 3 * math.sqrt((0.2 * 14 / 3 - 0.16) / n)


# -- probe sets --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def eval_set(tmp_path_factory):
    root = word_corpus(tmp_path_factory.mktemp("probe_corpus"), n_docs=80, words_per_doc=200, two_dirs=True)
    corpus = load_corpus(
        f"files:{root}",
        heldout_fraction=0.4,
        segment_bytes=128,
        max_eval_bytes=40000,
        cache_dir=tmp_path_factory.mktemp("probe_cache"),
    )
    return EvalSet.from_corpus(corpus)


def test_probe_sets_are_deterministic_and_fingerprinted(eval_set):
    words = probes.train_word_counts(eval_set.corpus)
    settings = probes.ProbeSettings(max_bytes=128, choice_items=40, spelling_items=40)
    a = probes.build_probe_set(eval_set, settings, words)
    b = probes.build_probe_set(eval_set, settings, words)
    assert a.lines() == b.lines() and a.fingerprint == b.fingerprint
    other = probes.build_probe_set(
        eval_set, probes.ProbeSettings(128, seed=1, choice_items=40, spelling_items=40), words
    )
    assert other.fingerprint != a.fingerprint
    assert len(a.choice) == 40 and len(a.spelling) == 40
    for it in a.choice:
        cands = it["candidates"]
        assert len(set(cands)) == 4 and len(it["context"]) >= settings.context_bytes - 3
        assert {len(characters(c)) for c in cands} == {settings.continuation_chars}
        assert it["distractors"] == "any group"  # (a group of files: is a file: one document each here)
        for kind in NOISES:
            assert len(it["noised"][kind]) + max(map(len, cands)) <= 128
    assert {it["edit"] for it in a.spelling} == set(probes.EDITS)
    for it in a.spelling:
        assert it["real"] != it["altered"] and abs(len(it["real"]) - len(it["altered"])) <= 4
        assert it["word"].encode() in it["real"]


def uniform(strings):
    return np.asarray([len(s) * 8 * LN2 for s in strings])


def copying(strings):
    """An oracle that copies its context: the byte after the longest earlier occurrence of the last
    8 bytes is predicted with probability 0.99, anything else uniformly."""
    out = []
    for s in strings:
        nats = 0.0
        for t in range(len(s)):
            k = s[max(0, t - 8) : t]
            at = s.rfind(k, 0, t - 1) if len(k) == 8 else -1
            p = 0.99 if at >= 0 and s[at + 8] == s[t] else 0.01 / 255
            nats -= math.log(p)
        out.append(nats)
    return np.asarray(out)


def test_a_copying_oracle_scores_one_and_a_uniform_model_chance(tmp_path):
    # documents that repeat a random 40-byte string: a context of 150 bytes holds the continuation's
    # earlier copy
    rng = np.random.default_rng(0)
    files = {}
    for i in range(60):
        period = bytes(rng.integers(97, 123, size=40).astype(np.uint8))
        files[f"d{i}.txt"] = period * 10
    root = tmp_path / "rep"
    write_files(root, files)
    corpus = load_corpus(
        f"files:{root}",
        heldout_fraction=0.5,
        segment_bytes=400,
        max_eval_bytes=100000,
        cache_dir=tmp_path / "c",
    )
    ev = EvalSet.from_corpus(corpus)
    settings = probes.ProbeSettings(max_bytes=400, choice_items=30, spelling_items=0)
    ps = probes.build_probe_set(ev, settings, probes.train_word_counts(corpus))
    assert len(ps.choice) >= 20
    contained = [it for it in ps.choice if it["candidates"][it["answer"]] in it["context"]]
    ps.choice = contained  # the items whose context holds the true continuation's first copy
    assert len(contained) == len(ps.choice)
    oracle = probes.summarize(ps, probes.item_outcomes(ps, copying), resamples=200)
    assert oracle["choice"]["accuracy"] == 1.0
    flat = probes.summarize(ps, probes.item_outcomes(ps, uniform), resamples=200)
    assert flat["choice"]["accuracy"] == 0.25
    assert flat["choice"]["robustness"] is None  # at chance: the score is undefined, not a number
    assert flat["choice"]["bpb_clean_context"] == pytest.approx(8.0)


def test_summary_intervals_bracket_the_point_and_groups_cover_items(eval_set):
    settings = probes.ProbeSettings(max_bytes=128, choice_items=40, spelling_items=40)
    ps = probes.build_probe_set(eval_set, settings, probes.train_word_counts(eval_set.corpus))
    rng = np.random.default_rng(4)

    def noisy(strings):
        return np.asarray([len(s) * (5 + rng.random()) for s in strings])

    f = probes.probe_model(ps, noisy, resamples=200)
    c = f["choice"]
    assert c["accuracy_ci95"][0] <= c["accuracy"] <= c["accuracy_ci95"][1]
    assert sum(g["items"] for g in c["groups"].values()) == len(ps.choice)
    assert set(c["noise"]) == set(NOISES)
    sp = f["spelling"]
    assert sum(v["items"] for v in sp["by_edit"].values()) == len(ps.spelling)
    assert sum(v["items"] for v in sp["by_band"].values()) == len(ps.spelling)
    assert "## Probes" in "\n".join(
        probe_lines(
            {
                "version": 1,
                "fingerprint": ps.fingerprint,
                "settings": {
                    **settings.__dict__,
                    "context_bytes": settings.context_bytes,
                    "continuation_chars": settings.continuation_chars,
                },
                "choice_items": len(ps.choice),
                "spelling_items": len(ps.spelling),
                "models": {"m": f},
            }
        )
    )


# -- conditional scoring for every family --------------------------------------------------------
COMMON = {
    k: v for k, v in INVARIANCE.items() if k.startswith(("data.", "train.batch", "train.seq", "eval.batch"))
}


@pytest.fixture(scope="module")
def trainers(tmp_path_factory):
    """An untrained model of every family (the batch-invariance test's sizes) on one corpus."""
    from bytelm.baselines.bpe import train_bpe_on_corpus  # noqa: PLC0415
    from bytelm.training.loop import train  # noqa: PLC0415

    root = word_corpus(tmp_path_factory.mktemp("cond_corpus"), n_docs=40, words_per_doc=120)
    art = tmp_path_factory.mktemp("cond_art")

    def cfg_of(extra):
        over = {"data.source": f"files:{root}", **COMMON, **extra}
        return load_config(None, [f"{k}={v}" for k, v in over.items()])

    base = cfg_of(FAMILIES["byte"])
    corpus = load_corpus_from_config(base.data)
    train_bpe_on_corpus(corpus, vocab_size=300, num_workers=1).save(art / "tokenizer")
    train(
        cfg_of(
            {
                **FAMILIES["byte"],
                "model.window": 16,
                "train.steps": 2,
                "train.warmup_steps": 1,
                "eval.every": 0,
            }
        ),
        art / "entropy",
    )
    out = {}
    for family in FAMILIES:
        cfg = cfg_of(tiny_family(family, art))
        out[family] = Trainer(cfg, make_task(cfg, load_corpus_from_config(cfg.data)))
    return out


PAIRS = [
    (b"the cat sat on ", b"the mat"),
    (b"", b"from BOS"),
    ("caf\u00e9 ".encode(), "na\u00efve".encode()),
    (b"x" * 30, b"\xff\xfe y"),
]


@pytest.mark.parametrize("family", ["blt", "bpe", "byte", "hnet", "megabyte"])
@pytest.mark.slow
def test_conditional_scoring_is_the_difference_of_two_full_scorings(family, trainers):
    trainer = trainers[family]
    got = probes.conditional_nats(probes.trainer_scorer(trainer), PAIRS)
    for (ctx, cont), value in zip(PAIRS, got):
        joint = trainer.evaluate([ctx + cont], batch_size=1).nats[0]
        alone = trainer.evaluate([ctx], batch_size=1).nats[0] if ctx else 0.0
        assert value == pytest.approx(joint - alone, rel=1e-5, abs=1e-4)
        assert value > 0


@pytest.mark.slow
def test_subword_conditional_scoring_equals_brute_force_over_the_exact_bytes(trainers):
    trainer = trainers["bpe"]
    model = nnx.merge(trainer.graphdef, trainer.model_params)

    def brute(data: bytes) -> float:
        """-log p of the exact bytes' tokens, one unpadded forward pass, log-softmax in float64."""
        ids, nbytes = trainer.task.encode_segment(data)
        assert nbytes.sum() == len(data)
        logits = np.asarray(model(jnp.asarray(ids[None, :-1])), np.float64)[0]
        logp = (
            logits
            - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
            - logits.max(-1, keepdims=True)
        )
        return float(-logp[np.arange(len(ids) - 1), ids[1:]].sum())

    got = probes.conditional_nats(probes.trainer_scorer(trainer), PAIRS)
    for (ctx, cont), value in zip(PAIRS, got):
        want = brute(ctx + cont) - (brute(ctx) if ctx else 0.0)
        assert value == pytest.approx(want, rel=1e-4, abs=1e-3)
