"""The ``bytelm`` command: argument parsing and console output only.

Every command is a pair: ``add_<command>(subparsers)`` declares its arguments and
``cmd_<command>(args)`` calls an importable library function and prints the result. Bad input
raises :class:`~bytelm.errors.UserError`, printed here as one line on stderr with exit status 2.
The ``bytelm`` executable enters through :func:`bytelm.__main__.entry`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import itertools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import jax
from flax import nnx

from bytelm.atomic import atomic_write_text
from bytelm.baselines import KINDS, NATIVE_FILES, encoders_of, is_saved, load_tokenizer
from bytelm.baselines.bpe import tokenizer_stats, train_bpe
from bytelm.baselines.hf_import import read_tokenizer_json
from bytelm.baselines.imported import import_tiktoken, import_tokenizer_json
from bytelm.config import load_config, load_run_config
from bytelm.data import default_cache_dir, load_corpus_from_config
from bytelm.errors import UserError
from bytelm.evaluation.evaluator import evaluate_runs
from bytelm.evaluation.external import export_heldout
from bytelm.evaluation.report import seconds, terminal_report
from bytelm.evaluation.results import EvalSet
from bytelm.experiments.ablate import ablate
from bytelm.experiments.compare import compare
from bytelm.experiments.runner import StageStopped
from bytelm.families.blt.source import read_patch_source
from bytelm.generate import load_decoder, stream, text_pieces
from bytelm.interop.hf import convert_hf, export_hf
from bytelm.patching import EntropyModel, PatchedText, format_patches, patch_windows, read_windows
from bytelm.patching.plot import plot_entropies
from bytelm.patching.show import CALIBRATION_WINDOWS
from bytelm.paths import check_output_dir, check_output_file
from bytelm.progress import ProgressBar
from bytelm.rundir import RunDir, run_path
from bytelm.sampling.sampler import SamplingOptions
from bytelm.training import distributed
from bytelm.training.host import configure_cpu_devices, keep_jax_off_absent_tpu, quiet_libtpu_without_tpu
from bytelm.training.loop import train
from bytelm.training.restore import ensure_run_record, restore_model, restore_scorer
from bytelm.training.trainer import TrainingDiverged

EXIT_USER_ERROR = 2
EXIT_SIGNAL = 130  # (128 + SIGINT, as shells report an interrupted command)
# The signal contract of every long command (train, compare, ablate, data prepare): SIGINT (Ctrl-C)
# stops it with exit status 130, SIGTERM (a scheduler's preemption notice) with exit status 0 (a
# clean stop: the scheduler runs the same command again, which resumes); training saves a
# checkpoint first, every other stage leaves only finished, atomically written files.
EXIT_TERMINATED = 0
LONG_COMMANDS = ("train", "compare", "ablate", "prepare")


class Terminated(BaseException):
    """SIGTERM outside a training step (which has its own handler, bytelm.training.loop): raised
    where the main thread is, like KeyboardInterrupt for SIGINT."""


def _terminate(signum, frame):
    raise Terminated()


# -- shared options -------------------------------------------------------------------------
def _add_config_options(p: argparse.ArgumentParser, *, with_config: bool = True) -> None:
    if with_config:
        p.add_argument(
            "--config", metavar="FILE", help="TOML config file (its [data] section applies; see configs/)"
        )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set data.heldout_fraction=0.1 (repeatable)",
    )


def _add_data_option(
    p: argparse.ArgumentParser, default: str = "the running Python's standard library"
) -> None:
    p.add_argument(
        "--data",
        metavar="SPEC",
        help=f"corpus spec (default: {default}): 'stdlib' (the running Python's standard library), "
        "'files:PATH[?split=paragraph|line]' (a file, directory or glob), 'jsonl:PATH[?field=text]' "
        "(also .jsonl.gz/.zst), 'parquet:PATH[?field=text]', 'hf:DIR[?split=train&field=text]' "
        "(save_to_disk), or 'tfds:NAME[/CONFIG][:SPLIT][?field=text&data_dir=DIR]' (the tfds extra); "
        "files:, jsonl:, parquet: and hf: also take gs://BUCKET/PATH (the gcs extra)",
    )


def _add_tokenizer_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokenizer",
        required=True,
        metavar="DIR",
        help="tokenizer directory written by 'bytelm tokenizer train' or 'bytelm tokenizer import' (holds "
        "bytelm_bpe.json, bytelm_unigram.json or bytelm_wordpiece.json)",
    )


def _add_workers_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, metavar="N", help="worker processes (default: all available CPUs)")


def _resolve_config(args: argparse.Namespace):
    overrides = list(args.overrides)
    if getattr(args, "data", None):
        overrides.append(f"data.source={args.data}")
    return load_config(getattr(args, "config", None), overrides)


def _load_corpus(data_cfg):
    bar = ProgressBar(f"reading {data_cfg.source}", unit=" docs")
    try:
        return load_corpus_from_config(data_cfg, progress=bar.update)
    finally:
        bar.close()


def _print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _stage_bars():
    """``progress(stage, done, total, suffix)`` for the library, one bar per stage; ``close()``."""
    current: dict = {}

    def progress(stage: str, done: int, total: int | None, suffix: str = "") -> None:
        if current.get("stage") != stage:
            close()
            current["stage"], current["bar"] = stage, ProgressBar(stage)
        current["bar"].update(done, total, suffix)

    def close() -> None:
        if current.get("bar") is not None:
            current["bar"].close()
        current.clear()

    return progress, close


def _stage_reporter():
    """``(progress, note, close)``: stage bars, and notes printed on stderr below a closed bar."""
    progress, close = _stage_bars()

    def note(message: str) -> None:
        close()
        print(message, file=sys.stderr, flush=True)

    return progress, note, close


# -- data info --------------------------------------------------------------------------------
def add_data_info(sub) -> None:
    p = sub.add_parser(
        "info",
        help="print documents, bytes, split sizes, evaluation segments and the fingerprint",
        description="Prepare (or reuse from the cache) a corpus and print its summary: documents, "
        "bytes, train/held-out sizes, the number of evaluation segments and the 64-hex fingerprint "
        "of the scored held-out bytes.",
    )
    _add_data_option(p)
    _add_config_options(p)
    p.set_defaults(func=cmd_data_info)


def cmd_data_info(args: argparse.Namespace) -> int:
    s = _load_corpus(_resolve_config(args).data).summary()
    _print_rows(
        [
            ("source", s["source"]),
            ("documents", f"{s['documents']:,}"),
            ("bytes", f"{s['bytes']:,}"),
            ("train", f"{s['train_documents']:,} documents, {s['train_bytes']:,} bytes"),
            ("held-out", f"{s['heldout_documents']:,} documents, {s['heldout_bytes']:,} bytes"),
            (
                "eval segments",
                f"{s['eval_segments']:,} segments, {s['eval_bytes']:,} bytes "
                f"(segment_bytes {s['segment_bytes']}, max_eval_bytes {s['max_eval_bytes']:,})",
            ),
            ("fingerprint", s["fingerprint"]),
            ("cache", s["cache"]),
        ]
    )
    return 0


# -- data prepare ------------------------------------------------------------------------------
def add_data_prepare(sub) -> None:
    p = sub.add_parser(
        "prepare",
        help="prepare a corpus once, in parallel, into the cache that training reads",
        description="Stream a corpus into the prepared format (byte shards and a binary index; "
        "bytelm/data/corpus.py) with several worker processes (a source of many files is cut into runs "
        "of files, one per worker; the result is the same for any number of workers), then print its "
        "summary. Training, evaluation and compare find it there (the same data.* settings and "
        "data.cache_dir). Memory stays bounded by a read chunk and the longest document piece.",
    )
    _add_data_option(p)
    _add_config_options(p)
    p.add_argument(
        "--out",
        metavar="DIR",
        help="the cache directory to prepare into (sets data.cache_dir; default: $BYTELM_CACHE_DIR or "
        "~/.cache/bytelm); train with --set data.cache_dir=DIR to read it",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="worker processes (default: the CPUs available to this process)",
    )
    p.set_defaults(func=cmd_data_prepare)


def cmd_data_prepare(args: argparse.Namespace) -> int:
    if args.out:
        check_output_dir(args.out, "--out")
        args.overrides = [*args.overrides, f"data.cache_dir={args.out}"]
    workers = args.workers if args.workers is not None else len(os.sched_getaffinity(0))
    if workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
    cfg = _resolve_config(args).data
    bar = ProgressBar(f"prepare {cfg.source}", unit=" docs")
    t0 = time.perf_counter()
    try:
        corpus = load_corpus_from_config(
            cfg, progress=lambda done, total: bar.update(done, total or None), workers=workers
        )
    finally:
        bar.close()
    seconds_ = time.perf_counter() - t0
    s = corpus.summary()
    rate = s["bytes"] / 1e6 / max(seconds_, 1e-9)
    _print_rows(
        [
            ("source", s["source"]),
            ("documents", f"{s['documents']:,} ({s['bytes']:,} bytes, {len(corpus.shards)} shard(s))"),
            ("held-out", f"{s['heldout_documents']:,} documents, fingerprint {s['fingerprint']}"),
            (
                "time",
                f"{seconds_:.1f} s with {workers} worker(s) ({rate:,.1f} MB of documents/s)",
            ),
            ("cache", s["cache"]),
        ]
    )
    return 0


# -- data export-heldout -----------------------------------------------------------------------
def add_data_export_heldout(sub) -> None:
    p = sub.add_parser(
        "export-heldout",
        help="write the exact scored held-out segments as JSON Lines (to score outside models)",
        description="Write the evaluation segments (id, group, length, base64 bytes), after a header line "
        "with the fingerprint, to --out. Score them with any model and add the result to 'bytelm eval "
        "--external NAME=SCORES.jsonl' (header {format: bytelm-scores, version: 1, fingerprint}, then one "
        "{id, nats} per segment; see bytelm/evaluation/external.py).",
    )
    _add_data_option(p)
    _add_config_options(p)
    p.add_argument("--out", required=True, metavar="FILE.jsonl", help="the JSON Lines file to write")
    p.set_defaults(func=cmd_data_export_heldout)


def cmd_data_export_heldout(args: argparse.Namespace) -> int:
    check_output_file(args.out, "--out")
    header = export_heldout(EvalSet.from_corpus(_load_corpus(_resolve_config(args).data)), args.out)
    print(
        f"wrote {args.out}: {header['segments']:,} segments, {header['bytes']:,} bytes, fingerprint "
        f"{header['fingerprint']}"
    )
    return 0


# -- train ----------------------------------------------------------------------------------------
def add_train(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train (or resume) a model from a config file",
        description="Train any model family from a TOML config. Re-running with the same --out resumes "
        "from the latest checkpoint (the config must match). SIGTERM (a preemption notice) or SIGINT to any "
        "process saves a checkpoint, every process at the same step, and stops: exit 0 after SIGTERM, 130 "
        "after Ctrl-C. --out may be a URL (gs://BUCKET/RUN, with the .[gcs] extra): the checkpoints, records "
        "and TensorBoard events go to the bucket. Progress lines give the loss and BPB of the last step, and "
        "bytes/s and MFU averaged over the log intervals of the last 30 s of training time (evaluations "
        "excluded); MFU is against the datasheet bf16 peak of a GPU/TPU or train.peak_flops, none on a CPU "
        "without it, and a ratio above 1 is never printed as MFU (a warning says the peak is too low).",
    )
    p.add_argument(
        "config",
        help="TOML config file, e.g. configs/tiny/byte.toml (a shipped config also by name: tiny/byte)",
    )
    p.add_argument(
        "--out",
        metavar="RUN_DIR",
        help="run directory, or a URL (gs://BUCKET/RUN) on hosts that share no file system (default: "
        "runs/<config name>)",
    )
    p.add_argument(
        "--minutes",
        type=float,
        metavar="M",
        help="train for M minutes of training time instead of train.steps (sets train.time_budget_s = 60 M): "
        "compilation counts, evaluations do not, a resumed run continues the same budget; the learning-rate "
        "schedule's horizon is planned from the first steps' time",
    )
    p.add_argument(
        "--allow-cpu",
        action="store_true",
        help="train on the CPU even a run that would take more than a day there (without it such a run, a "
        "small or base preset where JAX found no GPU or TPU, stops and says how to install the accelerator "
        "build)",
    )
    p.add_argument(
        "--profile-steps",
        metavar="A:B",
        help="write a jax.profiler trace of steps A to B (numbered from 1, as in the logs) into "
        "RUN_DIR/profile, for TensorBoard's profile plugin or XProf (sets train.profile_steps)",
    )
    _add_multihost_options(
        p,
        "Run the same command on every host: each process trains on its slice of every batch, the mesh spans "
        "all hosts' devices, process 0 alone writes the run's records, checkpoints are written together. "
        "--out must be a place every host sees: a shared file system, or a bucket (gs://BUCKET/RUN).",
    )
    _add_config_options(p, with_config=False)
    p.set_defaults(func=cmd_train)


def _add_multihost_options(p: argparse.ArgumentParser, description: str) -> None:
    multi = p.add_argument_group("multi-host (docs/scaling.md)", description)
    multi.add_argument(
        "--distributed",
        action="store_true",
        help="join the job's processes with jax.distributed.initialize(), which finds the cluster itself on "
        "Cloud TPU VMs, SLURM (srun), Open MPI and Kubernetes",
    )
    multi.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="the address of process 0, for an explicit layout (with the two below)",
    )
    multi.add_argument(
        "--num-processes", type=int, metavar="N", help="the number of processes in an explicit layout"
    )
    multi.add_argument(
        "--process-id", type=int, metavar="I", help="this process's index in an explicit layout, 0..N-1"
    )


def _join_processes(args: argparse.Namespace) -> None:
    """Join the job's processes (a no-op without the multi-host options) and quiet the others' logs."""
    distributed.initialize(
        auto=args.distributed,
        coordinator=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
    )
    distributed.configure_process_logging()


def _budget_seconds(minutes: float | None) -> float | None:
    """``--minutes`` in seconds (None: not given)."""
    if minutes is None:
        return None
    if not minutes > 0:
        raise UserError(f"--minutes must be > 0, got {minutes}")
    return 60.0 * minutes


def cmd_train(args: argparse.Namespace) -> int:
    budget = _budget_seconds(args.minutes)
    extra = [f"train.time_budget_s={budget}"] if budget else []
    if args.profile_steps:
        extra.append(f"train.profile_steps={args.profile_steps}")
    cfg = load_config(args.config, [*args.overrides, *extra])
    out = run_path(args.out) if args.out else Path("runs") / Path(args.config).stem
    _join_processes(args)
    bar = ProgressBar(f"train {out}", unit=" steps")
    progress = (
        (lambda done, total, suffix: bar.update(done, total, suffix)) if distributed.is_primary() else None
    )
    try:
        result = train(cfg, out, progress=progress, allow_cpu=args.allow_cpu)
    except TrainingDiverged as e:
        bar.close()
        print(f"bytelm: training stopped: {e}", file=sys.stderr)
        return 1
    bar.close()
    held_out = f", held-out BPB {result.eval_bpb:.4f}" if result.eval_bpb is not None else ""
    state = "stopped by signal" if result.stopped_by_signal else "done"
    spent = (
        f" ({result.train_s:.0f}s of training)"
        if cfg.train.time_budget_s and result.train_s is not None
        else ""
    )
    if distributed.is_primary():  # (one summary per job)
        print(f"{state}: {out} at step {result.step}{spent}, train loss {result.loss:.4f}{held_out}")
    # a user's Ctrl-C exits as an interrupted command; a scheduler's SIGTERM (a preemption notice, to
    # this process or another of the job) ends in a checkpoint, a clean stop: 0, as schedulers expect
    return EXIT_SIGNAL if result.stopped_by_signal and result.signum == signal.SIGINT else 0


# -- compile ----------------------------------------------------------------------------------------
def add_compile(sub) -> None:
    p = sub.add_parser(
        "compile",
        help="compile a config's train and eval steps for a TPU slice, here, and say whether they fit",
        description="Build the training step and the evaluation step of CONFIG from shapes alone (no "
        "weights, no data) on the abstract devices of a TPU slice and compile them ahead of time, on this "
        "machine: no TPU is needed, only libtpu (pip install -e '.[tpu]'). Prints, per program, XLA's memory "
        "per chip (arguments, outputs, temporaries; the total against the chip's HBM), the compile time, "
        "the collectives XLA placed (count and bytes per step; with --slices, the transfers over the "
        "data-centre network), XLA's FLOPs beside bytelm's analytic count, and ends with one JSON line. "
        "Exit status 1 when a program does not fit, with a one-line diagnosis. See docs/scaling.md.",
    )
    p.add_argument(
        "config",
        help="TOML config file, or a shipped config by name (small/byte, base/blt, ...)",
    )
    p.add_argument(
        "--topology",
        required=True,
        metavar="NAME",
        help="the slice: GENERATION-SIZE as Cloud TPU names it (v5e-256, v6e-256: chips; v4-64, v5p-128: "
        "TensorCores) or GENERATION:SHAPE (v5e:16x16, v5p:4x4x4)",
    )
    p.add_argument(
        "--slices",
        type=int,
        default=1,
        metavar="K",
        help="K slices joined by the data-centre network (multi-slice); the data axis spans them (default 1)",
    )
    p.add_argument(
        "--chips-per-host",
        type=int,
        default=4,
        choices=(4, 8),
        help="chips per host: 4 (a 2x2 board, as in multi-host slices) or 8 (default 4)",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        metavar="N",
        help="a subword LM's vocabulary size, when its tokenizer directory (model.tokenizer) is not here",
    )
    p.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="compile every combination of these values (repeatable; e.g. --sweep train.batch_size=128,256 "
        "--sweep model.remat=none,block --sweep train.mesh_fsdp=4,8) and print them side by side: memory, "
        "the roofline bound of the step time and of bytes per second per chip",
    )
    p.add_argument("--json", metavar="FILE", help="also write the whole report (every figure) to FILE")
    _add_config_options(p, with_config=False)
    p.set_defaults(func=cmd_compile)


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def cmd_compile(args: argparse.Namespace) -> int:
    from bytelm.training.aot import diagnosis  # noqa: PLC0415
    from bytelm.training.topology import parse_topology  # noqa: PLC0415

    if args.json:
        check_output_file(args.json, "--json")
    quiet_libtpu_without_tpu()
    topology = parse_topology(args.topology)
    if args.sweep:
        return _compile_sweep(args, topology)
    report = _compile_report(args, topology, [])
    c, t = report["config"], report["topology"]
    mesh = " x ".join(f"{k} {v}" for k, v in c["mesh"].items())
    print(
        f"{args.config} ({c['family']}, {c['params'] / 1e6:.1f}M parameters, batch {c['batch_size']} x "
        f"{c['seq_len']}) on {t['slices']} x {t['name']} ({t['libtpu']}, {t['chips']} chips, "
        f"{_gib(t['hbm_bytes'])} HBM each), mesh {mesh}"
    )
    for prog in report["programs"]:
        m = prog["memory"]
        used = [
            f"{k} {v['count']} ({_gib(v['bytes'])})" for k, v in prog["collectives"].items() if v["count"]
        ]
        print(
            f"  {prog['name']}: {_gib(m['total'])} per chip (arguments {_gib(m['arguments'])}, outputs "
            f"{_gib(m['outputs'])}, reused {_gib(m['aliased'])}, temporaries {_gib(m['temporaries'])}, code "
            f"{_gib(m['code'])}); compiled in {prog['compile_s']:.1f}s"
        )
        print(f"    collectives per step: {', '.join(used) if used else 'none'}")
    train = report["programs"][0]
    xla = train["xla_flops"]
    analytic = report["analytic_train_flops_per_device"]
    counted = f"{xla:.4g}" if xla is not None else "n/a (not compiled)"
    print(
        f"  FLOPs per chip per step: XLA {counted}, analytic {analytic:.4g}"
        + (f" (XLA / analytic {xla / analytic:.3f})" if xla and analytic else "")
        + ("; XLA counts a scanned stack's loop body once" if report["config"].get("scan_layers") else "")
    )
    r = report["roofline"]
    terms = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in r["seconds"].items())
    rate = r["bytes_per_s_per_chip_upper_bound"]
    print(
        "  roofline (an estimate from datasheet peaks, a lower bound): step >= "
        f"{r['step_s_lower_bound'] * 1e3:.1f} ms, {r['binding']}-bound ({terms})"
        + (f"; at most {rate:,.0f} bytes/s per chip" if rate else "")
    )
    verdict = "fits" if report["fits"] else "does not fit"
    print(f"  {verdict}: {report['hbm_free_fraction']:.1%} of HBM free at the larger program")
    if args.json:
        atomic_write_text(args.json, json.dumps(report, indent=1))
    headline = {
        "config": args.config,
        "topology": t["name"],
        "slices": t["slices"],
        "fits": report["fits"],
        "hbm_free_fraction": round(report["hbm_free_fraction"], 4),
        "train_bytes_per_chip": train["memory"]["total"],
        "eval_bytes_per_chip": report["programs"][1]["memory"]["total"],
        "compile_s": round(sum(p["compile_s"] for p in report["programs"]), 2),
        "xla_flops_per_chip": xla,
        "analytic_flops_per_chip": analytic,
        "collectives": {k: v["count"] for k, v in train["collectives"].items() if v["count"]},
        "step_s_lower_bound": r["step_s_lower_bound"],
        "bytes_per_s_per_chip_upper_bound": rate,
    }
    print(json.dumps(headline))
    if not report["fits"]:
        print(f"bytelm: {args.config} on {t['name']}: {diagnosis(report)}", file=sys.stderr)
        return 1
    return 0


def _compile_report(args: argparse.Namespace, topology, extra: list[str]) -> dict:
    """The compile report of the command's config with ``extra`` overrides."""
    from bytelm.training.aot import compile_for_topology  # noqa: PLC0415

    cfg = load_config(args.config, [*args.overrides, *extra])
    return compile_for_topology(
        cfg, topology, slices=args.slices, chips_per_host=args.chips_per_host, vocab_size=args.vocab_size
    )


def _compile_sweep(args: argparse.Namespace, topology) -> int:
    """``bytelm compile --sweep``: every combination of the swept values, one row each."""

    axes = []
    for item in args.sweep:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise UserError(f"--sweep {item!r}: give KEY=V1,V2,... (e.g. train.batch_size=128,256)")
        axes.append([f"{key.strip()}={v.strip()}" for v in values.split(",") if v.strip()])
    rows: list[dict] = []
    for combo in itertools.product(*axes):
        label = " ".join(combo)
        try:
            report = _compile_report(args, topology, list(combo))
        except UserError as e:
            rows.append({"settings": label, "error": str(e)})
            print(f"{label}: {e}", file=sys.stderr)
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
    where = f"{args.slices} x {topology.name} ({topology.chips} chips per slice)"
    print(f"{args.config} on {where}; the roofline columns are an estimate (a lower bound of the step time)")
    print(f"| {'settings':40s} | fits | GiB/chip | HBM free | step >= ms | bound   | bytes/s/chip <= |")
    for row in rows:
        if "error" in row:
            print(f"| {row['settings']:40s} | error: {row['error'][:90]}")
            continue
        rate = row["bytes_per_s_per_chip_upper_bound"]
        print(
            f"| {row['settings']:40s} | {'yes' if row['fits'] else 'no':4s} | "
            f"{row['train_bytes_per_chip'] / (1 << 30):8.2f} | {row['hbm_free_fraction']:8.1%} | "
            f"{row['step_s_lower_bound'] * 1e3:10.1f} | {row['binding']:7s} | "
            + (f"{rate:15,.0f} |" if rate else f"{'-':>15s} |")
        )
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=1))
    print(json.dumps({"config": args.config, "topology": topology.name, "sweep": rows}))
    return 0


# -- patch ------------------------------------------------------------------------------------------
def add_patch(sub) -> None:
    p = sub.add_parser(
        "patch",
        help="show the entropy patches of a text (and the BLT-paper entropy figure)",
        description="Run an entropy model on a text and print the text with '|' between patches (bytes that "
        "are not printable, or UTF-8 split across patches, shown escaped) and the mean patch length. RUN_DIR "
        "is a BLT run (its entropy model and recorded patching settings are used) or an entropy-model run "
        "(family 'byte'; give --threshold or --target-len). A text of any length is read and patched in "
        "windows of the run's train.seq_len + 1 positions, each by itself, as the run patches the windows it "
        "trains on (memory stays bounded; a progress bar on stderr for long files). --png draws the first "
        "window.",
    )
    p.add_argument(
        "run_dir", metavar="RUN_DIR", help="a BLT run directory, or an entropy-model (byte LM) run directory"
    )
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", metavar="TEXT", help="the text to patch")
    text.add_argument("--file", metavar="PATH", help="patch the bytes of this file")
    thr = p.add_mutually_exclusive_group()
    thr.add_argument(
        "--threshold",
        type=float,
        metavar="T",
        help="global entropy threshold in nats: a patch starts after a byte whose next-byte entropy exceeds "
        "T (overrides a BLT run's threshold)",
    )
    thr.add_argument(
        "--target-len",
        type=float,
        metavar="L",
        help="calibrate the threshold on this text itself (its first 256 windows) to give a mean patch "
        "length of L bytes",
    )
    p.add_argument(
        "--png", metavar="PATH", help="also draw per-byte entropy, the threshold and the boundaries to PATH"
    )
    p.set_defaults(func=cmd_patch)


def cmd_patch(args: argparse.Namespace) -> int:
    if args.png:
        check_output_file(args.png, "--png")
    ensure_run_record(args.run_dir)  # (a damaged run.json is rebuilt, not refused)
    source = read_patch_source(args.run_dir)
    kwargs = source.patch_kwargs(threshold=args.threshold, target_len=args.target_len)
    width = load_run_config(source.run_dir).train.seq_len + 1  # the run's windows (bytelm/patching/show.py)
    if args.file is not None:
        try:
            stream: BinaryIO = open(args.file, "rb")  # noqa: SIM115 (closed below, also on error)
            total = os.fstat(stream.fileno()).st_size
        except OSError as e:
            raise UserError(f"cannot read --file {args.file}: {e.strerror}; give a readable file") from None
    else:
        data = os.fsencode(args.text)
        stream, total = io.BytesIO(data), len(data)
    with stream:
        if not total:
            what = f"the file {args.file} is empty" if args.file is not None else "the text to patch is empty"
            raise UserError(f"{what}; give some text (--text or --file)")
        model = EntropyModel(restore_model(source.entropy_run), width=width)
        source.check_fingerprint(model.fingerprint)
        bar = ProgressBar("patching", unit="B")
        first: PatchedText | None = None
        n_bytes = n_patches = n_windows = 0
        t0 = time.perf_counter()
        for part in patch_windows(model, read_windows(stream, width), width=width, **kwargs):
            sys.stdout.write(("|" if n_windows else "") + format_patches(part.patches()))
            first = first or part
            n_windows += 1
            n_bytes += len(part.data)
            n_patches += part.n_patches
            bar.update(n_bytes, total)
        bar.close()
        sys.stdout.write("\n")
        seconds = time.perf_counter() - t0
    assert first is not None
    if first.calibrated:
        calibrated_on = min(n_windows, CALIBRATION_WINDOWS)
        how = (
            f"calibrated on the first {calibrated_on} window(s) of this text for a target mean patch length "
            f"of {first.target_len:g}"
        )
    elif args.threshold is not None:
        how = "given with --threshold"
    else:
        how = f"from the BLT run {source.run_dir}"
    rows = [("entropy model", f"{source.entropy_run} (fingerprint {model.fingerprint[:16]})")]
    if first.threshold is not None:
        rows.append(("threshold", f"{first.threshold:.6g} nats ({how})"))
    if first.monotonic_threshold is not None:
        rows.append(("monotonic", f"{first.monotonic_threshold:.6g} nats (from the BLT run)"))
    if first.max_patch_len is not None:
        rows.append(("max patch len", str(first.max_patch_len)))
    rows.append(
        (
            "windows",
            f"{n_windows} of {width} positions (the run's train.seq_len + 1), each patched by itself as the "
            "run patches its training windows: a patch starts at each window's first two positions",
        )
    )
    rows.append(
        (
            "mean patch len",
            f"{n_bytes / max(n_patches, 1):.3f} bytes ({n_bytes} bytes in {n_patches} patches; "
            f"{(n_bytes + 1) / (n_patches + 1):.3f} counting the BOS patch, as calibration does)",
        )
    )
    rows.append(("speed", f"{n_bytes / max(seconds, 1e-9) / 1e6:.3f} MB/s ({seconds:.1f}s)"))
    if args.png:
        plot_entropies(
            args.png,
            first.data,
            first.entropies,
            first.starts,
            threshold=first.threshold,
            monotonic_threshold=first.monotonic_threshold,
            title=f"entropy patching, {source.entropy_run.name}"
            + (f" (first window, {len(first.data)} bytes)" if n_windows > 1 else ""),
        )
        rows.append(
            (
                "png",
                f"{args.png}" + (f" (the first window, {len(first.data)} bytes)" if n_windows > 1 else ""),
            )
        )
    _print_rows(rows)
    return 0


# -- chunks ---------------------------------------------------------------------------------------
def add_chunks(sub) -> None:
    p = sub.add_parser(
        "chunks",
        help="show the chunks an H-Net run learned to make of a text",
        description="Run an H-Net (family 'hnet') on a text and print the text with '|' between the chunks "
        "its router makes, one line per stage (stage 2's chunks are groups of stage 1's), with each stage's "
        "mean chunk length on this text. Bytes that are not printable, or UTF-8 split across chunks, are "
        "shown escaped. The text must fit the model's context (train.seq_len - 1 bytes after the BOS).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="an H-Net run directory")
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", metavar="TEXT", help="the text to chunk")
    text.add_argument("--file", metavar="PATH", help="chunk the bytes of this file")
    p.add_argument(
        "--step", type=int, metavar="N", help="use checkpoint N (default: the newest that restores)"
    )
    p.add_argument(
        "--png",
        metavar="PATH",
        help="also draw stage 1's boundary probability per byte, the 0.5 threshold and its chunk boundaries "
        "to PATH",
    )
    p.set_defaults(func=cmd_chunks)


def cmd_chunks(args: argparse.Namespace) -> int:
    from bytelm.families.hnet.model import HNet
    from bytelm.families.hnet.show import chunk_text

    if args.png:
        check_output_file(args.png, "--png")
    if args.file is not None:
        try:
            data = Path(args.file).read_bytes()
        except OSError as e:
            raise UserError(f"cannot read --file {args.file}: {e.strerror}; give a readable file") from None
    else:
        data = os.fsencode(args.text)
    trainer = restore_scorer(args.run_dir, load_corpus=False, step=args.step)
    model = nnx.merge(trainer.graphdef, trainer.model_params)
    if not isinstance(model, HNet):
        raise UserError(
            f"{args.run_dir} is not an H-Net run (its model is {type(model).__name__}); 'bytelm chunks' "
            "shows an H-Net's learned chunks ('bytelm patch' shows a BLT's entropy patches)"
        )
    result = chunk_text(model, data, trainer.cfg.train.seq_len)
    rows = []
    for stage in range(len(result.starts)):
        print(f"stage {stage + 1}: " + format_patches(result.chunks(stage)))
        rows.append(
            (
                f"stage {stage + 1} chunks",
                f"{len(result.chunks(stage))}, mean {result.mean_chunk_len(stage):.3f} bytes "
                f"(target N = {model.cfg.targets()[stage]:g} {'bytes' if stage == 0 else 'stage-1 chunks'})",
            )
        )
    if args.png:
        plot_entropies(
            args.png,
            data,
            result.probs,
            result.starts[0],
            threshold=0.5,
            title=f"H-Net stage 1 chunks, {Path(args.run_dir).name}",
            quantity="boundary probability p",
            unit="chunk",
            units="chunks",
        )
        rows.append(("png", args.png))
    _print_rows(rows)
    return 0


# -- tokenizer train ------------------------------------------------------------------------------
def add_tokenizer_train(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a BPE, Unigram or WordPiece tokenizer on the train split of a corpus",
        description="Learn a tokenizer on the train documents of --data and write its "
        "directory. --kind bpe (default): a merge list identical to HF tokenizers' BpeTrainer with the same "
        "pattern; files bytelm_bpe.json (native, versioned), tokenizer.json (HF tokenizers), ranks.tiktoken "
        "(tiktoken) and vocab.txt (human-readable). --kind unigram: a Unigram LM (seed substrings, EM over "
        "all segmentations, pruning; SentencePiece's algorithm on bytes); files bytelm_unigram.json, "
        "tokenizer.json (HF Unigram model) and vocab.txt. --kind wordpiece: merges chosen by the likelihood "
        "score f(xy) / (f(x) f(y)), encoded by longest match with ## continuation pieces and a whole-word "
        "[UNK] (BERT's WordPiece), byte-level or (--level char) character-level; files "
        "bytelm_wordpiece.json, tokenizer.json (HF WordPiece model, same ids) and vocab.txt.",
    )
    _add_data_option(p)
    _add_config_options(p)
    p.add_argument(
        "--kind",
        choices=KINDS,
        default="bpe",
        help="the algorithm: 'bpe' (ranked merges, default), 'unigram' (Viterbi over scored pieces) or "
        "'wordpiece' (longest match with ## pieces)",
    )
    p.add_argument(
        "--encoder",
        choices=["ranks", "viterbi", "wordpiece", "longest"],
        help="the segmentation rule recorded with the tokenizer: the kind's own (bpe: 'ranks', unigram: "
        "'viterbi', wordpiece: 'wordpiece'; the default) or, for bpe and unigram, 'longest' (greedy longest "
        "match over the same vocabulary, without WordPiece's ## marks)",
    )
    p.add_argument(
        "--level",
        choices=["byte", "char"],
        default="byte",
        help="wordpiece only: 'byte' (default; the 256 bytes as the alphabet, never [UNK]) or 'char' "
        "(the characters seen in training, [UNK] for the rest, as BERT)",
    )
    p.add_argument(
        "--max-input-chars-per-word",
        type=int,
        metavar="N",
        help="wordpiece --level char only: a longer word becomes [UNK] (default 100, BERT's)",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        required=True,
        metavar="N",
        help="number of ids: 256 bytes + learned merges or pieces + special tokens (as HF counts it)",
    )
    p.add_argument(
        "--pattern",
        default="cl100k",
        metavar="gpt2|cl100k|REGEX",
        help="pre-tokenization pattern: 'cl100k' (default; digits in runs of 1-3), 'gpt2', or a regex",
    )
    p.add_argument(
        "--special",
        action="append",
        default=[],
        metavar="TOKEN",
        help="reserve a special token, e.g. --special '<|endoftext|>' (repeatable; ids after the merges)",
    )
    _add_workers_option(p)
    p.add_argument(
        "--sample-mb",
        type=float,
        default=0,
        metavar="MB",
        help="train on a sample of about MB megabytes of the train split (every k-th document, in "
        "order, streamed; default 0: the whole split)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write the tokenizer files into")
    p.add_argument(
        "--force",
        action="store_true",
        help="write over a tokenizer already in --out (runs trained on it will then refuse the new one)",
    )
    p.set_defaults(func=cmd_tokenizer_train)


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    check_output_dir(args.out, "--out")
    if RunDir(args.out).started() or RunDir(args.out).has_info():
        raise UserError(f"--out {args.out} is a run directory; write the tokenizer to a directory of its own")
    if is_saved(args.out) and not args.force:
        raise UserError(
            f"--out {args.out} holds a tokenizer already (runs trained on it check its fingerprint); give "
            "another directory, or --force to replace it"
        )
    if args.sample_mb < 0:
        raise UserError(f"--sample-mb must be >= 0 (0: the whole train split), got {args.sample_mb}")
    corpus = _load_corpus(_resolve_config(args).data)
    sample, sample_bytes = corpus.sample("train", int(args.sample_mb * 1e6))
    rules = encoders_of(args.kind)
    if args.encoder not in (None, *rules):
        raise UserError(
            f"--encoder {args.encoder} is not a rule of a {args.kind} tokenizer: use {rules[0]} (the default)"
            + (" or longest" if len(rules) > 1 else "")
        )
    if args.kind != "wordpiece" and (args.level != "byte" or args.max_input_chars_per_word is not None):
        raise UserError(f"--level and --max-input-chars-per-word are for --kind wordpiece, not {args.kind}")
    if args.max_input_chars_per_word is not None and args.level != "char":
        raise UserError(
            "--max-input-chars-per-word is for --level char: a byte-level WordPiece has no [UNK] to turn "
            "long words into"
        )
    count_bar = ProgressBar("pre-tokenizing", unit=" MB")
    learn_bar = ProgressBar(
        "pruning" if args.kind == "unigram" else "merging",
        unit=" rounds" if args.kind == "unigram" else " merges",
    )
    bars_open = [count_bar]

    def on_learn(done: int, total: int) -> None:
        if count_bar in bars_open:
            count_bar.close()
            bars_open.remove(count_bar)
            bars_open.append(learn_bar)
        learn_bar.update(done, total)

    kwargs = dict(
        vocab_size=args.vocab_size,
        pattern=args.pattern,
        special_tokens=args.special,
        num_workers=args.workers,
        progress=on_learn,
        count_progress=lambda done, total: count_bar.update(done >> 20, (total or 0) >> 20 or None),
        total_bytes=sample_bytes,
    )
    documents = (corpus.document(int(i)).tobytes() for i in sample)  # (streamed)
    try:
        if args.kind == "bpe":
            tok = train_bpe(documents, **kwargs)
        elif args.kind == "unigram":
            from bytelm.baselines.unigram import train_unigram

            tok = train_unigram(documents, **kwargs)
        else:
            from bytelm.baselines.wordpiece import train_wordpiece

            tok = train_wordpiece(
                documents, level=args.level, max_input_chars_per_word=args.max_input_chars_per_word, **kwargs
            )
    finally:
        for bar in bars_open:
            bar.close()
    if args.encoder == "longest":
        tok = tok.with_encoder("longest")
    tok.save(args.out)
    _remove_stale_files(args.out, args.kind)
    short = (
        f" (not the {args.vocab_size:,} asked for: the corpus gave no more; train on more text for more)"
        if tok.n_vocab < args.vocab_size
        else ""
    )
    if args.kind == "bpe":
        learned = f"256 bytes + {len(tok.merges):,} merges"
    elif args.kind == "unigram":
        learned = f"256 bytes + {tok.n_mergeable - 256:,} pieces"
    else:
        unk = ", [UNK] included" if tok.unk_id is not None else ""
        learned = f"{tok.n_mergeable:,} pieces ({tok.level}-level{unk})"
    _print_rows(
        [
            ("tokenizer", args.out),
            ("kind", f"{args.kind} (encoder: {tok.encoder})"),
            (
                "data",
                f"{corpus.spec} (train split: {corpus.split_bytes('train'):,} bytes; trained on "
                f"{len(sample):,} documents, {sample_bytes:,} bytes)",
            ),
            ("pattern", args.pattern),
            ("ids", f"{tok.n_vocab:,} = {learned} + {len(tok.special_tokens)} special{short}"),
            ("fingerprint", tok.fingerprint),
        ]
    )
    return 0


# -- tokenizer import -----------------------------------------------------------------------------
def add_tokenizer_import(sub) -> None:
    p = sub.add_parser(
        "import",
        help="import an HF tokenizer.json or a tiktoken rank file as the subword baseline, with its ids",
        description="Read an HF tokenizer.json (a BPE model with the ByteLevel pre-tokenizer, WordPiece with "
        "BertPreTokenizer, or Unigram with Metaspace; ids as Tokenizer.encode(text, "
        "add_special_tokens=False): "
        "added tokens applied as by HF, the post-processor not; a normalizer, pre-tokenizer or added "
        "token that cannot be "
        "reproduced exactly is refused, naming it) or a tiktoken rank file (base64(token) rank per line; "
        "--pattern gives the split pattern that goes with it: ids as tiktoken.Encoding(pat_str=PATTERN, "
        "mergeable_ranks=..., special_tokens={})), and write a tokenizer directory that encodes with the "
        "source's ids. Use it like a trained one: --tokenizer DIR, model.tokenizer = DIR, or 'dir = DIR' in "
        "a compare preset's [tokenizer] table (the subword LM takes only tokenizers whose tokens' bytes "
        "reproduce the text: not BertPreTokenizer, Metaspace or ByteLevel add_prefix_space=true).",
    )
    p.add_argument(
        "path", metavar="PATH", help="an HF tokenizer.json, or a tiktoken rank file (e.g. ranks.tiktoken)"
    )
    p.add_argument(
        "--pattern",
        default="cl100k",
        metavar="gpt2|cl100k|REGEX",
        help="tiktoken only: the split pattern of the ranks: 'cl100k' (default), 'gpt2', or a regex",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write the tokenizer files into")
    p.add_argument("--force", action="store_true", help="write over a tokenizer already in --out")
    p.set_defaults(func=cmd_tokenizer_import)


def cmd_tokenizer_import(args: argparse.Namespace) -> int:
    check_output_dir(args.out, "--out")
    if is_saved(args.out) and not args.force:
        raise UserError(f"--out {args.out} holds a tokenizer already; give another directory, or --force")
    if not Path(args.path).is_file():
        raise UserError(f"{args.path} is not a file: give an HF tokenizer.json or a tiktoken rank file")
    if read_tokenizer_json(args.path) is not None:
        tok = import_tokenizer_json(args.path)
        source = f"{args.path} (HF tokenizer.json, {tok.inner.pattern or tok.kind})"
    else:
        tok = import_tiktoken(args.path, pattern=args.pattern)
        source = f"{args.path} (tiktoken ranks, pattern {args.pattern})"
    tok.save(args.out, source_file=args.path)
    _remove_stale_files(args.out, "imported")
    _print_rows(
        [
            ("tokenizer", args.out),
            ("source", source),
            ("kind", f"{tok.kind} (encoder: {tok.encoder}), ids as in the source"),
            ("ids", f"{tok.n_vocab:,}"),
            ("subword LM", f"refused: {tok.lossy}" if tok.lossy else "yes (byte-exact)"),
            ("fingerprint", tok.fingerprint),
        ]
    )
    return 0


def _remove_stale_files(out, kind: str) -> None:
    """--force over another kind: its native file could be read first, its tiktoken ranks mislead."""
    stale = [name for k, name in NATIVE_FILES.items() if k != kind]
    if kind != "bpe" and kind != "imported":
        stale.append("ranks.tiktoken")
    if kind != "imported":
        stale.append("bytelm_imported.json")
    for name in stale:
        if (Path(out) / name).is_file():
            (Path(out) / name).unlink()


# -- tokenizer encode / decode -------------------------------------------------------------------
def add_tokenizer_encode(sub) -> None:
    p = sub.add_parser(
        "encode",
        help="encode stdin (raw bytes) to token ids on stdout",
        description="Read raw bytes on stdin (any bytes) and print their token ids, space-separated, on "
        "one line. A special token's spelling in the input is an error unless --allow-special or "
        "--special-as-text is given.",
    )
    _add_tokenizer_option(p)
    special = p.add_mutually_exclusive_group()
    special.add_argument(
        "--allow-special", action="store_true", help="encode special tokens' spellings as the special tokens"
    )
    special.add_argument(
        "--special-as-text", action="store_true", help="encode special tokens' spellings as ordinary text"
    )
    p.set_defaults(func=cmd_tokenizer_encode)


def cmd_tokenizer_encode(args: argparse.Namespace) -> int:
    tok = load_tokenizer(args.tokenizer)
    data = sys.stdin.buffer.read()
    kwargs: dict[str, Any]
    if args.allow_special:
        kwargs = {"allowed_special": "all"}
    elif args.special_as_text:
        kwargs = {"disallowed_special": ()}
    else:
        kwargs = {}
    try:
        ids = tok.encode(data, **kwargs)
    except ValueError as e:
        raise UserError(f"{e} (on the command line: --allow-special or --special-as-text)") from None
    print(" ".join(map(str, ids)))
    return 0


def add_tokenizer_decode(sub) -> None:
    p = sub.add_parser(
        "decode",
        help="decode token ids on stdin to raw bytes on stdout",
        description="Read whitespace-separated token ids on stdin and write the exact bytes they stand for.",
    )
    _add_tokenizer_option(p)
    p.set_defaults(func=cmd_tokenizer_decode)


def cmd_tokenizer_decode(args: argparse.Namespace) -> int:
    tok = load_tokenizer(args.tokenizer)
    ids = []
    for field in sys.stdin.buffer.read().split():
        try:
            ids.append(int(field))
        except ValueError:
            raise UserError(
                "decode reads whitespace-separated integer token ids on stdin, got "
                f"{field.decode(errors='replace')!r}"
            ) from None
    try:
        data = tok.decode_bytes(ids)
    except ValueError as e:
        raise UserError(str(e)) from None
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0


# -- tokenizer stats --------------------------------------------------------------------------------
def add_tokenizer_stats(sub) -> None:
    p = sub.add_parser(
        "stats",
        help="print bytes per token overall and per document group (the token tax table)",
        description="Encode the documents of --data and print bytes per token overall and per document "
        "group (directory), with each group's token tax: its tokens per byte relative to the whole corpus.",
    )
    _add_tokenizer_option(p)
    _add_data_option(p)
    _add_config_options(p)
    p.add_argument(
        "--split",
        choices=["all", "train", "heldout"],
        default="all",
        help="which documents to measure (default: all)",
    )
    p.add_argument(
        "--group-by",
        choices=["group", "dir"],
        default="group",
        help="'group': the corpus's document groups (stdlib: top-level package; files: each file); "
        "'dir': the first directory of each document's path, e.g. one per language (default: group)",
    )
    _add_workers_option(p)
    p.add_argument("--json", metavar="FILE", help="also write the numbers as JSON to FILE")
    p.set_defaults(func=cmd_tokenizer_stats)


def cmd_tokenizer_stats(args: argparse.Namespace) -> int:
    if args.json:
        check_output_file(args.json, "--json")
    tok = load_tokenizer(args.tokenizer)
    corpus = _load_corpus(_resolve_config(args).data)
    bar = ProgressBar("encoding", unit=" docs")
    try:
        stats = tokenizer_stats(
            tok,
            corpus,
            split=args.split,
            group_by=args.group_by,
            num_workers=args.workers,
            progress=bar.update,
        )
    finally:
        bar.close()
    print(stats.format_table())
    if args.json:
        atomic_write_text(args.json, json.dumps(stats.to_dict(), indent=1) + "\n")
    return 0


# -- eval -----------------------------------------------------------------------------------------
def add_eval(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="score trained runs (and outside scores) on the identical held-out bytes",
        description="Restore the latest checkpoint of each RUN_DIR (any family), score every held-out "
        "segment from BOS, print the BPB table (with per-directory breakdown) and write the report JSON. "
        "Runs must share one fingerprint (the same held-out bytes); a BPE run whose tokenizer changed is "
        "refused.",
    )
    p.add_argument(
        "run_dirs",
        nargs="*",
        metavar="RUN_DIR",
        help="run directories written by 'bytelm train' or 'bytelm compare'",
    )
    _add_data_option(p, default="the corpus the runs were trained on, which they must share")
    p.add_argument(
        "--json",
        default="report.json",
        metavar="PATH",
        help="where to write the report JSON (default: report.json)",
    )
    p.add_argument(
        "--external",
        action="append",
        default=[],
        metavar="NAME=SCORES.jsonl",
        help="add a model scored elsewhere: per-segment nats for the segments of 'bytelm data "
        "export-heldout' (format: bytelm/evaluation/external.py); checked against the segment ids and "
        "fingerprint (repeatable)",
    )
    _add_multihost_options(
        p,
        "Run the same command on every host: the runs are restored onto a mesh of every host's devices, "
        "each process scores its share of the segments, and process 0 writes the report (the same numbers "
        "as one process).",
    )
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    check_output_file(args.json, "--json")
    _join_processes(args)
    primary = distributed.is_primary()
    progress, close = _stage_bars() if primary else (None, lambda: None)
    try:
        report = evaluate_runs(
            args.run_dirs,
            data_spec=args.data,
            externals=args.external,
            json_path=args.json if primary else None,  # (process 0 writes the report)
            progress=progress,
        )
    finally:
        close()
    if primary:
        print(terminal_report(report))
        print(f"report: {args.json}")
    return 0


# -- run check ------------------------------------------------------------------------------------
def add_run_check(sub) -> None:
    p = sub.add_parser(
        "check",
        help="verify a run directory, repair what can be repaired (run.json), say what cannot",
        description="Check RUN_DIR's config.toml, run.json (a damaged one is rebuilt from the config, the "
        "newest checkpoint that restores and metrics.jsonl), every checkpoint (its files against the digests "
        "written with it, then its parameters restored) and metrics.jsonl (a train record every "
        "train.log_every steps: the records lost and from which step). One line per item: ok, repaired, "
        "damaged, lost records or unusable. Exit 0 when the run is usable (its config and some checkpoint), "
        "else 2.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by bytelm train or compare")
    p.add_argument("--json", metavar="PATH", help="also write the findings as JSON to PATH")
    p.set_defaults(func=cmd_run_check)


def cmd_run_check(args: argparse.Namespace) -> int:
    from bytelm.training.check import check_run, findings_json  # noqa: PLC0415

    if args.json:
        check_output_file(args.json, "--json")
    if not RunDir(args.run_dir).config_path.is_file() and not RunDir(args.run_dir).has_info():
        raise UserError(f"{args.run_dir} is not a run directory (no config.toml, no run.json)")
    findings = check_run(args.run_dir)
    for f in findings:
        print(f"{f.state:12s} {f.what}" + (f": {f.detail}" if f.detail else ""))
    if args.json:
        atomic_write_text(args.json, findings_json(findings) + "\n")
    return 2 if any(f.state == "unusable" for f in findings) else 0


# -- probe ----------------------------------------------------------------------------------------
def add_probe(sub) -> None:
    p = sub.add_parser(
        "probe",
        help="continuation-choice, noise-robustness and spelling probes of trained runs on held-out bytes",
        description="Build the probe set from the held-out segments (deterministic from --seed, written to "
        "OUT/probe_set.jsonl with its fingerprint) and score every RUN_DIR on it by conditional "
        "log-likelihood: continuation choice among four, the same with BLT's five noises on the context "
        "(accuracy, H-Net's robustness score, the continuation's BPB given the noised context and R), and "
        "spelling minimal pairs per edit kind and word band, each with a 95% interval from the bootstrap "
        "over documents. Writes OUT/probes.json, OUT/probes.md and OUT/probes.png; a run already probed "
        "on the same probe set at the same step is reused. See docs/evaluation.md, 'Probes'.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories of any family")
    _add_data_option(p, default="the corpus the runs were trained on, which they must share")
    p.add_argument("--out", default="probes", metavar="DIR", help="output directory (default: probes)")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="the probe set's seed (default 0; another seed, another probe set)",
    )
    p.add_argument(
        "--items",
        type=int,
        default=None,
        metavar="N",
        help="continuation items and spelling pairs, N of each at most (default 96)",
    )
    p.add_argument(
        "--export-lm-eval",
        metavar="DIR",
        help="instead of scoring the runs, write the held-out segments and the probe set as "
        "lm-evaluation-harness tasks into DIR (YAML + JSON Lines: bytelm_heldout, bytelm_choice and one per "
        "noise, bytelm_spelling, the group bytelm_probes), for any harness model; see docs/interop.md",
    )
    p.set_defaults(func=cmd_probe)


def cmd_probe(args: argparse.Namespace) -> int:
    from bytelm.evaluation.evaluator import eval_sets_for_runs  # noqa: PLC0415
    from bytelm.evaluation.plots import plot_probes  # noqa: PLC0415
    from bytelm.evaluation.probe_tables import probe_lines  # noqa: PLC0415
    from bytelm.evaluation.probes import probe_runs  # noqa: PLC0415

    if args.items is not None and args.items < 1:
        raise UserError(f"--items must be >= 1, got {args.items}")
    check_output_dir(args.out, "--out")
    names = [Path(r).name or str(r) for r in args.run_dirs]
    if len(set(names)) != len(names):
        raise UserError("two runs would share a name in one table: give run directories distinct names")
    eval_set, per_run = eval_sets_for_runs(args.run_dirs, data_spec=args.data)
    corpus = per_run[str(args.run_dirs[0])]
    if args.export_lm_eval:
        return _export_lm_eval(args, eval_set, corpus)
    out = Path(args.out)
    record = probe_runs(
        eval_set,
        corpus,
        dict(zip(names, args.run_dirs)),
        seed=args.seed,
        items=args.items,
        out=out,
        note=lambda line: print(line, file=sys.stderr),
    )
    record["data"] = eval_set.describe()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "probes.json", json.dumps(record, indent=1) + "\n")
    text = "\n".join(probe_lines(record))
    atomic_write_text(out / "probes.md", text + "\n")
    plot_probes(out / "probes.png", record, subtitle=f"probe set {record['fingerprint'][:16]}")
    print(text)
    print(f"wrote {out / 'probes.json'}, {out / 'probes.md'}, {out / 'probes.png'}")
    return 0


def _export_lm_eval(args: argparse.Namespace, eval_set, corpus) -> int:
    from bytelm.evaluation.probes import corpus_probe_set  # noqa: PLC0415
    from bytelm.interop.lm_eval import write_tasks  # noqa: PLC0415 (the harness, only when asked)

    check_output_dir(args.export_lm_eval, "--export-lm-eval")
    probe_set = corpus_probe_set(eval_set, corpus, seed=args.seed, items=args.items)
    summary = write_tasks(args.export_lm_eval, eval_set, probe_set)
    held = summary["heldout"]
    rows = [
        (
            "held-out",
            f"{held['segments']} segments, {held['bytes']} bytes ({held['left_out']} left out: not UTF-8)",
        )
    ]
    for name in summary["tasks"][1:]:
        rows.append(
            (name, f"{summary[name]['items']} items ({summary[name]['left_out']} left out: not UTF-8)")
        )
    _print_rows(rows)
    print(
        f"wrote {len(summary['tasks'])} tasks to {args.export_lm_eval}; run them with: bytelm-lm-eval "
        f"--model "
        f"bytelm --model_args run=RUN_DIR --tasks bytelm_heldout,bytelm_probes --include_path "
        f"{args.export_lm_eval}"
    )
    return 0


# -- compare --------------------------------------------------------------------------------------
def add_compare(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="the main job: train every family at a matched FLOP budget and compare them in BPB",
        description="Prepare the corpus, train the BPE tokenizer and BPE-token LM, the byte LM (with and "
        "without BLT's hashed n-gram tables), MegaByte, the entropy model and BLT with a preset's configs at "
        "a matched training-FLOP budget (each model's total: its own training plus what it needs, BLT's "
        "entropy model included), score all on the same held-out segments and write report.md, report.json "
        "and bpb.png. Re-running with the same --out skips finished stages and resumes an interrupted "
        "training.",
    )
    p.add_argument(
        "--preset",
        default="tiny",
        metavar="NAME|FILE",
        help="a preset in configs/compare/ (tiny, test) or a preset TOML file (default: tiny)",
    )
    _add_data_option(p)
    p.add_argument(
        "--out", default="runs/compare", metavar="DIR", help="output directory (default: runs/compare)"
    )
    p.add_argument(
        "--minutes",
        type=float,
        metavar="M",
        help="give every compared model M minutes of training time instead of the preset's FLOP budget "
        "(the entropy model keeps its FLOP budget); the report shows every model's FLOPs and time",
    )
    p.add_argument(
        "--seeds",
        type=int,
        metavar="N",
        help="train every compared model with N seeds (train.seed + 0 .. N-1; the learning rate is chosen "
        "once, with the first); the report gives each model's mean and spread and says whether each gap of "
        "the ranking exceeds the spread (default: the preset's, 1). Runs of an earlier compare into the same "
        "--out are reused",
    )
    _add_multihost_options(
        p,
        "Run the same command on every host, with an --out all of them see (a shared file system): process 0 "
        "prepares the corpus and trains the tokenizer, every run trains and is scored on all processes' "
        "devices, and process 0 writes the report (the numbers of one process).",
    )
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    check_output_dir(args.out, "--out")
    _join_processes(args)
    primary = distributed.is_primary()
    progress, note, close = _stage_reporter() if primary else (None, lambda msg: None, lambda: None)
    try:
        result = compare(
            args.preset,
            args.out,
            data_spec=args.data,
            progress=progress,
            note=note,
            time_budget_s=_budget_seconds(args.minutes),
            seeds=args.seeds,
        )
    finally:
        close()
    if primary:
        print(terminal_report(result.report))
        print(
            f"wall time {seconds(result.report['compare']['wall_s'])}, its stages summed over every "
            f"invocation on {args.out} (this one: {seconds(time.perf_counter() - started)}); wrote "
            f"{result.report_md}, "
            f"{result.report_json}, {result.plot} and scores.jsonl, pairs.png"
            + (", probes.png" if (result.report.get("probes") or {}).get("models") else "")
        )
    return 0


# -- scaling --------------------------------------------------------------------------------------
def add_scaling(sub) -> None:
    p = sub.add_parser(
        "scaling",
        help="fit scaling laws, compute-optimal patch sizes and vocabularies, and crossovers to ablations",
        description="Read one or more 'bytelm ablate' outputs (ablation.json and scores.jsonl, one "
        "evaluation set) and fit, per family (its best cell at each budget) and per cell series, "
        "L(C) = E + A C^-alpha against total training FLOPs; per budget the iso-FLOP optimum of the "
        "patch size or vocabulary and its law against compute; for every pair of families the compute "
        "where their laws meet. 95% intervals from the bootstrap over held-out documents and seeds. "
        "Writes OUT/scaling.json, OUT/scaling.md, OUT/scaling.png and OUT/isoflop.png. See "
        "docs/ablations.md, 'Scaling fits'.",
    )
    p.add_argument(
        "dirs", nargs="+", metavar="DIR", help="--out directories of finished 'bytelm ablate' grids"
    )
    p.add_argument("--out", default="scaling", metavar="DIR", help="output directory (default: scaling)")
    p.add_argument(
        "--resamples",
        type=int,
        default=400,
        metavar="R",
        help="bootstrap resamples for the intervals (default 400)",
    )
    p.add_argument("--seed", type=int, default=0, metavar="S", help="the bootstrap's seed (default 0)")
    p.set_defaults(func=cmd_scaling)


def cmd_scaling(args: argparse.Namespace) -> int:
    from bytelm.experiments.scaling import scaling, scaling_lines  # noqa: PLC0415 (scipy, on use)

    check_output_dir(args.out, "--out")
    result = scaling(args.dirs, args.out, resamples=args.resamples, seed=args.seed)
    print("\n".join(scaling_lines(result)[:-4]))
    print(f"wrote {Path(args.out) / 'scaling.json'}, scaling.md, scaling.png and isoflop.png")
    return 0


# -- ablate ---------------------------------------------------------------------------------------
def add_ablate(sub) -> None:
    p = sub.add_parser(
        "ablate",
        help="patch size vs subword vocabulary: a grid of runs at several FLOP budgets, with tuned learning "
        "rates",
        description="Run the grid of configs/ablations/NAME.toml (or a grid file): MegaByte patch sizes, BLT "
        "patch lengths and space patching, BPE vocabularies and patterns, the byte LM, each at every budget, "
        "sized by the grid's size rule, all scored on the same held-out bytes. Each family's learning rate "
        "is chosen by a sweep at the smallest budget on a validation split carved from the training "
        "documents. A finished run is skipped, an interrupted one resumes, a failing one is reported and the "
        "others go on. Writes ablation.json, ablation.md, bpb_vs_bytes_per_step.png, bpb_vs_flops.png (and "
        "bpb_per_group.png when the data has groups). See docs/ablations.md.",
    )
    p.add_argument(
        "grid",
        nargs="?",
        default="tiny",
        metavar="GRID",
        help="a grid in configs/ablations/ (micro, tiny, small, base) or a grid TOML file (default: tiny)",
    )
    _add_data_option(p)
    p.add_argument("--out", default=None, metavar="DIR", help="output directory (default: runs/ablate-GRID)")
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        metavar="S",
        help="multiply every budget (and the entropy model's) by S (default: 1)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="train N runs at once, each in its own 'bytelm train' process (default: 1, in this process)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        metavar="K",
        help="train each family's best cell (smallest budget) with K seeds, train.seed + 0 .. K-1 "
        "(initialisation and data order); its intervals then fold seed variance in (default: the grid's "
        "extra_seeds + 1)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--print-commands",
        action="store_true",
        help="train nothing: print one command per run of the first unfinished stage (artefacts, sweep, "
        "grid, seeds) for a scheduler, then run this again for the next stage",
    )
    mode.add_argument(
        "--collect", action="store_true", help="train nothing: build the report from the runs on disk"
    )
    _add_multihost_options(
        p,
        "Run the same command on every host, with an --out all of them see (a shared file system; --jobs 1): "
        "every run trains and is scored on all processes' devices, and process 0 writes the outputs.",
    )
    p.set_defaults(func=cmd_ablate)


def cmd_ablate(args: argparse.Namespace) -> int:
    out = args.out or f"runs/ablate-{Path(args.grid).stem}"
    check_output_dir(out, "--out")
    _join_processes(args)
    primary = distributed.is_primary()
    progress, note, close = _stage_reporter() if primary else (None, lambda msg: None, lambda: None)
    try:
        result = ablate(
            args.grid,
            out,
            data_spec=args.data,
            scale=args.scale,
            jobs=args.jobs,
            print_commands=args.print_commands,
            collect=args.collect,
            progress=progress,
            note=note,
            seeds=args.seeds,
        )
    finally:
        close()
    if not primary:
        return 0
    if args.print_commands:
        for command in result.commands:
            print(command)
        left = (
            "the grid is complete"
            if result.stage == "done"
            else f"stage {result.stage}: {len(result.commands)} command(s)"
        )
        print(
            f"# {left}; run them, then 'bytelm ablate ... --print-commands' again for the next stage, "
            "or '--collect' for the report",
            file=sys.stderr,
        )
        return 0
    for sentence in result.report["sentences"]:
        print(sentence)
    state = "complete" if result.stage == "done" else f"incomplete (stage {result.stage})"
    print(f"grid {state}; wrote {result.out / 'ablation.md'}, {result.out / 'ablation.json'} and the plots")
    if result.scaling is not None:
        for c in result.scaling["crossovers"]:
            print(c["statement"])
        fits = result.out / "scaling"
        print(f"scaling fits: {fits / 'scaling.md'} (and scaling.json, scaling.png, isoflop.png)")
    return 0


# -- sample ---------------------------------------------------------------------------------------
def add_sample(sub) -> None:
    p = sub.add_parser(
        "sample",
        help="generate bytes from a trained run of any family, with caches, streaming to the terminal",
        description="Restore RUN_DIR's latest checkpoint and continue the prompt, printing the generated "
        "bytes as they come (incomplete UTF-8 held back until it completes, a character the prompt leaves "
        "open completed by the first generated bytes, invalid bytes shown as U+FFFD). Every family "
        "decodes with key/value caches: MegaByte runs its global model once per patch, BLT patches online "
        "with its entropy model and runs its global model once per closed patch. Stops at EOS or after "
        "--max-bytes bytes.",
    )
    p.add_argument(
        "run_dir", metavar="RUN_DIR", help="a run directory written by 'bytelm train' or 'bytelm compare'"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--prompt",
        default="",
        metavar="TEXT",
        help="the prompt, as the bytes of the argument (default: empty, i.e. start from BOS)",
    )
    src.add_argument(
        "--prompt-file", metavar="PATH", help="read the prompt's bytes from PATH ('-': standard input)"
    )
    p.add_argument(
        "--max-bytes",
        type=int,
        default=256,
        metavar="N",
        help="stop after N generated bytes (default: 256; a token that overshoots is cut)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        metavar="T",
        help="divide the logits by T before sampling (default: 1.0)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=0,
        metavar="K",
        help="sample among the K most likely ids only (default: 0, no limit)",
    )
    p.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        metavar="P",
        help="sample among the smallest set of ids whose probability reaches P (default: 1.0, all)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="random seed; the same seed gives the same sample (default: 0)",
    )
    p.add_argument(
        "--greedy",
        action="store_true",
        help="always take the most likely id (ignores temperature, top-k, top-p)",
    )
    p.add_argument(
        "--step",
        type=int,
        default=None,
        metavar="N",
        help="use the checkpoint of step N (default: the latest)",
    )
    p.add_argument("--echo", action="store_true", help="print the prompt before the generated text")
    p.add_argument(
        "--stats",
        action="store_true",
        help="print one JSON line on stderr at the end: bytes, seconds, bytes/s, global-model calls",
    )
    _add_multihost_options(
        p,
        "Run the same command on every host (a run trained on a pod, sampled where it lies): the model is "
        "restored onto a mesh of every host's devices, every process decodes the same bytes, and process 0 "
        "prints them.",
    )
    p.set_defaults(func=cmd_sample)


def _prompt_bytes(args: argparse.Namespace) -> bytes:
    if args.prompt_file is None:
        return os.fsencode(args.prompt)  # the argument's own bytes, whatever they are
    if args.prompt_file == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(args.prompt_file).read_bytes()
    except OSError as e:
        raise UserError(f"cannot read the prompt file {args.prompt_file}: {e.strerror}") from None


def cmd_sample(args: argparse.Namespace) -> int:
    options = SamplingOptions(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, greedy=args.greedy, seed=args.seed
    )
    prompt = _prompt_bytes(args)
    _join_processes(args)
    decoder = load_decoder(args.run_dir, step=args.step)
    note = RunDir(args.run_dir).progress_note(decoder.checkpoint_step)
    if note and distributed.is_primary():
        print(f"bytelm: note: {args.run_dir} is at {note}: a partial run", file=sys.stderr)
    out = sys.stdout.buffer if distributed.is_primary() else io.BytesIO()  # (process 0 prints)
    started, produced = time.perf_counter(), 0

    def generated():
        nonlocal produced
        for data in stream(decoder, prompt, max_bytes=args.max_bytes, options=options):
            produced += len(data)
            yield data

    if args.echo:
        pieces = text_pieces(itertools.chain([prompt], generated()))
    else:
        pieces = text_pieces(generated(), after=prompt)
    for piece in pieces:
        out.write(piece.encode("utf-8"))
        out.flush()
    out.write(b"\n")
    out.flush()
    if args.stats and distributed.is_primary():
        wall = time.perf_counter() - started
        record = {
            "family": decoder.family,
            "prompt_bytes": len(prompt),
            "generated_bytes": produced,
            "seconds": round(wall, 4),
            "bytes_per_s": round(produced / wall, 2) if wall > 0 else None,
            **decoder.stats(),
        }
        print(json.dumps(record), file=sys.stderr)
    return 0


# -- convert / export -----------------------------------------------------------------------------
def add_convert(sub) -> None:
    p = sub.add_parser(
        "convert",
        help="read checkpoints in other formats into bytelm run directories",
        description="Read a checkpoint written by another library into bytelm run directories that "
        "'bytelm eval', 'bytelm patch' and 'bytelm sample' take like trained runs.",
    )
    conv = p.add_subparsers(
        dest="convert_command", metavar="FORMAT", required=True, help="the format to read"
    )
    q = conv.add_parser(
        "hf-blt",
        help="a Hugging Face BLT folder (BltForCausalLM with its entropy patcher, e.g. Meta's BLT-1B)",
        description="Convert a Hugging Face BLT folder (config.json + safetensors, as save_pretrained writes "
        "it) into a BLT run in the reference variant (RUN_DIR) and its entropy model's run (RUN_DIR/entropy "
        "unless --entropy-out). Every tensor's name and shape is checked against config.json before anything "
        "is written. The architecture notes are docs/interop.md.",
    )
    q.add_argument(
        "hf_dir", metavar="HF_DIR", help="the folder holding config.json and model.safetensors (or its index)"
    )
    q.add_argument(
        "--out", required=True, metavar="RUN_DIR", help="the BLT run directory to write (must not hold a run)"
    )
    q.add_argument(
        "--entropy-out", metavar="DIR", help="the entropy model's run directory (default: RUN_DIR/entropy)"
    )
    q.add_argument(
        "--seq-len",
        type=int,
        default=1024,
        metavar="N",
        help="the context the runs score with (train.seq_len; held-out segments of at most N bytes) "
        "(default: 1024)",
    )
    q.add_argument(
        "--max-patch-len",
        type=int,
        metavar="N",
        help="split patches longer than N bytes (default: the reference's max_patch_length, else 64; the "
        "reference then keeps longer patches whole, so a window holding one scores differently unless N "
        "covers it; memory grows with N)",
    )
    q.add_argument(
        "--max-patches",
        type=int,
        metavar="N",
        help="patch slots per window (default: seq-len + 1, so no window ever runs out; fewer is faster)",
    )
    _add_config_options(q, with_config=False)
    q.set_defaults(func=cmd_convert_hf_blt)


def cmd_convert_hf_blt(args: argparse.Namespace) -> int:
    for name in ("seq_len", "max_patch_len", "max_patches"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    check_output_dir(args.out, "--out")
    if args.entropy_out:
        check_output_dir(args.entropy_out, "--entropy-out")
    progress, close = _stage_bars()
    try:
        blt, artefacts = convert_hf(
            args.hf_dir,
            args.out,
            artefacts_out={"entropy_run": args.entropy_out} if args.entropy_out else None,
            model_type="blt",
            seq_len=args.seq_len,
            max_patch_len=args.max_patch_len,
            max_patches=args.max_patches,
            overrides=tuple(args.overrides),
            progress=progress,
        )
    finally:
        close()
    print(f"BLT run: {blt}\nentropy model run: {artefacts['entropy_run']}")
    return 0


def add_export(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write bytelm runs in other formats",
        description="Write a bytelm run's latest checkpoint in another library's format.",
    )
    exp = p.add_subparsers(dest="export_command", metavar="FORMAT", required=True, help="the format to write")
    q = exp.add_parser(
        "hf",
        help="a Hugging Face folder: BLT (reference variant) as BltForCausalLM, a byte LM as "
        "LlamaForCausalLM",
        description="Write RUN_DIR as a Hugging Face folder (config.json + model.safetensors) that "
        "transformers loads with from_pretrained: a BLT run in the reference variant as BltForCausalLM (its "
        "entropy model as the patcher), a byte LM without a sliding window as LlamaForCausalLM. What the "
        "format cannot hold is refused, naming it.",
    )
    q.add_argument("run_dir", metavar="RUN_DIR", help="a run directory")
    q.add_argument(
        "--out", required=True, metavar="HF_DIR", help="the folder to write (must not hold a config.json)"
    )
    q.set_defaults(func=cmd_export_hf)


def cmd_export_hf(args: argparse.Namespace) -> int:
    check_output_dir(args.out, "--out")
    progress, close = _stage_bars()
    try:
        arch = export_hf(args.run_dir, args.out, progress=progress)
    finally:
        close()
    print(f"{arch}: {args.out}")
    return 0


# -- the parser -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bytelm",
        description="Tokenizer-free language modelling in JAX: byte LMs, MegaByte, BLT and a BPE "
        "baseline, all scored in bits per byte on the identical held-out bytes.",
    )
    parser.add_argument("--version", action="version", version=f"bytelm {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, help="what to do")
    data = sub.add_parser(
        "data", help="inspect and export corpora", description="Inspect and export corpora."
    )
    data_sub = data.add_subparsers(
        dest="data_command", metavar="SUBCOMMAND", required=True, help="data command"
    )
    add_data_info(data_sub)
    add_data_prepare(data_sub)
    add_data_export_heldout(data_sub)
    run = sub.add_parser("run", help="run directories: check (and repair) one")
    run_sub = run.add_subparsers(dest="run_command", metavar="SUBCOMMAND", required=True, help="run command")
    add_run_check(run_sub)
    add_train(sub)
    add_compile(sub)
    add_patch(sub)
    add_chunks(sub)
    tok = sub.add_parser(
        "tokenizer",
        help="train, import and use the subword baseline tokenizers (BPE, Unigram or WordPiece)",
        description="Train, import, apply and measure the BPE, Unigram and WordPiece tokenizers of the "
        "subword baseline.",
    )
    tok_sub = tok.add_subparsers(
        dest="tokenizer_command", metavar="SUBCOMMAND", required=True, help="tokenizer command"
    )
    for add in (
        add_tokenizer_train,
        add_tokenizer_import,
        add_tokenizer_encode,
        add_tokenizer_decode,
        add_tokenizer_stats,
    ):
        add(tok_sub)
    add_eval(sub)
    add_probe(sub)
    add_compare(sub)
    add_ablate(sub)
    add_scaling(sub)
    add_sample(sub)
    add_convert(sub)
    add_export(sub)
    for p in [parser, *_subparsers(parser)]:  # -v and -q anywhere on the command line
        top = p is parser
        p.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=False if top else argparse.SUPPRESS,
            help="log debug messages too (on stderr; before or after the command)",
        )
        p.add_argument(
            "-q",
            "--quiet",
            action="store_true",
            default=False if top else argparse.SUPPRESS,
            help="log warnings and errors only, and draw no progress bars",
        )
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every command's and subcommand's parser below ``parser`` (each once)."""
    out: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                if child not in out:
                    out += [child, *[c for c in _subparsers(child) if c not in out]]
    return out


def _version() -> str:
    try:
        return importlib.metadata.version("bytelm")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


class _StderrHandler(logging.StreamHandler):
    """Log records to ``sys.stderr`` as it is when each record comes, not as it was when logging
    was set up (a caller that swaps the stream, as a test's capture does, and closes it later)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _configure_logging(verbose: bool, quiet: bool) -> None:
    """bytelm's log format and level on stderr. absl (imported by orbax) configures the root logger
    at import (``logging.basicConfig()``: a plain stream handler, ``LEVEL:name:message``), which
    would keep bytelm's own set-up from taking effect: plain stream handlers on the root (absl's, or
    an earlier call's) are replaced; others (a test runner's capture) stay."""
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    root = logging.getLogger()
    for handler in list(root.handlers):
        if type(handler) in (logging.StreamHandler, _StderrHandler):
            root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("absl", "jax", "orbax"):
        logging.getLogger(noisy).setLevel(logging.NOTSET if verbose else logging.WARNING)
    ProgressBar.quiet = quiet


def _enable_compilation_cache() -> None:
    """Reuse compiled XLA programs across runs (resumes, evals, compare stages) unless the user
    configured JAX's cache themselves."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ or getattr(jax.config, "jax_compilation_cache_dir", None):
        return
    jax.config.update("jax_compilation_cache_dir", str(default_cache_dir() / "jax"))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose and args.quiet:
        parser.error("-v/--verbose and -q/--quiet cannot be given together")
    _configure_logging(args.verbose, args.quiet)
    _enable_compilation_cache()
    keep_jax_off_absent_tpu()  # (libtpu installed, no TPU here: the CPU, without libtpu's complaints)
    configure_cpu_devices()  # before the first computation starts JAX's CPU backend
    func: Callable[[argparse.Namespace], int] = args.func
    long_command = func.__name__.removeprefix("cmd_").removeprefix("data_") in LONG_COMMANDS
    previous = signal.signal(signal.SIGTERM, _terminate) if long_command else None
    try:
        return func(args)
    except UserError as e:
        print(f"bytelm: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except StageStopped as e:  # a compare or ablate training stopped by a signal: checkpoint saved
        print(f"bytelm: {e}", file=sys.stderr)
        return EXIT_TERMINATED if e.signum == signal.SIGTERM else EXIT_SIGNAL
    except Terminated:
        print(
            "bytelm: stopped by SIGTERM (what was finished is kept); run the same command again to resume",
            file=sys.stderr,
        )
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print("bytelm: interrupted", file=sys.stderr)
        return EXIT_SIGNAL
    except BrokenPipeError:  # the reader went away (`bytelm sample RUN | head -c1`): a normal end
        _silence_stdout()
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of what the closed pipe did
    not take raises nothing more."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # (a test's captured stream)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
