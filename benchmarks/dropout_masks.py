"""The cost of dropout masks: ``jax.random.bernoulli`` (threefry, and the ``rbg`` key) against the
keyed hash of ``bytelm.models.core.dropout_bits``, with the zero-cost peer of no mask at all.

The masks are those of one forward pass of the ten-minute byte LM (``configs/cpu/byte_10min.toml``:
4 layers, width 192, batch 16 x 256): nine activations of ``16 x 256 x 192`` (the embedding, and
each block's attention and MLP outputs), each masked and rescaled in one jitted function. Each
variant is compiled once, then timed over ``--repeats`` calls in turn with the others (the order
alternates each round, so a drift of the machine lands on all of them); the medians are printed.
The last line is one JSON object: milliseconds per forward pass's masks (``threefry_ms``,
``rbg_ms``, ``hash_ms``, ``none_ms``) and ``threefry_over_hash``.

    python benchmarks/dropout_masks.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
from results import record
from train_step import cpu_model  # (benchmarks/ is on sys.path when this script runs)

from bytelm.models.core import dropout_bits

SHAPE, SITES, RATE = (16, 256, 192), 9, 0.1


def masked(kind: str):
    threshold = jnp.uint32(round(RATE * 2**32))

    @jax.jit
    def run(key, x):
        out = x
        for site in range(SITES):
            k = jax.random.fold_in(key, site)
            if kind == "hash":
                keep = dropout_bits(k, SHAPE) >= threshold
            elif kind == "none":
                keep = jnp.ones(SHAPE, bool)
            else:
                keep = jax.random.bernoulli(k, 1.0 - RATE, SHAPE)
            out = jnp.where(keep, out / (1.0 - RATE), 0.0) + 1.0  # + 1: no site can be folded away
        return out

    impl = "rbg" if kind == "rbg" else "threefry2x32"
    return run, jax.random.key(0, impl=impl)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=30, help="timed calls per variant (default 30)")
    p.add_argument(
        "--record",
        action="store_true",
        help="append the JSON line to benchmarks/results/ (printed either way)",
    )
    args = p.parse_args()
    x = jax.random.normal(jax.random.key(1), SHAPE)
    kinds = ["threefry", "rbg", "hash", "none"]
    runs = {k: masked(k) for k in kinds}
    for fn, key in runs.values():
        fn(key, x).block_until_ready()
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.repeats):
        for k in kinds if r % 2 == 0 else kinds[::-1]:
            fn, key = runs[k]
            t = time.perf_counter()
            fn(jax.random.fold_in(key, r), x).block_until_ready()
            times[k].append(time.perf_counter() - t)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    for k in kinds:
        print(f"{k:>9}: {ms[k]:8.2f} ms for {SITES} masks of {SHAPE}")
    result = {
        **{f"{k}_ms": round(v, 3) for k, v in ms.items()},
        "threefry_over_hash": round(ms["threefry"] / ms["hash"], 1),
        "cpu": cpu_model(),
        "devices": jax.device_count(),
    }
    print(json.dumps(result))
    if args.record:
        record("dropout_masks", result)


if __name__ == "__main__":
    main()
