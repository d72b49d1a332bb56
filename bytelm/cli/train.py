"""``bytelm train`` (train or resume a run) and ``bytelm run check`` (verify and repair a run)."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from bytelm import console
from bytelm.atomic import atomic_write_text
from bytelm.cli.options import add_config_options, add_multihost_options, budget_seconds, join_processes
from bytelm.config import load_config
from bytelm.errors import UserError
from bytelm.paths import check_output_file
from bytelm.rundir import RunDir, run_path
from bytelm.training.loop import train
from bytelm.training.trainer import TrainingDiverged


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
    add_multihost_options(
        p,
        "Run the same command on every host: each process trains on its slice of every batch, the mesh spans "
        "all hosts' devices, process 0 alone writes the run's records, checkpoints are written together. "
        "--out must be a place every host sees: a shared file system, or a bucket (gs://BUCKET/RUN).",
    )
    add_config_options(p, with_config=False)
    console.command(p, cmd_train, long=True)


def cmd_train(args: argparse.Namespace) -> int:
    budget = budget_seconds(args.minutes)
    extra = [f"train.time_budget_s={budget}"] if budget else []
    if args.profile_steps:
        extra.append(f"train.profile_steps={args.profile_steps}")
    cfg = load_config(args.config, [*args.overrides, *extra])
    out = run_path(args.out) if args.out else Path("runs") / Path(args.config).stem
    primary = join_processes(args)
    try:
        with console.progress_bar(f"train {out}", unit=" steps") as bar:
            result = train(cfg, out, progress=bar.update if primary else None, allow_cpu=args.allow_cpu)
    except TrainingDiverged as e:
        console.warn(f"training stopped: {e}")
        return 1
    held_out = f", held-out BPB {result.eval_bpb:.4f}" if result.eval_bpb is not None else ""
    state = "stopped by signal" if result.stopped_by_signal else "done"
    spent = (
        f" ({result.train_s:.0f}s of training)"
        if cfg.train.time_budget_s and result.train_s is not None
        else ""
    )
    if primary:  # (one summary per job)
        print(f"{state}: {out} at step {result.step}{spent}, train loss {result.loss:.4f}{held_out}")
    # a user's Ctrl-C exits as an interrupted command; a scheduler's SIGTERM (a preemption notice, to
    # this process or another of the job) ends in a checkpoint, a clean stop: 0, as schedulers expect
    if result.stopped_by_signal and result.signum == signal.SIGINT:
        return console.EXIT_SIGNAL
    return 0


# -- run check ------------------------------------------------------------------------------------
def add_run(sub) -> None:
    run = sub.add_parser("run", help="run directories: check (and repair) one")
    run_sub = run.add_subparsers(dest="run_command", metavar="SUBCOMMAND", required=True, help="run command")
    add_run_check(run_sub)


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
    console.command(p, cmd_run_check)


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
