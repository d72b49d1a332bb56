"""The report's bootstrap at cluster scale, against the plain numpy bootstrap measured in the same run.

10 models x 100,000 held-out documents x 1,000 resamples (documents of log-normal length, bits per
byte scattered around 2): ``bootstrap_s`` is the wall time of ``bytelm.evaluation.stats.bootstrap``
(per resample one draw of the documents, their counts, one matrix product for every model).
The peer is the same resampling written plainly (``bits[:, idx].sum(axis=1)`` per resample, the
gather a reader would write), timed on ``--peer-resamples`` resamples and scaled to 1,000:
``bootstrap_speedup`` = the peer's time over ours. Both take the same draws; their BPB samples
are checked equal (1e-9) on the resamples the peer ran. ``group_intervals_s``: the per-group
intervals of the same scores over 30 groups (a report computes them for its groups and its
directories). Target (the measuring-instrument issue):
``bootstrap_s`` < 5 on 2 cores.

    python benchmarks/bootstrap.py [--models 10] [--documents 100000] [--resamples 1000] [--record]

The last line is one JSON object of the headline figures; ``--record`` also appends it to
``benchmarks/results/bootstrap.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from bytelm.evaluation import stats


def plain(bits: np.ndarray, nbytes: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    D = len(nbytes)
    out = np.empty((resamples, bits.shape[0]))
    for r in range(resamples):
        idx = rng.integers(0, D, size=D)
        out[r] = bits[:, idx].sum(axis=1) / nbytes[idx].sum()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=10, help="models scored (default 10)")
    ap.add_argument("--documents", type=int, default=100_000, help="held-out documents (default 100,000)")
    ap.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1,000)")
    ap.add_argument(
        "--peer-resamples", type=int, default=100, help="resamples the plain peer runs (default 100)"
    )
    ap.add_argument("--record", action="store_true", help="append the JSON line to benchmarks/results/")
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    nbytes = np.maximum(1, rng.lognormal(7.0, 1.0, size=args.documents)).astype(np.int64)
    bits = 2.0 * rng.gamma(8.0, 1 / 8.0, size=(args.models, args.documents)) * nbytes

    stats.bootstrap([b[None] for b in bits], nbytes, resamples=2, seed=1)  # (warm the code paths)
    t0 = time.perf_counter()
    ours = stats.bootstrap([b[None] for b in bits], nbytes, resamples=args.resamples, seed=0)
    ours_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs = plain(bits, nbytes, args.peer_resamples, 0)
    peer_s = (time.perf_counter() - t0) * args.resamples / args.peer_resamples
    same = bool(np.allclose(ours[: args.peer_resamples], theirs, rtol=1e-9, atol=0))
    labels = [f"group{i % 30}" for i in range(args.documents)]
    t0 = time.perf_counter()
    stats.group_intervals([b[None] for b in bits], nbytes, labels, resamples=args.resamples)
    groups_s = time.perf_counter() - t0
    result = {
        "models": args.models,
        "documents": args.documents,
        "resamples": args.resamples,
        "cores": os.cpu_count(),
        "bootstrap_s": round(ours_s, 3),
        "plain_bootstrap_s": round(peer_s, 3),
        "bootstrap_speedup": round(peer_s / ours_s, 2),
        "same_samples": same,
        "group_intervals_s": round(groups_s, 3),
    }
    if args.record:
        from results import record

        record("bootstrap", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
