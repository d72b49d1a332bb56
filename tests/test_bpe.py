"""Byte-level BPE: docs/tokenizers.md worked cases, properties, bad input, files and the CLI.

Parity with tiktoken / HF tokenizers lives in test_bpe_parity.py.
"""

from __future__ import annotations

import io
import json
import sys
from collections import Counter

import numpy as np
import pytest
from conftest import write_files
from helpers import stdlib_sample
from hypothesis import given, settings
from hypothesis import strategies as st

from bytelm import cli
from bytelm.baselines.bpe import (
    PATTERNS,
    PreTokenizer,
    Tokenizer,
    count_chunks,
    extend_embeddings,
    learn_merges,
    load_tokenizer,
    merge,
    pair_counts,
    tokenizer_stats,
    train_bpe,
)
from bytelm.baselines.bpe.asciisplit import cl100k_starts, factorize, number_chunks, pack_chunks, unpack_chunk
from bytelm.baselines.bpe.bytelevel import BYTE_TO_CHAR, HF_BYTE_ORDER, bytes_to_chars, chars_to_bytes
from bytelm.baselines.bpe.fast import FastEncoder
from bytelm.baselines.bpe.parallel import balanced_shards

a, b, c, d = (ord(x) for x in "abcd")
WS = r"\S+|\s+"  # a pattern that keeps words whole, for character-level worked cases
SPECIALS = ["<|endoftext|>", "<|fim|>"]


def pieces(tok: Tokenizer, ids: list[int]) -> list[bytes]:
    return [tok.token_bytes(i) for i in ids]


@pytest.fixture(scope="module")
def sample_tok() -> Tokenizer:
    return train_bpe(stdlib_sample(150_000), vocab_size=1000, special_tokens=SPECIALS, num_workers=1)


# -- docs/tokenizers.md worked cases ------------------------------------------------------------------
def test_encoding_is_lowest_rank_first_not_longest_match():
    tok = Tokenizer([(a, b), (c, d), (256, c)], pattern=WS)  # ab=256, cd=257, abc=258
    assert pieces(tok, tok.encode("abcd")) == [b"ab", b"cd"]
    # greedy longest-match over the same vocabulary {a, b, c, d, ab, cd, abc} gives [abc, d]
    vocab = {b"a", b"b", b"c", b"d", b"ab", b"cd", b"abc"}
    text, greedy = b"abcd", []
    while text:
        best = max((v for v in vocab if text.startswith(v)), key=len)
        greedy.append(best)
        text = text[len(best) :]
    assert greedy == [b"abc", b"d"]


def test_rank_order_decides():
    forward = Tokenizer([(a, b), (b, c)], pattern=WS)
    assert pieces(forward, forward.encode("abc")) == [b"ab", b"c"]
    reversed_ = Tokenizer([(b, c), (a, b)], pattern=WS)
    assert pieces(reversed_, reversed_.encode("abc")) == [b"a", b"bc"]


def test_whole_chunk_shortcut_only_for_tokens_that_encode_to_themselves():
    # merges [b+c, a+b, ab+c]: "abc" is a token (ab+c), yet BPE turns "abc" into [a, bc] first
    tok = Tokenizer([(b, c), (a, b), (257, c)], pattern=WS)
    assert pieces(tok, tok.encode("abc")) == [b"a", b"bc"]
    assert pieces(tok, tok.encode("ab")) == [b"ab"]  # a token that does encode to itself
    fast = FastEncoder(tok)
    fast._prepare()
    assert tok.token_id(b"abc") == 258 and b"abc" not in fast._whole_tokens


def test_training_counts_abab_abac():
    words = {(a, b, a, b): 3, (a, b, a, c): 1}
    assert pair_counts(words)[(a, b)] == 7
    assert learn_merges({b"abab": 3, b"abac": 1}, 2) == [(a, b), (256, 256)]
    # the same through the whole trainer: the documents hold "abab" x3 and "abac" x1 as chunks
    tok = train_bpe([b"abab abab abab abac"], vocab_size=258, pattern=r"\w+", num_workers=1)
    assert pieces(tok, [256, 257]) == [b"ab", b"abab"]


def naive_train(words: dict[bytes, int], n_merges: int, tie: str) -> list[tuple[bytes, bytes]]:
    """Reference trainer: recount every pair after every merge (the slow version of docs/tokenizers.md).

    tie="first": ties go to the pair seen first in the corpus (the classic Wikipedia example);
    tie="hf": ties go to the smallest pair with bytes numbered in HF order (this trainer's rule).
    """
    seqs = {tuple(bytes([x]) for x in w): n for w, n in words.items()}
    order = {bytes([x]): i for i, x in enumerate(HF_BYTE_ORDER)}
    merges = []
    for _ in range(n_merges):
        counts: Counter = Counter()
        first: dict = {}
        for s, n in seqs.items():
            for pair in zip(s, s[1:]):
                counts[pair] += n
                first.setdefault(pair, len(first))
        if not counts:
            break
        top = max(counts.values())
        tied = [p for p, k in counts.items() if k == top]
        if tie == "first":
            best = min(tied, key=first.__getitem__)
        else:
            best = min(tied, key=lambda p: (order[p[0]], order[p[1]]))
        merges.append(best)
        order.setdefault(best[0] + best[1], len(order))
        new = {}
        for s, n in seqs.items():
            out, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(s[i] + s[i + 1])
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + n
        seqs = new
    return merges


def test_wikipedia_example_and_tie_rules():
    text = b"aaabdaaabac"
    # ties broken by first occurrence: aa, aa+a, aaa+b
    assert naive_train({text: 1}, 3, tie="first") == [(b"a", b"a"), (b"aa", b"a"), (b"aaa", b"b")]
    tok = Tokenizer([(a, a), (256, a), (257, b)], pattern=WS)
    assert tok.encode(text) == [258, 100, 258, 97, 99]
    # this trainer's rule (HF order) picks a+b at step 2: a different, equally valid tokenizer
    ours = learn_merges({text: 1}, 3)
    assert ours == [(a, a), (a, b), (256, 257)]
    assert [(bytes([x]) if x < 256 else None) for x, _ in ours[:2]] == [b"a", b"a"]
    assert Tokenizer(ours, pattern=WS).encode(text) == [258, 100, 258, 97, 99]


def test_aaa_counts_twice_but_merges_once():
    assert pair_counts({(a, a, a): 1})[(a, a)] == 2
    assert merge([a, a, a], (a, a), 256) == [256, a]
    tok = Tokenizer([(a, a)], pattern=WS)
    assert pieces(tok, tok.encode("aaa")) == [b"aa", b"a"]
    assert learn_merges({b"aaa": 1}, 1) == [(a, a)]


def test_prefix_instability():
    tok = Tokenizer([(a, b), (256, c)], pattern=WS)
    assert pieces(tok, tok.encode("ab")) == [b"ab"]
    assert pieces(tok, tok.encode("abc")) == [b"abc"]


def test_gpt2_byte_alphabet():
    assert BYTE_TO_CHAR[0x20] == "\u0120" and BYTE_TO_CHAR[0x0A] == "\u010a"
    assert len(set(BYTE_TO_CHAR)) == 256 and all(ch.isprintable() for ch in BYTE_TO_CHAR)
    assert chars_to_bytes(bytes_to_chars(bytes(range(256)))) == bytes(range(256))
    assert sorted(HF_BYTE_ORDER) == list(range(256)) and HF_BYTE_ORDER[0] == ord("!")


def test_patterns_split_digits_differently():
    assert PreTokenizer("gpt2").split("x = 12345") == ["x", " =", " 12345"]
    assert PreTokenizer("cl100k").split("x = 12345") == ["x", " =", " ", "123", "45"]


def test_chunks_never_merge_across_boundaries():
    tok = train_bpe([b"ab ab ab ab"], vocab_size=300, pattern="gpt2", num_workers=1)
    learned = [tok.token_bytes(i) for i in range(256, tok.n_mergeable)]
    assert learned == [b"ab", b" ab"]  # then nothing: never "b " or "ab ab"


def test_cjk_first_merges_assemble_characters():
    text = "日本語のテキストです。東京は日本の首都です。".encode() * 50
    tok = train_bpe([text], vocab_size=290, num_workers=1)
    learned = [tok.token_bytes(i) for i in range(256, tok.n_mergeable)]
    # the first merge joins the 2 leading bytes of a 3-byte character
    assert len(learned[0]) == 2 and learned[0][0] >= 0xE0
    # a few merges later whole characters exist
    assert any(len(t) == 3 and t.decode("utf-8", "strict") for t in learned if _valid_utf8(t))


def _valid_utf8(t: bytes) -> bool:
    try:
        t.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_special_tokens_longest_first_before_bpe():
    tok = Tokenizer([], pattern=WS, special_tokens=["<a>", "<a><b>"])
    a_id, ab_id = tok.special_tokens["<a>"], tok.special_tokens["<a><b>"]
    assert tok.encode("x<a><b>y<a>", allowed_special="all") == [ord("x"), ab_id, ord("y"), a_id]
    assert tok.encode("<a>", allowed_special={"<a>"}) == [a_id]
    # only the allowed one is matched; the other is ordinary text when not disallowed
    assert tok.encode("<a><b>", allowed_special={"<a>"}, disallowed_special=()) == [a_id, *b"<b>"]


def test_disallowed_special_error_names_token_and_fixes():
    tok = Tokenizer([], special_tokens=SPECIALS)
    with pytest.raises(ValueError) as e:
        tok.encode("hello <|endoftext|> world")
    msg = str(e.value)
    assert "'<|endoftext|>'" in msg and "allowed_special" in msg and "disallowed_special=()" in msg
    with pytest.raises(ValueError, match="fim"):
        tok.encode("<|fim|>", allowed_special={"<|endoftext|>"})
    with pytest.raises(ValueError, match="not special tokens"):
        tok.encode("x", allowed_special={"<|nope|>"})
    # bytes input is checked the same way
    with pytest.raises(ValueError, match="endoftext"):
        tok.encode(b"\xff<|endoftext|>")


def test_added_tokens_are_matched_and_allowed_by_default():
    tok = Tokenizer([(a, b)], pattern="cl100k", special_tokens=["<|eot|>"])
    n = tok.n_vocab
    ids = tok.add_tokens(["hello world", "ab", "<|eot|>"])
    assert ids == [n, 256, tok.special_tokens["<|eot|>"]]  # new, existing mergeable, existing special
    assert tok.n_vocab == n + 1
    assert tok.encode("say hello world!") == [*b"say ", n, ord("!")]
    assert tok.encode_ordinary("hello worlds") == [n, ord("s")]
    assert tok.add_tokens(["hello world"]) == [n]
    assert tok.decode_bytes([n]) == b"hello world"


def test_counting_the_vocabulary():
    tok = Tokenizer([(a, b), (256, c)], special_tokens=SPECIALS)
    assert tok.n_mergeable == 258 and tok.n_vocab == 260
    tok.add_tokens(["zzz"])
    assert tok.n_vocab == 261 and tok.token_bytes(260) == b"zzz"
    t = train_bpe([b"abcabc abcab"] * 5, vocab_size=262, special_tokens=SPECIALS, num_workers=1)
    assert t.n_vocab == 262 and len(t.merges) == 262 - 256 - 2
    assert sorted(t.special_tokens.values()) == [260, 261]


def test_incremental_decoder_holds_back_incomplete_utf8():
    tok = Tokenizer([])
    ids = tok.encode("a€b")  # € is 3 bytes
    dec = tok.incremental_decoder()
    assert [dec.decode([i]) for i in ids] == ["a", "", "", "€", "b"]
    assert dec.flush() == ""
    dec = tok.incremental_decoder()
    assert dec.decode(ids[:2]) == "a" and dec.flush() == "\ufffd"
    assert tok.decode(ids[:2]) == "a\ufffd"  # plain decode is lossy
    assert tok.decode_bytes(ids[:2]) == b"a\xe2"  # decode_bytes is exact


def test_extend_embeddings_mean_of_old_pieces():
    old = Tokenizer([(a, b)], pattern=WS)
    new = Tokenizer([(a, b)], pattern=WS, special_tokens=["<s>"])
    new_ids = new.add_tokens(["abc"])
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(old.n_vocab, 4)).astype(np.float32)
    out = extend_embeddings(old, new, emb, pad_to_multiple=8)
    assert out.shape == (264, 4) and out.dtype == np.float32
    np.testing.assert_array_equal(out[: old.n_vocab], emb)
    np.testing.assert_allclose(out[new_ids[0]], (emb[256] + emb[c]) / 2, rtol=1e-6)  # "abc" -> [ab, c]
    s = new.special_tokens["<s>"]
    # a float32 mean of 3 rows (numpy's SIMD kernels may sum in another order per ISA): an atol for means near
    # 0
    np.testing.assert_allclose(out[s], emb[[ord("<"), ord("s"), ord(">")]].mean(0), rtol=1e-6, atol=1e-7)
    assert not out[new.n_vocab :].any()
    with pytest.raises(ValueError, match="rows"):
        extend_embeddings(old, new, emb[:10])


# -- properties -----------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_decode_bytes_encode_roundtrip_any_bytes(sample_tok, data):
    assert sample_tok.decode_bytes(sample_tok.encode(data)) == data
    assert sample_tok.decode_bytes(sample_tok.encode_ordinary(data)) == data


texts_with_specials = st.lists(st.one_of(st.text(max_size=20), st.sampled_from(SPECIALS)), max_size=6).map(
    "".join
)


@settings(max_examples=150, deadline=None)
@given(texts_with_specials)
def test_encode_ordinary_equals_encode_with_no_disallowed(sample_tok, text):
    ids = sample_tok.encode_ordinary(text)
    assert ids == sample_tok.encode(text, disallowed_special=())
    special_ids = set(sample_tok.special_tokens.values())
    assert not special_ids & set(ids)  # ordinary text never becomes a special token
    assert sample_tok.decode(ids) == text


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_special_tokens_never_from_ordinary_text(sample_tok, text):
    ids = (
        sample_tok.encode(text) if not any(s in text for s in SPECIALS) else sample_tok.encode_ordinary(text)
    )
    assert not set(sample_tok.special_tokens.values()) & set(ids)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.text(max_size=300), st.binary(max_size=200).map(lambda b: b.decode("utf-8", "surrogateescape"))
    )
)
def test_fast_pretokenizer_equals_regex_module(text):
    for name in PATTERNS:
        assert PreTokenizer(name).split(text) == PreTokenizer(name, fast=False).split(text)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.binary(min_size=1, max_size=8), st.integers(1, 5), max_size=12),
    st.integers(0, 20),
)
def test_trainer_equals_naive_recounting(words, n_merges):
    expected = naive_train(words, n_merges, tie="hf")
    got = learn_merges(words, n_merges)
    tok = Tokenizer(got)
    assert [(tok.token_bytes(x), tok.token_bytes(y)) for x, y in got] == expected


def test_parallel_counting_equals_serial():
    docs = stdlib_sample(200_000)
    assert count_chunks(docs, num_workers=2, block_bytes=50_000) == count_chunks(docs, num_workers=1)
    assert balanced_shards([5, 5, 5, 5], 2) == [(0, 2), (2, 4)]
    assert balanced_shards([], 3) == []


def test_encode_batch_and_documents(sample_tok):
    docs = stdlib_sample(1_200_000, skip=5)  # large enough for the process pool
    ids, counts = sample_tok.encode_documents(docs, num_workers=2)
    assert ids.dtype == np.int32 and counts.sum() == len(ids) and len(counts) == len(docs)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    for i in range(len(docs)):
        assert ids[offsets[i] : offsets[i + 1]].tolist() == sample_tok.encode_ordinary(docs[i])
    batch = sample_tok.encode_batch(docs, num_workers=2)
    assert [len(x) for x in batch] == counts.tolist()
    assert (
        sample_tok.encode_batch(["a<|fim|>"], allowed_special="all")[0][-1]
        == sample_tok.special_tokens["<|fim|>"]
    )


def test_long_single_character_runs(sample_tok):
    for ch in ["a", " ", "\n", "1", "!", "é", "日"]:
        text = ch * 20_000
        ids = sample_tok.encode(text)
        assert sample_tok.decode(ids) == text
        # the heap merger for long chunks agrees with the simple one
        piece = text.encode()[:600]
        assert (
            FastEncoder(sample_tok)._bpe_long(piece)
            == _simple_bpe(sample_tok, piece)
            == sample_tok.bpe(piece)
        )


def _simple_bpe(tok: Tokenizer, piece: bytes) -> tuple[int, ...]:
    ids = list(piece)
    ranks = {m: r for r, m in reversed(list(enumerate(tok.merges)))}
    while len(ids) > 1:
        cands = [(ranks[p], i) for i, p in enumerate(zip(ids, ids[1:])) if p in ranks]
        if not cands:
            break
        r, i = min(cands)
        ids[i : i + 2] = [tok.merge_results[r]]
    return tuple(ids)


def test_a_merge_that_remakes_a_token_applies_one_occurrence_at_a_time():
    """merges [b+c, a+b, ab+c, abc+a, a+bc]: the last re-makes "abc". In "abcabc", b+c merges
    twice first, leaving [a, bc, a, bc]; one merge of a+bc makes "abc", and abc+a (rank 3, below
    a+bc's 4) then takes the next "a": [abca, bc]. Merging both a+bc at once would give [abc, abc]."""
    tok = Tokenizer([(b, c), (a, b), (257, c), (258, a), (a, 256)], pattern=WS)
    assert pieces(tok, tok.encode("abcabc")) == [b"abca", b"bc"]
    fast = FastEncoder(tok)
    fast._prepare()
    assert (
        fast._bpe(b"abcabc")
        == fast._bpe_long(b"abcabc")
        == fast._bpe_vectorized([b"abcabc"])[0]
        == tok.bpe(b"abcabc")
    )


@st.composite
def _merge_lists(draw):
    """Random merge lists over a 3-letter alphabet, so that different pairs often spell the same
    bytes (merges that re-make an older token) and repeated pairs occur."""
    n_ids, merges = 256, []
    for _ in range(draw(st.integers(1, 14))):
        left = draw(st.sampled_from([97, 98, 99, *range(256, n_ids)]))
        right = draw(st.sampled_from([97, 98, 99, *range(256, n_ids)]))
        merges.append((left, right))
        n_ids = Tokenizer(merges).n_mergeable
    return merges


@settings(max_examples=300, deadline=None)
@given(
    _merge_lists(),
    st.lists(
        st.binary(min_size=1, max_size=40).map(lambda b: bytes(97 + x % 3 for x in b)), min_size=1, max_size=6
    ),
)
def test_reference_bpe_equals_one_merge_at_a_time_and_the_fast_mergers(merges, chunks):
    """Tokenizer.bpe (every occurrence of a new token's pair per pass) against a plain loop that
    merges one leftmost occurrence at a time, and the fast path's mergers, on random merge lists."""
    tok = Tokenizer(merges)
    fast = FastEncoder(tok)
    fast._prepare()
    want = [_simple_bpe(tok, c) for c in chunks]
    assert [tok.bpe(c) for c in chunks] == want
    assert [fast._bpe(c) for c in chunks] == want == [fast._bpe_long(c) for c in chunks]
    assert fast._bpe_vectorized([c for c in chunks if len(c) > 1]) == [
        w for c, w in zip(chunks, want) if len(c) > 1
    ]


@settings(max_examples=120, deadline=None)
@given(
    _merge_lists(),
    st.sampled_from(["cl100k", "gpt2"]),
    st.lists(
        st.one_of(
            st.text(alphabet="abc \n'1.é", max_size=30),
            st.binary(max_size=20).map(lambda b: bytes(97 + x % 3 for x in b)),
        ),
        max_size=6,
    ),
)
def test_fast_documents_path_equals_the_reference_on_random_merge_lists(merges, pattern, docs):
    """Tokenizer.encode_documents (the fast path: numpy split and packed keys for ASCII documents
    under cl100k, the whole-token shortcut, the vectorized merger) against encode_ordinary (the
    reference) on every document, for random merge lists, merges that re-make a token included."""
    tok = Tokenizer(merges, pattern=pattern)
    ids, counts = tok.encode_documents(docs, num_workers=1)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    assert [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(docs))] == [
        tok.encode_ordinary(d) for d in docs
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(min_size=2, max_size=64),
            st.sampled_from(
                [b" " * 3, b" " * 7, b"=" * 7, b"-" * 9, b"#" * 5, b"\n" * 3, b"aaaaaaa", b"0000000"]
            ),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_vectorized_bpe_equals_simple_bpe(sample_tok, pieces):
    """The numpy merger (all new chunks at once, one merge per chunk per round) against a plain
    per-chunk loop over the merge list, on random byte strings and repeated-pair runs."""
    fast = FastEncoder(sample_tok)
    fast._prepare()
    assert (
        fast._bpe_vectorized(pieces)
        == [_simple_bpe(sample_tok, p) for p in pieces]
        == [sample_tok.bpe(p) for p in pieces]
    )


# the characters whose neighbours decide cl100k's boundaries, and a few of everything else
_ASCII_PIECES = [
    *"'sStTrReEvVmMlLdDx01(.:_ \t\n\r\x0b\x0c\x00\x1c",
    *["'s", "'T", "'re", "'Ve", "'m", "'ll", "'D", "'r", "'l", "ab", "1234", "((", "  ", "\r\n", " \n "],
]
_ASCII_CASES = st.lists(st.sampled_from(_ASCII_PIECES), max_size=25).map("".join)
_ASCII_TEXT = st.one_of(_ASCII_CASES, st.text(alphabet=st.characters(max_codepoint=127), max_size=60))


@settings(max_examples=300, deadline=None)
@given(st.lists(_ASCII_TEXT, max_size=5))
def test_vectorized_ascii_split_equals_regex_module(texts):
    """The numpy cl100k split of ASCII documents, concatenated, against the pattern itself
    (the regex module) run on each document."""
    data = "".join(texts).encode()
    sizes = [len(t) for t in texts]
    doc_starts = np.cumsum([0, *sizes])[:-1] if texts else np.zeros(1, np.int64)
    starts = cl100k_starts(np.frombuffer(data, np.uint8), doc_starts)
    got = [data[a:b].decode() for a, b in zip(starts.tolist(), [*starts[1:].tolist(), len(data)])]
    assert got == [c for t in texts for c in PreTokenizer("cl100k", fast=False).split(t)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**63, 2**64 - 1])), max_size=300)
)
def test_factorize_equals_numpy_unique(values):
    keys = np.array(values, np.uint64)
    uniq, index = factorize(keys)
    want_uniq, want_index = np.unique(keys, return_inverse=True)
    assert uniq.tolist() == want_uniq.tolist() and index.tolist() == want_index.reshape(-1).tolist()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.binary(min_size=1, max_size=8).map(lambda b: bytes(x & 0x7F for x in b)), min_size=1, max_size=50
    )
)
def test_packed_chunk_keys_are_exact(chunks):
    data = b"".join(chunks) + bytes(7)
    lens = np.array([len(c) for c in chunks])
    keys = pack_chunks(data, np.cumsum(lens) - lens, lens).tolist()
    assert [unpack_chunk(k) for k in keys] == chunks
    assert len(set(keys)) == len(set(chunks))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([b"x" * 9, b"x" * 16, b"x" * 17, b"\x00" * 12]),
            st.binary(min_size=1, max_size=32).map(lambda b: bytes(x & 0x7F for x in b)),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_numbered_chunks_are_equal_exactly_when_bytes_are(chunks):
    data = b"".join(chunks) + bytes(32)
    lens = np.array([len(c) for c in chunks])
    number, example = number_chunks(data, np.cumsum(lens) - lens, lens)
    assert all(
        (number[i] == number[j]) == (chunks[i] == chunks[j])
        for i in range(len(chunks))
        for j in range(len(chunks))
    )
    assert [chunks[example[k]] for k in number] == chunks


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(_ASCII_TEXT, st.text(max_size=40), st.binary(max_size=30)), max_size=8))
def test_encode_documents_equals_encode_ordinary(sample_tok, docs):
    """encode_documents (ASCII documents through the numpy split and packed keys, the rest through
    the regex) gives each document exactly what encode_ordinary gives it."""
    ids, counts = sample_tok.encode_documents(docs, num_workers=1)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    assert [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(docs))] == [
        sample_tok.encode_ordinary(d) for d in docs
    ]


# -- bad input ------------------------------------------------------------------------------------
def test_bad_input_raises_clear_value_errors():
    with pytest.raises(ValueError, match=r"vocab_size 257 is below 256 byte tokens \+ 2 special"):
        train_bpe([b"abc"], vocab_size=257, special_tokens=SPECIALS)
    with pytest.raises(ValueError, match="does not compile"):
        train_bpe([b"abc"], vocab_size=300, pattern="([a-z")
    with pytest.raises(ValueError, match="does not compile"):
        Tokenizer([], pattern="(?P<x")
    with pytest.raises(ValueError, match="empty"):
        train_bpe([], vocab_size=300)
    with pytest.raises(ValueError, match="empty"):
        train_bpe([b"", b""], vocab_size=300)
    with pytest.raises(ValueError, match="non-empty string"):
        train_bpe([b"abc"], vocab_size=300, special_tokens=[""])
    with pytest.raises(ValueError, match="twice"):
        Tokenizer([], special_tokens=["<s>", "<s>"])
    with pytest.raises(TypeError, match="bytes"):
        train_bpe(["text, not bytes"], vocab_size=300)
    with pytest.raises(ValueError, match="does not exist yet"):
        Tokenizer([(256, 97)])
    tok = Tokenizer([(a, b)])
    for bad in ([257], [-1], [0, 10**9]):
        with pytest.raises(ValueError, match="unknown token id"):
            tok.decode_bytes(bad)
    with pytest.raises(ValueError, match="unknown token id"):
        tok.token_bytes(999)
    with pytest.raises(ValueError, match="integers"):
        tok.decode_bytes([1.5])


def test_custom_pattern_gaps_and_groups_keep_every_byte():
    for pat in [r"[a-z]+", r"([a-z])+", r"x*"]:
        tok = Tokenizer([(a, b)], pattern=pat)
        text = "ab, cd AB x\n"
        assert tok.decode(tok.encode(text)) == text


# -- files ----------------------------------------------------------------------------------------
def test_save_load_roundtrip(tmp_path, sample_tok):
    tok = Tokenizer(sample_tok.merges, pattern="gpt2", special_tokens=SPECIALS)
    tok.add_tokens(["hello world", "def"])
    tok.save(tmp_path / "tok")
    back = load_tokenizer(tmp_path / "tok")
    assert back.fingerprint == tok.fingerprint and back.n_vocab == tok.n_vocab
    text = "def hello world():\n    return 12345 <|fim|>"
    assert back.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all")
    names = sorted(p.name for p in (tmp_path / "tok").iterdir())
    assert names == ["bytelm_bpe.json", "ranks.tiktoken", "tokenizer.json", "vocab.txt"]
    assert "made by merge rank" in (tmp_path / "tok" / "vocab.txt").read_text()
    # saving again over an existing directory works and keeps it loadable
    back.save(tmp_path / "tok")
    assert load_tokenizer(tmp_path / "tok") == tok


def test_fingerprint_depends_on_what_changes_ids(sample_tok):
    base = Tokenizer(sample_tok.merges[:50])
    assert base.fingerprint == Tokenizer(sample_tok.merges[:50]).fingerprint
    assert len(base.fingerprint) == 64
    others = [
        Tokenizer(sample_tok.merges[:49]),
        Tokenizer(sample_tok.merges[:50], pattern="gpt2"),
        Tokenizer(sample_tok.merges[:50], special_tokens=["<s>"]),
        Tokenizer(sample_tok.merges[:50], added_tokens=["zz"]),
    ]
    assert len({base.fingerprint, *(t.fingerprint for t in others)}) == 5


def test_corrupted_files_give_clear_errors(tmp_path, sample_tok):
    d = tmp_path / "tok"
    sample_tok.save(d)
    native = d / "bytelm_bpe.json"
    good = native.read_text()
    native.write_text(good[: len(good) // 2])
    with pytest.raises(ValueError, match=r"bytelm_bpe\.json.*truncated or corrupted"):
        load_tokenizer(d)
    doc = json.loads(good)
    doc["merges"][3] = [doc["merges"][3][1], doc["merges"][3][0]]
    native.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="fingerprint mismatch"):
        load_tokenizer(d)
    native.write_text(json.dumps({**json.loads(good), "version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        load_tokenizer(d)
    native.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="not UTF-8"):
        load_tokenizer(d)
    native.unlink()
    with pytest.raises(ValueError, match="bytelm_bpe.json is missing"):
        load_tokenizer(d)
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")


# -- stats and CLI ----------------------------------------------------------------------------------
@pytest.fixture
def lang_dir(tmp_path):
    files = {}
    for i in range(12):
        files[f"en/doc{i:02d}.txt"] = (f"The quick brown fox {i} jumps over the lazy dog.\n" * 20).encode()
        files[f"ja/doc{i:02d}.txt"] = (f"素早い茶色の狐{i}がのろまな犬を飛び越える。\n" * 20).encode()
    return write_files(tmp_path / "corpus", files)


def test_stats_token_tax(lang_dir):
    tok = train_bpe([b"The quick brown fox jumps over the lazy dog.\n" * 10], vocab_size=300, num_workers=1)
    stats = tokenizer_stats(tok, f"files:{lang_dir}", group_by="dir", num_workers=1)
    groups = {g.group: g for g in stats.groups}
    assert set(groups) == {"en", "ja"}
    ja, en = groups["ja"], groups["en"]
    assert ja.bytes == sum(len(p.read_bytes()) for p in (lang_dir / "ja").iterdir())
    corpus_files = sorted((lang_dir / "ja").iterdir())
    assert ja.tokens == sum(len(tok.encode(p.read_bytes())) for p in corpus_files)
    assert ja.tax(stats.overall) > 1.0 > en.tax(stats.overall)  # English-trained: Japanese pays
    assert stats.overall.bytes == en.bytes + ja.bytes and stats.overall.tokens == en.tokens + ja.tokens
    table = stats.format_table()
    assert "token tax" in table and "TOTAL" in table
    per_file = tokenizer_stats(tok, f"files:{lang_dir}", num_workers=1)
    assert len(per_file.groups) == 24


def test_cli_train_encode_decode_stats(tmp_path, lang_dir, capsys, monkeypatch):
    out = tmp_path / "tok"
    rc = cli.main(
        ["tokenizer", "train", "--data", f"files:{lang_dir}", "--vocab-size", "300", "--pattern", "gpt2",
         "--special", "<|endoftext|>", "--workers", "1", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    assert "fingerprint" in capsys.readouterr().out
    tok = load_tokenizer(out)
    assert tok.n_vocab == 300 and tok.pattern == PATTERNS["gpt2"]

    def run(argv, stdin: bytes):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        return cli.main(argv)

    data = "The quick 狐\n".encode() + b"\xff\xfe"
    assert run(["tokenizer", "encode", "--tokenizer", str(out)], data) == 0
    printed = capsys.readouterr().out
    ids = [int(x) for x in printed.split()]
    assert ids == tok.encode(data)
    # decode writes raw bytes (not valid UTF-8 here): read them through a binary buffer
    buf = io.BytesIO()
    stdout = io.TextIOWrapper(buf)
    with monkeypatch.context() as m:
        m.setattr(sys, "stdout", stdout)
        assert run(["tokenizer", "decode", "--tokenizer", str(out)], printed.encode()) == 0
    assert buf.getvalue() == data

    assert run(["tokenizer", "encode", "--tokenizer", str(out)], b"x<|endoftext|>") == 2
    assert "--allow-special" in capsys.readouterr().err
    assert run(["tokenizer", "encode", "--tokenizer", str(out), "--allow-special"], b"x<|endoftext|>") == 0
    assert capsys.readouterr().out.split()[-1] == str(tok.special_tokens["<|endoftext|>"])
    assert run(["tokenizer", "decode", "--tokenizer", str(out)], b"1 2 99999") == 2
    assert "unknown token id 99999" in capsys.readouterr().err
    assert run(["tokenizer", "decode", "--tokenizer", str(out)], b"1 x") == 2
    assert "integer token ids" in capsys.readouterr().err

    json_path = tmp_path / "stats.json"
    assert cli.main(["tokenizer", "stats", "--tokenizer", str(out), "--data", f"files:{lang_dir}",
                     "--group-by", "dir", "--workers", "1", "--json", str(json_path)]) == 0  # fmt: skip
    table = capsys.readouterr().out
    assert "token tax" in table and "ja" in table and "en" in table
    assert {g["group"] for g in json.loads(json_path.read_text())["groups"]} == {"en", "ja"}


def test_cli_errors_exit_2(tmp_path, lang_dir, capsys, monkeypatch):
    missing = tmp_path / "missing"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"abc")))
    assert cli.main(["tokenizer", "encode", "--tokenizer", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bytelm: error:") and str(missing) in err and len(err.strip().splitlines()) == 1
    assert cli.main(["tokenizer", "stats", "--tokenizer", str(missing), "--data", f"files:{lang_dir}"]) == 2
    capsys.readouterr()
    argv = [
        "tokenizer",
        "train",
        "--data",
        f"files:{lang_dir}",
        "--out",
        str(tmp_path / "t"),
        "--workers",
        "1",
    ]
    assert cli.main([*argv, "--vocab-size", "100"]) == 2
    assert "below 256" in capsys.readouterr().err
    assert cli.main([*argv, "--vocab-size", "300", "--pattern", "(["]) == 2
    assert "does not compile" in capsys.readouterr().err
    assert cli.main([*argv, "--vocab-size", "300", "--workers", "0"]) == 2
