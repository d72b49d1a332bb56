"""Preparing corpora at scale: the streamed, sharded format keeps every split, segment and
fingerprint of the format before it; a parallel build equals a serial one; record formats
(jsonl, jsonl.gz, jsonl.zst, parquet, datasets' save_to_disk) and their bad input."""

import gzip
import hashlib
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import text_dir_files, word_corpus, write_files
from hypothesis import given, settings
from hypothesis import strategies as st

from bytelm import cli
from bytelm.data import load_corpus
from bytelm.data.sources import StdlibSource, split_pieces
from bytelm.data.split import fingerprint_segments, is_heldout
from bytelm.errors import UserError


def stream_digest(corpus) -> str:
    return hashlib.sha256(np.asarray(corpus.train_stream, dtype=np.uint16).tobytes()).hexdigest()


def protocol1_segments(docs: list[bytes], segment_bytes: int, cap: int) -> list[bytes]:
    """Evaluation protocol 1: the held-out documents in order, cut until the cap is spent."""
    out, budget = [], cap
    for data in docs:
        for start in range(0, len(data), segment_bytes):
            if budget <= 0:
                return out
            out.append(data[start : start + min(segment_bytes, budget)])
            budget -= len(out[-1])
    return out


def _unit(text: str) -> float:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") / 2.0**64


def protocol2_segments(docs: list[tuple[str, str, bytes]], seed: int, S: int, cap: int) -> list[bytes]:
    """Evaluation protocol 2 transcribed from docs/evaluation.md as plain loops: ``docs`` are the
    held-out documents ``(name, group, bytes)`` in canonical order."""
    docs = [d for d in docs if d[2]]
    by_group: dict[str, list[int]] = {}
    for i, (name, group, _) in enumerate(docs):
        by_group.setdefault(group, []).append(i)
    key = {}
    for group, members in by_group.items():
        members = sorted(members, key=lambda i: _unit(f"{seed}\0eval-doc\0{docs[i][0]}"))
        v = _unit(f"{seed}\0eval-group\0{group}")
        for j, i in enumerate(members):
            key[i] = ((j + v) / len(members), _unit(f"{seed}\0eval-doc\0{docs[i][0]}"))
    order = sorted(range(len(docs)), key=lambda i: key[i])
    slots = [-(-len(d[2]) // S) for d in docs]

    def cost(i, k):
        return len(docs[i][2]) if k >= slots[i] else k * S

    k, spent = [0] * len(docs), 0
    while any(k[i] < slots[i] for i in order):
        open_ = [i for i in order if k[i] < slots[i]]
        whole = sum(cost(i, k[i] + 1) - cost(i, k[i]) for i in open_)
        if spent + whole <= cap:
            for i in open_:
                k[i] += 1
            spent += whole
            continue
        for i in open_:
            c = cost(i, k[i] + 1) - cost(i, k[i])
            if spent + c > cap:
                break
            k[i] += 1
            spent += c
        break
    if not any(k):
        return [docs[order[0]][2][:cap]]
    out = []
    for i, (_, _, data) in enumerate(docs):
        for j in range(k[i]):
            start = (j * slots[i] // k[i]) * S
            out.append(data[start : start + S])
    return out


# (fingerprint, documents, bytes, sha256 of the training ids as uint16, their number): the fingerprints
# by evaluation protocol 1 (protocol1_segments); computed with the format before this one (a uint16
# copy of the training stream, a JSON manifest), commit c4a5886
GOLDEN = {
    ("wc", "", ()): (
        "26c996c8dfcd34c9e87ddfb0ec009b42f97b863643dd0dfe1b54372d50d6b229",
        60,
        67234,
        "533aa2588d8d9d1618d8f65134e4f092bfeb471a4c34a287a7743e45b18c4e2e",
        66223,
    ),
    ("wc", "", (("validation_fraction", 0.1), ("segment_bytes", 64), ("max_eval_bytes", 4096))): (
        "9699377f49361355e3697008451616c1784804fcaccefbaa6b63a7462a0b0c83",
        60,
        67234,
        "9b6617275f028cbc61a34237e076e6a2cd81b1ea95ffb76076b05b67df9fee30",
        59499,
    ),
    ("td", "?split=line", (("segment_bytes", 100),)): (
        "aacf8a7d67de5c9da05384cd9c77536978e1108f2b458b04be726d20f492e8d2",
        440,
        28870,
        "dc6c4eba03613e0243baaec2933338098571041f5317d7a53711d930de6b4242",
        28171,
    ),
    ("td", "?split=paragraph", (("heldout_fraction", 0.3),)): (
        "f53b0f9436452654aad8fb8a5a24fa96b2d4851130364f72b833504ab92a0650",
        40,
        29310,
        "fff56679f35e677d5d55043ee9e8a668461252409c5c8690b304e9fa372960e3",
        22819,
    ),
    ("td", "/en/*.txt", (("heldout_fraction", 0.2),)): (
        "7f3767ead009132f74b9e0c36219e3a9cc145e15c968e21cda9621008a013558",
        20,
        12125,
        "68e7ed8c7770c8cd8686525d703707604fc999645c6940c15a3e6561ada7ba86",
        8569,
    ),
}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    return {"wc": word_corpus(root / "wc", two_dirs=True), "td": write_files(root / "td", text_dir_files())}


@pytest.mark.parametrize("workers", [1, 3])
def test_fingerprints_and_training_ids_are_those_of_the_format_before(corpora, tmp_path, workers):
    for (which, suffix, kw), want in GOLDEN.items():
        c = load_corpus(
            f"files:{corpora[which]}{suffix}", cache_dir=tmp_path / "cache", workers=workers, **dict(kw)
        )
        held = [c.document(int(i)).tobytes() for i in c.document_indices("heldout")]
        v1 = fingerprint_segments(protocol1_segments(held, c.segment_bytes, c.max_eval_bytes), protocol=1)
        got = (v1, c.n_documents, c.n_bytes, stream_digest(c), len(c.train_stream))
        assert got == want, (which, suffix, kw, workers)
        named = [
            (c.names[int(i)], c.groups[int(i)], c.document(int(i)).tobytes())
            for i in c.document_indices("heldout")
        ]
        v2 = protocol2_segments(named, 0, c.segment_bytes, c.max_eval_bytes)
        assert c.fingerprint == fingerprint_segments(v2) and c.segment_data() == v2


def test_the_stdlib_fingerprint_is_the_one_its_documents_give(tmp_path):
    """The stdlib corpus, built with 2 workers, against the protocol computed here from its files."""
    c = load_corpus("stdlib", cache_dir=tmp_path / "cache", workers=2)
    docs = list(StdlibSource().documents())
    assert c.n_documents == len(docs) and list(c.names) == [d.name for d in docs]
    held = [(d.name, d.group, d.data) for d in docs if is_heldout(d.name, 0, 0.05)]
    assert c.fingerprint == fingerprint_segments(
        protocol2_segments(held, 0, c.segment_bytes, c.max_eval_bytes)
    )


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=400).map(lambda b: b.replace(b"a", b"\n").replace(b"b", b"\r")),
    size=st.integers(1, 50),
    mode=st.sampled_from(["line", "paragraph"]),
)
def test_split_pieces_read_in_chunks_equal_cutting_the_whole(data, size, mode):
    chunks = [data[i : i + size] for i in range(0, len(data), size)] or [b""]
    whole = data.split(b"\n") if mode == "line" else re.split(rb"(?:\r?\n){2,}", data)
    assert list(split_pieces(chunks, mode)) == [p for p in whole if p not in (b"", b"\r")]


# -- record formats -------------------------------------------------------------------------------------
TEXTS = ["first document", "zweites Dokument, ä ö ü", "третий", "", "line one\nline two", "🙂 five"]


def write_jsonl(path, texts, field="text", opener=open):
    with opener(path, "wb") as f:
        for t in texts:
            f.write(json.dumps({field: t, "id": 1}).encode() + b"\n")


def zst_open(path, mode):
    return zstandard.ZstdCompressor().stream_writer(open(path, mode), closefd=True)


def test_jsonl_gz_zst_and_parquet_give_one_document_per_record(tmp_path):
    d = tmp_path / "j"
    d.mkdir()
    write_jsonl(d / "a.jsonl", TEXTS[:2])
    write_jsonl(d / "b.jsonl.gz", TEXTS[2:4], opener=gzip.open)
    write_jsonl(d / "c.jsonl.zst", TEXTS[4:], opener=zst_open)
    c = load_corpus(f"jsonl:{d}", cache_dir=tmp_path / "cache", require_split=False)
    assert list(c.documents()) == [t.encode() for t in TEXTS]
    assert list(c.names) == [
        "a.jsonl#0",
        "a.jsonl#1",
        "b.jsonl.gz#0",
        "b.jsonl.gz#1",
        "c.jsonl.zst#0",
        "c.jsonl.zst#1",
    ]
    assert c.index["names"] == "group#k"
    parquet = tmp_path / "p.parquet"
    pq.write_table(pa.table({"body": TEXTS, "n": list(range(len(TEXTS)))}), parquet, row_group_size=2)
    p = load_corpus(f"parquet:{parquet}?field=body", cache_dir=tmp_path / "cache", require_split=False)
    assert list(p.documents()) == [t.encode() for t in TEXTS] and p.names[3] == "p.parquet#3"


def test_a_datasets_save_to_disk_directory(tmp_path):
    """The layout of datasets' save_to_disk (Arrow stream files listed in state.json, a
    dataset_dict.json over split folders), written here with pyarrow."""
    root = tmp_path / "ds"
    (root / "train").mkdir(parents=True)
    table = pa.table({"text": TEXTS})
    with pa.OSFile(str(root / "train" / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=4)
    (root / "train" / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    c = load_corpus(f"hf:{root}", cache_dir=tmp_path / "cache", require_split=False)
    assert list(c.documents()) == [t.encode() for t in TEXTS] and c.names[5] == "train/5"
    assert c.index["names"] == "group/k"
    with pytest.raises(UserError, match="has no split 'test'"):
        load_corpus(f"hf:{root}?split=test", cache_dir=tmp_path / "cache", require_split=False)


def test_bad_record_files_fail_in_one_line_naming_the_file_and_leave_no_cache(tmp_path, capsys):
    cases = []
    d = tmp_path / "nofield"
    d.mkdir()
    write_jsonl(d / "a.jsonl", ["x", "y"], field="content")
    cases.append((f"jsonl:{d}", r"a.jsonl line 1 has no field 'text' .*\?field=NAME"))
    d = tmp_path / "notjson"
    d.mkdir()
    (d / "a.jsonl").write_bytes(b'{"text": "ok"}\n{"text": \n')
    cases.append((f"jsonl:{d}", r"a.jsonl line 2 is not JSON"))
    d = tmp_path / "truncated"
    d.mkdir()
    write_jsonl(d / "a.jsonl.gz", ["x" * 1000] * 50, opener=gzip.open)
    data = (d / "a.jsonl.gz").read_bytes()
    (d / "a.jsonl.gz").write_bytes(data[: len(data) // 2])
    cases.append((f"jsonl:{d}", r"cannot read .*a.jsonl.gz .*corrupt or truncated"))
    d = tmp_path / "zst"
    d.mkdir()
    (d / "a.jsonl.zst").write_bytes(b"not zstd at all")
    cases.append((f"jsonl:{d}", r"a.jsonl.zst .*corrupt or truncated"))
    d = tmp_path / "mixed"
    d.mkdir()
    write_jsonl(d / "a.jsonl", ["x"])
    (d / "notes.txt").write_text("hello")
    cases.append((f"jsonl:{d}", r"notes.txt .* is not a jsonl file"))
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 garbage")
    cases.append((f"parquet:{tmp_path / 'bad.parquet'}", r"cannot read .*bad.parquet as parquet"))
    for spec, pattern in cases:
        with pytest.raises(UserError, match=pattern):
            load_corpus(spec, cache_dir=tmp_path / "cache", require_split=False)
        assert (
            cli.main(["data", "info", "--data", spec, "--set", f"data.cache_dir={tmp_path / 'cache'}"]) == 2
        )
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert list((tmp_path / "cache" / "corpora").iterdir()) == []  # nothing half-written


def test_a_parallel_build_of_record_files_equals_the_serial_one(tmp_path, capsys):
    d = tmp_path / "many"
    d.mkdir()
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "ε", "ζήτα"]
    for f in range(6):
        texts = [" ".join(rng.choice(words, size=rng.integers(1, 40))) for _ in range(30)]
        write_jsonl(d / f"part{f}.jsonl{'.zst' if f % 2 else ''}", texts, opener=zst_open if f % 2 else open)
    one = load_corpus(f"jsonl:{d}", cache_dir=tmp_path / "c1")
    assert (
        cli.main(["data", "prepare", "--data", f"jsonl:{d}", "--out", str(tmp_path / "c3"), "--workers", "3"])
        == 0
    )
    assert "3 worker(s)" in capsys.readouterr().out
    three = load_corpus(f"jsonl:{d}", cache_dir=tmp_path / "c3")
    assert three.fingerprint == one.fingerprint and list(three.documents()) == list(one.documents())
    assert stream_digest(three) == stream_digest(one) and list(three.names) == list(one.names)
    assert len(three.shards) == 3 and len(one.shards) == 1


NAMES = ["a", "a.c", "a-b", "b", "_x", "A", "a b", ".hid", "é"]  # ('.', '-', ' ' sort below '/')


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.lists(
            st.sampled_from(["a", "a.c", "a-b", "b", "_x", "A", "a b", ".hid", "é"]), min_size=1, max_size=3
        ),
        min_size=1,
        max_size=12,
    )
)
def test_a_directory_walked_without_its_listing_in_memory_is_listed_in_path_order(tmp_path_factory, paths):
    """The streamed walk lists a directory's files in the order of their relative paths (the order
    the split, the shards and the names depend on), skipping dot-names, as sorting the whole listing
    does; and a parallel build's runs of it concatenate to it."""
    from bytelm.data.sources.files import _file_runs, _Walk

    root = tmp_path_factory.mktemp("walk")
    for parts in paths:
        p = root.joinpath(*parts)
        if any(q.is_file() for q in [*p.parents, p] if q != root) or p.is_dir():
            continue  # (a name already used for a file or a directory)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(parts[-1].encode() * 3)
    expected = sorted(
        (
            q.relative_to(root).as_posix()
            for q in root.rglob("*")
            if q.is_file() and not any(part.startswith(".") for part in q.relative_to(root).parts)
        ),
    )
    walk = _Walk(str(root))
    assert [f[len(str(root)) + 1 :] for f in walk] == expected
    for n in (2, 3):
        runs = _file_runs(walk, n)
        assert [f for run in runs for f in run] == list(walk) and len(runs) <= n
