"""SpaceByte's speed, each figure against a peer measured in the same run.

``train``     Training throughput at T = 2048 (batch 4) against the flat byte LM that MegaByte, BLT and
              H-Net are measured against (``benchmarks/train_step.py``: 6 x 256, full attention). The
              SpaceByte's global blocks are that same 6 x 256 stack, over at most T / 6 global
              positions (the paper's slots); its local blocks are 128 wide (the paper's D / 2), 2
              before and 2 after, sliding window 128. A step's cost does not depend on where the
              global positions fall (the slots are static), so random bytes do. Paired, alternating
              timing in two worker processes (train_step.py's): ``spacebyte_vs_flat`` is the median
              per-round ratio of the flat model's step time to the SpaceByte's (the same bytes per
              step: the ratio of bytes/s). Target (the SpaceByte issue): >= 2.
``generate``  Cached decoding against full recomputation (as ``benchmarks/generate.py``): the tiny
              SpaceByte (``configs/tiny/spacebyte.toml``) trained ``--train-steps`` steps on the
              stdlib corpus here (its ``spacebyte_overflow_rate``: the fraction of training windows
              with more global positions than slots, from the run's record), then ``--max-bytes``
              bytes generated after a 64-byte stdlib prompt at a context of ``--context`` with the
              caches, and again by recomputing the full pass for every byte.
              ``spacebyte_cached_speedup`` = the recomputation's time over the cache's. Target: >= 5.

The last line is one JSON object of the headline figures. About 6 minutes on a 2-core CPU.

    python benchmarks/spacebyte.py [--only train,generate] [--steps 6] [--train-steps 120]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from results import record
from train_step import FLAT, Worker, alternate, cpu_model, seconds, spread

SPACEBYTE = [
    "model.family=spacebyte",
    "model.local.d_model=128",
    "model.local.heads=2",
    "model.local.mlp_dim=352",
    "model.local.encoder_layers=2",
    "model.local.decoder_layers=2",
    "model.local.window=128",
    "model.global.d_model=256",
    "model.global.layers=6",
    "model.global.heads=4",
    "model.global.mlp_dim=704",
    "model.bytes_per_slot=6.0",
]


def train_section(steps: int, result: dict) -> None:
    T, B = 2048, 4
    with (
        Worker("jax", model_overrides=FLAT, batch=B, seq_len=T) as flat,
        Worker("jax", model_overrides=SPACEBYTE, batch=B, seq_len=T) as sb,
    ):
        ft, st = alternate(flat, sb, steps)
        info_flat, info_sb = flat.info, sb.info
    ratios = spread([f / h for f, h in zip(seconds(ft, "step_s"), seconds(st, "step_s"))])
    dt_f, dt_s = float(np.median(seconds(ft, "step_s"))), float(np.median(seconds(st, "step_s")))
    for name, dt, info in (("flat byte LM", dt_f, info_flat), ("SpaceByte", dt_s, info_sb)):
        print(
            f"{name:<13} T={T} B={B} params={info['params']:,}: {B * T / dt:,.0f} bytes/s, "
            f"{info['flops_per_step'] / (B * T) / 1e6:.1f} MFLOP/byte (analytic, training)"
        )
    print(
        f"SpaceByte / flat bytes/s per round: median {ratios['median']} (min {ratios['min']}, max "
        f"{ratios['max']})"
    )
    result.update(
        spacebyte_vs_flat=ratios["median"],
        spacebyte_vs_flat_min=ratios["min"],
        spacebyte_vs_flat_max=ratios["max"],
        spacebyte_t2048_bytes_s=round(B * T / dt_s),
        flat_t2048_bytes_s=round(B * T / dt_f),
        spacebyte_params=info_sb["params"],
        flat_params=info_flat["params"],
    )


def generate_section(train_steps: int, max_bytes: int, context: int, result: dict) -> None:
    from flax import nnx
    from generate import recompute_generate

    from bytelm.config import load_config, resolve_config_path
    from bytelm.constants import EOS_ID
    from bytelm.data import load_corpus
    from bytelm.families.spacebyte.decoder import SpaceByteDecoder
    from bytelm.generate import generate
    from bytelm.sampling.sampler import SamplingOptions
    from bytelm.training.loop import train
    from bytelm.training.restore import restore_scorer

    run = tempfile.mkdtemp(prefix="bytelm-spacebyte-bench-")
    cfg = load_config(
        resolve_config_path("tiny/spacebyte"),
        [
            f"train.steps={train_steps}",
            "eval.every=0",
            "train.checkpoint_every=100000",
            "train.peak_flops=1e11",
        ],
    )
    t0 = time.perf_counter()
    train(cfg, run)
    print(f"tiny SpaceByte trained {train_steps} steps in {time.perf_counter() - t0:.0f} s")
    trainer = restore_scorer(run, load_corpus=False)
    model = nnx.merge(trainer.graphdef, trainer.model_params)
    decoder = SpaceByteDecoder(model, context)
    decoder.allowed_V[EOS_ID] = False  # every measurement generates exactly max_bytes bytes
    corpus = load_corpus("stdlib")
    prompt = bytes(corpus.train_stream[1000:1064].astype(np.uint8))
    options = SamplingOptions(seed=0, top_k=0)
    generate(decoder, prompt, max_bytes=32, options=options)  # compile
    recompute_generate(decoder, prompt, 2, options)
    t0 = time.perf_counter()
    cached = generate(decoder, prompt, max_bytes=max_bytes, options=options)
    cached_s = time.perf_counter() - t0
    globals_ = decoder.stats()["global_positions"]
    t0 = time.perf_counter()
    full = recompute_generate(decoder, prompt, max_bytes, options)
    full_s = time.perf_counter() - t0
    overflow = json.loads((Path(run) / "run.json").read_text())["overflow_windows"]
    print(
        f"SpaceByte (tiny) generation at context {context}: cached {max_bytes / cached_s:.1f} B/s, "
        f"recompute {max_bytes / full_s:.1f} B/s, speedup {full_s / cached_s:.1f}x; same sample "
        f"{cached == full}; {globals_} global positions over the prompt and generated bytes; training "
        f"windows that overflowed their slots: {100 * overflow:.1f}%"
    )
    result.update(
        spacebyte_cached_speedup=round(full_s / cached_s, 2),
        spacebyte_cached_bytes_s=round(max_bytes / cached_s, 1),
        spacebyte_recompute_bytes_s=round(max_bytes / full_s, 1),
        spacebyte_same_sample=cached == full,
        spacebyte_overflow_rate=round(overflow, 4),
        spacebyte_train_steps=train_steps,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="train,generate", help="comma-separated sections: train, generate")
    p.add_argument("--steps", type=int, default=6, help="alternating timing rounds (train)")
    p.add_argument("--train-steps", type=int, default=120, help="training steps of the generating model")
    p.add_argument("--max-bytes", type=int, default=256, help="bytes generated per measurement")
    p.add_argument("--context", type=int, default=1024, help="the decoder's context (positions)")
    p.add_argument(
        "--record",
        action="store_true",
        help="append the JSON line to benchmarks/results/ (printed either way)",
    )
    args = p.parse_args()
    sections = set(args.only.split(","))
    result: dict = {"cpu": cpu_model()}
    if "train" in sections:
        train_section(args.steps, result)
    if "generate" in sections:
        generate_section(args.train_steps, args.max_bytes, args.context, result)
    print(json.dumps(result))
    if args.record:
        record("spacebyte", result)


if __name__ == "__main__":
    main()
