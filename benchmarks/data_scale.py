"""Data at cluster scale (issue 48): preparing, starting, reading and patching a multi-gigabyte corpus.

Generates a corpus of ``--gb`` GB of text (half ``jsonl.zst`` shards of one-line JSON records, half
many plain files; the text is slices of the running Python's standard library, so it is real code
and prose, and the generated files are reused from ``--work``), then measures, each part in its own
process, one thing at a time:

- ``prepare_mb_s``: ``bytelm data prepare --workers W`` on both halves (two specs: ``jsonl:`` and
  ``files:``), the input's text bytes over the wall time of both builds (the generated files were
  just written or read, so they are in the page cache: this is the build, not the disk);
- ``prepare_peak_rss_mb``: the peak resident anonymous memory (``RssAnon``: file pages read through
  memory maps are page cache, not the job's memory) of the whole process tree (the CLI and its
  workers, summed, sampled every 20 ms), the larger of the two builds; and the same at ``--small-gb``
  (``prepare_peak_rss_small_mb``): memory must not grow with the corpus;
- ``output_ratio``: the prepared directories' bytes over the input's text bytes;
- ``start_s``: a training run's start on the prepared corpus (cache hit: source listing, index,
  split checks, the task, its first batch), compile excluded: the slower of the two halves;
- ``pipeline_mb_s``: corpus bytes in training windows (B x (T+1), B=64, T=2048) delivered by the
  training iterator with its background prefetch, over ``--seconds`` (the slower half), and made
  inline as its peer (``pipeline_inline_mb_s``);
- ``blt_step_ratio``: the tiny BLT's train step with its entropy patching in the prefetched
  pipeline over the step on patch lengths computed beforehand (``blt_step_ratio_inline``: patching
  in the loop, no prefetch);
- ``arrayrecord_window_mb_s`` vs ``memmap_window_mb_s``: random training windows read from an
  ArrayRecord file of the training stream (what grain reads) and from the memory-mapped shards;
- ``subword_encode_scaling``: a BPE tokenizer encoding the training split into parts with 2 workers
  over 1 (``subword_encode_mb_s``: with 2), and the peak RSS at two corpus sizes.

The last line is a JSON object with the headline figures.

    python benchmarks/data_scale.py [--gb 4] [--small-gb 1] [--workers 2] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import numpy as np
import psutil  # (a dependency of orbax-checkpoint)
from results import record

ROOT = Path(__file__).resolve().parent.parent


def _base_text() -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for p in sorted(root.rglob("*.py")):
        if "site-packages" in p.parts:
            continue
        try:
            parts.append(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return "\n\n".join(parts)


def generate(out: Path, total_bytes: int, seed: int = 0) -> dict:
    """Write the corpus (``out/jsonl/*.jsonl.zst`` and ``out/files/dNNN/*.txt``) unless a finished
    one is there; returns its description (text bytes per half)."""
    done = out / "generated.json"
    if done.is_file():
        info = json.loads(done.read_text())
        if info["target_bytes"] == total_bytes and info["seed"] == seed:
            return info
    import shutil

    import zstandard

    shutil.rmtree(out, ignore_errors=True)
    (out / "jsonl").mkdir(parents=True)
    (out / "files").mkdir(parents=True)
    base = _base_text()
    rng = np.random.default_rng(seed)
    half = total_bytes // 2
    t0 = time.perf_counter()

    # one-line JSON records: lengths log-normal (median ~1.3 KB, mean ~2.2 KB, like web documents)
    shard_text = 128 << 20
    jsonl_bytes = docs = shard = 0
    cctx = zstandard.ZstdCompressor(level=3, threads=2)
    while jsonl_bytes < half:
        lines, size = [], 0
        while size < shard_text and jsonl_bytes + size < half:
            n = int(np.clip(rng.lognormal(7.2, 1.0), 16, 100_000))
            lo = int(rng.integers(0, len(base) - n))
            text = base[lo : lo + n]
            size += len(text.encode("utf-8"))
            lines.append(json.dumps({"id": docs, "text": text}))
            docs += 1
        data = ("\n".join(lines) + "\n").encode("utf-8")
        (out / "jsonl" / f"part-{shard:05d}.jsonl.zst").write_bytes(cctx.compress(data))
        jsonl_bytes += size
        shard += 1
        took = time.perf_counter() - t0
        print(f"  generated {jsonl_bytes / 1e9:.2f} GB of jsonl.zst ({took:.0f} s)", flush=True)

    # plain files: sizes log-normal (median ~22 KB), a thousand per directory
    raw = base.encode("utf-8")
    files_bytes = files = 0
    while files_bytes < half:
        n = int(np.clip(rng.lognormal(10.0, 1.0), 64, 4 << 20))
        n = min(n, half - files_bytes) or 1
        lo = int(rng.integers(0, len(raw) - n))
        d = out / "files" / f"d{files // 1000:04d}"
        if files % 1000 == 0:
            d.mkdir()
        (d / f"f{files:07d}.txt").write_bytes(raw[lo : lo + n])
        files_bytes += n
        files += 1
    info = {
        "target_bytes": total_bytes,
        "seed": seed,
        "jsonl_text_bytes": jsonl_bytes,
        "jsonl_documents": docs,
        "jsonl_shards": shard,
        "files_bytes": files_bytes,
        "files": files,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    done.write_text(json.dumps(info))
    print(f"  generated {out}: {info}", flush=True)
    return info


def _anon_rss(pid: int) -> int:
    """A process's resident anonymous memory (``RssAnon``: what it allocated; the pages of files it
    reads through memory maps are page cache, counted in ``RssFile``, and not included)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += _anon_rss(p.pid)
        except (OSError, psutil.Error):
            pass
    return total


def run_measured(cmd: list[str], env: dict | None = None) -> tuple[float, int, str]:
    """Run ``cmd``; its wall time, the peak summed RSS of its process tree, its output."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    ps = psutil.Process(proc.pid)
    peak = 0
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    while proc.poll() is None:
        try:
            peak = max(peak, _tree_rss(ps))
        except psutil.Error:
            pass
        time.sleep(0.02)
    seconds = time.perf_counter() - t0
    reader.join()
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{''.join(out)}")
    return seconds, peak, "".join(out)


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def prepare(corpus_dir: Path, info: dict, cache: Path, workers: int) -> dict:
    """Both halves prepared from scratch into ``cache``; their time, peak memory and output size."""
    import shutil

    shutil.rmtree(cache, ignore_errors=True)
    specs = [f"jsonl:{corpus_dir / 'jsonl'}", f"files:{corpus_dir / 'files'}"]
    seconds = peak = 0.0
    for spec in specs:
        cmd = [sys.executable, "-m", "bytelm", "-q", "data", "prepare", "--data", spec, "--out", str(cache)]
        s, rss, _ = run_measured([*cmd, "--workers", str(workers)])
        print(f"  prepare {spec}: {s:.1f} s, peak RSS {rss / 2**20:,.0f} MB", flush=True)
        seconds += s
        peak = max(peak, rss)
    text = info["jsonl_text_bytes"] + info["files_bytes"]
    return {
        "specs": specs,
        "seconds": seconds,
        "mb_s": text / 1e6 / seconds,
        "peak_rss_mb": peak / 2**20,
        "output_ratio": _du(cache) / text,
    }


_START = """
import json, sys, time
t0 = time.perf_counter()
from bytelm.config import load_config
from bytelm.data import load_corpus_from_config
from bytelm.families import task_class
t_import = time.perf_counter()
cfg = load_config(sys.argv[1], overrides=[f"data.source={sys.argv[2]}", f"data.cache_dir={sys.argv[3]}"])
corpus = load_corpus_from_config(cfg.data)
task = task_class(cfg.model.family)(cfg, corpus)
batch = next(iter(task.train_batches(0, 0, 1)))
t1 = time.perf_counter()
print(json.dumps({"start_s": t1 - t_import, "import_s": t_import - t0}))
"""


def start(specs: list[str], cache: Path) -> float:
    worst = 0.0
    for spec in specs:
        _, _, out = run_measured([sys.executable, "-c", _START, "tiny/byte", spec, str(cache)])
        s = json.loads(out.strip().splitlines()[-1])["start_s"]
        print(f"  start on {spec}: {s:.2f} s (imports excluded)", flush=True)
        worst = max(worst, s)
    return worst


_PIPELINE = """
import json, sys, time
from bytelm.data import WindowBatches, load_corpus
from bytelm.data.prefetch import Prefetch
spec, cache, seconds, B, T = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
corpus = load_corpus(spec, cache_dir=cache, build=False)

def rate(prefetch):
    layout = dict(seed=0, process_index=0, process_count=1)
    it = WindowBatches(corpus.train_stream, batch_size=B, window=T + 1, **layout)
    if prefetch:
        it = Prefetch(it, depth=4)
    for _ in range(10):  # warm the pages and the allocator
        next(it)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        next(it)
        n += 1
    mb_s = n * B * (T + 1) / 1e6 / (time.perf_counter() - t0)
    if prefetch:
        it.close()
    return mb_s

print(json.dumps({"prefetch": rate(True), "inline": rate(False)}))
"""


def pipeline(specs: list[str], cache: Path, seconds: float, batch: int, seq_len: int) -> dict:
    """Training windows delivered per second on each half: with the background prefetch (the
    headline) and made inline (its peer)."""
    worst: dict = {}
    for spec in specs:
        cmd = [sys.executable, "-c", _PIPELINE, spec, str(cache), str(seconds), str(batch), str(seq_len)]
        _, _, out = run_measured(cmd)
        r = json.loads(out.strip().splitlines()[-1])
        print(f"  pipeline on {spec}: {r['prefetch']:,.0f} MB/s with prefetch, {r['inline']:,.0f} inline")
        if not worst or r["prefetch"] < worst["prefetch"]:
            worst = r
    return worst


_BLT = """
import json, sys, time
from bytelm.training.host import configure_cpu_devices
configure_cpu_devices()  # as bytelm train does
import jax
from bytelm.config import load_config
from bytelm.data import WindowBatches, load_corpus_from_config
from bytelm.data.prefetch import Prefetch
from bytelm.training.loop import train
from bytelm.training.restore import make_task
from bytelm.training.trainer import Trainer
work, steps = sys.argv[1], int(sys.argv[2])
quiet = ["train.log_every=1000", "eval.every=0"]
train(load_config("tiny/entropy", [*quiet, "train.steps=60"]), work + "/entropy")  # (kept if done)
cfg = load_config("tiny/blt", [*quiet, f"model.entropy_run={work}/entropy"])
task = make_task(cfg, load_corpus_from_config(cfg.data))
trainer = Trainer(cfg, task)
t = cfg.train

def run(batches, n):
    # as the training loop: a step's loss is read after the next step is dispatched
    pending = trainer.train_step(next(batches))
    t0 = time.perf_counter()
    for _ in range(n):
        m = trainer.train_step(next(batches))
        float(pending["loss"])
        pending = m
    float(pending["loss"])
    return (time.perf_counter() - t0) / n

def precomputed(start, n):
    ids = WindowBatches(task.train_stream(), batch_size=t.batch_size, window=t.seq_len + 1, seed=t.seed,
                        step=start, process_index=0, process_count=1)
    return iter([task.decorate({"ids": next(ids)}) for _ in range(n + 1)])

run(precomputed(0, 3), 3)  # compile and warm up
pre = [run(precomputed(100, steps), steps)]
ahead = Prefetch(task.train_batches(200), 2)
on = run(ahead, steps)
ahead.close()
inline = run(task.train_batches(300), steps)
pre.append(run(precomputed(400, steps), steps))
print(json.dumps({"precomputed_s": sum(pre) / 2, "prefetched_s": on, "inline_s": inline,
                  "batch": t.batch_size, "seq_len": t.seq_len}))
"""


def blt_steps(work: Path, steps: int) -> dict:
    """The tiny BLT's train step with its patching in the pipeline (prefetched; and inline), over
    the step on patch lengths computed beforehand (the mean of one measurement before and one
    after). The entropy model is a tiny byte LM trained 60 steps on the stdlib corpus."""
    _, _, out = run_measured([sys.executable, "-c", _BLT, str(work / "blt"), str(steps)])
    r = json.loads(out.strip().splitlines()[-1])
    print(
        f"  BLT step: {r['precomputed_s'] * 1e3:.0f} ms on precomputed patches, "
        f"{r['prefetched_s'] * 1e3:.0f} ms patching prefetched, {r['inline_s'] * 1e3:.0f} ms inline"
    )
    return r


_ENCODE = """
import json, sys, tempfile, time
from pathlib import Path
from bytelm.data import load_corpus
from bytelm.baselines.token_stream import encode_train_split
spec, cache, tok, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
corpus = load_corpus(spec, cache_dir=cache)
with tempfile.TemporaryDirectory(dir=cache) as out:
    t0 = time.perf_counter()
    m = encode_train_split(corpus, tok, Path(out), workers=workers)
    s = time.perf_counter() - t0
print(json.dumps({"seconds": s, "mb_s": m["bytes"] / 1e6 / s, "parts": m["parts"], "bytes": m["bytes"]}))
"""


def subword(work: Path, sizes_gb: list[float], vocab: int) -> dict:
    """A BPE tokenizer (``vocab`` ids, trained on 8 MB of the generated text: tokenizer training is
    off the ledger) encodes the training split of each corpus's jsonl half into parts, with 1 and
    2 workers (each in its own process tree; peak RSS of the tree)."""
    from bytelm.baselines.bpe import train_bpe

    tok = work / f"bpe-{vocab}"
    if not (tok / "bytelm_bpe.json").is_file():
        text = _base_text().encode("utf-8")[: 8 << 20]
        train_bpe(
            [text[i : i + 65536] for i in range(0, len(text), 65536)], vocab_size=vocab, num_workers=1
        ).save(tok)
    out = {}
    for gb in sizes_gb:
        d = work / f"corpus-{gb:g}gb"
        generate(d, int(gb * 1e9))
        spec, cache = f"jsonl:{d / 'jsonl'}", work / "cache-subword"
        run_measured(
            [sys.executable, "-m", "bytelm", "-q", "data", "prepare", "--data", spec, "--out", str(cache)]
        )
        for workers in (1, 2):
            _, rss, text = run_measured(
                [sys.executable, "-c", _ENCODE, spec, str(cache), str(tok), str(workers)]
            )
            r = json.loads(text.strip().splitlines()[-1])
            r["peak_rss_mb"] = rss / 2**20
            out[(gb, workers)] = r
            print(
                f"  encode {r['bytes'] / 1e6:,.0f} MB with {workers} worker(s): {r['mb_s']:.1f} MB/s, "
                f"{r['parts']} parts, peak RSS {r['peak_rss_mb']:,.0f} MB",
                flush=True,
            )
    return out


_ARRAYRECORD = """
import json, os, sys, time
import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter
from array_record.python.array_record_data_source import ArrayRecordDataSource
from bytelm.data import load_corpus
spec, cache, out = sys.argv[1:4]
seconds, B, T = float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
R, N = 4096, 64 << 20  # ids per record, ids written (the stream's first 64 Mi ids)
stream = load_corpus(spec, cache_dir=cache, build=False).train_stream
N = min(N, len(stream)) // R * R
if not os.path.exists(out):
    # one record per chunk, uncompressed: the fastest random reads of the settings tried (records of
    # 32 Ki ids, compressed: 38 MB/s; 4 Ki, uncompressed: 111 MB/s; a read per row: 11-14 MB/s)
    w = ArrayRecordWriter(out + ".tmp", "group_size:1,uncompressed")
    for lo in range(0, N, R):
        w.write(stream[lo : lo + R].astype(np.uint16).tobytes())
    w.close()
    os.replace(out + ".tmp", out)
source = ArrayRecordDataSource([out])
rng = np.random.default_rng(0)

def arrayrecord(starts):
    rows = np.empty((len(starts), T + 1), np.int32)
    spans = [(s // R, (s + T) // R) for s in starts]
    wanted = sorted({k for a, b in spans for k in range(a, b + 1)})
    got = dict(zip(wanted, source.__getitems__(wanted)))  # one read of the batch's records
    for r, (s, (first, last)) in enumerate(zip(starts, spans)):
        chunk = np.frombuffer(b"".join(got[k] for k in range(first, last + 1)), np.uint16)
        rows[r] = chunk[s - first * R : s - first * R + T + 1]
    return rows

def memmap(starts):
    return stream.windows(starts, T + 1)

def rate(fn):
    fn(rng.integers(0, N - T - 1, B))
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn(rng.integers(0, N - T - 1, B))
        n += 1
    return n * B * (T + 1) / 1e6 / (time.perf_counter() - t0)

starts = rng.integers(0, N - T - 1, B)
assert np.array_equal(arrayrecord(starts), memmap(starts))  # the same rows
print(json.dumps({"arrayrecord_mb_s": rate(arrayrecord), "memmap_mb_s": rate(memmap),
                  "arrayrecord_bytes_per_id": os.path.getsize(out) / N}))
"""


def arrayrecord_peer(spec: str, cache: Path, work: Path, seconds: float, batch: int, seq_len: int) -> dict:
    """Random training windows read from ArrayRecord (the format grain reads: the training stream's
    ids in records of 4 Ki ids, uncompressed, group size 1 for random access; one read of the records
    a batch spans, each window assembled from its records) against the same windows gathered from
    the memory-mapped shards. Grain over ArrayRecord adds its sampler and workers on top of these
    reads, so this is that peer's upper bound."""
    out = work / "stream-4k-uncompressed.array_record"
    cmd = [
        sys.executable,
        "-c",
        _ARRAYRECORD,
        spec,
        str(cache),
        str(out),
        str(seconds),
        str(batch),
        str(seq_len),
    ]
    _, _, text = run_measured(cmd)
    r = json.loads(text.strip().splitlines()[-1])
    print(
        f"  random windows: ArrayRecord {r['arrayrecord_mb_s']:,.0f} MB/s, memory-mapped shards "
        f"{r['memmap_mb_s']:,.0f} MB/s (ArrayRecord: {r['arrayrecord_bytes_per_id']:.2f} bytes per id)",
        flush=True,
    )
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=4.0, help="corpus size in GB of text (default 4)")
    p.add_argument(
        "--small-gb", type=float, default=1.0, help="the smaller corpus (memory flatness; 0: skip)"
    )
    p.add_argument("--workers", type=int, default=2, help="preparation workers (default 2)")
    p.add_argument("--work", default="/tmp/bytelm-data-scale", help="where corpora and caches go")
    p.add_argument("--seconds", type=float, default=5.0, help="pipeline measurement time per half")
    p.add_argument("--blt-steps", type=int, default=20, help="BLT steps per measurement (default 20)")
    p.add_argument(
        "--subword-gb",
        type=float,
        nargs=2,
        default=[0.128, 1.0],
        help="two corpora whose jsonl halves the subword encoding runs on (default 0.128 1)",
    )
    p.add_argument("--subword-vocab", type=int, default=4096, help="BPE vocabulary (default 4096)")
    p.add_argument("--batch-size", type=int, default=64, help="pipeline batch (default 64 rows)")
    p.add_argument("--seq-len", type=int, default=2048, help="pipeline window T (rows of T+1; default 2048)")
    p.add_argument(
        "--record",
        action="store_true",
        help="append the JSON line to benchmarks/results/ (printed either way)",
    )
    args = p.parse_args()
    work = Path(args.work)
    results: dict = {}

    small = None
    if args.small_gb:
        print(f"corpus of {args.small_gb} GB:", flush=True)
        info = generate(work / f"corpus-{args.small_gb:g}gb", int(args.small_gb * 1e9))
        small = prepare(work / f"corpus-{args.small_gb:g}gb", info, work / "cache-small", args.workers)
    print(f"corpus of {args.gb} GB:", flush=True)
    info = generate(work / f"corpus-{args.gb:g}gb", int(args.gb * 1e9))
    big = prepare(work / f"corpus-{args.gb:g}gb", info, work / "cache", args.workers)
    results["prepare_mb_s"] = round(big["mb_s"], 1)
    results["prepare_peak_rss_mb"] = round(big["peak_rss_mb"])
    if small:
        results["prepare_peak_rss_small_mb"] = round(small["peak_rss_mb"])
    results["output_ratio"] = round(big["output_ratio"], 4)
    results["start_s"] = round(start(big["specs"], work / "cache"), 2)
    r = pipeline(big["specs"], work / "cache", args.seconds, args.batch_size, args.seq_len)
    results["pipeline_mb_s"] = round(r["prefetch"], 1)
    results["pipeline_inline_mb_s"] = round(r["inline"], 1)
    r = arrayrecord_peer(big["specs"][0], work / "cache", work, args.seconds, args.batch_size, args.seq_len)
    results["arrayrecord_window_mb_s"] = round(r["arrayrecord_mb_s"], 1)
    results["memmap_window_mb_s"] = round(r["memmap_mb_s"], 1)
    r = blt_steps(work, args.blt_steps)
    results["blt_step_ratio"] = round(r["prefetched_s"] / r["precomputed_s"], 3)
    results["blt_step_ratio_inline"] = round(r["inline_s"] / r["precomputed_s"], 3)
    small_gb, big_gb = args.subword_gb
    enc = subword(work, [small_gb, big_gb], args.subword_vocab)
    results["subword_encode_mb_s"] = round(enc[(big_gb, 2)]["mb_s"], 2)
    results["subword_encode_scaling"] = round(enc[(big_gb, 2)]["mb_s"] / enc[(big_gb, 1)]["mb_s"], 3)
    results["subword_encode_peak_rss_mb"] = round(enc[(big_gb, 2)]["peak_rss_mb"])
    results["subword_encode_peak_rss_small_mb"] = round(enc[(small_gb, 2)]["peak_rss_mb"])
    results["gb"] = args.gb
    results["workers"] = args.workers
    print(json.dumps(results))
    if args.record:
        record("data_scale", results, note=f"generated corpus: {json.dumps(info)}")


if __name__ == "__main__":
    main()
