"""A held-out segment's score and patches never depend on the batch it is scored in.

For every family, the same segments are scored with batch sizes 1, 3 and 32 and in another order
with other companions. BLT patch lengths must be identical (integers, from entropies that every
row gets from one compiled single-row program: bitwise by construction). Scores come from
differently shaped programs (B x W for each batch size B), whose float32 per-position NLLs may
differ in the last bits (about 1e-7 relative each); the evaluator sums them per segment in float64
in a fixed order, so per-segment nats agree to 1e-5 relative (a wide margin over 64 positions of
float32 noise) and BPB to 1e-6 absolute (the issue's tolerance; the noise averages out over the
segments, leaving about 1e-8).
"""

import numpy as np
import pytest
from conftest import TINY_COMMON as COMMON
from conftest import TINY_FAMILIES as FAMILIES
from conftest import word_corpus

from bytelm.baselines.bpe import train_bpe_on_corpus
from bytelm.config import load_config
from bytelm.data import load_corpus_from_config
from bytelm.training.loop import train
from bytelm.training.restore import make_task
from bytelm.training.trainer import Trainer


def overrides(corpus_dir, extra):
    return [f"{k}={v}" for k, v in {"data.source": f"files:{corpus_dir}", **COMMON, **extra}.items()]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return word_corpus(tmp_path_factory.mktemp("invariance_corpus"), n_docs=40, words_per_doc=120)


@pytest.fixture(scope="module")
def artefacts(corpus_dir, tmp_path_factory):
    """The BPE tokenizer and a (2-step) entropy model run for the bpe and blt families."""
    root = tmp_path_factory.mktemp("artefacts")
    cfg = load_config(None, overrides(corpus_dir, FAMILIES["byte"]))
    corpus = load_corpus_from_config(cfg.data)
    train_bpe_on_corpus(corpus, vocab_size=300, num_workers=1).save(root / "tokenizer")
    train(
        load_config(None, overrides(corpus_dir, {**FAMILIES["byte"], "model.window": 16})), root / "entropy"
    )
    return {"model.tokenizer": root / "tokenizer", "model.entropy_run": root / "entropy"}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.slow
def test_segment_scores_and_patches_do_not_depend_on_the_batch(family, corpus_dir, artefacts):
    extra = dict(FAMILIES[family])
    if family == "bpe":
        extra["model.tokenizer"] = artefacts["model.tokenizer"]
    if family == "blt":
        extra["model.entropy_run"] = artefacts["model.entropy_run"]
    cfg = load_config(None, overrides(corpus_dir, extra))
    corpus = load_corpus_from_config(cfg.data)
    trainer = Trainer(cfg, make_task(cfg, corpus))
    segments = corpus.segment_data()
    assert len(segments) >= 40

    def score(segs, batch_size):
        lengths = []

        def on_batch(batch, n_real):
            if "patch_lengths" in batch:
                lengths.extend(np.asarray(batch["patch_lengths"])[:n_real].tolist())

        return trainer.evaluate(segs, on_batch=on_batch, batch_size=batch_size), lengths

    ref, ref_lengths = score(segments, 1)
    for batch_size in (3, 32):
        got, lengths = score(segments, batch_size)
        if family == "blt":
            assert lengths == ref_lengths and len(lengths) == len(segments)
        np.testing.assert_array_equal(got.nbytes, ref.nbytes)
        np.testing.assert_allclose(got.nats, ref.nats, rtol=1e-5)
        if family == "hnet":  # the chunks the model made of each segment (its global steps)
            np.testing.assert_array_equal(got.global_steps, ref.global_steps)
        assert abs(got.bpb - ref.bpb) <= 1e-6
    # other companions, another order: segment i's result is its own
    order = np.random.default_rng(0).permutation(len(segments))[: len(segments) // 2]
    got, lengths = score([segments[i] for i in order], 3)
    if family == "blt":
        assert lengths == [ref_lengths[i] for i in order]
        assert len({len([x for x in row if x]) for row in ref_lengths}) > 3  # patchings of many sizes
    np.testing.assert_allclose(got.nats, ref.nats[order], rtol=1e-5)
