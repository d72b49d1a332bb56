"""Reading the prepared corpus at scale: each process reads only its rows (the loader's counters,
the shards it opens), background prefetch hands over the same batches, and a process that must not
build the corpus says how to get it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from conftest import word_corpus

from bytelm.data import WindowBatches, load_corpus
from bytelm.data import prepare as prepare_mod
from bytelm.data.prefetch import Prefetch
from bytelm.errors import UserError

LOADER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from bytelm.data import WindowBatches, load_corpus
    spec, cache, pid, count, out = sys.argv[1:6]
    c = load_corpus(spec, cache_dir=cache, build=False)
    it = WindowBatches(c.train_stream, batch_size=8, window=65, seed=3, step=2,
                       process_index=int(pid), process_count=int(count))
    np.save(out, np.stack([next(it) for _ in range(6)]))
    print(json.dumps({**c.reads, "opened": c.shards.opened, "shards": len(c.shards)}))
    """
)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A corpus of 60 documents of ~2 KB prepared into shards of one document each."""
    root = tmp_path_factory.mktemp("sharded")
    spec = f"files:{word_corpus(root / 'docs')}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prepare_mod, "SHARD_BYTES", 1024)
        corpus = load_corpus(spec, cache_dir=root / "cache")
    assert len(corpus.shards) == corpus.n_documents == 60
    return spec, root / "cache"


def test_two_processes_each_read_their_half_and_together_make_one_process_batches(sharded, tmp_path):
    spec, cache = sharded
    layouts = [(0, 2), (1, 2), (0, 1)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LOADER, spec, str(cache), str(i), str(n), str(tmp_path / f"{i}of{n}.npy")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, n in layouts
    ]
    reads = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        reads.append(json.loads(out.strip().splitlines()[-1]))
    half0, half1, whole = (np.load(tmp_path / f"{i}of{n}.npy") for i, n in layouts)
    assert half0.shape == half1.shape == (6, 4, 65) and whole.shape == (6, 8, 65)
    assert np.array_equal(np.concatenate([half0, half1], axis=1), whole)  # bit for bit
    r0, r1, rw = reads
    assert r0["rows"] == r1["rows"] == rw["rows"] // 2 == 24 and r0["ids"] == r1["ids"] == 24 * 65
    assert r0["documents"] + r1["documents"] == rw["documents"]
    assert 0.3 < r0["documents"] / rw["documents"] < 0.7
    # a process opens only the shards its rows lie in
    assert set(r0["opened"]) | set(r1["opened"]) == set(rw["opened"])
    assert len(r0["opened"]) < r0["shards"] and len(r1["opened"]) < r1["shards"]
    assert set(r0["opened"]) != set(r1["opened"])


def test_prefetch_hands_over_the_same_batches_and_resumes_at_a_step(sharded):
    spec, cache = sharded
    stream = load_corpus(spec, cache_dir=cache, build=False).train_stream

    def batches(step):
        layout = {"process_index": 0, "process_count": 1}
        return WindowBatches(stream, batch_size=4, window=33, seed=5, step=step, **layout)

    plain = [next(batches(0)) for _ in range(1)] + [b for _, b in zip(range(9), batches(1))]
    with Prefetch(batches(0), depth=3) as ahead:
        got = [next(ahead) for _ in range(10)]
    assert all(np.array_equal(a, b) for a, b in zip(got, plain))
    with Prefetch(batches(6), depth=2) as resumed:  # a resume at step 6 is the uninterrupted tail
        tail = [next(resumed) for _ in range(4)]
    assert all(np.array_equal(a, b) for a, b in zip(tail, plain[6:]))


def test_prefetch_raises_the_worker_error_after_the_items_before_it_and_stops():
    def items():
        yield 1
        yield 2
        raise UserError("bad shard")

    ahead = Prefetch(items(), depth=4)
    assert [next(ahead), next(ahead)] == [1, 2]
    with pytest.raises(UserError, match="bad shard"):
        next(ahead)
    with pytest.raises(StopIteration):
        next(ahead)
    assert list(Prefetch(iter(range(5)))) == [0, 1, 2, 3, 4]

    started = threading.Event()

    def endless():
        started.set()
        k = 0
        while True:
            yield k
            k += 1

    ahead = Prefetch(endless(), depth=2)
    started.wait(10)
    assert next(ahead) == 0
    ahead.close()
    assert not ahead._thread.is_alive()
    with pytest.raises(ValueError, match="depth must be >= 1"):
        Prefetch(iter(()), depth=0)


def test_a_process_that_must_not_build_names_the_cache_and_the_fix(tmp_path):
    spec = f"files:{word_corpus(tmp_path / 'docs', n_docs=8)}"
    with pytest.raises(UserError) as e:
        load_corpus(spec, cache_dir=tmp_path / "cache", build=False)
    message = str(e.value)
    assert str(tmp_path / "cache") in message and "bytelm data prepare" in message
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("index.json"))


@pytest.mark.parametrize("damage", ["truncate", "remove"])
def test_a_damaged_shard_names_the_file_and_the_fix(tmp_path, damage, capsys):
    spec = f"files:{word_corpus(tmp_path / 'docs', n_docs=12)}"
    corpus = load_corpus(spec, cache_dir=tmp_path / "cache")
    shard = corpus.path / "shard-00000.u8"
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-10])
    else:
        shard.unlink()
    from bytelm import cli

    rc = cli.main(["data", "info", "--data", spec, "--set", f"data.cache_dir={tmp_path / 'cache'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert str(shard) in err[0] and f"delete {corpus.path}" in err[0]


def test_a_tokenizer_trains_on_a_spread_sample_of_the_documented_size(tmp_path, capsys):
    spec = f"files:{word_corpus(tmp_path / 'docs', n_docs=40)}"
    corpus = load_corpus(spec, cache_dir=tmp_path / "cache")
    train = corpus.document_indices("train")
    total = corpus.split_bytes("train")
    chosen, nbytes = corpus.sample("train", total // 4)
    k = -(-total // (total // 4))
    assert chosen.tolist() == train[::k].tolist() and k >= 4
    assert nbytes == sum(len(corpus.document(int(i))) for i in chosen) and nbytes <= total / 3
    assert corpus.sample("train", 0)[0].tolist() == train.tolist()  # 0: the whole split
    assert corpus.sample("train", total * 2)[1] == total

    from bytelm import cli
    from bytelm.baselines import load_tokenizer
    from bytelm.baselines.bpe import train_bpe

    mb = total / 4 / 1e6
    args = ["tokenizer", "train", "--data", spec, "--vocab-size", "300", "--workers", "1"]
    args += [
        "--set",
        f"data.cache_dir={tmp_path / 'cache'}",
        "--sample-mb",
        str(mb),
        "--out",
        str(tmp_path / "t"),
    ]
    assert cli.main(args) == 0
    assert f"trained on {len(chosen):,} documents, {nbytes:,} bytes" in capsys.readouterr().out
    want = train_bpe((corpus.document(int(i)).tobytes() for i in chosen), vocab_size=300, num_workers=1)
    assert load_tokenizer(tmp_path / "t").fingerprint == want.fingerprint
