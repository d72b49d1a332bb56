"""Sources in a bucket: ``gs://`` data read through gcsfs from a local GCS emulator that this test
starts (``gcp-storage-emulator``, in memory, on localhost) gives the documents, the split and the
training batches of the same files on disk; a missing bucket or object stops in one line."""

from __future__ import annotations

import json
import os
import socket
import socketserver

import pytest

# gcsfs's experimental bucket-type lookup speaks gRPC to the real service: off for the emulator
# (before gcsfs is first imported)
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import zstandard  # noqa: E402
from conftest import word_corpus  # noqa: E402

from bytelm import cli  # noqa: E402
from bytelm.config import load_config  # noqa: E402
from bytelm.data import WindowBatches, load_corpus  # noqa: E402
from bytelm.errors import UserError  # noqa: E402
from bytelm.training.loop import train  # noqa: E402


def _conditional_media_reads() -> None:
    """What the emulator's media download lacks and tensorstore relies on, as GCS does it: the object's
    ``x-goog-generation`` header, and the ``ifGenerationNotMatch`` / ``ifGenerationMatch`` preconditions
    (304 when the generation is unchanged, 412 when it differs). Without them a read that revalidates
    a cached OCDBT manifest gets the bytes with no generation, and the next conditional write fails
    ("Malformed StorageGeneration"), by the timing of tensorstore's cache: a flaky test."""
    from http import HTTPStatus

    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    if getattr(objects.download, "conditional", False):
        return
    plain = objects.download

    def download(request, response, storage, *args, **kwargs):
        try:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        except NotFound:
            return plain(request, response, storage, *args, **kwargs)
        generation = str(obj["generation"])
        if request.query.get("ifGenerationNotMatch", [None])[0] == generation:
            response.status = HTTPStatus.NOT_MODIFIED
            return None
        match = request.query.get("ifGenerationMatch", [None])[0]
        if match is not None and match != generation:
            response.status = HTTPStatus.PRECONDITION_FAILED
            return None
        response["x-goog-generation"] = generation
        response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))
        return plain(request, response, storage, *args, **kwargs)

    download.conditional = True  # type: ignore[attr-defined]
    objects.download = download
    server.HANDLERS = tuple(
        (pattern, {m: (download if h is plain else h) for m, h in methods.items()})
        for pattern, methods in server.HANDLERS
    )


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """The emulator with bucket ``bkt``: a word corpus under ``docs/`` (and a dot-file, skipped), two
    jsonl.zst files under ``records/``; the same files on disk; the emulator's address in the
    environment while the module's tests run."""
    from gcp_storage_emulator.server import create_server

    _conditional_media_reads()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="bkt")
    # the emulator serves from this process: a request the client drops (gcsfs closing a connection)
    # would print socketserver's traceback into the stderr the tests read
    quiet = socketserver.BaseServer.handle_error
    socketserver.BaseServer.handle_error = lambda self, request, client_address: None
    server.start()
    old = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    import gcsfs

    fs = gcsfs.GCSFileSystem(token="anon", project="test", skip_instance_cache=True)
    local = tmp_path_factory.mktemp("local")
    docs = word_corpus(local / "docs", n_docs=24, words_per_doc=120)
    (local / "records").mkdir()
    for k in range(2):
        lines = "".join(f'{{"text": "record {k}.{i} {"x" * i}"}}\n' for i in range(40))
        (local / "records" / f"part{k}.jsonl.zst").write_bytes(
            zstandard.ZstdCompressor().compress(lines.encode())
        )
    texts = [f"row {i}: " + "y" * (i % 17) for i in range(60)]
    (local / "tables").mkdir()
    for k in range(2):
        pq.write_table(pa.table({"text": texts[k::2]}), str(local / "tables" / f"part{k}.parquet"))
    (local / "hfds" / "train").mkdir(parents=True)  # datasets' save_to_disk layout, written with pyarrow
    table = pa.table({"text": texts})
    with pa.OSFile(str(local / "hfds" / "train" / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=8)
    (local / "hfds" / "train" / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    (local / "hfds" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        fs.pipe(f"bkt/{path.relative_to(local).as_posix()}", path.read_bytes())
    fs.pipe("bkt/docs/.hidden", b"not a document")
    try:
        yield local, docs
    finally:
        server.stop()
        socketserver.BaseServer.handle_error = quiet
        os.environ.pop("TENSORSTORE_GCS_HTTP_URL", None)  # (set from STORAGE_EMULATOR_HOST by bytelm.rundir)
        if old is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = old


def _batches(corpus, n=4):
    it = WindowBatches(corpus.train_stream, batch_size=4, window=33, seed=1, process_index=0, process_count=1)
    return np.stack([next(it) for _ in range(n)])


@pytest.mark.parametrize(
    "kind, sub", [("files", "docs"), ("jsonl", "records"), ("parquet", "tables"), ("hf", "hfds")]
)
@pytest.mark.slow
def test_a_bucket_gives_the_documents_split_and_batches_of_the_same_files_on_disk(
    bucket, tmp_path, kind, sub
):
    local, _ = bucket
    remote = load_corpus(f"{kind}:gs://bkt/{sub}", cache_dir=tmp_path / "remote", heldout_fraction=0.25)
    disk = load_corpus(f"{kind}:{local / sub}", cache_dir=tmp_path / "disk", heldout_fraction=0.25)
    assert list(remote.names) == list(disk.names) and len(remote.names) > 20
    assert list(remote.documents()) == list(disk.documents())
    assert remote.fingerprint == disk.fingerprint
    assert np.array_equal(_batches(remote), _batches(disk))
    if kind == "hf":  # (a directory, not a glob; read by one process)
        return
    # a glob of objects, and parallel preparation from the bucket
    pattern = {"files": "*.txt", "jsonl": "*.jsonl.zst", "parquet": "*.parquet"}[kind]
    globbed = load_corpus(
        f"{kind}:gs://bkt/{sub}/{pattern}", cache_dir=tmp_path / "glob", heldout_fraction=0.25
    )
    assert list(globbed.documents()) == list(disk.documents())
    two = load_corpus(f"{kind}:gs://bkt/{sub}", cache_dir=tmp_path / "two", heldout_fraction=0.25, workers=2)
    assert list(two.documents()) == list(disk.documents())


def test_bytelm_train_on_a_bucket_equals_training_on_the_files(bucket, tmp_path):
    local, docs = bucket
    losses = {}
    for where, source in (("bucket", "files:gs://bkt/docs"), ("disk", f"files:{docs}")):
        cfg = load_config(
            None,
            [
                f"data.source={source}",
                f"data.cache_dir={tmp_path / where / 'cache'}",
                "data.heldout_fraction=0.25",
                "data.segment_bytes=16",
                "data.max_eval_bytes=1024",
                "model.family=byte",
                "model.d_model=16",
                "model.n_layers=1",
                "model.n_heads=2",
                "model.mlp_dim=32",
                "train.batch_size=4",
                "train.seq_len=32",
                "train.steps=2",
                "train.log_every=1",
                "eval.every=0",
            ],
        )
        train(cfg, tmp_path / where / "run")
        records = map(json.loads, (tmp_path / where / "run" / "metrics.jsonl").read_text().splitlines())
        losses[where] = [(r["step"], r["loss"], r["bpb"]) for r in records if r["kind"] == "train"]
    assert losses["bucket"] == losses["disk"] and len(losses["disk"]) == 2  # the same batches, bit for bit


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("hf:gs://bkt/docs", "state.json is missing"),
        ("hf:gs://bkt/hfds?split=test", "has no split 'test'"),
        ("files:gs://no-such-bucket/docs", "gs://no-such-bucket/docs"),
        ("files:gs://bkt/nothing-here", "gs://bkt/nothing-here"),
        ("files:gs://bkt/docs/*.nope", "matched no objects"),
        ("jsonl:gs://bkt/docs", "is not a jsonl file"),
    ],
)
def test_a_missing_bucket_or_object_fails_in_one_line_naming_the_url(bucket, tmp_path, capsys, spec, needle):
    with pytest.raises(UserError) as e:
        load_corpus(spec, cache_dir=tmp_path / "c")
    assert needle in str(e.value)
    rc = cli.main(["data", "prepare", "--data", spec, "--out", str(tmp_path / "out")])
    # (the emulator runs in this process and logs its requests to stderr too)
    err = [
        line for line in capsys.readouterr().err.strip().splitlines() if "gcp_storage_emulator" not in line
    ]
    assert rc == 2 and len(err) == 1 and needle in err[0]
    assert not any((tmp_path / "out").rglob("index.json"))


def test_an_unreachable_store_is_named_with_the_fix_not_reported_as_missing(monkeypatch, tmp_path, capsys):
    """A store that cannot be reached (gcsfs raises after its retries, a minute against a closed
    port: here a stand-in filesystem raises at once) is not "no such object"."""
    import bytelm.data.remote as remote

    class Unreachable:
        def info(self, path, **kwargs):
            raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 9)")

        glob = find = info

    monkeypatch.setattr(remote, "filesystem", lambda url, spec: (Unreachable(), url.split("://", 1)[1]))
    for spec in ("files:gs://bkt/docs", "jsonl:gs://bkt/docs/*.jsonl"):
        rc = cli.main(["data", "prepare", "--data", spec, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, err
        assert "cannot reach gs://bkt/docs" in err[0] and "Connect call failed" in err[0]
        assert "credentials" in err[0] and "no such object" not in err[0]
    assert not any((tmp_path / "out").rglob("index.json"))


# -- run directories in a bucket ------------------------------------------------------------------
def _tiny_run(docs, tmp_path, **changes) -> list[str]:
    values = {
        "data.source": f"files:{docs}",
        "data.cache_dir": tmp_path / "cache",
        "data.heldout_fraction": 0.25,
        "data.segment_bytes": 32,
        "data.max_eval_bytes": 1024,
        "model.family": "byte",
        "model.d_model": 16,
        "model.n_layers": 1,
        "model.n_heads": 2,
        "model.mlp_dim": 32,
        "train.batch_size": 4,
        "train.seq_len": 32,
        "train.steps": 6,
        "train.checkpoint_every": 3,
        "train.log_every": 1,
        "eval.every": 0,
        **changes,
    }
    return [f"{k}={v}" for k, v in values.items()]


KILLED_AFTER_3 = """
import json, os, signal, sys
from bytelm.config import load_config
from bytelm.training import loop

save = loop._Run.save

def dying(self, step):
    save(self, step)
    if step == 3:  # the job lost right after its checkpoint of step 3 is complete
        self.ckpt.wait()
        os.kill(os.getpid(), signal.SIGKILL)

loop._Run.save = dying
loop.train(load_config(None, json.loads(sys.argv[1])), sys.argv[2])
"""


def _objects(prefix: str) -> list[str]:
    import gcsfs

    fs = gcsfs.GCSFileSystem(token="anon", project="test", skip_instance_cache=True)
    return fs.find(prefix)


@pytest.mark.slow
def test_a_run_in_a_bucket_killed_and_resumed_evaluates_and_samples_as_on_disk(
    bucket, tmp_path, capsysbinary
):
    """Train into gs://bkt/run, lose the job (SIGKILL) after the checkpoint of step 3, resume: the
    records, the held-out BPB and a seeded sample equal those of the same run on disk, uninterrupted."""
    import subprocess
    import sys

    from conftest import subprocess_env

    _, docs = bucket
    overrides = _tiny_run(docs, tmp_path, **{"train.tensorboard": "true"})
    disk = tmp_path / "disk"
    train(load_config(None, overrides), disk)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_3, json.dumps(overrides), "gs://bkt/run"],
        env=subprocess_env(1),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert {"bkt/run/checkpoints/3/commit_success.txt", "bkt/run/metrics.jsonl"} <= set(_objects("bkt/run"))
    resumed = train(load_config(None, overrides), "gs://bkt/run")
    assert resumed.step == 6

    from bytelm.rundir import RunDir

    def records(where):
        return [(r["step"], r["loss"], r["bpb"]) for r in RunDir(where).metrics() if r["kind"] == "train"]

    assert records("gs://bkt/run") == records(disk) and len(records(disk)) == 6  # bit for bit, each step once
    assert RunDir("gs://bkt/run").info()["status"] == "finished"
    assert any("tensorboard/events.out.tfevents" in p for p in _objects("bkt/run"))
    reports = {}
    samples = {}
    for name, where in (("disk", str(disk)), ("bucket", "gs://bkt/run")):
        assert cli.main(["eval", where, "--json", str(tmp_path / f"{name}.json")]) == 0
        reports[name] = {
            m["name"]: m["bpb"] for m in json.loads((tmp_path / f"{name}.json").read_text())["models"]
        }
        capsysbinary.readouterr()
        assert cli.main(["sample", where, "--prompt", "the ", "--max-bytes", "24", "--seed", "3"]) == 0
        samples[name] = capsysbinary.readouterr().out
    assert reports["bucket"]["run"] == reports["disk"]["disk"]
    for name, where in (("disk", str(disk)), ("bucket", "gs://bkt/run")):
        assert cli.main(["export", "hf", where, "--out", str(tmp_path / f"hf-{name}")]) == 0
    from safetensors.numpy import load_file

    exported = {name: load_file(tmp_path / f"hf-{name}" / "model.safetensors") for name in ("disk", "bucket")}
    assert exported["disk"].keys() == exported["bucket"].keys() and exported["disk"]
    for key, weights in exported["disk"].items():
        np.testing.assert_array_equal(exported["bucket"][key], weights)
    assert samples["bucket"] == samples["disk"] and len(samples["disk"]) >= 24


def _one_error_line(capsys) -> str:
    err = [
        line for line in capsys.readouterr().err.strip().splitlines() if "gcp_storage_emulator" not in line
    ]
    assert len(err) == 1, err
    return err[0]


def test_a_run_url_that_cannot_be_written_fails_in_one_line_before_anything_is_written(
    bucket, tmp_path, capsys, monkeypatch
):
    import fsspec

    _, docs = bucket
    args = ["train", "bytelm/configs/tiny/byte.toml", "--allow-cpu"]
    for item in _tiny_run(docs, tmp_path):
        args += ["--set", item]
    # a bucket that does not exist
    assert cli.main([*args, "--out", "gs://no-such-bucket/run"]) == 2
    line = _one_error_line(capsys)
    assert "gs://no-such-bucket/run" in line and "does not exist" in line and "buckets create" in line
    assert not _objects("bkt/run-denied")

    real = fsspec.core.url_to_fs

    class Store:  # the emulator's filesystem, with one failure
        def __init__(self, fs, fail):
            self.fs, self.fail = fs, fail

        def __getattr__(self, name):
            return getattr(self.fs, name)

        def pipe_file(self, path, data, **kwargs):
            raise self.fail

    for fail, needle in (
        (PermissionError("403 Forbidden: anon does not have storage.objects.create access"), "roles/storage"),
        (ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 9)"), "credentials"),
    ):
        monkeypatch.setattr(
            fsspec.core, "url_to_fs", lambda url, **kw: (Store(real(url, **kw)[0], fail), real(url, **kw)[1])
        )
        assert cli.main([*args, "--out", "gs://bkt/run-denied"]) == 2
        line = _one_error_line(capsys)
        assert "gs://bkt/run-denied" in line and needle in line, line
        monkeypatch.setattr(fsspec.core, "url_to_fs", real)
    assert not _objects("bkt/run-denied")  # nothing half-written
