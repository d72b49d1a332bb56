"""The Unigram tokenizer and the greedy longest-match rule: worked cases computed by hand, the
numpy lattice against the readable reference, HF ``tokenizers`` parity (Unigram and WordPiece
models), SentencePiece's trainer as a quality peer, sampling, files and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import ADVERSARIAL, MULTILINGUAL, stdlib_sample
from hypothesis import given, settings
from hypothesis import strategies as st

from bytelm.baselines import load_tokenizer
from bytelm.baselines.bpe import Tokenizer, train_bpe
from bytelm.baselines.bpe.trainer import count_chunks
from bytelm.baselines.unigram import UnigramTokenizer, digamma, train_unigram
from bytelm.baselines.unigram.lattice import Chunks, Lattice, PieceIndex, find_edges
from bytelm.baselines.unigram.trainer import learn_pieces
from bytelm.errors import UserError

WORDS = r"\S+|\s+"  # a pattern that keeps each word one chunk


def toy(scores: dict[bytes, float], default: float = -10.0, **kw) -> UnigramTokenizer:
    """A tokenizer whose bytes score ``default`` unless listed, plus the listed multi-byte pieces."""
    pieces = [p for p in scores if len(p) > 1]
    byte_scores = [scores.get(bytes([b]), default) for b in range(256)]
    return UnigramTokenizer(pieces, byte_scores + [scores[p] for p in pieces], pattern=WORDS, **kw)


def spelled(tok, ids) -> list[bytes]:
    return [tok.token_bytes(i) for i in ids]


# -- worked cases -----------------------------------------------------------------------------------
def test_ranks_longest_match_and_viterbi_segment_one_vocabulary_three_ways():
    """The notes' example: corpus ab x3, cd x4, abc x2 trains the merges [a+b, c+d, ab+c]; on
    `abcd` ranked merges give ab|cd, longest match abc|d; and Viterbi a|bc on its own worked case."""
    corpus = [b" ".join([b"ab"] * 3 + [b"cd"] * 4 + [b"abc"] * 2)]
    bpe = train_bpe(corpus, vocab_size=259, pattern=WORDS, num_workers=1)
    assert [(bpe.token_bytes(a), bpe.token_bytes(b)) for a, b in bpe.merges] == [
        (b"a", b"b"),
        (b"c", b"d"),
        (b"ab", b"c"),
    ]
    assert spelled(bpe, bpe.encode("abcd")) == [b"ab", b"cd"]
    longest = Tokenizer(bpe.merges, pattern=WORDS, encoder="longest")
    assert spelled(longest, longest.encode("abcd")) == [b"abc", b"d"]
    assert longest.fingerprint != bpe.fingerprint  # the rule is part of the contract
    # Viterbi: a -2, b -2, c -2, ab -3, bc -2.5: a|b|c -6, ab|c -5, a|bc -4.5
    uni = toy({b"a": -2, b"b": -2, b"c": -2, b"ab": -3, b"bc": -2.5})
    assert spelled(uni, uni.encode("abc")) == [b"a", b"bc"]
    assert spelled(uni.with_encoder("longest"), uni.with_encoder("longest").encode("abc")) == [b"ab", b"c"]


def test_viterbi_ties_go_to_the_longest_last_piece_in_both_paths():
    # a -1, b -1, c -1, ab -2, bc -2: every path of abc scores -3; best[2] is ab (a|b ties, ab is
    # longer), then at the end bc (from best[1] = a) ties with c (from best[2]) and is longer
    tok = toy({b"a": -1, b"b": -1, b"c": -1, b"ab": -2, b"bc": -2})
    assert spelled(tok, tok.viterbi(b"abc")) == [b"a", b"bc"]
    assert spelled(tok, tok.viterbi(b"ab")) == [b"ab"]
    assert tok.viterbi_many([b"abc", b"ab", b"", b"cab"]) == [
        tok.viterbi(p) for p in (b"abc", b"ab", b"", b"cab")
    ]


def test_em_step_on_a_three_piece_vocabulary_matches_the_hand_computation():
    """p(a) = .2, p(b) = .3, p(ab) = .1; chunks ab x1 and aab x2.
    ab: paths a|b .06, ab .1 (Z .16); aab: a|a|b .012, a|ab .02 (Z .032)."""
    logp = np.full(257, -50.0)
    logp[ord("a")], logp[ord("b")], logp[256] = math.log(0.2), math.log(0.3), math.log(0.1)
    pieces = [bytes([b]) for b in range(256)] + [b"ab"]
    chunks = Chunks.of([b"ab", b"aab"], [1, 2])
    counts, loglik = Lattice(chunks, find_edges(chunks, PieceIndex(pieces))).expected_counts(logp, 257)
    c_a = 0.06 / 0.16 + 2 * (2 * 0.012 + 0.02) / 0.032
    c_b = 0.06 / 0.16 + 2 * 0.012 / 0.032
    c_ab = 0.1 / 0.16 + 2 * 0.02 / 0.032
    assert (
        counts[ord("a")] == pytest.approx(c_a)
        and counts[ord("b")] == pytest.approx(c_b)
        and counts[256] == pytest.approx(c_ab)
    )
    assert counts.sum() == pytest.approx(c_a + c_b + c_ab)
    assert loglik == pytest.approx(math.log(0.16) + 2 * math.log(0.032))
    # the M-step's digamma against a numerical derivative of log-gamma
    for x in (0.5, 1.0, 2.75, 7.3, 1234.5):
        h = 1e-5 * x
        assert digamma(np.array([x]))[0] == pytest.approx(
            (math.lgamma(x + h) - math.lgamma(x - h)) / (2 * h), rel=1e-6
        )


def test_sampling_follows_the_path_probabilities():
    """Chunk ab with p(ab) = .1 and p(a)p(b) = .06: with alpha = 1 the whole piece is drawn with
    probability .1 / .16 = .625; alpha = 0.5 flattens it to sqrt(.1) / (sqrt(.1) + sqrt(.06))."""
    tok = toy({b"a": math.log(0.2), b"b": math.log(0.3), b"ab": math.log(0.1)})
    n = 4000
    for alpha, p in ((1.0, 0.625), (0.5, math.sqrt(0.1) / (math.sqrt(0.1) + math.sqrt(0.06)))):
        ids = tok.encode_sampled(" ".join(["ab"] * n), alpha=alpha, rng=0)
        whole = sum(1 for i in ids if i == 256)
        assert abs(whole / n - p) < 5 * math.sqrt(p * (1 - p) / n), (alpha, whole / n, p)
        assert tok.decode_bytes(ids) == " ".join(["ab"] * n).encode()
    with pytest.raises(ValueError, match="alpha"):
        tok.encode_sampled("ab", alpha=0)


# -- a trained tokenizer ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    docs = stdlib_sample(300_000)
    tok = train_unigram(
        docs, vocab_size=1500, pattern="cl100k", special_tokens=["<|endoftext|>"], num_workers=1
    )
    tok.add_tokens(["    return self"])
    d = tmp_path_factory.mktemp("unigram")
    tok.save(d)
    return {"tok": tok, "dir": d, "docs": docs}


def test_training_is_deterministic_and_sized(trained):
    tok = trained["tok"]
    assert tok.n_mergeable == 1500 - 1 and tok.n_vocab == 1500 + 1  # + the special, + the added token
    scores = tok.scores[256:]
    assert scores == sorted(scores, reverse=True)  # learned ids by decreasing score
    again = train_unigram(
        trained["docs"], vocab_size=1500, pattern="cl100k", special_tokens=["<|endoftext|>"], num_workers=2
    )
    again.add_tokens(["    return self"])
    assert again.fingerprint == tok.fingerprint  # any number of workers, the same tokenizer


def test_training_leaves_numpys_page_setting_as_it_was():
    setting = pytest.importorskip(
        "numpy._core.multiarray"
    )._set_madvise_hugepage  # sets, returns the old value
    original = setting(True)
    try:
        for wanted in (True, False):
            setting(wanted)
            seen = []
            learn_pieces({b"abab": 3, b"cdcd": 2}, 2, progress=lambda *_: seen.append(setting(False)))
            assert seen and not any(seen)  # off while training
            assert setting(wanted) is wanted  # as it was before
    finally:
        setting(original)


def test_files_round_trip_and_bad_files_name_the_problem(trained, tmp_path):
    tok, d = trained["tok"], trained["dir"]
    back = load_tokenizer(d)
    assert isinstance(back, UnigramTokenizer) and back == tok and back.scores == tok.scores
    text = (d / "bytelm_unigram.json").read_text()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "bytelm_unigram.json").write_text(text.replace('"encoder": "viterbi"', '"encoder": "longest"'))
    with pytest.raises(UserError, match="fingerprint mismatch"):
        load_tokenizer(bad)
    (bad / "bytelm_unigram.json").write_text(text[: len(text) // 2])
    with pytest.raises(UserError, match="truncated or corrupted"):
        load_tokenizer(bad)
    with pytest.raises(UserError, match="none of"):
        load_tokenizer(tmp_path)


def test_fast_path_equals_reference_on_documents(trained):
    tok = trained["tok"]
    docs = (
        stdlib_sample(150_000, skip=60) + [t.encode() for t in MULTILINGUAL] + [b"\xff\xfe\x80 abc \xc3", b""]
    )
    ids, counts = tok.encode_documents(docs, num_workers=1)
    ref = [tok.encode_ordinary(d) for d in docs]
    assert counts.tolist() == [len(r) for r in ref] and ids.tolist() == [i for r in ref for i in r]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=6))
def test_bytes_round_trip_and_fast_equals_reference_on_random_bytes(trained, docs):
    tok = trained["tok"]
    ids, counts = tok.encode_documents(docs, num_workers=1)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    for j, d in enumerate(docs):
        part = ids[offsets[j] : offsets[j + 1]].tolist()
        assert part == tok.encode_ordinary(d)
        assert tok.decode_bytes(part) == d


def test_hf_unigram_and_wordpiece_give_identical_ids(trained, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = trained["tok"]
    # the adversarial strings up to 10k characters, and one of 100k (the others of 100k cost seconds, not
    # coverage)
    texts = (
        [d.decode() for d in stdlib_sample(100_000, skip=80)]
        + MULTILINGUAL
        + [t for t in ADVERSARIAL if len(t) <= 10_000]
    )
    hf = tokenizers.Tokenizer.from_file(str(trained["dir"] / "tokenizer.json"))
    for t in [*texts, "a" * 100_000]:
        assert hf.encode(t).ids == tok.encode_ordinary(t), t[:60]
    assert hf.encode("x<|endoftext|>").ids == tok.encode("x<|endoftext|>", allowed_special="all")
    longest = tok.with_encoder("longest")
    longest.save(tmp_path)
    wp = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for t in texts:  # (HF's WordPiece tries every end of a word from its last: quadratic on 100k-char words)
        assert wp.encode(t).ids == longest.encode_ordinary(t), t[:60]


def test_quality_next_to_sentencepiece_on_the_same_chunks():
    """SentencePiece's unigram trainer on bytelm's own chunks (bytelm.baselines.unigram.peer):
    on held-out stdlib files, ours is no worse than 2% in bytes per token and in Viterbi
    log-likelihood per byte."""
    pytest.importorskip("sentencepiece")
    from bytelm.baselines.unigram.peer import quality, train_sentencepiece

    chunks = count_chunks(stdlib_sample(400_000), pattern="cl100k", num_workers=1)
    pieces, logp, _ = learn_pieces(chunks, 1500 - 256)
    ours = UnigramTokenizer(pieces, logp.tolist())
    sp, _ = train_sentencepiece(chunks, 1500, num_threads=1)
    seen = set(b"".join(chunks))
    held = [
        c
        for c, n in count_chunks(stdlib_sample(100_000, skip=90), pattern="cl100k", num_workers=1).items()
        for _ in range(n)
        if set(c) <= seen
    ]
    q_ours, q_sp = quality(held, ours=ours), quality(held, sp=sp)
    assert q_ours["bytes_per_token"] >= 0.98 * q_sp["bytes_per_token"], (q_ours, q_sp)
    assert q_ours["loglik_per_byte"] >= 1.02 * q_sp["loglik_per_byte"], (
        q_ours,
        q_sp,
    )  # log-likelihoods are negative


def test_bad_input_is_a_value_error_naming_the_problem():
    with pytest.raises(ValueError, match="below 256 byte pieces"):
        train_unigram([b"abc"], vocab_size=256, special_tokens=["<s>"])
    with pytest.raises(ValueError, match="empty"):
        train_unigram([b"", b""], vocab_size=300)
    with pytest.raises(ValueError, match="encoder"):
        toy({b"ab": -1.0}, encoder="ranks")
    with pytest.raises(ValueError, match="scores for"):
        UnigramTokenizer([b"ab"], [-1.0] * 256)
    with pytest.raises(ValueError, match="listed twice"):
        UnigramTokenizer([b"ab", b"ab"], [-1.0] * 258)
    with pytest.raises(ValueError, match="finite"):
        UnigramTokenizer([b"ab"], [-1.0] * 256 + [math.nan])


def test_cli_trains_either_kind_with_its_rule(text_dir, tmp_path, capsys):
    from bytelm import cli

    base = ["tokenizer", "train", "--data", f"files:{text_dir}", "--vocab-size", "300", "--pattern", "gpt2"]
    assert cli.main([*base, "--kind", "unigram", "--out", str(tmp_path / "u")]) == 0
    tok = load_tokenizer(tmp_path / "u")
    assert (tok.kind, tok.encoder, tok.n_vocab) == ("unigram", "viterbi", tok.n_mergeable)
    assert "unigram (encoder: viterbi)" in capsys.readouterr().out
    assert cli.main([*base, "--encoder", "longest", "--out", str(tmp_path / "b")]) == 0
    tok = load_tokenizer(tmp_path / "b")
    assert (tok.kind, tok.encoder) == ("bpe", "longest") and not (tmp_path / "b" / "ranks.tiktoken").exists()
    assert cli.main([*base, "--kind", "bpe", "--encoder", "viterbi", "--out", str(tmp_path / "x")]) == 2
    assert "not a rule of a bpe tokenizer" in capsys.readouterr().err
