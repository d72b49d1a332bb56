import builtins
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import write_files
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bytelm import cli
from bytelm.constants import BOS_ID, BYTE_OFFSET, EOS_ID
from bytelm.data import (
    WindowBatches,
    fingerprint_segments,
    is_heldout,
    is_validation,
    load_corpus,
    parse_source,
)
from bytelm.data import corpus as corpus_mod
from bytelm.data import prepare as prepare_mod
from bytelm.errors import UserError


def load(spec, tmp_path, **kw):
    return load_corpus(spec, cache_dir=tmp_path / "cache", **kw)


# -- sources ------------------------------------------------------------------------------
def test_directory_source_documents_and_groups(text_dir, tmp_path):
    c = load(f"files:{text_dir}", tmp_path)
    assert c.n_documents == 40
    assert c.names == sorted(c.names)
    assert c.names[0] == "de/doc00.txt" and c.groups[0] == "de/doc00.txt"
    raw = (text_dir / "en/doc03.txt").read_bytes()
    assert c.document(c.names.index("en/doc03.txt")).tobytes() == raw
    assert c.n_bytes == sum(p.stat().st_size for p in text_dir.rglob("*.txt"))


def test_glob_and_paragraph_and_line_split(tmp_path):
    root = write_files(
        tmp_path / "g",
        {"a.txt": b"one\n\ntwo\r\n\r\n\r\nthree\n", "b.md": b"x\ny\r\n\nz", ".hidden": b"h"},
    )
    docs = list(parse_source(f"files:{root}/*.txt?split=paragraph").documents())
    assert [(d.name, d.data) for d in docs] == [
        ("a.txt#0", b"one"),
        ("a.txt#1", b"two"),
        ("a.txt#2", b"three\n"),
    ]
    lines = list(parse_source(f"files:{root}?split=line").documents())
    assert [d.data for d in lines] == [b"one", b"two\r", b"three", b"x", b"y\r", b"z"]
    assert {d.group for d in lines} == {"a.txt", "b.md"}  # hidden files skipped in directories


def test_stdlib_source_lists_python_files():
    src = parse_source("stdlib")
    files = src.files()
    assert len(files) > 500
    assert all(f.suffix == ".py" and "site-packages" not in f.parts for f in files)


# -- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make_spec, pattern",
    [
        (lambda t: f"files:{t}/missing", r"no such file or directory: .*missing"),
        (lambda t: (t / "empty").mkdir() or f"files:{t}/empty", r"directory .*empty.* contains no files"),
        (lambda t: f"files:{t}/*.nothing", r"glob .*\*\.nothing.* matched no files"),
        (lambda t: "files:", r"names no path"),
        (lambda t: f"files:{t}?split=word", r"split='word'.*file, paragraph, line"),
        (lambda t: "s3://bucket", r"unknown data source"),
    ],
)
def test_bad_specs_raise_clear_errors(tmp_path, make_spec, pattern):
    with pytest.raises(UserError, match=pattern):
        load(make_spec(tmp_path), tmp_path)


def test_unreadable_file_is_named(tmp_path):
    root = write_files(tmp_path / "d", {"ok.txt": b"fine"})
    (root / "dangling.txt").symlink_to(root / "gone.txt")  # listed, but cannot be read (even by root)
    with pytest.raises(UserError, match=r"cannot read .*dangling.txt.*fix its permissions or remove it"):
        load(f"files:{root}", tmp_path)


def test_permission_denied_is_named(tmp_path, monkeypatch):
    root = write_files(tmp_path / "d", {"a.txt": b"a", "secret.txt": b"b"})
    import bytelm.data.remote as files_mod  # (where the sources open local files)

    def deny(path, *args, **kw):  # (the process runs as root in CI: a chmod would not stop it)
        if Path(path).name == "secret.txt":
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, *args, **kw)

    monkeypatch.setattr(files_mod, "open", deny, raising=False)
    with pytest.raises(UserError, match=r"cannot read .*secret.txt.*Permission denied"):
        load(f"files:{root}", tmp_path)


def test_single_file_corpus_suggests_split(tmp_path):
    f = tmp_path / "one.txt"
    f.write_bytes(b"a single document\n\nwith paragraphs\n")
    with pytest.raises(UserError, match=r"held-out part .* is empty.*\?split=paragraph.*\?split=line"):
        load(f"files:{f}", tmp_path)


def test_tfds_without_extra(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_tfds(name, *args, **kwargs):
        if name.startswith("tensorflow_datasets"):
            raise ImportError("No module named 'tensorflow_datasets'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tfds)
    with pytest.raises(UserError, match=r"needs tensorflow-datasets.*pip install 'bytelm\[tfds\]'"):
        load("tfds:tiny_text", tmp_path)


def test_cli_bad_input_exit_code_2_no_traceback(tmp_path, capsys):
    rc = cli.main(["data", "info", "--data", f"files:{tmp_path}/missing"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "no such file or directory" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_cli_data_info_on_directory(text_dir, capsys):
    assert cli.main(["data", "info", "--data", f"files:{text_dir}"]) == 0
    out = capsys.readouterr().out
    assert "documents      40" in out
    fp = [line.split()[-1] for line in out.splitlines() if line.startswith("fingerprint")][0]
    assert len(fp) == 64 and int(fp, 16) >= 0


# -- bytes are data -------------------------------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(st.binary(max_size=300), min_size=2, max_size=8))
def test_arbitrary_bytes_round_trip_through_cache(tmp_path_factory, docs):
    docs[0] = docs[0] + b"\x00\r\n\xff\xfe"  # NUL, CRLF, invalid UTF-8 always present
    root = tmp_path_factory.mktemp("bin")
    write_files(root, {f"f{i:02d}.bin": d for i, d in enumerate(docs)})
    c = load_corpus(f"files:{root}", cache_dir=root / ".cache", require_split=False)
    assert list(c.documents()) == docs
    # and once more from the cache (a second load must not rebuild)
    c2 = load_corpus(f"files:{root}", cache_dir=root / ".cache", require_split=False)
    assert c2.path == c.path and list(c2.documents()) == docs
    # the train stream is exactly [BOS, b+4..., EOS] per train document
    expected = []
    for d, held in zip(docs, c.heldout):
        if not held:
            expected += [BOS_ID, *(b + BYTE_OFFSET for b in d), EOS_ID]
    assert c.train_stream.tolist() == expected


# -- cache --------------------------------------------------------------------------------
def test_second_load_reuses_cache(text_dir, tmp_path, monkeypatch):
    c1 = load(f"files:{text_dir}", tmp_path)
    calls = []
    monkeypatch.setattr(corpus_mod, "build_corpus", lambda *a, **k: calls.append(a))
    c2 = load(f"files:{text_dir}", tmp_path)
    assert calls == [] and c2.path == c1.path and c2.fingerprint == c1.fingerprint


def test_changed_file_invalidates_cache(text_dir, tmp_path):
    c1 = load(f"files:{text_dir}", tmp_path)
    (text_dir / "en/doc00.txt").write_bytes(b"changed contents, changed size")
    c2 = load(f"files:{text_dir}", tmp_path)
    assert c2.path != c1.path


def test_failed_build_leaves_no_cache(text_dir, tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(corpus_mod, "build_corpus", boom)
    with pytest.raises(RuntimeError):
        load(f"files:{text_dir}", tmp_path)
    assert not list((tmp_path / "cache" / "corpora").iterdir())  # no final dir, no temp dir


# -- split, segments, fingerprint --------------------------------------------------------
def test_split_stable_when_documents_are_added(text_dir, tmp_path):
    before = load(f"files:{text_dir}", tmp_path)
    split_before = dict(zip(before.names, before.heldout))
    write_files(text_dir, {f"fr/new{i}.txt": f"nouveau {i}".encode() for i in range(30)})
    after = load(f"files:{text_dir}", tmp_path)
    split_after = dict(zip(after.names, after.heldout))
    assert len(split_after) == 70
    assert all(split_after[n] == h for n, h in split_before.items())


def test_split_fraction_is_respected():
    names = [f"doc{i}" for i in range(20000)]
    frac = np.mean([is_heldout(n, 0, 0.1) for n in names])
    assert 0.09 < frac < 0.11
    assert np.mean([is_heldout(n, 0, 0.1) == is_heldout(n, 1, 0.1) for n in names]) < 0.9  # seed matters


def test_validation_split_is_carved_from_train_and_moves_no_heldout_document(text_dir, tmp_path):
    plain = load(f"files:{text_dir}", tmp_path, segment_bytes=64)
    carved = load(f"files:{text_dir}", tmp_path, segment_bytes=64, validation_fraction=0.3)
    assert carved.path != plain.path  # its own cache: the training stream differs
    assert carved.fingerprint == plain.fingerprint and (carved.heldout == plain.heldout).all()
    assert (
        not plain.validation.any()
        and carved.validation.any()
        and not (carved.validation & carved.heldout).any()
    )
    for i, name in enumerate(carved.names):
        assert carved.validation[i] == (not carved.heldout[i] and is_validation(name, 0, 0.3))
    train = set(carved.document_indices("train"))
    assert train.isdisjoint(carved.document_indices("validation")) and train.isdisjoint(
        carved.document_indices("heldout")
    )
    assert len(train) + carved.validation.sum() + carved.heldout.sum() == carved.n_documents
    # the training stream holds exactly the train documents, each as BOS bytes EOS
    expected = np.concatenate(
        [
            np.concatenate([[BOS_ID], np.frombuffer(d, np.uint8) + BYTE_OFFSET, [EOS_ID]])
            for d in carved.documents("train")
        ]
    )
    np.testing.assert_array_equal(np.asarray(carved.train_stream), expected)
    assert b"".join(carved.segment_data(carved.validation_segments)) == b"".join(
        carved.documents("validation")
    )
    frac = np.mean([is_validation(f"doc{i}", 0, 0.1) for i in range(20000)])
    assert 0.09 < frac < 0.11
    assert (
        np.mean([is_validation(f"doc{i}", 0, 0.5) == is_heldout(f"doc{i}", 0, 0.5) for i in range(20000)])
        < 0.6
    )  # independent draws
    with pytest.raises(UserError, match="validation_fraction"):
        load(f"files:{text_dir}", tmp_path, validation_fraction=1.0)


def test_segments_cover_heldout_in_order(text_dir, tmp_path):
    c = load(f"files:{text_dir}", tmp_path, segment_bytes=100, max_eval_bytes=10**9)
    joined = b"".join(c.segment_data())
    assert joined == b"".join(c.documents("heldout"))
    assert all(0 < s.length <= 100 for s in c.segments)
    capped = load(f"files:{text_dir}", tmp_path, segment_bytes=100, max_eval_bytes=250)
    # (protocol v2: whole slots only, under the cap, each one a piece of the uncapped set)
    assert 0 < capped.eval_bytes <= 250
    whole = {(s.doc, s.start): d for s, d in zip(c.segments, c.segment_data())}
    for s, d in zip(capped.segments, capped.segment_data()):
        assert whole[(s.doc, s.start)] == d


def test_fingerprint_is_sha256_of_length_prefixed_segments(text_dir, tmp_path):
    c = load(f"files:{text_dir}", tmp_path, segment_bytes=64)
    h = hashlib.sha256()
    h.update(b"bytelm-eval-protocol 2\0")
    for s in c.segment_data():
        h.update(len(s).to_bytes(8, "little") + s)
    h.update(b"total" + c.eval_bytes.to_bytes(8, "little"))
    assert c.fingerprint == h.hexdigest()
    # the length prefix matters: moving a boundary changes the fingerprint
    assert fingerprint_segments([b"ab", b"c"]) != fingerprint_segments([b"a", b"bc"])


def test_fingerprint_changes_when_one_heldout_byte_changes(text_dir, tmp_path):
    c1 = load(f"files:{text_dir}", tmp_path)
    held = c1.names[int(np.flatnonzero(c1.heldout)[0])]
    train = c1.names[int(np.flatnonzero(~c1.heldout)[0])]
    p = text_dir / held
    data = bytearray(p.read_bytes())
    data[5] ^= 1
    p.write_bytes(bytes(data))
    c2 = load(f"files:{text_dir}", tmp_path)
    assert c2.fingerprint != c1.fingerprint
    # a change in a train document leaves the fingerprint alone
    q = text_dir / train
    q.write_bytes(q.read_bytes() + b"more training text")
    assert load(f"files:{text_dir}", tmp_path).fingerprint == c2.fingerprint


def test_fingerprint_identical_across_processes(text_dir, tmp_path):
    code = (
        "import sys; from bytelm.data import load_corpus; "
        "print(load_corpus(sys.argv[1], cache_dir=sys.argv[2]).fingerprint)"
    )
    fps = [
        subprocess.run(
            [sys.executable, "-c", code, f"files:{text_dir}", str(tmp_path / f"c{i}")],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        for i in range(2)
    ]
    assert fps[0] == fps[1] == load(f"files:{text_dir}", tmp_path).fingerprint


# -- batches ------------------------------------------------------------------------------
@pytest.fixture
def stream():
    return np.random.default_rng(0).integers(0, 260, size=10_000).astype(np.uint16)


def test_batches_are_windows_of_the_stream(stream):
    it = WindowBatches(stream, batch_size=8, window=33, seed=3, process_index=0, process_count=1)
    b = next(it)
    assert b.shape == (8, 33) and b.dtype == np.int32
    for row, s in zip(b, it.starts(0)):
        np.testing.assert_array_equal(row, stream[s : s + 33])


def test_batches_deterministic_and_resumable(stream):
    kw = dict(batch_size=4, window=17, process_index=0, process_count=1)
    a = WindowBatches(stream, seed=1, **kw)
    first = [next(a) for _ in range(10)]
    b = WindowBatches(stream, seed=1, **kw)
    np.testing.assert_array_equal(np.stack([next(b) for _ in range(10)]), np.stack(first))
    resumed = WindowBatches(stream, seed=1, step=7, **kw)
    np.testing.assert_array_equal(next(resumed), first[7])
    assert resumed.state() == {"step": 8, "seed": 1}
    other = WindowBatches(stream, seed=2, **kw)
    assert not np.array_equal(next(other), first[0])


@pytest.mark.parametrize("hosts", [2, 4])
def test_host_slices_disjoint_and_cover_batch(stream, hosts):
    full = WindowBatches(stream, batch_size=8, window=9, seed=5, process_index=0, process_count=1)
    parts = [
        WindowBatches(stream, batch_size=8, window=9, seed=5, process_index=h, process_count=hosts).batch(3)
        for h in range(hosts)
    ]
    np.testing.assert_array_equal(np.concatenate(parts), full.batch(3))
    assert all(len(p) == 8 // hosts for p in parts) and len(set(full.starts(3).tolist())) > 1


def test_batch_errors(stream):
    with pytest.raises(UserError, match="not divisible by the number of hosts 3"):
        WindowBatches(stream, batch_size=8, window=9, process_index=0, process_count=3)
    with pytest.raises(UserError, match="fewer than one window"):
        WindowBatches(stream[:5], batch_size=8, window=9, process_index=0, process_count=1)


# -- tfds ---------------------------------------------------------------------------------
def test_tfds_array_record_source(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")

    class TinyBytes(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict({"body": tfds.features.Text()})
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(40), "test": self._generate_examples(5)}

        def _generate_examples(self, n):
            for i in range(n):
                yield i, {"body": f"record {i}: naïve café ☕ " * (i + 1)}

    data_dir = tmp_path / "tfds"
    TinyBytes(data_dir=str(data_dir)).download_and_prepare(file_format="array_record")
    spec = f"tfds:tiny_bytes:train?field=body&data_dir={data_dir}"
    c = load(spec, tmp_path)
    assert c.n_documents == 40
    docs = set(c.documents())
    assert {f"record {i}: naïve café ☕ ".encode() * (i + 1) for i in range(40)} == docs
    assert set(c.groups) == {"train"}
    with pytest.raises(UserError, match="has no field 'text'"):
        load(f"tfds:tiny_bytes:train?data_dir={data_dir}", tmp_path)
    with pytest.raises(UserError, match="cannot open tfds dataset 'nonexistent_ds'"):
        load(f"tfds:nonexistent_ds?data_dir={data_dir}", tmp_path)


def test_summary_is_json_serialisable(text_dir, tmp_path):
    s = load(f"files:{text_dir}", tmp_path).summary()
    assert json.loads(json.dumps(s))["documents"] == 40


# -- the prepared format: shards, derived names, the derived training stream ------------------
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    docs=st.lists(st.binary(max_size=120), min_size=3, max_size=30),
    shard_bytes=st.integers(1, 400),
    data=st.data(),
)
def test_training_windows_across_shards_equal_the_materialised_stream(
    tmp_path_factory, monkeypatch, docs, shard_bytes, data
):
    """Rows gathered from the shards (both the per-segment and the batch-gather paths) equal slices
    of the stream built by hand, for any documents (empty ones too) and any shard size."""
    monkeypatch.setattr(prepare_mod, "SHARD_BYTES", shard_bytes)
    root = tmp_path_factory.mktemp("shards")
    write_files(root, {f"f{i:03d}.bin": d for i, d in enumerate(docs)})
    c = load_corpus(f"files:{root}", cache_dir=root / ".cache", require_split=False, heldout_fraction=0.3)
    assert len(c.shards) >= 1 and c.n_bytes == sum(map(len, docs))
    assert [c.document(i).tobytes() for i in range(len(docs))] == docs
    expected = []
    for d, held in zip(docs, c.heldout):
        if not held:
            expected += [BOS_ID, *(b + BYTE_OFFSET for b in d), EOS_ID]
    expected = np.asarray(expected, np.int32)
    stream = c.train_stream
    assert len(stream) == len(expected)
    if len(expected) == 0:
        return
    width = data.draw(st.integers(1, len(expected)))
    n_rows = data.draw(st.integers(1, 12))
    starts = np.asarray(
        data.draw(st.lists(st.integers(0, len(expected) - width), min_size=n_rows, max_size=n_rows))
    )
    want = np.stack([expected[s : s + width] for s in starts])
    np.testing.assert_array_equal(stream.windows(starts, width), want)
    np.testing.assert_array_equal(np.asarray(stream).astype(np.int32), expected)


@pytest.mark.slow
def test_names_are_derived_from_groups_or_stored(text_dir, tmp_path):
    """Per-file pieces name themselves GROUP#k, whole files their group: neither is stored; the
    stdlib's names (not derivable from its package groups) are."""
    lines = load(f"files:{text_dir}?split=line", tmp_path)
    assert lines.index["names"] == "group#k" and not (lines.path / "names.jsonl").exists()
    assert lines.names[0] == "de/doc00.txt#0" and lines.names[2] == "de/doc01.txt#0"
    whole = load(f"files:{text_dir}", tmp_path)
    assert whole.index["names"] == "group" and list(whole.names) == list(whole.groups)
    stdlib = load_corpus("stdlib", cache_dir=tmp_path / "cache", require_split=False)
    assert stdlib.index["names"] == "stored" and stdlib.names[0] != stdlib.groups[0]


def test_a_relative_files_spec_has_the_signature_of_its_absolute_path(tmp_path, monkeypatch):
    """A corpus named by a relative path (``files:corpus`` or ``files:corpus/a.txt``, run from its
    parent) is signed by its files' absolute paths, sizes and times: the same signature as the
    absolute spec, and a changed file changes it."""
    from bytelm.data.sources import parse_source

    write_files(tmp_path / "corpus", {"a.txt": b"one\n\ntwo\n", "sub/b.txt": b"three\n"})
    monkeypatch.chdir(tmp_path)
    for rel in ("corpus", "corpus/a.txt"):
        relative = parse_source(f"files:{rel}?split=paragraph").signature()
        assert relative == parse_source(f"files:{tmp_path / rel}?split=paragraph").signature()
    before = parse_source("files:corpus").signature()
    (tmp_path / "corpus" / "a.txt").write_bytes(b"changed, longer\n")
    assert parse_source("files:corpus").signature() != before
