"""Model FLOPs utilisation of every family at a preset size: step time, bytes/s and MFU.

    python benchmarks/mfu.py [--size small] [--families byte,bpe,megabyte,blt] [--steps 10]
                             [--batch B] [--seq-len T] [--set KEY=VALUE ...]

For each family, the ``configs/<size>/<family>.toml`` model (``--set`` overrides apply to every
family, e.g. ``--set model.remat=block``) trains on random bytes with bytelm's own jitted train
step (the one ``bytelm train`` runs: same optimizer, sharding over every local device,
data-parallel). The step is timed ``--steps`` times after 2 warm-up steps (compilation), each to
``block_until_ready``; the median is reported.

MFU = the step's analytic training FLOPs (``bytelm.models.flops`` and each family's formula: 6 x the
multiply-adds the model needs per position, attention counted over the keys a position may see) / step time /
(devices x peak). ``mfu`` is the figure ``bytelm train`` prints, by its definition
(``bytelm.training.peak.device_peak``): against the datasheet's dense bf16 peak of the device kind
(the table in bytelm/training/peak.py), or against ``--peak-flops`` per device when given, and none
at all on a CPU without it (a CPU has no peak that holds while other processes share its cores); a
ratio above 1 is never reported as MFU. Beside it, two diagnostics that are not MFU:

- ``mfu_datasheet``: against the datasheet peak (None where the device is not in the table);
- ``mfu_measured``: against the best of 5 square matmuls (4096, the model's compute dtype) on one
  device, timed here (on a CPU it moves with the machine's load).

Beside it, for the decoder LMs (``byte``, ``bpe``), ``mfu_palm_datasheet``: the PaLM paper's
convention (Chowdhery et al. 2022, appendix B), ``6 N + 12 L H Q T`` FLOPs per token (``N`` the
non-embedding parameters, ``L`` layers, ``H Q`` = ``d_model``, ``T`` the context): attention over
the full ``T x T`` scores, the causal half included, so it reads higher than ours at long context;
no norms, no head beyond ``N``.

Family notes. ``bpe``: the byte LM's trunk over 32,768 token ids (random ids; no tokenizer is
needed to time a step; the FLOPs count its head). ``blt``: patch boundaries every
``target_patch_len`` bytes instead of an entropy model's (the model's step at that mean patch
length; patching runs in the input pipeline, timed by ``benchmarks/train_step.py``). The last
line printed is one JSON object: per family ``step_s``, ``bytes_s`` (``positions_s``: tokens for
``bpe``), ``mfu``, ``mfu_datasheet``, ``mfu_measured``, ``params``, and the device, peaks and
settings; ``--record`` also appends it to benchmarks/results/mfu.jsonl.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

from results import record

from bytelm.training.peak import datasheet_peak, device_peak

N_TOKEN_IDS = 32768


def measured_peak(dtype: str) -> float:
    import jax
    import jax.numpy as jnp

    from bytelm.training.peak import measure_matmul_peak

    n = 4096 if jax.default_backend() != "cpu" else 1024
    return measure_matmul_peak(n, repeats=5, dtype=jnp.dtype(dtype))


def family_step(size: str, family: str, overrides: list[str], batch: int | None, seq_len: int | None):
    """``(step() -> seconds, info, trainer)``: one family's jitted train step on random data."""
    import jax
    import numpy as np

    from bytelm.config import load_config
    from bytelm.constants import BYTE_OFFSET
    from bytelm.families.blt import flops as blt_flops
    from bytelm.families.blt.model import BLT
    from bytelm.families.bpe.model import TokenLM
    from bytelm.families.byte import ByteTask
    from bytelm.families.megabyte import MegaByteTask
    from bytelm.models import flops
    from bytelm.patching.lengths import starts_to_lengths
    from bytelm.patching.patchers import real_lengths, static_starts
    from bytelm.training.optim import schedule_plan
    from bytelm.training.trainer import Trainer

    sets = [
        *(["train.batch_size=%d" % batch] if batch else []),
        *(["train.seq_len=%d" % seq_len] if seq_len else []),
    ]
    if family == "blt":
        sets.append("model.entropy_run=")  # not used: fixed patches (module docstring)
    cfg = load_config(f"{size}/{family}", [*overrides, *sets])
    B, T, m = cfg.train.batch_size, cfg.train.seq_len, cfg.model

    class Bench(MegaByteTask if family == "megabyte" else ByteTask):
        def __init__(self):
            super().__init__(cfg, None)

        def build_model(self, rngs):
            if family == "bpe":
                return TokenLM(m, N_TOKEN_IDS, rngs=rngs)
            if family == "blt":
                return BLT(m, rngs=rngs)
            return super().build_model(rngs)

        def forward_flops_per_position(self):
            if family == "bpe":
                return flops.decoder_lm_forward_flops_per_position(m, N_TOKEN_IDS + BYTE_OFFSET, T)
            if family == "blt":
                return blt_flops.forward_flops_per_byte(m, T, float(round(m.target_patch_len)))
            return super().forward_flops_per_position()

    task = Bench()
    trainer = Trainer(cfg, task)
    plan = schedule_plan(cfg.train, 10**6)
    seed_step = np.asarray(
        [cfg.train.seed, 0], np.uint32
    )  # the dropout key of a step, when model.dropout > 0
    rng = np.random.default_rng(0)
    high = N_TOKEN_IDS + BYTE_OFFSET if family == "bpe" else 256 + BYTE_OFFSET
    ids = rng.integers(BYTE_OFFSET, high, size=(B, T + 1)).astype(np.int32)
    ids[:, 0] = 1  # BOS
    batch_np = {"ids": ids}
    if family == "blt":
        starts = static_starts(ids, int(round(m.target_patch_len)))
        batch_np["patch_lengths"] = starts_to_lengths(starts, real_lengths(ids), m.patches_for(T))
    device_batch = trainer.device_batch(batch_np)

    def step() -> float:
        t0 = time.perf_counter()
        trainer.params, trainer.opt_state, metrics = trainer._train_step(
            trainer.params, trainer.opt_state, device_batch, plan, seed_step
        )
        jax.block_until_ready(metrics["loss"])
        return time.perf_counter() - t0

    palm = None
    if family in ("byte", "bpe"):  # PaLM (Chowdhery et al. 2022, appendix B): 6N + 12 L H Q T per token
        palm = (6 * trainer.param_counts["non_embedding"] + 12 * m.n_layers * m.d_model * T) * B * T
    info = {
        "palm_flops_per_step": palm,
        "params": trainer.param_counts["total"],
        "non_embedding_params": trainer.param_counts["non_embedding"],
        "flops_per_step": task.train_flops_per_position() * B * T,
        "positions_per_step": B * T,
        "batch": B,
        "seq_len": T,
        "dtype": m.dtype,
        "devices": trainer.mesh.devices.size,
    }
    return step, info, trainer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--size",
        default="small",
        help="preset size: configs/<size>/<family>.toml (tiny, small, base; default small)",
    )
    p.add_argument(
        "--families", default="byte,bpe,megabyte,blt", help="comma-separated families (default: all four)"
    )
    p.add_argument(
        "--steps", type=int, default=10, help="timed steps per family after 2 warm-up steps (default 10)"
    )
    p.add_argument("--batch", type=int, help="override train.batch_size (sequences per step)")
    p.add_argument("--seq-len", type=int, help="override train.seq_len")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for every family (repeatable)",
    )
    p.add_argument(
        "--peak-flops",
        type=float,
        default=0.0,
        metavar="F",
        help="per-device peak FLOP/s for mfu, as train.peak_flops (default: the datasheet's; none on CPU)",
    )
    p.add_argument(
        "--record", action="store_true", help="append the JSON line to benchmarks/results/mfu.jsonl"
    )
    args = p.parse_args(argv)

    import jax

    device = jax.devices()[0]
    kind = device.device_kind
    sheet = datasheet_peak(kind)
    result: dict = {
        "device": kind,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "size": args.size,
        "datasheet_bf16_peak": sheet,
        "families": {},
    }
    measured: dict[str, float] = {}
    peak_per_device, peak_source = device_peak(
        jax.default_backend(), kind, args.peak_flops, measure=lambda: measured_peak("bfloat16")
    )
    result["peak_flops"], result["peak_source"] = peak_per_device, peak_source
    for family in [f.strip() for f in args.families.split(",") if f.strip()]:
        step, info, trainer = family_step(args.size, family, args.overrides, args.batch, args.seq_len)
        if info["dtype"] not in measured:
            measured[info["dtype"]] = measured_peak(info["dtype"])
        t0 = time.perf_counter()
        for _ in range(2):
            step()
        warm_s = time.perf_counter() - t0
        times = [step() for _ in range(args.steps)]
        step_s = statistics.median(times)
        n = info["devices"]
        peak_m = measured[info["dtype"]] * (1 if jax.default_backend() == "cpu" else n)
        row = {
            **info,
            "warmup_s": round(warm_s, 2),
            "step_s": step_s,
            "step_s_min": min(times),
            "step_s_max": max(times),
            "positions_s": info["positions_per_step"] / step_s,
            "bytes_s": None
            if family == "bpe"
            else info["positions_per_step"] / step_s,  # bpe: tokens, not bytes
            "mfu": _mfu(info["flops_per_step"] / step_s, peak_per_device, n),
            "mfu_measured": info["flops_per_step"] / step_s / peak_m,
            "mfu_datasheet": (info["flops_per_step"] / step_s / (sheet * n)) if sheet else None,
            # the PaLM convention beside ours (module docstring): decoder LMs only
            "mfu_palm_datasheet": (info["palm_flops_per_step"] / step_s / (sheet * n))
            if sheet and info.get("palm_flops_per_step")
            else None,
        }
        result["families"][family] = row
        sheet_txt = f"{row['mfu_datasheet']:.3f}" if sheet else "n/a"
        print(
            f"{family:9s} {info['params'] / 1e6:8.1f}M params  B={info['batch']} T={info['seq_len']} "
            f"{info['dtype']}  step {step_s * 1e3:9.1f} ms  {row['positions_s']:12,.0f} "
            f"{'tokens' if family == 'bpe' else 'bytes'}/s  MFU datasheet {sheet_txt}  measured "
            f"{row['mfu_measured']:.3f}",
            file=sys.stderr,
            flush=True,
        )
        del step, trainer
        gc.collect()
        jax.clear_caches()
    result["measured_peak"] = measured
    print(
        f"device {kind} x {jax.device_count()}: datasheet bf16 peak {sheet}, measured matmul peak {measured}",
        file=sys.stderr,
    )
    print(json.dumps(result))
    if args.record:
        record("mfu", result)
    return 0


def _mfu(flops_s: float, peak_per_device: float | None, devices: int) -> float | None:
    """bytelm's MFU (``bytelm train``'s): None without a peak, or where the ratio exceeds 1."""
    if peak_per_device is None:
        return None
    ratio = flops_s / (peak_per_device * devices)
    return ratio if ratio <= 1 else None


if __name__ == "__main__":
    raise SystemExit(main())
