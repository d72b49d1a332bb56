"""Importing the tokenizer people already have: a tiktoken rank file (with its split pattern) becomes
a tokenizer directory whose ids are tiktoken's, on stdlib files, multilingual and random text; the
subword LM's pieces (load_tokenizer, encode_documents, per-token bytes) work on it; bad files are
refused naming the line or the byte."""

from __future__ import annotations

import base64
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bpe import stdlib_sample
from test_bpe_parity import MULTILINGUAL

from bytelm.baselines import load_tokenizer
from bytelm.baselines.bpe import PATTERNS, train_bpe
from bytelm.baselines.imported import ImportedTokenizer, import_tiktoken, merges_from_ranks
from bytelm.errors import UserError

tiktoken = pytest.importorskip("tiktoken")
import tiktoken.load  # noqa: E402, F811


def write_ranks(path, ranks: dict[bytes, int]) -> None:
    path.write_text(
        "".join(
            f"{base64.b64encode(t).decode()} {r}\n" for t, r in sorted(ranks.items(), key=lambda kv: kv[1])
        )
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Rank files from our BPE (trained here, exported as ranks.tiktoken): as written (ranks = our ids)
    and with the single bytes' ranks reversed (so that the id map is not the identity)."""
    d = tmp_path_factory.mktemp("bpe")
    train_bpe(stdlib_sample(200_000), vocab_size=1200, pattern="cl100k", num_workers=1).save(d)
    ranks = tiktoken.load.load_tiktoken_bpe(str(d / "ranks.tiktoken"))
    shuffled = {t: (255 - t[0] if len(t) == 1 else r) for t, r in ranks.items()}
    write_ranks(d / "shuffled.tiktoken", shuffled)
    out = {}
    for name, path, table in (
        ("ours", d / "ranks.tiktoken", ranks),
        ("shuffled", d / "shuffled.tiktoken", shuffled),
    ):
        target = tmp_path_factory.mktemp(name)
        import_tiktoken(path, pattern="cl100k").save(target, source_file=path)
        enc = tiktoken.Encoding(name, pat_str=PATTERNS["cl100k"], mergeable_ranks=table, special_tokens={})
        out[name] = (load_tokenizer(target), enc)
    return out


def check(sources, text: str) -> None:
    for tok, enc in sources.values():
        ids = tok.encode_ordinary(text)
        assert ids == enc.encode_ordinary(text), text[:80]
        assert tok.decode_bytes(ids) == text.encode()
        assert tok.encode_documents([text], num_workers=1)[0].tolist() == ids
        assert sum(tok.encode_ordinary_with_bytes(text)[1]) == len(text.encode())


def test_ids_identical_to_tiktoken_on_stdlib_files(sources):
    for doc in stdlib_sample(150_000, skip=40):
        check(sources, doc.decode())


def test_ids_identical_to_tiktoken_on_multilingual_text(sources):
    for text in MULTILINGUAL:
        check(sources, text)


@settings(max_examples=150, deadline=None)
@given(st.text(st.characters(max_codepoint=0xFFFF, blacklist_categories=("Cs",)), max_size=80))
def test_ids_identical_to_tiktoken_on_random_text(sources, text):
    check(sources, text)


def test_the_imported_directory_reads_back_with_its_id_map(sources):
    tok, enc = sources["shuffled"]
    assert isinstance(tok, ImportedTokenizer) and tok.kind == "bpe" and tok.n_vocab == enc.n_vocab
    assert tok.token_bytes(0) == b"\xff" and tok.encode_ordinary(b"\xff") == [0]
    assert [tok.token_bytes(i) for i in range(tok.n_vocab)] == [
        enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)
    ]
    assert sources["ours"][0].fingerprint != tok.fingerprint


def test_merges_come_from_the_ranks_below_each_token():
    ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256, b"abc": 257, b"bc": 258, b"abcbc": 259}
    merges, to_source = merges_from_ranks(ranks)
    assert merges == [(97, 98), (256, 99), (98, 99), (257, 258)]
    assert to_source == list(range(260))


def test_bad_rank_files_are_refused(tmp_path):
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("YQ== 0\nnot a line\n")
    with pytest.raises(UserError, match="line 2"):
        import_tiktoken(bad, pattern="cl100k")
    write_ranks(bad, {bytes([b]): b for b in range(255)})
    with pytest.raises(UserError, match="byte 0xff"):
        import_tiktoken(bad, pattern="cl100k")
    write_ranks(bad, {bytes([b]): b for b in range(256)} | {b"abc": 256})
    with pytest.raises(UserError, match="not one merge"):
        import_tiktoken(bad, pattern="cl100k")


def test_cli_imports_a_rank_file(sources, tmp_path):
    tok, _ = sources["ours"]
    ranks = tmp_path / "r.tiktoken"
    write_ranks(ranks, {tok.token_bytes(i): i for i in range(tok.n_vocab)})
    cmd = [sys.executable, "-m", "bytelm", "tokenizer", "import", str(ranks), "--out", str(tmp_path / "t")]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert load_tokenizer(tmp_path / "t") == tok
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode != 0 and "--force" in again.stderr
