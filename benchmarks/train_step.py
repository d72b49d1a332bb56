"""Train-step throughput of the model families, with peers measured in the same run.

Sections (``--only`` picks some):

``byte``      the 6-layer, width-256, 4-head byte LM (context 512, batch 16): steps/s, bytes/s and
              MFU against the fp32 matmul peak measured here, next to the same model in PyTorch
              (eager, ``scaled_dot_product_attention``, same threads) when torch is installed
              (``pip install -e '.[bench]'``).
``megabyte``  MegaByte P=4 and P=8 against a flat byte LM of similar parameter count at T=2048.
``blt``       BLT at mean patch length 4 and 6 (threshold calibrated on stdlib windows with a freshly
              initialised tiny entropy model: its cost, not its quality, matters here) against the
              same flat byte LM, with the entropy model's share of the step time (patching runs in
              the input pipeline).

MFU = analytic training FLOPs of the step (``bytelm.training.flops``) / step time / matmul peak.
Each measurement runs in its own process, one after the other, so no peer's threads linger in
another's timing. JAX runs as ``bytelm train`` does on a CPU host: one virtual device per core,
data-parallel (``bytelm.training.host``), and ``malloc`` backing large blocks with huge pages
(``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, which ``bytelm`` sets for itself); the PyTorch
peer runs under the same environment. ``BYTELM_NO_HUGEPAGE_MALLOC=1`` measures both without
it. The last line is one JSON object with the headline figures.

    python benchmarks/train_step.py [--only byte,megabyte] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def _timeit(step, n_warmup: int, n_steps: int) -> float:
    """Median seconds per call of ``step()`` (which must block until done)."""
    for _ in range(n_warmup):
        step()
    times = []
    for _ in range(n_steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


# -- JAX ------------------------------------------------------------------------------------
def jax_step_time(model_overrides: list[str], batch: int, seq_len: int, n_steps: int) -> tuple[float, float, int]:
    """(seconds per train step, training FLOPs per step, parameter count) for a bytelm model."""
    import jax

    from bytelm.config import load_config
    from bytelm.training.tasks import make_task
    from bytelm.training.trainer import Trainer

    cfg = load_config(
        None,
        [*model_overrides, f"train.batch_size={batch}", f"train.seq_len={seq_len}", "train.steps=1000", "train.warmup_steps=10"],
    )
    task = make_task(cfg, corpus=None)
    trainer = Trainer(cfg, task)
    rng = np.random.default_rng(0)
    batch_ids = {"ids": rng.integers(4, 260, size=(batch, seq_len + 1)).astype(np.int32)}
    device_batch = trainer.device_batch(batch_ids)

    def step():
        trainer.params, trainer.opt_state, m = trainer._train_step(trainer.params, trainer.opt_state, device_batch)
        jax.block_until_ready(m["loss"])

    dt = _timeit(step, 2, n_steps)
    flops_per_step = task.train_flops_per_position() * batch * seq_len
    return dt, flops_per_step, trainer.param_counts["total"]


def blt_step_time(model_overrides: list[str], entropy_overrides: list[str], batch: int, seq_len: int, n_steps: int) -> tuple:
    """(seconds per train step, seconds of patching per batch, FLOPs per step, params, achieved mean
    patch length) for a BLT whose patches come from a byte-LM entropy model."""
    import jax
    from flax import nnx

    from bytelm.config import load_config
    from bytelm.data import WindowBatches, load_corpus
    from bytelm.models.byte_lm import ByteLM
    from bytelm.patching import EntropyModel, EntropyPatcher
    from bytelm.training import flops
    from bytelm.training.tasks import ByteTask
    from bytelm.training.trainer import Trainer

    cfg = load_config(None, [*model_overrides, f"train.batch_size={batch}", f"train.seq_len={seq_len}", "train.steps=1000", "train.warmup_steps=10"])
    ent_cfg = load_config(None, entropy_overrides).model
    corpus = load_corpus("stdlib")
    windows = WindowBatches(corpus.train_stream, batch_size=batch, window=seq_len + 1, seed=0, process_index=0, process_count=1)
    entropy = EntropyModel(ByteLM(ent_cfg, rngs=nnx.Rngs(0)), batch_size=batch)
    patcher, achieved = EntropyPatcher.calibrated(
        entropy, WindowBatches(corpus.train_stream, batch_size=32, window=seq_len + 1, seed=1, process_index=0, process_count=1).batch(0),
        cfg.model.target_patch_len, max_patch_len=cfg.model.max_patch_len,
    )

    class Task(ByteTask):
        family = "blt"

        def build_model(self, rngs):
            from bytelm.models.blt import BLT

            return BLT(self.cfg.model, rngs=rngs)

        def train_flops_per_position(self):
            return flops.blt_train_flops_per_byte(self.cfg.model, seq_len, achieved)

    task = Task(cfg, corpus)
    trainer = Trainer(cfg, task)
    max_patches = cfg.model.patches_for(seq_len)
    batches = [windows.batch(i) for i in range(n_steps + 2)]

    def patch(ids):
        return {"ids": ids, "patch_lengths": patcher.lengths(ids, max_patches)}

    patch(batches[0])  # compile the entropy model
    t0 = time.perf_counter()
    prepared = [patch(b) for b in batches]
    patch_s = (time.perf_counter() - t0) / len(batches)
    device_batches = [trainer.device_batch(b) for b in prepared]
    it = iter(device_batches)

    def step():
        trainer.params, trainer.opt_state, m = trainer._train_step(trainer.params, trainer.opt_state, next(it))
        jax.block_until_ready(m["loss"])

    dt = _timeit(step, 2, n_steps)
    return dt, patch_s, task.train_flops_per_position() * batch * seq_len, trainer.param_counts["total"], achieved


# -- PyTorch peer ---------------------------------------------------------------------------
def torch_step_time(d: int, layers: int, heads: int, mlp: int, vocab: int, batch: int, seq_len: int, n_steps: int, threads: int) -> float | None:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(threads)
    torch.manual_seed(0)

    class RMSNorm(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale

    def rope(x, cos, sin):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
            self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
            self.o = torch.nn.Linear(d, d, bias=False)
            self.gate_up = torch.nn.Linear(d, 2 * mlp, bias=False)
            self.down = torch.nn.Linear(mlp, d, bias=False)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(B, T, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(B, T, d))
            g, u = self.gate_up(self.n2(x)).chunk(2, -1)
            return x + self.down(F.silu(g) * u)

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, d)
            self.blocks = torch.nn.ModuleList([Block() for _ in range(layers)])
            self.norm = RMSNorm(d)
            self.head = torch.nn.Linear(d, vocab, bias=False)
            half = d // heads // 2
            inv = 10000.0 ** (-torch.arange(half) / half)
            ang = torch.arange(seq_len)[:, None] * inv
            self.register_buffer("cos", torch.cos(ang))
            self.register_buffer("sin", torch.sin(ang))

        def forward(self, ids):
            x = self.emb(ids)
            for b in self.blocks:
                x = b(x, self.cos, self.sin)
            return self.head(self.norm(x))

    model = LM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    ids = torch.randint(4, 260, (batch, seq_len + 1))

    def step():
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab).float(), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return _timeit(step, 2, n_steps)


def _in_subprocess(kind: str, **kwargs):
    """Run one measurement in a fresh interpreter (CPU devices configured as the CLI does)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import train_step as b; "
        "from bytelm.training.host import configure_cpu_devices; configure_cpu_devices(); "
        "print('RESULT ' + json.dumps(getattr(b, sys.argv[2])(**json.loads(sys.argv[3]))))"
    )
    from bytelm.training.host import huge_page_malloc_env

    r = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__)), kind, json.dumps(kwargs)],
        capture_output=True,
        text=True,
        env=huge_page_malloc_env(),  # as the bytelm command runs (None: this environment as it is)
    )
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode or not lines:
        raise RuntimeError(f"{kind} failed:\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def matmul_peak() -> float:
    from bytelm.training.flops import measure_matmul_peak

    return measure_matmul_peak()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="byte,megabyte,blt", help="comma-separated sections: byte, megabyte, blt")
    p.add_argument("--steps", type=int, default=4, help="timed steps per model (after 2 warm-up steps)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="PyTorch intra-op threads")
    args = p.parse_args()
    sections = set(args.only.split(","))

    peak = _in_subprocess("matmul_peak")
    print(f"fp32 matmul peak (2048^3, best of 5): {peak / 1e9:,.1f} GFLOP/s")
    result: dict = {"matmul_peak_gflops": round(peak / 1e9, 1)}

    if "byte" in sections:
        d, L, H, F, B, T = 256, 6, 4, 704, 16, 512
        model = ["model.family=byte", f"model.d_model={d}", f"model.n_layers={L}", f"model.n_heads={H}", f"model.mlp_dim={F}"]
        dt, flops_step, n_params = _in_subprocess("jax_step_time", model_overrides=model, batch=B, seq_len=T, n_steps=args.steps)
        mfu = flops_step / dt / peak
        print(f"byte LM (JAX)  L={L} d={d} H={H} T={T} B={B} params={n_params:,}: {1 / dt:.3f} steps/s, {B * T / dt:,.0f} bytes/s, MFU {mfu:.2f}")
        result.update(byte_lm_steps_s=round(1 / dt, 4), byte_lm_bytes_s=round(B * T / dt), byte_lm_mfu=round(mfu, 3))
        tdt = _in_subprocess(
            "torch_step_time", d=d, layers=L, heads=H, mlp=F, vocab=384, batch=B, seq_len=T, n_steps=args.steps, threads=args.threads
        )
        if tdt is None:
            print("torch not installed: pip install -e '.[bench]' for the PyTorch peer")
            result.update(torch_steps_s=None, ratio_vs_torch=None)
        else:
            tmfu = flops_step / tdt / peak
            print(f"byte LM (torch, eager, SDPA, {args.threads} threads): {1 / tdt:.3f} steps/s, MFU {tmfu:.2f}")
            result.update(torch_steps_s=round(1 / tdt, 4), torch_mfu=round(tmfu, 3), ratio_vs_torch=round(tdt / dt, 3))

    if "megabyte" in sections:
        T, B = 2048, 4
        flat = ["model.family=byte", "model.d_model=256", "model.n_layers=6", "model.n_heads=4", "model.mlp_dim=704"]
        dt_flat, f_flat, n_flat = _in_subprocess("jax_step_time", model_overrides=flat, batch=B, seq_len=T, n_steps=max(2, args.steps // 2))
        print(f"flat byte LM  T={T} B={B} params={n_flat:,}: {B * T / dt_flat:,.0f} bytes/s, {f_flat / (B * T) / 1e6:.1f} MFLOP/byte")
        result.update(flat_t2048_bytes_s=round(B * T / dt_flat), flat_t2048_flops_per_byte=round(f_flat / (B * T)))
        for P in (4, 8):
            # same global stack as the flat model (6 x 256, P * d_G = 256) plus a small local model
            mb = [
                "model.family=megabyte", f"model.patch_size={P}", f"model.embed_dim={256 // P}", "model.global_d_model=256",
                "model.global_layers=6", "model.global_heads=4", "model.global_mlp_dim=704",
                "model.local_d_model=128", "model.local_layers=2", "model.local_heads=2", "model.local_mlp_dim=352",
            ]
            dt_mb, f_mb, n_mb = _in_subprocess("jax_step_time", model_overrides=mb, batch=B, seq_len=T, n_steps=args.steps)
            print(f"MegaByte P={P}  T={T} B={B} params={n_mb:,}: {B * T / dt_mb:,.0f} bytes/s, {f_mb / (B * T) / 1e6:.1f} MFLOP/byte, {dt_flat / dt_mb:.2f}x flat")
            result[f"megabyte_p{P}_bytes_s"] = round(B * T / dt_mb)
            result[f"megabyte_p{P}_flops_per_byte"] = round(f_mb / (B * T))
            result[f"megabyte_p{P}_params"] = n_mb
        result["flat_params"] = n_flat
        result["megabyte_p8_vs_flat"] = round(result["megabyte_p8_bytes_s"] / result["flat_t2048_bytes_s"], 3)

    if "blt" in sections:
        T, B = 2048, 4
        if "flat_t2048_bytes_s" not in result:
            flat = ["model.family=byte", "model.d_model=256", "model.n_layers=6", "model.n_heads=4", "model.mlp_dim=704"]
            dt_flat, f_flat, n_flat = _in_subprocess("jax_step_time", model_overrides=flat, batch=B, seq_len=T, n_steps=2)
            result.update(flat_t2048_bytes_s=round(B * T / dt_flat), flat_params=n_flat)
        entropy = ["model.family=byte", "model.d_model=128", "model.n_layers=2", "model.n_heads=2", "model.mlp_dim=352", "model.window=64"]
        for target in (4, 6):
            blt = [
                # 2x the expected patch count as slots (the config default, one slot per byte, never
                # overflows but runs the global model over T+1 slots)
                "model.family=blt", f"model.target_patch_len={target}", "model.max_patch_len=16",
                f"model.max_patches={2 * (T + 1) // target + 2}",
                "model.local_d_model=128", "model.encoder_layers=1", "model.decoder_layers=2", "model.local_heads=2",
                "model.local_mlp_dim=352", "model.local_window=64", "model.global_d_model=256", "model.global_layers=6",
                "model.global_heads=4", "model.global_mlp_dim=704", "model.hash_table_size=4096",
            ]
            dt, patch_s, f, n, achieved = _in_subprocess(
                "blt_step_time", model_overrides=blt, entropy_overrides=entropy, batch=B, seq_len=T, n_steps=args.steps
            )
            share = patch_s / (patch_s + dt)
            bytes_s = B * T / (dt + patch_s)
            print(
                f"BLT target {target} (achieved {achieved:.2f})  T={T} B={B} params={n:,}: {bytes_s:,.0f} bytes/s "
                f"(step {dt:.2f} s + patching {patch_s:.2f} s), {f / (B * T) / 1e6:.1f} MFLOP/byte, entropy share {share:.1%}, "
                f"{bytes_s / result['flat_t2048_bytes_s']:.2f}x flat"
            )
            result[f"blt_p{target}_bytes_s"] = round(bytes_s)
            result[f"blt_p{target}_flops_per_byte"] = round(f / (B * T))
            result[f"blt_p{target}_params"] = n
            result[f"blt_p{target}_entropy_share"] = round(share, 4)
        result["blt_entropy_share"] = max(result["blt_p4_entropy_share"], result["blt_p6_entropy_share"])

    print(json.dumps(result))


if __name__ == "__main__":
    main()
