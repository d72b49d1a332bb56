"""The BPE-token LM: token cache, byte counts under the loss mask, tokenizer fingerprint checks."""

import json

import numpy as np
import pytest
from helpers import corpus_dir, tiny_overrides  # noqa: F401  (module fixture)

from bytelm.baselines.bpe import train_bpe
from bytelm.baselines.wordpiece import train_wordpiece
from bytelm.config import load_config
from bytelm.data import load_corpus
from bytelm.errors import UserError
from bytelm.evaluation.evaluator import evaluate_trainer
from bytelm.evaluation.results import EvalSet
from bytelm.training.loop import train
from bytelm.training.restore import make_task, restore_scorer


@pytest.fixture(scope="module")
def tokenizer_dir(corpus_dir, tmp_path_factory):  # noqa: F811
    corpus = load_corpus(f"files:{corpus_dir}", cache_dir=tmp_path_factory.mktemp("tc"))
    tok = train_bpe(corpus.documents("train"), vocab_size=320, pattern="gpt2", num_workers=1)
    out = tmp_path_factory.mktemp("tok") / "tok"
    tok.save(out)
    return out


def bpe_cfg(corpus_dir, tokenizer_dir, **extra):  # noqa: F811
    return load_config(
        None,
        tiny_overrides(
            corpus_dir,
            **{"model.family": "bpe", "model.tokenizer": str(tokenizer_dir), "train.seq_len": 32, **extra},
        ),
    )


def test_token_stream_matches_tokenizer(corpus_dir, tokenizer_dir):  # noqa: F811
    cfg = bpe_cfg(corpus_dir, tokenizer_dir)
    corpus = load_corpus(cfg.data.source, segment_bytes=64, max_eval_bytes=4096)
    task = make_task(cfg, corpus)
    stream = np.asarray(task.train_stream()).astype(np.int64)
    first = next(corpus.documents("train"))
    expected = [1, *(t + 4 for t in task.tokenizer.encode_ordinary(first)), 2]
    assert stream[: len(expected)].tolist() == expected
    # bytes per position: each target's token length, control ids count 0
    batch = next(task.train_batches(0))
    ids = batch["ids"][:, 1:]
    lens = np.where(
        ids >= 4,
        [[len(task.tokenizer.token_bytes(int(i) - 4)) if i >= 4 else 0 for i in row] for row in ids],
        0,
    )
    np.testing.assert_array_equal(batch["nbytes"], lens)
    assert task.bytes_per_position() == pytest.approx(
        corpus.split_bytes("train") / (len(stream) - 2 * len(list(corpus.documents("train"))))
    )


def test_bpe_eval_counts_segment_bytes_not_tokens(corpus_dir, tokenizer_dir, tmp_path):  # noqa: F811
    cfg = bpe_cfg(corpus_dir, tokenizer_dir, **{"train.steps": 4, "eval.every": 0})
    train(cfg, tmp_path / "run")
    trainer = restore_scorer(tmp_path / "run")
    segments = trainer.task.corpus.segment_data()
    scores = trainer.evaluate(segments)
    assert scores.total_bytes == sum(len(s) for s in segments)
    assert np.array_equal(scores.nbytes, [len(s) for s in segments])
    n_tokens = sum(len(trainer.task.tokenizer.encode_ordinary(s)) for s in segments)
    assert n_tokens < scores.total_bytes  # so a token count would have been the wrong denominator
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["tokenizer_fingerprint"] == trainer.task.tokenizer.fingerprint


def test_missing_tokenizer_dir(corpus_dir, tmp_path):  # noqa: F811
    cfg = bpe_cfg(corpus_dir, tmp_path / "nope")
    with pytest.raises(UserError, match=r"tokenizer directory .*nope does not exist"):
        make_task(cfg, load_corpus(cfg.data.source))


def test_run_refuses_another_tokenizer(corpus_dir, tokenizer_dir, tmp_path):  # noqa: F811
    cfg = bpe_cfg(corpus_dir, tokenizer_dir, **{"train.steps": 2, "eval.every": 0})
    train(cfg, tmp_path / "run")
    # replace the tokenizer behind the run's back with a different one at the same path
    corpus = load_corpus(cfg.data.source)
    other = train_bpe(corpus.documents("train"), vocab_size=300, pattern="gpt2", num_workers=1)
    other.save(tokenizer_dir.parent / "swapped")
    text = (
        (tmp_path / "run" / "config.toml")
        .read_text()
        .replace(str(tokenizer_dir), str(tokenizer_dir.parent / "swapped"))
    )
    (tmp_path / "run" / "config.toml").write_text(text)
    with pytest.raises(UserError, match="was trained with"):
        restore_scorer(tmp_path / "run")


def test_unigram_stream_and_sampled_segmentations(corpus_dir, tmp_path):  # noqa: F811
    """A Unigram tokenizer feeds the same LM; with model.sample_alpha > 0 the train stream's
    segmentations are drawn (reproducibly, by train.seed) but spell the same bytes, and a BPE
    tokenizer refuses sampling."""
    from bytelm.baselines.unigram import train_unigram

    corpus = load_corpus(f"files:{corpus_dir}", cache_dir=tmp_path / "c")
    tok = train_unigram(corpus.documents("train"), vocab_size=320, pattern="gpt2", num_workers=1)
    tok.save(tmp_path / "uni")

    def stream(**extra):
        cfg = bpe_cfg(corpus_dir, tmp_path / "uni", **extra)
        task = make_task(cfg, load_corpus(cfg.data.source, segment_bytes=64, max_eval_bytes=4096))
        return task, np.asarray(task.train_stream()).astype(np.int64)

    task, viterbi = stream()
    first = next(task.corpus.documents("train"))
    assert viterbi[1 : 1 + len(tok.encode_ordinary(first))].tolist() == [
        t + 4 for t in tok.encode_ordinary(first)
    ]
    _, sampled = stream(**{"model.sample_alpha": 0.3})
    _, again = stream(**{"model.sample_alpha": 0.3})
    _, other_seed = stream(**{"model.sample_alpha": 0.3, "train.seed": 1})
    assert (
        np.array_equal(sampled, again)
        and not np.array_equal(sampled, viterbi)
        and not np.array_equal(sampled, other_seed)
    )
    spell = lambda s: task.tokenizer.decode_bytes([int(t) - 4 for t in s if t >= 4])  # noqa: E731
    assert spell(sampled) == spell(viterbi) and len(sampled) > len(
        viterbi
    )  # drawn paths are longer on average
    with pytest.raises(UserError, match="sample_alpha"):
        stream(**{"model.tokenizer": str(tokenizer_dir_of(corpus_dir, tmp_path)), "model.sample_alpha": 0.3})


def tokenizer_dir_of(corpus_dir, tmp_path):  # noqa: F811
    corpus = load_corpus(f"files:{corpus_dir}", cache_dir=tmp_path / "c")
    out = tmp_path / "bpe"
    train_bpe(corpus.documents("train"), vocab_size=300, pattern="gpt2", num_workers=1).save(out)
    return out


def test_the_train_split_encoded_in_parts_by_two_workers_is_the_one_process_stream(
    corpus_dir,  # noqa: F811
    tokenizer_dir,
    tmp_path,
):
    """Sharded, parallel encoding (parts of ~2 KB, 2 spawned workers) gives the stream of encoding
    every train document in this process, BOS/EOS-framed, in order."""
    from bytelm.baselines import load_tokenizer
    from bytelm.baselines.token_stream import encode_train_split

    corpus = load_corpus(f"files:{corpus_dir}", cache_dir=tmp_path / "c")
    tok = load_tokenizer(tokenizer_dir)
    expected = [
        i for doc in corpus.documents("train") for i in (1, *(t + 4 for t in tok.encode_ordinary(doc)), 2)
    ]
    runs = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        out.mkdir()
        manifest = encode_train_split(corpus, str(tokenizer_dir), out, workers=workers, part_bytes=2048)
        assert manifest["parts"] > 4 and manifest["length"] == len(expected)
        assert manifest["tokens"] == len(expected) - 2 * len(corpus.document_indices("train"))
        runs[workers] = np.fromfile(out / "train.u32", np.uint32)
        assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "train.u32"]
    assert runs[1].tolist() == expected and runs[2].tolist() == expected


def test_wordpiece_unk_is_charged_with_the_bytes_it_replaced(corpus_dir, tmp_path):  # noqa: F811
    """A character-level WordPiece whose words longer than 3 characters are [UNK]: each [UNK] stands
    for different bytes, so every segment is still scored on exactly its bytes, and the evaluation
    reports the share of them that went to [UNK]."""
    corpus = load_corpus(f"files:{corpus_dir}", cache_dir=tmp_path / "tc")
    tok = train_wordpiece(
        corpus.documents("train"), vocab_size=200, level="char", max_input_chars_per_word=3, num_workers=1
    )
    tok.save(tmp_path / "tok")
    cfg = bpe_cfg(corpus_dir, tmp_path / "tok", **{"train.steps": 2, "eval.every": 0})
    train(cfg, tmp_path / "run")
    trainer = restore_scorer(tmp_path / "run")
    segments = trainer.task.corpus.segment_data()
    scores = trainer.evaluate(segments)
    assert np.array_equal(scores.nbytes, [len(s) for s in segments])
    unk = total = 0
    for s in segments:
        ids, nbytes = tok.encode_ordinary_with_bytes(s)
        unk += sum(n for i, n in zip(ids, nbytes) if i == tok.unk_id)
        total += sum(nbytes)
    assert unk > 0 and total == sum(map(len, segments))
    _, _, stats = evaluate_trainer(trainer, EvalSet.from_corpus(trainer.task.corpus))
    assert stats == {"bytes_in_unk": pytest.approx(unk / total)}
