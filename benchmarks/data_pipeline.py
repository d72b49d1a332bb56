"""Throughput of the training batch iterator (issue: foundation).

Measures batches/s and bytes/s of ``WindowBatches`` over the stdlib corpus's training stream for
B=64, T=2048 (windows of T+1 ids), after one warm-up pass. "Bytes" are corpus bytes delivered:
one byte id per corpus byte, B*(T+1) per batch (the int32 arrays handed to the model are 4x
larger in memory). The last line is a JSON object with the headline figures.

    python benchmarks/data_pipeline.py [--data SPEC] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import time

from results import record

from bytelm.data import WindowBatches, load_corpus


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="stdlib", help="corpus spec (default: stdlib)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--seconds", type=float, default=3.0, help="measurement time")
    p.add_argument(
        "--record",
        action="store_true",
        help="append the JSON line to benchmarks/results/ (printed either way)",
    )
    args = p.parse_args()

    corpus = load_corpus(args.data)
    stream = corpus.train_stream
    it = WindowBatches(
        stream, batch_size=args.batch_size, window=args.seq_len + 1, seed=0, process_index=0, process_count=1
    )
    for _ in range(20):  # warm the page cache and the allocator
        next(it)
    n = 0
    t0 = time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < args.seconds:
        for _ in range(10):
            batch = next(it)
        n += 10
    elapsed = time.perf_counter() - t0
    per_batch = batch.shape[0] * batch.shape[1]
    batches_s = n / elapsed
    bytes_s = batches_s * per_batch
    print(f"corpus {args.data}: train stream {len(stream):,} ids")
    print(f"B={args.batch_size} T={args.seq_len}: {n} batches in {elapsed:.2f} s")
    print(f"{batches_s:,.1f} batches/s, {bytes_s / 1e6:,.1f} MB/s of corpus bytes delivered")
    result = {
        "batches_s": round(batches_s, 2),
        "bytes_s": round(bytes_s),
        "mb_per_s": round(bytes_s / 1e6, 1),
    }
    print(json.dumps(result))
    if args.record:
        record("data_pipeline", result)


if __name__ == "__main__":
    main()
