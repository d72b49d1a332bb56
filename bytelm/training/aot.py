"""Ahead-of-time compilation of a config's training and evaluation steps for a TPU slice, on any
machine (``bytelm compile``): the programs a pod would run, built from shapes alone (no weights, no
data) on the slice's abstract devices, with XLA's per-device memory, its FLOP count and the
collectives it placed. Whether a config fits a slice is known before the slice is rented.

The step compiled is the one training runs (:class:`~bytelm.training.programs.Programs`: the same
function, optimizer, donation and shardings), on the mesh :func:`~bytelm.training.sharding.make_mesh`
lays on the slice's devices. Memory per device is XLA's: arguments + outputs - what the outputs
reuse of the arguments (the donated parameters and optimizer state) + temporaries + code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence

import jax
import numpy as np
from jax.experimental.compilation_cache.compilation_cache import reset_cache

from bytelm.config import Config, load_config
from bytelm.errors import UserError
from bytelm.families import task_class
from bytelm.models.kernels import target_backend
from bytelm.training.optim import schedule_plan
from bytelm.training.peak import DATASHEET_BF16_PEAK
from bytelm.training.sharding import batch_sharding, make_mesh
from bytelm.training.topology import Topology, topology_devices
from bytelm.training.trainer import Trainer

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "f8e4m3fn": 1, "f8e5m2": 1,
}  # fmt: skip
_SHAPE = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([0-9,]*)\]")
_OP = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<type>.*?)\s(?P<op>"
    + "|".join(COLLECTIVES)
    + r")(?P<start>-start)?\("
)
_DCN = re.compile(
    r"^\s*%?[\w.\-]+\s*=\s*(?P<type>.*?)\ssend\(.*_xla_megascale_transfer_type=\"(?P<kind>\w+)\""
)
_GROUPS_LIST = re.compile(r"replica_groups=\{(\{[0-9,]*\}(?:,\{[0-9,]*\})*)\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?")


def _shapes_bytes(text: str) -> list[int]:
    return [
        _DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
        for dtype, dims in _SHAPE.findall(text)
    ]


def _groups(line: str) -> list[list[int]] | None:
    """The device groups of a collective's ``replica_groups`` (listed, or XLA's iota form
    ``[G,S]<=[dims]T(perm)``); None when the line has none."""
    m = _GROUPS_LIST.search(line)
    if m:
        return [
            [int(x) for x in g.strip("{}").split(",") if x] for g in re.findall(r"\{[0-9,]*\}", m.group(1))
        ]
    m = _GROUPS_IOTA.search(line)
    if m:
        shape = [int(x) for x in m.group(1).split(",")]
        dims = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        return ids.reshape(shape[0], -1).tolist()
    return None


def collectives(hlo_text: str, slice_of_device: list[int] | None = None) -> dict[str, dict]:
    """Per kind of collective in a compiled program's HLO: how many, the bytes of their results per
    device, and (``slice_of_device``: each device id's slice) how many of them cross slices. With
    several slices, what crosses the data-centre network is not an HLO collective but a transfer
    of libtpu's multi-slice runtime: ``dcn`` counts those (their sends, with the bytes sent and the
    collective each implements)."""
    out: dict[str, dict] = {k: {"count": 0, "bytes": 0, "cross_slice": 0} for k in COLLECTIVES}
    out["dcn"] = {"count": 0, "bytes": 0, "cross_slice": 0}
    kinds: dict[str, int] = {}
    for line in hlo_text.splitlines():
        dcn = _DCN.search(line)
        if dcn is not None:  # a transfer between slices (libtpu's "megascale" runtime), by its send
            out["dcn"]["count"] += 1
            out["dcn"]["cross_slice"] += 1
            out["dcn"]["bytes"] += sum(_shapes_bytes(dcn.group("type"))[:1])
            kind = dcn.group("kind").lower()
            kinds[kind] = kinds.get(kind, 0) + 1
            out["dcn"]["kinds"] = kinds
            continue
        m = _OP.search(line)
        if m is None:
            continue
        kind, sizes = m.group("op"), _shapes_bytes(m.group("type"))
        if m.group("start") and kind == "all-gather":
            sizes = sizes[len(sizes) // 2 :]  # (operands, results)
        elif m.group("start") and kind == "collective-permute":
            sizes = sizes[:1]
        out[kind]["count"] += 1
        out[kind]["bytes"] += sum(sizes)
        groups = _groups(line)
        if slice_of_device is not None and groups:
            if any(len({slice_of_device[i] for i in g if i < len(slice_of_device)}) > 1 for g in groups):
                out[kind]["cross_slice"] += 1
    return out


def _memory(compiled) -> dict[str, int]:
    m = compiled.memory_analysis()
    if m is None:
        raise UserError("XLA reported no memory analysis for this program")
    record = {
        "arguments": int(m.argument_size_in_bytes),
        "outputs": int(m.output_size_in_bytes),
        "aliased": int(m.alias_size_in_bytes),
        "temporaries": int(m.temp_size_in_bytes),
        "code": int(m.generated_code_size_in_bytes),
    }
    record["total"] = (
        record["arguments"] + record["outputs"] - record["aliased"] + record["temporaries"] + record["code"]
    )
    return record


def _cost(compiled, key: str) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    return float(cost[key]) if cost and key in cost else None


@dataclasses.dataclass
class Program:
    name: str
    compile_s: float
    memory: dict[str, int]
    xla_flops: float | None  # per device, XLA's count
    xla_bytes_accessed: float | None  # per device, XLA's count of memory traffic
    collectives: dict[str, dict]
    largest: list[tuple[str, int]]  # the largest arrays the program makes (HLO results), name -> bytes


def _largest(hlo_text: str, n: int = 3) -> list[tuple[str, int]]:
    sizes = []
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\S+)\s+(\S+?)\(", line)
        if m is None or m.group(3) in ("parameter", "get-tuple-element", "tuple", "bitcast"):
            continue
        total = sum(_shapes_bytes(m.group(2)))
        sizes.append((f"{m.group(3)} {m.group(2).split('{')[0]}", total))
    sizes.sort(key=lambda kv: -kv[1])
    seen, out = set(), []
    for name, size in sizes:
        if name not in seen:
            seen.add(name)
            out.append((name, size))
        if len(out) == n:
            break
    return out


_OOM = re.compile(r"temporaries \(([0-9.]+)([KMGT])\).*?available HBM \(([0-9.]+)([KMGT])\)", re.S)


def _compile(name: str, fn, args, mesh, slice_of_device) -> Program:
    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
        lowered = fn.lower(*args)
        try:
            compiled = lowered.compile()
        except Exception as e:  # (XLA refuses a program whose temporaries exceed the chip's HBM)
            m = _OOM.search(str(e))
            if m is None or "RESOURCE_EXHAUSTED" not in str(e):
                raise
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
            temporaries = int(float(m.group(1)) * unit[m.group(2)])
            return Program(
                name,
                time.perf_counter() - t0,
                {
                    "arguments": 0,
                    "outputs": 0,
                    "aliased": 0,
                    "temporaries": temporaries,
                    "code": 0,
                    "total": temporaries,
                },  # fmt: skip
                None,
                None,
                {},
                [("temporaries (XLA stopped: " + str(e).strip().splitlines()[0][:160] + ")", temporaries)],
            )
    dt = time.perf_counter() - t0
    text = compiled.as_text()
    return Program(
        name,
        dt,
        _memory(compiled),
        _cost(compiled, "flops"),
        _cost(compiled, "bytes accessed"),
        collectives(text, slice_of_device),
        _largest(text),
    )


def compile_for_topology(
    cfg: Config,
    topology: Topology,
    *,
    slices: int = 1,
    chips_per_host: int = 4,
    vocab_size: int | None = None,
) -> dict:
    """Compile the training step and the evaluation step of ``cfg`` for ``slices`` slices of
    ``topology``; the report ``bytelm compile`` prints (see the module docstring)."""
    # the kernels a TPU would run (splash attention, XLA's MLP), and no persistent compilation cache
    with target_backend("tpu"), _without_persistent_cache():
        return _compile_for_topology(cfg, topology, slices, chips_per_host, vocab_size)


@contextlib.contextmanager
def _without_persistent_cache() -> Iterator[None]:
    """JAX's persistent compilation cache off inside the block, and as it was after it.

    The cache would store the TPU programs compiled here and then fail to read them back (a
    compile-only client cannot load an executable: a warning on every later compile of the same
    step). JAX decides once per process whether it uses the cache, at its first compilation, so
    the setting alone changes nothing once anything was compiled: the cache is reset on the way in
    and on the way out, and JAX decides again at the next compilation."""
    previous = getattr(jax.config, "jax_enable_compilation_cache")  # noqa: B009 (no typed attribute)
    jax.config.update("jax_enable_compilation_cache", False)
    reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", previous)
        reset_cache()


def _compile_for_topology(
    cfg: Config, topology: Topology, slices: int, chips_per_host: int, vocab_size
) -> dict:
    model = cfg.require_model()
    devices = topology_devices(topology, slices=slices, chips_per_host=chips_per_host)
    mesh = make_mesh(cfg.train, devices)
    task = task_class(model.family).for_shapes(cfg, vocab_size=vocab_size)
    trainer = Trainer(cfg, task, mesh=mesh, init=False)
    programs = trainer.programs

    def abstract_batch(rows: int) -> dict:
        return {
            k: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh, len(shape)))
            for k, (shape, dtype) in task.batch_shapes(rows).items()
        }

    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    opt_state = trainer.opt_state  # (abstract, placed as training places it)
    plan = schedule_plan(cfg.train, cfg.train.steps)
    seed_step = jax.ShapeDtypeStruct((2,), np.uint32, sharding=replicated)
    slice_of_device = [int(getattr(d, "slice_index", 0)) for d in mesh.devices.flat]
    micro = cfg.train.batch_size // cfg.train.grad_accum
    train = _compile(
        "train step",
        programs.train_step,
        (trainer.params, opt_state, abstract_batch(cfg.train.batch_size), plan, seed_step),
        mesh,
        slice_of_device,
    )
    evaluate = _compile(
        "eval step",
        programs.score_positions,
        (trainer.params, abstract_batch(cfg.eval.batch_size)),
        mesh,
        slice_of_device,
    )
    n = len(devices)
    analytic = task.train_flops_per_position() * task.positions_per_step() / n
    hbm = topology.chip.hbm_bytes
    worst = max(train.memory["total"], evaluate.memory["total"])
    try:
        bytes_per_step = task.positions_per_step() * task.bytes_per_position()
    except UserError:  # (a subword LM's bytes per token come from its corpus)
        bytes_per_step = None
    return {
        "roofline": roofline(train, analytic, task.positions_per_step() / n, bytes_per_step, n, topology),
        "config": {"family": model.family, "batch_size": cfg.train.batch_size, "seq_len": cfg.train.seq_len,
                   "micro_batch": micro, "remat": getattr(model, "remat", None),
                   "scan_layers": bool(getattr(model, "scan_layers", False)),
                   "mesh": dict(mesh.shape), "params": trainer.param_counts["total"]},
        "topology": {"name": topology.name, "libtpu": topology.libtpu_name, "slices": slices,
                     "chips": n, "chips_per_host": chips_per_host, "chip": topology.chip.name,
                     "hbm_bytes": hbm},
        "programs": [dataclasses.asdict(p) for p in (train, evaluate)],
        "analytic_train_flops_per_device": analytic,
        "fits": worst <= hbm,
        "hbm_free_fraction": 1.0 - worst / hbm,
    }  # fmt: skip


def roofline(
    train: Program,
    flops_per_chip: float,
    positions_per_chip: float,
    bytes_per_step: float | None,
    chips: int,
    topology: Topology,
) -> dict:
    """A lower bound of the train step's time on the slice, labelled as an estimate: each of compute
    (bytelm's analytic FLOPs at the chip's datasheet bf16 peak), memory traffic (XLA's bytes accessed
    at the HBM bandwidth), collectives over ICI and over the data-centre network (their result bytes
    at the chip's bandwidths) takes at least its own time, so the step takes at least the longest.
    XLA counts a scanned stack's loop body once (its FLOPs, bytes and collectives), which only loosens
    the bound. The upper bound of bytes (and positions) per second per chip follows from it."""
    chip = topology.chip
    peak = DATASHEET_BF16_PEAK[chip.device_kind]
    ici = sum(v["bytes"] for k, v in train.collectives.items() if k != "dcn")
    dcn = train.collectives.get("dcn", {}).get("bytes", 0)
    terms = {
        "compute": flops_per_chip / peak,
        "memory": (train.xla_bytes_accessed or 0.0) / chip.hbm_bandwidth,
        "ici": ici / chip.ici_bandwidth,
    }
    if dcn and chip.dcn_bandwidth:
        terms["dcn"] = dcn / chip.dcn_bandwidth
    bound = max(terms.values())
    return {
        "estimate": "a lower bound of the step time from datasheet peaks (bytelm/training/aot.py, roofline)",
        "seconds": terms,
        "step_s_lower_bound": bound,
        "binding": max(terms, key=lambda k: terms[k]),
        "positions_per_s_per_chip_upper_bound": positions_per_chip / bound if bound > 0 else None,
        "bytes_per_s_per_chip_upper_bound": (
            bytes_per_step / chips / bound if bytes_per_step and bound > 0 else None
        ),
        "dcn_bandwidth_known": chip.dcn_bandwidth is not None,
    }


def diagnosis(report: dict) -> str:
    """One line for a program that does not fit: the sizes, the largest arrays, what would help."""
    c, t = report["config"], report["topology"]
    train = report["programs"][0]
    gib = 1 << 30
    largest = ", ".join(f"{name} {size / gib:.2f} GiB" for name, size in train["largest"])
    fixes = []
    if not c.get("remat") or c["remat"] == "none":
        fixes.append('model.remat="block" (recompute each block in the backward pass)')
    if c["micro_batch"] > c["mesh"]["data"] * c["mesh"]["fsdp"]:
        fixes.append(
            f"a smaller train.batch_size ({c['batch_size']}), or train.grad_accum > 1 (micro-batch "
            f"{c['micro_batch']})"
        )
    if c["mesh"]["fsdp"] < t["chips"]:
        fixes.append(
            f"a larger train.mesh_fsdp (now {c['mesh']['fsdp']}) to shard weights and optimizer state"
        )
    if c["mesh"]["tensor"] == 1:
        fixes.append("train.mesh_tensor=2 or 4 (tensor parallelism) for activations too large for one chip")
    return (
        f"does not fit: {train['memory']['total'] / gib:.2f} GiB per chip of the train step "
        f"(temporaries {train['memory']['temporaries'] / gib:.2f} GiB, arguments "
        f"{train['memory']['arguments'] / gib:.2f} GiB) against {t['hbm_bytes'] / gib:.0f} GiB of HBM on "
        f"{t['chip']}; largest arrays: {largest}; try " + "; or ".join(fixes)
    )


def compile_config(config: str, overrides: Sequence[str], topology: Topology, **kwargs) -> dict:
    """:func:`compile_for_topology` of the config file (or shipped config) ``config`` with
    ``overrides`` (``KEY=VALUE``); ``kwargs``: its keyword arguments."""
    return compile_for_topology(load_config(config, list(overrides)), topology, **kwargs)


def headline(config: str, report: dict) -> dict:
    """The main figures of a compile report, for one JSON line."""
    t, r = report["topology"], report["roofline"]
    train = report["programs"][0]
    return {
        "config": config,
        "topology": t["name"],
        "slices": t["slices"],
        "fits": report["fits"],
        "hbm_free_fraction": round(report["hbm_free_fraction"], 4),
        "train_bytes_per_chip": train["memory"]["total"],
        "eval_bytes_per_chip": report["programs"][1]["memory"]["total"],
        "compile_s": round(sum(p["compile_s"] for p in report["programs"]), 2),
        "xla_flops_per_chip": train["xla_flops"],
        "analytic_flops_per_chip": report["analytic_train_flops_per_device"],
        "collectives": {k: v["count"] for k, v in train["collectives"].items() if v["count"]},
        "step_s_lower_bound": r["step_s_lower_bound"],
        "bytes_per_s_per_chip_upper_bound": r["bytes_per_s_per_chip_upper_bound"],
    }


def sweep_settings(sweep: Sequence[str]) -> list[list[str]]:
    """Every combination of swept values: ``["KEY=V1,V2,...", ...]`` -> the override lists."""
    axes = []
    for item in sweep:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise UserError(f"--sweep {item!r}: give KEY=V1,V2,... (e.g. train.batch_size=128,256)")
        axes.append([f"{key.strip()}={v.strip()}" for v in values.split(",") if v.strip()])
    return [list(combo) for combo in itertools.product(*axes)]


def compile_sweep(
    config: str,
    overrides: Sequence[str],
    topology: Topology,
    sweep: Sequence[str],
    *,
    note: Callable[[str], None] | None = None,
    **kwargs,
) -> list[dict]:
    """One row per combination of the ``sweep`` values (:func:`sweep_settings`), each compiled by
    :func:`compile_config` (``kwargs``: its keyword arguments): memory, compile time and the roofline
    bound; a combination refused (:class:`UserError`) is a row with its ``error``, also passed to
    ``note``."""
    rows: list[dict] = []
    for combo in sweep_settings(sweep):
        label = " ".join(combo)
        try:
            report = compile_config(config, [*overrides, *combo], topology, **kwargs)
        except UserError as e:
            rows.append({"settings": label, "error": str(e)})
            if note is not None:
                note(f"{label}: {e}")
            continue
        train, r = report["programs"][0], report["roofline"]
        rows.append(
            {
                "settings": label,
                "fits": report["fits"],
                "train_bytes_per_chip": train["memory"]["total"],
                "hbm_free_fraction": round(report["hbm_free_fraction"], 4),
                "compile_s": round(train["compile_s"] + report["programs"][1]["compile_s"], 2),
                "step_s_lower_bound": r["step_s_lower_bound"],
                "binding": r["binding"],
                "bytes_per_s_per_chip_upper_bound": r["bytes_per_s_per_chip_upper_bound"],
            }
        )
    return rows
