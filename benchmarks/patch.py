"""``bytelm patch`` on large files: speed (MB of input per second) and peak memory at two file sizes.

Trains (or takes, ``--run``) an entropy-model run of the default compare's entropy configuration
(``configs/tiny/entropy.toml``: a 2-layer byte LM, window 64, ``train.seq_len`` 256, so windows of
257 positions; a few steps only: the weights do not change the speed), writes a text file of each
size from ``--corpus`` (repeated to length; default: tiny shakespeare from the shared corpora, else
random common words), and runs ``bytelm patch RUN --file F --threshold T`` on each as a child
process, reading its peak resident memory from the kernel (``os.wait4``). The peer measured in the
same run: the entropy model's bare forward (the same rows through :class:`EntropyModel`, in
process, no file reading, boundary rules or printing), and a 2048 x 2048 float32 matmul, whose rate
bounds what any implementation of this model can reach here (``bound_mb_s``: that rate over the
model's FLOPs per byte).

    python benchmarks/patch.py [--sizes-mb 1 8] [--run RUN] [--corpus FILE] [--record]

The last line is one JSON object: ``patch_mb_s`` (the largest file), ``peak_rss_mb`` per size,
``rss_growth`` (largest over smallest), ``forward_mb_s``, ``patch_vs_forward``, ``flops_per_byte``,
``matmul_gflops``, ``bound_mb_s``. ``--record`` also appends it to ``benchmarks/results/patch.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT.parent / "shared" / "corpora" / "tinyshakespeare.txt"


def text_of_size(corpus: Path | None, size: int) -> bytes:
    if corpus is not None and corpus.is_file():
        base = corpus.read_bytes()
    else:
        words = "the of and to in is that for it as with was on be by this are from at or an which".split()
        base = " ".join(np.random.default_rng(0).choice(words, size=200_000)).encode()
    return (base * (size // len(base) + 1))[:size]


def train_entropy_run(out: Path) -> Path:
    cmd = [
        sys.executable, "-m", "bytelm", "train", str(ROOT / "bytelm/configs/tiny/entropy.toml"),
        "--out", str(out), "--set", "train.steps=2", "--set", "eval.every=0", "-q",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def run_patch(run: Path, path: Path, threshold: float) -> tuple[float, float]:
    """(seconds, peak RSS in MB) of ``bytelm patch`` on ``path`` in a child process."""
    cmd = [
        sys.executable,
        "-m",
        "bytelm",
        "patch",
        str(run),
        "--file",
        str(path),
        "--threshold",
        str(threshold),
    ]
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        child = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"bytelm patch failed ({child.returncode}): {child.stderr.read().decode()[-2000:]}")
    return seconds, usage.ru_maxrss / 1024  # (kilobytes on Linux)


def peer_forward(run: Path, rows: int = 64) -> tuple[float, float, float]:
    """(MB/s of the bare forward, FLOPs per byte, matmul GFLOP/s), in process."""
    import jax
    import jax.numpy as jnp

    from bytelm.config import load_run_config
    from bytelm.families.blt.flops import entropy_forward_flops_per_id
    from bytelm.patching import EntropyModel
    from bytelm.training.restore import restore_model

    cfg = load_run_config(run)
    width = cfg.train.seq_len + 1
    model = EntropyModel(restore_model(run), width=width)
    ids = np.random.default_rng(0).integers(4, 260, (rows, width)).astype(np.int32)
    model.entropies(ids[:2])
    t0 = time.perf_counter()
    model.entropies(ids)
    forward_mb_s = rows * width / (time.perf_counter() - t0) / 1e6
    a = jnp.ones((2048, 2048), jnp.float32)
    (a @ a).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(10):
        (a @ a).block_until_ready()
    gflops = 10 * 2 * 2048**3 / (time.perf_counter() - t0) / 1e9
    del jax
    return forward_mb_s, entropy_forward_flops_per_id(cfg.model, cfg.train.seq_len), gflops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 8], help="file sizes to patch (MB)")
    ap.add_argument("--run", type=Path, help="an entropy-model or BLT run (default: train a tiny one)")
    ap.add_argument("--corpus", type=Path, default=SHAKESPEARE, help="text repeated into the files")
    ap.add_argument("--threshold", type=float, default=2.0, help="the entropy threshold (nats)")
    ap.add_argument("--record", action="store_true", help="append the JSON line to benchmarks/results/")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run or train_entropy_run(Path(tmp) / "entropy")
        rss, rates = {}, {}
        for mb in sorted(args.sizes_mb):
            path = Path(tmp) / f"text_{mb:g}mb.txt"
            path.write_bytes(text_of_size(args.corpus, int(mb * 1e6)))
            seconds, peak = run_patch(run, path, args.threshold)
            rss[f"{mb:g}"], rates[f"{mb:g}"] = round(peak, 1), round(mb / seconds, 4)
            print(
                f"patch {mb:g} MB: {seconds:.1f}s, {mb / seconds:.4f} MB/s, peak RSS {peak:.0f} MB",
                flush=True,
            )
            path.unlink()
        forward_mb_s, flops_per_byte, gflops = peer_forward(run)
    largest, smallest = max(args.sizes_mb), min(args.sizes_mb)
    result = {
        "sizes_mb": sorted(args.sizes_mb),
        "cores": os.cpu_count(),
        "patch_mb_s": rates[f"{largest:g}"],
        "patch_mb_s_by_size": rates,
        "peak_rss_mb": rss,
        "rss_growth": round(rss[f"{largest:g}"] / rss[f"{smallest:g}"], 3),
        "forward_mb_s": round(forward_mb_s, 4),
        "patch_vs_forward": round(rates[f"{largest:g}"] / forward_mb_s, 3),
        "flops_per_byte": round(flops_per_byte),
        "matmul_gflops": round(gflops, 1),
        "bound_mb_s": round(gflops * 1e9 / flops_per_byte / 1e6, 4),
    }
    if args.record:
        from results import record

        record("patch", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
