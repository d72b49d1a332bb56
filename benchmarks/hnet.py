"""H-Net's speed, each figure against a peer measured in the same run.

``train``     Training throughput at T = 2048 (batch 4) against the flat byte LM that MegaByte and BLT
              are measured against (``benchmarks/train_step.py``: 6 x 256, full attention). The
              H-Net's main network is that same 6 x 256 stack, over chunks of N = 6 bytes (slots for
              twice the expected chunks, as the presets); its stage 1 is 128 wide, encoder and decoder
              4 Mamba-2 layers each (the released layout's ``m4``, as the presets; state 32, heads of
              32 channels, chunks of 16, as the tiny preset). ``--outer attention``: 2 attention
              blocks each (sliding window 64) instead, the attention-outer variant. A training step's
              cost does not depend on where the router puts boundaries (the chunk slots are static),
              so random bytes do. Paired,
              alternating timing in two worker processes (train_step.py's): ``hnet_vs_flat`` is the
              median per-round ratio of the flat model's step time to the H-Net's (the same bytes per
              step: the ratio of bytes/s). Target (the H-Net issue): >= 2.
``generate``  Cached decoding against full recomputation (as ``benchmarks/generate.py`` for the other
              families): the tiny H-Net (``configs/tiny/hnet.toml``) trained ``--train-steps`` steps on
              the stdlib corpus here (so its router makes chunks of a trained length; the figure is
              reported), then ``--max-bytes`` bytes generated after a 64-byte stdlib prompt at a
              context of ``--context`` with the caches, and again by recomputing the full pass for
              every byte (one padded width, one compiled program). ``hnet_cached_speedup`` = the
              recomputation's time over the cache's. Target: >= 5.

The last line is one JSON object of the headline figures. About 6 minutes on a 2-core CPU.

    python benchmarks/hnet.py [--only train,generate] [--steps 6] [--train-steps 120]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from results import record
from train_step import FLAT, Worker, alternate, cpu_model, seconds, spread

HNET = [
    "model.family=hnet",
    "model.stages=1",
    "model.local.d_model=128",
    "model.local.heads=2",
    "model.local.mlp_dim=352",
    "model.local.window=64",
    "model.ssm.d_state=32",
    "model.ssm.head_dim=32",
    "model.ssm.chunk=16",
    "model.global.d_model=256",
    "model.global.layers=6",
    "model.global.heads=4",
    "model.global.mlp_dim=704",
    "model.target_chunk_len=6.0",
    "model.chunk_slots=2.0",
]


OUTER = {
    "mamba": ["model.local.encoder=m4", "model.local.decoder=m4"],
    "attention": ["model.local.encoder=T2", "model.local.decoder=T2"],
}


def train_section(steps: int, outer: str, result: dict) -> None:
    T, B = 2048, 4
    with (
        Worker("jax", model_overrides=FLAT, batch=B, seq_len=T) as flat,
        Worker("jax", model_overrides=HNET + OUTER[outer], batch=B, seq_len=T) as hnet,
    ):
        ft, ht = alternate(flat, hnet, steps)
        info_flat, info_hnet = flat.info, hnet.info
    ratios = spread([f / h for f, h in zip(seconds(ft, "step_s"), seconds(ht, "step_s"))])
    dt_f, dt_h = float(np.median(seconds(ft, "step_s"))), float(np.median(seconds(ht, "step_s")))
    for name, dt, info in (("flat byte LM", dt_f, info_flat), ("H-Net N=6", dt_h, info_hnet)):
        print(
            f"{name:<13} T={T} B={B} params={info['params']:,}: {B * T / dt:,.0f} bytes/s, "
            f"{info['flops_per_step'] / (B * T) / 1e6:.1f} MFLOP/byte (analytic, training)"
        )
    print(
        f"H-Net / flat bytes/s per round: median {ratios['median']} (min {ratios['min']}, max "
        f"{ratios['max']})"
    )
    result.update(
        hnet_outer=outer,
        hnet_vs_flat=ratios["median"],
        hnet_vs_flat_min=ratios["min"],
        hnet_vs_flat_max=ratios["max"],
        hnet_t2048_bytes_s=round(B * T / dt_h),
        flat_t2048_bytes_s=round(B * T / dt_f),
        hnet_params=info_hnet["params"],
        flat_params=info_flat["params"],
    )


def generate_section(train_steps: int, max_bytes: int, context: int, result: dict) -> None:
    from generate import cached_and_recomputed, trained_tiny_decoder

    from bytelm.families.hnet.decoder import HNetDecoder

    decoder, _ = trained_tiny_decoder("tiny/hnet", train_steps, HNetDecoder, context)
    cached, cached_s, full, full_s = cached_and_recomputed(decoder, max_bytes)
    chunks = decoder.stats()["chunks_per_stage"][0]
    mean_chunk = (1 + 64 + max_bytes - 1) / max(chunks, 1)  # (BOS, the 64-byte prompt, the bytes fed back)
    print(
        f"H-Net (tiny) generation at context {context}: cached {max_bytes / cached_s:.1f} B/s, recompute "
        f"{max_bytes / full_s:.1f} B/s, speedup {full_s / cached_s:.1f}x; same sample {cached == full}; "
        f"{chunks} stage-1 chunks over the prompt and generated bytes (mean {mean_chunk:.2f} bytes)"
    )
    result.update(
        hnet_cached_speedup=round(full_s / cached_s, 2),
        hnet_cached_bytes_s=round(max_bytes / cached_s, 1),
        hnet_recompute_bytes_s=round(max_bytes / full_s, 1),
        hnet_same_sample=cached == full,
        hnet_generated_mean_chunk_len=round(mean_chunk, 3),
        hnet_train_steps=train_steps,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="train,generate", help="comma-separated sections: train, generate")
    p.add_argument("--steps", type=int, default=6, help="alternating timing rounds (train)")
    p.add_argument(
        "--outer",
        choices=sorted(OUTER),
        default="mamba",
        help="the H-Net's stage-1 layers in the train section: Mamba-2 (m4, the default) or attention (T2)",
    )
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
        train_section(args.steps, args.outer, result)
    if "generate" in sections:
        generate_section(args.train_steps, args.max_bytes, args.context, result)
    print(json.dumps(result))
    if args.record:
        record("hnet", result)


if __name__ == "__main__":
    main()
