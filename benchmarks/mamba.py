"""Mamba-2 layers' speed (bytelm/models/ssd.py), each figure against a peer measured in the same run.

``train``     Training throughput at T = 8192 (batch 1): a MambaByte stack (6 Mamba-2 layers x 256,
              state 128, heads of 64 channels, chunks of 256 positions) against the byte LM's
              attention stack of the same width and depth (6 x 256, 4 heads, SwiGLU 704, full causal
              attention through the package's default kernel), one bytelm training step each on the
              same random bytes, in two worker processes timed alternately (train_step.py's).
              ``ssd_vs_attention_t8192`` is the median per-round ratio of the attention stack's step
              time to the Mamba stack's (the same bytes per step: the ratio of bytes/s). Target (the
              Mamba-2 issue): >= 1.5 on CPU.
``generate``  Cached decoding against full recomputation (as ``benchmarks/generate.py``): the tiny
              MambaByte (``configs/tiny/mambabyte.toml``, freshly initialised: decoding speed does not
              depend on the weights) generates ``--max-bytes`` bytes after a 64-byte stdlib prompt at a
              context of ``--context``, carrying each layer's state, then again recomputing the whole
              prefix for every byte (one padded width, one compiled program).
              ``mambabyte_cached_speedup`` = the recomputation's time over the cache's. Target: >= 5.

The last line is one JSON object of the headline figures.

    python benchmarks/mamba.py [--only train,generate] [--steps 6] [--max-bytes 256] [--record]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from results import record
from train_step import Worker, alternate, cpu_model, seconds, spread

WIDTH, DEPTH, T = 256, 6, 8192
ATTENTION = [
    "model.family=byte",
    f"model.d_model={WIDTH}",
    f"model.n_layers={DEPTH}",
    "model.n_heads=4",
    "model.mlp_dim=704",
]
MAMBA = [
    "model.family=mambabyte",
    f"model.d_model={WIDTH}",
    f"model.n_layers={DEPTH}",
    "model.d_state=128",
    "model.head_dim=64",
    "model.chunk=256",
]


def train_section(steps: int, result: dict) -> None:
    with (
        Worker("jax", model_overrides=ATTENTION, batch=1, seq_len=T) as attention,
        Worker("jax", model_overrides=MAMBA, batch=1, seq_len=T) as mamba,
    ):
        at, mt = alternate(attention, mamba, steps)
        info_a, info_m = attention.info, mamba.info
    ratios = spread([a / m for a, m in zip(seconds(at, "step_s"), seconds(mt, "step_s"))])
    dt_a, dt_m = float(np.median(seconds(at, "step_s"))), float(np.median(seconds(mt, "step_s")))
    for name, dt, info in (("attention", dt_a, info_a), ("Mamba-2", dt_m, info_m)):
        print(
            f"{name:<10} {DEPTH} x {WIDTH}, T={T}, params={info['params']:,}: {T / dt:,.0f} bytes/s, "
            f"{info['flops_per_step'] / T / 1e6:.1f} MFLOP/byte (analytic, training)"
        )
    print(
        f"Mamba-2 / attention bytes/s per round: median {ratios['median']} "
        f"(min {ratios['min']}, max {ratios['max']})"
    )
    result.update(
        ssd_vs_attention_t8192=ratios["median"],
        ssd_vs_attention_t8192_min=ratios["min"],
        ssd_vs_attention_t8192_max=ratios["max"],
        mamba_t8192_bytes_s=round(T / dt_m),
        attention_t8192_bytes_s=round(T / dt_a),
    )


def generate_section(max_bytes: int, context: int, result: dict) -> None:
    from flax import nnx
    from generate import recompute_generate

    from bytelm.config import load_config, resolve_config_path
    from bytelm.constants import EOS_ID
    from bytelm.data import load_corpus
    from bytelm.families.byte import byte_decoder
    from bytelm.families.mambabyte.model import MambaByte
    from bytelm.generate import generate
    from bytelm.sampling.sampler import SamplingOptions

    cfg = load_config(resolve_config_path("tiny/mambabyte"), [f"train.seq_len={context}"])
    decoder = byte_decoder(MambaByte(cfg.model, rngs=nnx.Rngs(0)), context)
    decoder.allowed_V[EOS_ID] = False  # every measurement generates exactly max_bytes bytes
    prompt = bytes(load_corpus("stdlib").train_stream[1000:1064].astype(np.uint8))
    options = SamplingOptions(seed=0, top_k=0)

    generate(decoder, prompt, max_bytes=32, options=options)  # compile the prefill and the step
    recompute_generate(decoder, prompt, 2, options)  # compile the full pass
    t0 = time.perf_counter()
    cached = generate(decoder, prompt, max_bytes=max_bytes, options=options)
    cached_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    full = recompute_generate(decoder, prompt, max_bytes, options)
    full_s = time.perf_counter() - t0
    print(
        f"MambaByte (tiny) generation at context {context}: cached {max_bytes / cached_s:.1f} B/s, "
        f"recompute {max_bytes / full_s:.1f} B/s, speedup {full_s / cached_s:.1f}x; "
        f"same sample {cached == full}"
    )
    result.update(
        mambabyte_cached_speedup=round(full_s / cached_s, 2),
        mambabyte_cached_bytes_s=round(max_bytes / cached_s, 1),
        mambabyte_recompute_bytes_s=round(max_bytes / full_s, 1),
        mambabyte_same_sample=cached == full,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="train,generate", help="comma-separated sections: train, generate")
    p.add_argument("--steps", type=int, default=6, help="alternating rounds (one timed step per side each)")
    p.add_argument(
        "--max-bytes", type=int, default=256, help="bytes generated per measurement (default: 256)"
    )
    p.add_argument("--context", type=int, default=1024, help="decoding context in bytes (default: 1024)")
    p.add_argument("--record", action="store_true", help="append the JSON line to benchmarks/results/")
    args = p.parse_args()
    sections = {s for s in args.only.split(",") if s}
    unknown = sections - {"train", "generate"}
    if unknown:
        raise SystemExit(f"--only: unknown sections {sorted(unknown)} (known: train, generate)")
    result: dict = {"cpu": cpu_model()}
    if "train" in sections:
        train_section(args.steps, result)
    if "generate" in sections:
        generate_section(args.max_bytes, args.context, result)
    print(json.dumps(result))
    if args.record:
        record("mamba", result)


if __name__ == "__main__":
    main()
