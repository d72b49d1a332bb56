"""Train-step throughput of the model families, with peers measured in the same run, step by step.

Sections (``--only`` picks some):

``byte``      the 6-layer, width-256, 4-head byte LM (context 512, batch 16): steps/s, bytes/s and
              MFU against the fp32 matmul peak measured here, next to the same model in PyTorch
              (eager, ``scaled_dot_product_attention``, same threads) when torch is installed
              (``pip install -e '.[bench]'``).
``megabyte``  MegaByte P=4 and P=8 against a flat byte LM of similar parameter count at T=2048.
``blt``       BLT at mean patch length 4 and 6 (threshold calibrated on stdlib windows with a freshly
              initialised tiny entropy model: its cost, not its quality, matters here) against the
              same flat byte LM, with the entropy model's share of the step time (patching runs in
              the input pipeline) and the share of windows that ran out of patch slots (keys
              ``blt_p4_vs_flat``, ``blt_p6_vs_flat``, ``blt_entropy_share``, ``blt_overflow_rate``).

**Paired, alternating timing.** Each model lives in its own process (no peer's threads linger in
another's timing), set up and warmed up once; then the parent asks the two processes of a pair for
one step each, in turn (the order flips every round), with a short pause between steps. A drift
of the shared machine therefore lands on both sides of a round, and the verdict is the median of
the per-round ratios, printed with their min and max. Throughput and MFU come from each side's
median step time.

MFU = analytic training FLOPs of the step (``bytelm.models.flops`` and each family's formula) / step time /
matmul peak. JAX runs as ``bytelm train`` does on a CPU host: one virtual device per core, data-parallel
(``bytelm.training.host``), and ``malloc`` backing large blocks with huge pages
(``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, which ``bytelm`` sets for itself); the PyTorch peer
runs under the same environment. ``BYTELM_NO_HUGEPAGE_MALLOC=1`` measures both without it. The
last line is one JSON object with the headline figures, including the CPU model (``cpu``).

    python benchmarks/train_step.py [--only byte,megabyte] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
from results import record

PAUSE_S = 0.2  # between two steps of a round: lets the previous side's spinning threads go idle


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# -- the measured sides (each runs in a worker process) ---------------------------------------
def jax_setup(model_overrides: list[str], batch: int, seq_len: int):
    """A bytelm train step on random bytes: ``(step() -> {"step_s"}, info)``."""
    import jax

    from bytelm.config import load_config
    from bytelm.training.optim import schedule_plan
    from bytelm.training.restore import make_task
    from bytelm.training.trainer import Trainer

    cfg = load_config(
        None,
        [
            *model_overrides,
            f"train.batch_size={batch}",
            f"train.seq_len={seq_len}",
            "train.steps=1000",
            "train.warmup_steps=10",
        ],
    )
    task = make_task(cfg, corpus=None)
    trainer = Trainer(cfg, task)
    plan = schedule_plan(cfg.train, trainer.horizon)  # the schedule's runtime arguments
    seed_step = np.asarray(
        [cfg.train.seed, 0], np.uint32
    )  # the dropout key of a step, when model.dropout > 0
    rng = np.random.default_rng(0)
    device_batch = trainer.device_batch(
        {"ids": rng.integers(4, 260, size=(batch, seq_len + 1)).astype(np.int32)}
    )

    def step():
        t0 = time.perf_counter()
        trainer.params, trainer.opt_state, m = trainer._train_step(
            trainer.params, trainer.opt_state, device_batch, plan, seed_step
        )
        jax.block_until_ready(m["loss"])
        return {"step_s": time.perf_counter() - t0}

    info = {
        "flops_per_step": task.train_flops_per_position() * batch * seq_len,
        "params": trainer.param_counts["total"],
    }
    return step, info


def blt_setup(model_overrides: list[str], entropy_overrides: list[str], batch: int, seq_len: int):
    """A BLT train step on stdlib windows patched by a byte-LM entropy model in the input pipeline:
    ``(step() -> {"step_s", "patch_s"}, info)``."""
    import jax
    from flax import nnx

    from bytelm.config import load_config
    from bytelm.data import WindowBatches, load_corpus
    from bytelm.families.blt import flops as blt_flops
    from bytelm.families.byte import ByteTask
    from bytelm.families.byte.model import ByteLM
    from bytelm.patching import EntropyModel, EntropyPatcher
    from bytelm.training.optim import schedule_plan
    from bytelm.training.trainer import Trainer

    cfg = load_config(
        None,
        [
            *model_overrides,
            f"train.batch_size={batch}",
            f"train.seq_len={seq_len}",
            "train.steps=1000",
            "train.warmup_steps=10",
        ],
    )
    ent_cfg = load_config(None, entropy_overrides).model
    corpus = load_corpus("stdlib")
    windows = WindowBatches(
        corpus.train_stream, batch_size=batch, window=seq_len + 1, seed=0, process_index=0, process_count=1
    )
    entropy = EntropyModel(ByteLM(ent_cfg, rngs=nnx.Rngs(0)), width=seq_len + 1)
    patcher, achieved = EntropyPatcher.calibrated(
        entropy,
        WindowBatches(
            corpus.train_stream, batch_size=32, window=seq_len + 1, seed=1, process_index=0, process_count=1
        ).batch(0),
        cfg.model.target_patch_len,
        max_patch_len=cfg.model.max_patch_len,
    )

    class Task(ByteTask):
        family = "blt"

        def build_model(self, rngs):
            from bytelm.families.blt.model import BLT

            return BLT(self.cfg.model, rngs=rngs)

        def forward_flops_per_position(self):
            return blt_flops.forward_flops_per_byte(self.cfg.model, seq_len, achieved)

    task = Task(cfg, corpus)
    trainer = Trainer(cfg, task)
    plan = schedule_plan(cfg.train, trainer.horizon)  # the schedule's runtime arguments
    seed_step = np.asarray(
        [cfg.train.seed, 0], np.uint32
    )  # the dropout key of a step, when model.dropout > 0
    max_patches = cfg.model.patches_for(seq_len)
    counter = iter(range(10**9))

    def step():
        ids = windows.batch(next(counter))
        t0 = time.perf_counter()
        layout = patcher.layout(ids, max_patches)
        t1 = time.perf_counter()
        batch_np = {"ids": ids, "patch_lengths": layout.lengths_BxP}
        trainer.params, trainer.opt_state, m = trainer._train_step(
            trainer.params, trainer.opt_state, trainer.device_batch(batch_np), plan, seed_step
        )
        jax.block_until_ready(m["loss"])
        return {"step_s": time.perf_counter() - t1, "patch_s": t1 - t0, **layout.stats()}

    info = {
        "flops_per_step": task.train_flops_per_position() * batch * seq_len,
        "params": trainer.param_counts["total"],
        "achieved": achieved,
        "slots": max_patches,
    }
    return step, info


def torch_setup(
    d: int, layers: int, heads: int, mlp: int, vocab: int, batch: int, seq_len: int, threads: int
):
    """The same byte LM in eager PyTorch: ``(step() -> {"step_s"}, info)``, or None without torch."""
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
        t0 = time.perf_counter()
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab).float(), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return {"step_s": time.perf_counter() - t0}

    return step, {"params": sum(p.numel() for p in model.parameters())}


def matmul_peak_setup():
    from bytelm.training.peak import measure_matmul_peak

    peak = measure_matmul_peak()
    return (lambda: {}), {"peak": peak}


SETUPS = {"jax": jax_setup, "blt": blt_setup, "torch": torch_setup, "matmul_peak": matmul_peak_setup}


def worker_main(kind: str, kwargs: dict) -> None:
    """The worker process: set up, warm up (2 steps), print ``READY info``, then one ``TIME`` line
    per ``step`` line read on stdin, until ``quit`` or end of input."""
    from bytelm.training.host import configure_cpu_devices

    configure_cpu_devices()
    made = SETUPS[kind](**kwargs)
    if made is None:
        print("READY null", flush=True)
        return
    step, info = made
    if kind != "matmul_peak":
        for _ in range(2):
            step()
    print("READY " + json.dumps(info), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        print("TIME " + json.dumps(step()), flush=True)


# -- the parent: paired, alternating rounds ------------------------------------------------------
class Worker:
    """One measured side in its own interpreter (CPU devices and huge-page malloc as the CLI sets them)."""

    def __init__(self, kind: str, **kwargs):
        from bytelm.training.host import huge_page_malloc_env

        self.kind = kind
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", kind, json.dumps(kwargs)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=huge_page_malloc_env(),  # as the bytelm command runs (None: this environment as it is)
        )
        self.info = json.loads(self._expect("READY "))

    def _expect(self, prefix: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :]
        self.stderr.seek(0)
        raise RuntimeError(f"{self.kind} worker failed:\n{self.stderr.read()[-3000:]}")

    def step(self) -> dict:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return json.loads(self._expect("TIME "))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def alternate(a: Worker, b: Worker, rounds: int) -> tuple[list[dict], list[dict]]:
    """``rounds`` rounds of one step on each side, the order flipping every round."""
    times_a, times_b = [], []
    for r in range(rounds):
        for side in (a, b) if r % 2 == 0 else (b, a):
            time.sleep(PAUSE_S)
            (times_a if side is a else times_b).append(side.step())
    return times_a, times_b


def spread(ratios: list[float]) -> dict:
    return {
        "median": round(float(np.median(ratios)), 3),
        "min": round(min(ratios), 3),
        "max": round(max(ratios), 3),
    }


def seconds(times: list[dict], *keys: str) -> list[float]:
    return [sum(t[k] for k in keys) for t in times]


FLAT = ["model.family=byte", "model.d_model=256", "model.n_layers=6", "model.n_heads=4", "model.mlp_dim=704"]


def against_flat(name: str, key: str, overrides: list[str], steps: int, result: dict) -> None:
    """Training throughput of the model of ``overrides`` against :data:`FLAT` at T = 2048 (batch 4),
    paired and alternating (:func:`alternate`): prints both and the ratio, and puts ``{key}_vs_flat``
    (the median per-round ratio of the flat model's step time to this one's: the ratio of bytes/s),
    its min and max, both bytes/s and both parameter counts into ``result``."""
    T, B = 2048, 4
    with (
        Worker("jax", model_overrides=FLAT, batch=B, seq_len=T) as flat,
        Worker("jax", model_overrides=overrides, batch=B, seq_len=T) as other,
    ):
        ft, ot = alternate(flat, other, steps)
        info_flat, info_other = flat.info, other.info
    ratios = spread([f / o for f, o in zip(seconds(ft, "step_s"), seconds(ot, "step_s"))])
    dt_f, dt_o = float(np.median(seconds(ft, "step_s"))), float(np.median(seconds(ot, "step_s")))
    for label, dt, info in (("flat byte LM", dt_f, info_flat), (name, dt_o, info_other)):
        print(
            f"{label:<13} T={T} B={B} params={info['params']:,}: {B * T / dt:,.0f} bytes/s, "
            f"{info['flops_per_step'] / (B * T) / 1e6:.1f} MFLOP/byte (analytic, training)"
        )
    r = ratios
    print(f"{name} / flat bytes/s per round: median {r['median']} (min {r['min']}, max {r['max']})")
    result.update(
        {
            f"{key}_vs_flat": ratios["median"],
            f"{key}_vs_flat_min": ratios["min"],
            f"{key}_vs_flat_max": ratios["max"],
            f"{key}_t2048_bytes_s": round(B * T / dt_o),
            "flat_t2048_bytes_s": round(B * T / dt_f),
            f"{key}_params": info_other["params"],
            "flat_params": info_flat["params"],
        }
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--only", default="byte,megabyte,blt", help="comma-separated sections: byte, megabyte, blt"
    )
    p.add_argument(
        "--steps", type=int, default=6, help="alternating rounds per pair (one timed step per side each)"
    )
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="PyTorch intra-op threads")
    p.add_argument("--worker", nargs=2, metavar=("KIND", "JSON"), help=argparse.SUPPRESS)
    p.add_argument(
        "--record",
        action="store_true",
        help="append the JSON line to benchmarks/results/ (printed either way)",
    )
    args = p.parse_args()
    if args.worker:
        worker_main(args.worker[0], json.loads(args.worker[1]))
        return
    sections = set(args.only.split(","))

    with Worker("matmul_peak") as w:
        peak = w.info["peak"]
    print(f"cpu: {cpu_model()}")
    print(f"fp32 matmul peak (2048^3, best of 5): {peak / 1e9:,.1f} GFLOP/s")
    result: dict = {"cpu": cpu_model(), "matmul_peak_gflops": round(peak / 1e9, 1)}

    if "byte" in sections:
        d, L, H, F, B, T = 256, 6, 4, 704, 16, 512
        model = [
            "model.family=byte",
            f"model.d_model={d}",
            f"model.n_layers={L}",
            f"model.n_heads={H}",
            f"model.mlp_dim={F}",
        ]
        with (
            Worker("jax", model_overrides=model, batch=B, seq_len=T) as jw,
            Worker(
                "torch", d=d, layers=L, heads=H, mlp=F, vocab=384, batch=B, seq_len=T, threads=args.threads
            ) as tw,
        ):
            flops_step, n_params = jw.info["flops_per_step"], jw.info["params"]
            if tw.info is None:  # no peer: time the JAX side alone
                jt, tt = [jw.step() for _ in range(args.steps)], None
            else:
                jt, tt = alternate(jw, tw, args.steps)
        dt = float(np.median(seconds(jt, "step_s")))
        mfu = flops_step / dt / peak
        print(
            f"byte LM (JAX)  L={L} d={d} H={H} T={T} B={B} params={n_params:,}: {1 / dt:.3f} steps/s, "
            f"{B * T / dt:,.0f} bytes/s, MFU {mfu:.2f}"
        )
        result.update(
            byte_lm_steps_s=round(1 / dt, 4), byte_lm_bytes_s=round(B * T / dt), byte_lm_mfu=round(mfu, 3)
        )
        if tt is None:
            print("torch not installed: pip install -e '.[bench]' for the PyTorch peer")
            result.update(torch_steps_s=None, ratio_vs_torch=None)
        else:
            tdt = float(np.median(seconds(tt, "step_s")))
            ratios = spread([t / j for t, j in zip(seconds(tt, "step_s"), seconds(jt, "step_s"))])
            print(
                f"byte LM (torch, eager, SDPA, {args.threads} threads): {1 / tdt:.3f} steps/s, MFU "
                f"{flops_step / tdt / peak:.2f}; JAX / torch speed per round: median {ratios['median']} (min "
                f"{ratios['min']}, max {ratios['max']}, {args.steps} rounds)"
            )
            result.update(
                torch_steps_s=round(1 / tdt, 4),
                torch_mfu=round(flops_step / tdt / peak, 3),
                ratio_vs_torch=ratios["median"],
                ratio_vs_torch_min=ratios["min"],
                ratio_vs_torch_max=ratios["max"],
            )

    if {"megabyte", "blt"} & sections:
        T, B = 2048, 4
        with Worker("jax", model_overrides=FLAT, batch=B, seq_len=T) as flat:
            n_flat, f_flat = flat.info["params"], flat.info["flops_per_step"]
            result.update(flat_params=n_flat, flat_t2048_flops_per_byte=round(f_flat / (B * T)))
            flat_times = []
            if "megabyte" in sections:
                for P in (4, 8):
                    # same global stack as the flat model (6 x 256, P * d_G = 256) plus a small local model
                    mb = [
                        "model.family=megabyte",
                        f"model.patch_size={P}",
                        f"model.embed_dim={256 // P}",
                        "model.global.d_model=256",
                        "model.global.layers=6",
                        "model.global.heads=4",
                        "model.global.mlp_dim=704",
                        "model.local.d_model=128",
                        "model.local.layers=2",
                        "model.local.heads=2",
                        "model.local.mlp_dim=352",
                    ]
                    with Worker("jax", model_overrides=mb, batch=B, seq_len=T) as w:
                        ft, mt = alternate(flat, w, args.steps)
                    flat_times += ft
                    ratios = spread([f / m for f, m in zip(seconds(ft, "step_s"), seconds(mt, "step_s"))])
                    dt = float(np.median(seconds(mt, "step_s")))
                    f_mb = w.info["flops_per_step"]
                    print(
                        f"MegaByte P={P}  T={T} B={B} params={w.info['params']:,}: {B * T / dt:,.0f} "
                        f"bytes/s, {f_mb / (B * T) / 1e6:.1f} MFLOP/byte; vs flat per round: median "
                        f"{ratios['median']}x (min {ratios['min']}, max {ratios['max']})"
                    )
                    result[f"megabyte_p{P}_bytes_s"] = round(B * T / dt)
                    result[f"megabyte_p{P}_flops_per_byte"] = round(f_mb / (B * T))
                    result[f"megabyte_p{P}_params"] = w.info["params"]
                    result[f"megabyte_p{P}_vs_flat"] = ratios["median"]
                    result[f"megabyte_p{P}_vs_flat_min"], result[f"megabyte_p{P}_vs_flat_max"] = (
                        ratios["min"],
                        ratios["max"],
                    )
            if "blt" in sections:
                entropy = [
                    "model.family=byte",
                    "model.d_model=128",
                    "model.n_layers=2",
                    "model.n_heads=2",
                    "model.mlp_dim=352",
                    "model.window=64",
                ]
                for target in (4, 6):
                    blt = [
                        # patch slots: the config default, 1.5x the expected count, with the causal slot rule
                        "model.family=blt",
                        f"model.target_patch_len={target}",
                        "model.max_patch_len=16",
                        "model.local.d_model=128",
                        "model.local.encoder_layers=1",
                        "model.local.decoder_layers=2",
                        "model.local.heads=2",
                        "model.local.mlp_dim=352",
                        "model.local.window=64",
                        "model.global.d_model=256",
                        "model.global.layers=6",
                        "model.global.heads=4",
                        "model.global.mlp_dim=704",
                        "model.hash_table_size=4096",
                    ]
                    with Worker(
                        "blt", model_overrides=blt, entropy_overrides=entropy, batch=B, seq_len=T
                    ) as w:
                        ft, bt = alternate(flat, w, args.steps)
                    flat_times += ft
                    ratios = spread(
                        [f / b for f, b in zip(seconds(ft, "step_s"), seconds(bt, "step_s", "patch_s"))]
                    )
                    shares = [t["patch_s"] / (t["patch_s"] + t["step_s"]) for t in bt]
                    dt, patch_s = (
                        float(np.median(seconds(bt, "step_s"))),
                        float(np.median(seconds(bt, "patch_s"))),
                    )
                    bytes_s = B * T / float(np.median(seconds(bt, "step_s", "patch_s")))
                    f = w.info["flops_per_step"]
                    print(
                        f"BLT target {target} (achieved {w.info['achieved']:.2f})  T={T} B={B} "
                        f"params={w.info['params']:,}: {bytes_s:,.0f} bytes/s (step {dt:.2f} s + patching "
                        f"{patch_s:.2f} s), {f / (B * T) / 1e6:.1f} MFLOP/byte, entropy share "
                        f"{np.median(shares):.1%}; vs flat per round: median {ratios['median']}x (min "
                        f"{ratios['min']}, max {ratios['max']})"
                    )
                    result[f"blt_p{target}_bytes_s"] = round(bytes_s)
                    result[f"blt_p{target}_flops_per_byte"] = round(f / (B * T))
                    result[f"blt_p{target}_params"] = w.info["params"]
                    result[f"blt_p{target}_entropy_share"] = round(float(np.median(shares)), 4)
                    result[f"blt_p{target}_vs_flat"] = ratios["median"]
                    result[f"blt_p{target}_vs_flat_min"], result[f"blt_p{target}_vs_flat_max"] = (
                        ratios["min"],
                        ratios["max"],
                    )
                    result[f"blt_p{target}_slots"] = w.info["slots"]
                    result[f"blt_p{target}_overflow_rate"] = round(
                        sum(t["overflow_windows"] for t in bt) / sum(t["windows"] for t in bt), 4
                    )
                result["blt_entropy_share"] = max(
                    result["blt_p4_entropy_share"], result["blt_p6_entropy_share"]
                )
                result["blt_overflow_rate"] = max(
                    result["blt_p4_overflow_rate"], result["blt_p6_overflow_rate"]
                )
            dt_flat = float(np.median(seconds(flat_times, "step_s")))
            result["flat_t2048_bytes_s"] = round(B * T / dt_flat)
            print(
                f"flat byte LM  T={T} B={B} params={n_flat:,}: {B * T / dt_flat:,.0f} bytes/s, "
                f"{f_flat / (B * T) / 1e6:.1f} MFLOP/byte"
            )

    print(json.dumps(result))
    if args.record:
        record("train_step", result)


if __name__ == "__main__":
    main()
