"""Importing the tokenizer people already have: a tiktoken rank file (with its split pattern) becomes
a tokenizer directory whose ids are tiktoken's, on stdlib files, multilingual and random text; the
subword LM's pieces (load_tokenizer, encode_documents, per-token bytes) work on it; bad files are
refused naming the line or the byte."""

from __future__ import annotations

import base64
import re
import subprocess
import sys

import pytest
from conftest import stable_text
from helpers import MULTILINGUAL, stdlib_sample
from hypothesis import given, settings

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
@given(stable_text(80))
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


@pytest.mark.slow
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
    native = tmp_path / "t" / "bytelm_imported.json"  # edited: refused, saying how to import it again
    native.write_text(native.read_text().replace('"fingerprint": "', '"fingerprint": "0'))
    with pytest.raises(
        UserError, match=r"fingerprint mismatch.*import it again: bytelm tokenizer import .*--force"
    ):
        load_tokenizer(tmp_path / "t")


# -- HF tokenizer.json ---------------------------------------------------------------------------
hf = pytest.importorskip("tokenizers")


def hf_corpus(tmp_path_factory) -> list[str]:
    """The repo's test corpora (word_corpus, text_dir_files), multilingual strings and a few edge cases."""
    from conftest import text_dir_files, word_corpus  # noqa: PLC0415

    root = word_corpus(tmp_path_factory.mktemp("words"), n_docs=20, words_per_doc=100)
    docs = [p.read_text() for p in sorted(root.glob("*.txt"))]
    docs += [b.decode() for b in text_dir_files().values()]
    edges = ["", " ", "  a", "a  ", "\u2581x \u2581", "##x #a don't"]
    # added tokens (ADDED, and each case's special tokens) at the start, inside words, overlapping
    added = ["<s>hello", "hello<s>world", "hello <s> world", "<s><s>x", "a<s>xs>", "shell world", "<s>",
             "<|endoftext|>[CLS]x<unk> y[SEP]", " <s>x <s> x\u2581<s>"]  # fmt: skip
    return docs + list(MULTILINGUAL) + edges + added


def hf_trained(kind: str, texts: list[str], **pre) -> "hf.Tokenizer":
    """An HF tokenizer trained by HF's own trainer (small vocabulary), paired as in the acceptance."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers  # noqa: PLC0415

    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(**pre)
        trainer = trainers.BpeTrainer(
            vocab_size=500,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=["<|endoftext|>"],
        )
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=1500, special_tokens=["[UNK]", "[CLS]", "[SEP]"])
    else:
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace(**pre)
        trainer = trainers.UnigramTrainer(vocab_size=1200, unk_token="<unk>", special_tokens=["<unk>"])
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens(["<s>", "<s>x", "s>"])  # leftmost-longest: "a<s>xs>" is a, <s>x, s>
    tok.add_tokens(
        [AddedToken("ell", normalized=True), AddedToken("llo", normalized=False)]
    )  # "hello": he, llo
    return tok


HF_CASES = {
    "bpe-bytelevel": ("bpe", {}),
    "bpe-bytelevel-no-prefix-space": ("bpe", {"add_prefix_space": False}),
    "bpe-bytelevel-no-regex": ("bpe", {"add_prefix_space": False, "use_regex": False}),
    "wordpiece-bert": ("wordpiece", {}),
    "unigram-metaspace": ("unigram", {}),
    "unigram-metaspace-never-nosplit": ("unigram", {"prepend_scheme": "never", "split": False}),
    "unigram-metaspace-first": ("unigram", {"prepend_scheme": "first"}),
}


HF_DIRS: dict = {}  # the imported directories, by case (filled by hf_sources)


@pytest.fixture(scope="module")
def hf_sources(tmp_path_factory):
    """Each case trained by HF, saved as tokenizer.json and imported with the CLI: (imported, HF, texts)."""
    texts = hf_corpus(tmp_path_factory)
    out = {}
    for name, (kind, pre) in HF_CASES.items():
        d = tmp_path_factory.mktemp(name)
        ref = hf_trained(kind, texts, **pre)
        ref.save(str(d / "tokenizer.json"))
        cmd = [
            sys.executable,
            "-m",
            "bytelm",
            "tokenizer",
            "import",
            str(d / "tokenizer.json"),
            "--out",
            str(d / "t"),
        ]
        run = subprocess.run(cmd, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        HF_DIRS[name] = d / "t"
        out[name] = (load_tokenizer(d / "t"), hf.Tokenizer.from_file(str(d / "tokenizer.json")), texts)
    return out


def check_hf(tok, ref, text: str) -> None:
    ids = tok.encode(text, allowed_special="all")
    assert ids == ref.encode(text, add_special_tokens=False).ids, text[:80]
    assert tok.encode_ordinary(text) == ids
    special = [s for s in tok.special_tokens if s in text]
    if special:  # the guard of every bytelm tokenizer: untrusted text cannot spell a control token
        with pytest.raises(ValueError, match="disallowed by default"):
            tok.encode(text)
    else:
        assert tok.encode(text) == ids
    got, nbytes = tok.encode_ordinary_with_bytes(text)
    assert got == ids and len(nbytes) == len(ids)
    if tok.lossy is None:
        assert tok.decode_bytes(ids) == text.encode() and sum(nbytes) == len(text.encode())


@pytest.mark.parametrize("name", list(HF_CASES))
@pytest.mark.slow
def test_ids_identical_to_hf_on_the_test_corpora(hf_sources, name):
    tok, ref, texts = hf_sources[name]
    assert isinstance(tok, ImportedTokenizer) and tok.source_kind == "tokenizer.json"
    for text in texts:
        check_hf(tok, ref, text)
    ids, counts = tok.encode_documents(texts, num_workers=1)
    assert ids.tolist() == [i for t in texts for i in ref.encode(t, add_special_tokens=False).ids]


@settings(max_examples=100, deadline=None)
@given(stable_text(60))
def test_ids_identical_to_hf_on_random_text(hf_sources, text):
    for tok, ref, _ in hf_sources.values():
        check_hf(tok, ref, text)


def test_added_token_ids_and_bytes_are_hfs(hf_sources, tmp_path):
    """Added-token ids as HF gives them on load, whatever the file's "id" says (a model string takes
    the model's id, others number on from the model's size in file order, a repeat keeps its first);
    an added token that is a model token with other bytes ("é" is byte 0xE9 in a ByteLevel vocabulary)
    makes the import lossy, its occurrences still charged with their own bytes; [UNK] stands for no
    bytes."""
    import json  # noqa: PLC0415

    from bytelm.baselines.imported import import_tokenizer_json  # noqa: PLC0415

    ref = hf_sources["bpe-bytelevel-no-prefix-space"][1]
    doc = json.loads(ref.to_str())
    n = len(doc["model"]["vocab"])

    def added(content: str, i: int, special: bool = True, normalized: bool = False) -> dict:
        return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": normalized, "special": special}  # fmt: skip

    text = "<|endoftext|>x<X><Y><A><B>the<C> the é"
    path = tmp_path / "tokenizer.json"
    for tokens in (
        [added("<|endoftext|>", n + 3), added("<X>", n + 50)],
        [added("<Y>", n + 1), added("<Y>", n + 2), added("<A>", n + 5), added("<B>", n + 1)],
        [added("<B>", 2), added("<A>", n + 5, special=False), added("the", 7, special=False),
         added("<C>", 0, normalized=True)],
    ):  # fmt: skip
        path.write_text(json.dumps({**doc, "added_tokens": tokens}))
        hf_ids = hf.Tokenizer.from_file(str(path)).encode(text, add_special_tokens=False).ids
        assert import_tokenizer_json(path).encode_ordinary(text) == hf_ids
    path.write_text(json.dumps({**doc, "added_tokens": [added("é", 0, special=False)]}))
    tok = import_tokenizer_json(path)
    assert tok.lossy is not None and "added token 'é'" in tok.lossy
    text = "非 é"  # U+975E is e9 9d 9e: byte 0xE9 is the added token's id too
    ids, nbytes = tok.encode_ordinary_with_bytes(text)
    assert ids == hf.Tokenizer.from_file(str(path)).encode(text, add_special_tokens=False).ids
    assert sum(nbytes) == len(text.encode())
    wordpiece = hf_sources["wordpiece-bert"][0]
    assert wordpiece.token_bytes(wordpiece.unk_id) == b""


def test_which_imports_are_byte_exact(hf_sources):
    """Only ByteLevel BPE without the prefix space is byte-exact; the others name the component.
    Metaspace charges every byte of the text to exactly one token (a prepended '▁' to none)."""
    lossy = {name: tok.lossy for name, (tok, _, _) in hf_sources.items()}
    assert lossy["bpe-bytelevel-no-prefix-space"] is None and lossy["bpe-bytelevel-no-regex"] is None
    assert "add_prefix_space" in lossy["bpe-bytelevel"]
    assert "BertPreTokenizer drops whitespace" in lossy["wordpiece-bert"]
    assert "Metaspace" in lossy["unigram-metaspace"]
    tok = hf_sources["unigram-metaspace"][0]
    for text in ("a b", " a", "x  \u2581y", "日本 語"):
        assert sum(tok.encode_ordinary_with_bytes(text)[1]) == len(text.encode())


@pytest.mark.slow
def test_bert_punctuation_is_hfs_on_every_code_point():
    from bytelm.baselines.hf_import import BERT_WHITESPACE, is_bert_punct  # noqa: PLC0415

    pre = hf.pre_tokenizers.BertPreTokenizer()
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        n = len(pre.pre_tokenize_str(f"a{chr(cp)}a"))
        assert (n == 3, n == 2) == (is_bert_punct(chr(cp)), chr(cp) in BERT_WHITESPACE), hex(cp)


def test_the_subword_lm_refuses_a_lossy_import(hf_sources):
    """model.tokenizer on a BertPreTokenizer or Metaspace import: refused naming the component; a
    byte-exact one loads."""
    from bytelm.config import load_config  # noqa: PLC0415
    from bytelm.families.bpe import TokenTask  # noqa: PLC0415

    for name, message in (("wordpiece-bert", "BertPreTokenizer drops"), ("unigram-metaspace", "Metaspace")):
        cfg = load_config(None, ["model.family=bpe", f"model.tokenizer={HF_DIRS[name]}"])
        with pytest.raises(UserError, match=f"{message}.*BPB would not be a likelihood"):
            TokenTask(cfg, None)
    exact = "bpe-bytelevel-no-prefix-space"
    cfg = load_config(None, ["model.family=bpe", f"model.tokenizer={HF_DIRS[exact]}"])
    assert TokenTask(cfg, None).n_vocab == hf_sources[exact][0].n_vocab


def test_bad_tokenizer_json_is_refused_naming_the_key(hf_sources, tmp_path):
    import json  # noqa: PLC0415

    from bytelm.baselines.imported import import_tokenizer_json  # noqa: PLC0415

    ref = hf_sources["wordpiece-bert"][1]
    doc = json.loads(ref.to_str())
    path = tmp_path / "tokenizer.json"
    cases = [
        ({"normalizer": {"type": "NFKC"}}, 'normalizer.type = "NFKC"'),
        ({"normalizer": {"type": "Lowercase"}}, 'normalizer.type = "Lowercase"'),
        (
            {"normalizer": {"type": "BertNormalizer", "clean_text": False, "handle_chinese_chars": False,
                            "strip_accents": None, "lowercase": True}},
            "normalizer.lowercase = true",
        ),
        ({"pre_tokenizer": {"type": "Whitespace"}}, 'pre_tokenizer.type = "Whitespace"'),
        ({"model": {**doc["model"], "continuing_subword_prefix": "@@"}}, "continuing_subword_prefix"),
        ({"model": {"type": "WordLevel"}}, "model.type = 'WordLevel'"),
        ({"truncation": {"max_length": 8}}, "truncation"),
        ({"added_tokens": [{**doc["added_tokens"][0], "lstrip": True}]}, "added_tokens[0].lstrip = true"),
        ({"added_tokens": [{**doc["added_tokens"][0], "single_word": True}]}, "added_tokens[0].single_word"),
        ({"added_tokens": [{"content": 3}]}, "added_tokens[0] = "),
    ]  # fmt: skip
    for change, message in cases:
        path.write_text(json.dumps({**doc, **change}))
        with pytest.raises(UserError, match=re.escape(message)):
            import_tokenizer_json(path)
    path.write_text('{"model": ')
    with pytest.raises(UserError, match="not valid JSON"):
        import_tokenizer_json(path)
    identity = {"type": "BertNormalizer", "clean_text": False, "handle_chinese_chars": False,
                "strip_accents": None, "lowercase": False}  # fmt: skip
    path.write_text(json.dumps({**doc, "normalizer": identity}))
    assert (
        import_tokenizer_json(path).encode("Hello, world")
        == ref.encode("Hello, world", add_special_tokens=False).ids
    )


# -- bytelm's own tokenizer.json -------------------------------------------------------------------
BYTELM_KINDS = ("bpe", "bpe-longest", "unigram", "unigram-longest", "wordpiece-byte", "wordpiece-char")


@pytest.fixture(scope="module")
def bytelm_round_trips(tmp_path_factory):
    """Each kind bytelm trains, saved by bytelm and imported back with the CLI: (original, imported)."""
    from conftest import text_dir_files  # noqa: PLC0415

    from bytelm import cli  # noqa: PLC0415
    from bytelm.baselines.unigram.trainer import train_unigram  # noqa: PLC0415
    from bytelm.baselines.wordpiece.trainer import train_wordpiece  # noqa: PLC0415

    docs = list(text_dir_files().values()) + [m.encode() for m in MULTILINGUAL]
    special = ["<|endoftext|>"]
    bpe = train_bpe(docs, vocab_size=400, pattern="gpt2", special_tokens=special)
    unigram = train_unigram(docs, vocab_size=400, special_tokens=special)
    originals = {
        "bpe": bpe,
        "bpe-longest": bpe.with_encoder("longest"),
        "unigram": unigram,
        "unigram-longest": unigram.with_encoder("longest"),
        "wordpiece-byte": train_wordpiece(docs, vocab_size=700, special_tokens=special),
        "wordpiece-char": train_wordpiece(docs, vocab_size=500, level="char", special_tokens=special),
    }
    out = {}
    for name, tok in originals.items():
        d = tmp_path_factory.mktemp(name)
        tok.save(d / "tok")
        assert (
            cli.main(["tokenizer", "import", str(d / "tok" / "tokenizer.json"), "--out", str(d / "imp")]) == 0
        )
        out[name] = (tok, load_tokenizer(d / "imp"), d / "tok" / "tokenizer.json")
    return out


def check_round_trip(original, imported, text: str) -> None:
    ids = original.encode(text, allowed_special="all")
    assert imported.encode(text, allowed_special="all") == ids, (text[:80], original)
    assert imported.decode_bytes(ids) == original.decode_bytes(ids)


def test_bytelm_tokenizer_json_imports_back_with_the_same_ids(bytelm_round_trips):
    """Every kind bytelm writes (BPE, Unigram, WordPiece byte- and char-level, longest match) is read
    back as the class it came from with identical ids, special tokens included, and HF agrees."""
    for name, (original, imported, _) in bytelm_round_trips.items():
        assert isinstance(imported, ImportedTokenizer) and imported.n_vocab == original.n_vocab, name
        assert imported.special_tokens == original.special_tokens and imported.lossy is None
        assert (imported.kind, imported.encoder) == (
            ("longest", "longest") if name.endswith("-longest") else (original.kind, original.encoder)
        )
        texts = list(MULTILINGUAL) + ["x<|endoftext|>the ## #a", "", "  \n\t", "日本語 don't"]
        ids, counts = imported.encode_documents(texts, num_workers=1)
        assert ids.tolist() == [i for t in texts for i in original.encode_ordinary(t)], name
        for text in texts:
            check_round_trip(original, imported, text)


@settings(max_examples=60, deadline=None)
@given(stable_text(60))
def test_bytelm_tokenizer_json_round_trip_on_random_text(bytelm_round_trips, text):
    for original, imported, _ in bytelm_round_trips.values():
        check_round_trip(original, imported, text)


def test_malformed_tokenizer_json_is_one_line_and_exit_2(bytelm_round_trips, tmp_path, capsys):
    """Missing keys, wrong types, bad merges, duplicate ids, an empty vocabulary, a Sequence bytelm does
    not write, a vocabulary out of bytelm's order: exit 2, one line naming the key, no traceback."""
    import json  # noqa: PLC0415

    from bytelm import cli  # noqa: PLC0415

    def written(name: str) -> dict:
        return json.loads(bytelm_round_trips[name][2].read_text())

    bpe = written("bpe")
    unigram = written("unigram")
    wordpiece = written("wordpiece-byte")
    model = bpe["model"]
    first = next(iter(model["vocab"]))
    cases = [
        ({"model": {"type": "BPE"}}, "model.vocab = null"),
        ({**bpe, "model": {**model, "vocab": []}}, "model.vocab = []"),
        ({**bpe, "model": {**model, "vocab": {}}}, "model.vocab = {}"),
        ({**bpe, "model": {**model, "vocab": {**model["vocab"], "xyz": model["vocab"][first]}}},
         'model.vocab["xyz"] = 0 is also the id of'),
        ({**bpe, "model": {**model, "vocab": {**model["vocab"], first: "7"}}},
         "is not a non-negative integer id"),
        ({**bpe, "model": {**model, "merges": "a b"}}, 'model.merges = "a b"'),
        ({**bpe, "model": {**model, "merges": ["a b c"]}}, 'model.merges[0] = "a b c"'),
        ({**bpe, "model": {**model, "merges": [["qq", "zz"]]}}, "joins tokens that are not in model.vocab"),
        ({**bpe, "model": {**model, "merges": [[1, 2]]}}, "model.merges[0] = [1, 2]"),
        ({**bpe, "pre_tokenizer": "ByteLevel"}, 'pre_tokenizer = "ByteLevel" is not an object'),
        ({**bpe, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}]}},
         "pre_tokenizer.pretokenizers[0]"),
        ({**bpe, "added_tokens": {"a": 1}}, "added_tokens = "),
        ({**unigram, "model": {**unigram["model"], "vocab": [["a", "x"]]}}, 'model.vocab[0] = ["a", "x"]'),
        ({**unigram, "model": {**unigram["model"], "vocab": unigram["model"]["vocab"][::-1]}},
         "does not start with the 256 bytes in order"),
        ({**unigram, "model": {**unigram["model"], "unk_id": 10**6}}, "model.unk_id = 1000000"),
        ({**wordpiece, "model": {**wordpiece["model"], "max_input_chars_per_word": "many"}},
         "model.max_input_chars_per_word"),
        ({**wordpiece, "pre_tokenizer": bpe["pre_tokenizer"]}, "does not go with a WordPiece model"),
    ]  # fmt: skip
    path = tmp_path / "tokenizer.json"
    for k, (doc, message) in enumerate(cases):
        path.write_text(json.dumps(doc))
        capsys.readouterr()
        code = cli.main(["tokenizer", "import", str(path), "--out", str(tmp_path / f"imp{k}")])
        err = capsys.readouterr().err.strip()
        assert code == 2 and "\n" not in err and "Traceback" not in err, (k, err)
        assert str(path) in err and message in err, (k, err)
        assert len(err) < 600, (k, err)
