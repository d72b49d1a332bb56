"""Options several commands share, and what they resolve to (a config, a corpus, a job's processes)."""

from __future__ import annotations

import argparse

from bytelm import console
from bytelm.config import Config, load_config
from bytelm.data import load_corpus_from_config
from bytelm.errors import UserError
from bytelm.training import distributed


def add_config_options(p: argparse.ArgumentParser, *, with_config: bool = True) -> None:
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


def add_data_option(
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


def add_tokenizer_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokenizer",
        required=True,
        metavar="DIR",
        help="tokenizer directory written by 'bytelm tokenizer train' or 'bytelm tokenizer import' (holds "
        "bytelm_bpe.json, bytelm_unigram.json or bytelm_wordpiece.json)",
    )


def add_workers_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, metavar="N", help="worker processes (default: all available CPUs)")


def add_multihost_options(p: argparse.ArgumentParser, description: str) -> None:
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


def resolve_config(args: argparse.Namespace) -> Config:
    """The config of ``--config`` with ``--set`` overrides and ``--data``."""
    overrides = list(args.overrides)
    if getattr(args, "data", None):
        overrides.append(f"data.source={args.data}")
    return load_config(getattr(args, "config", None), overrides)


def load_corpus(data_cfg):
    """The corpus of a ``[data]`` config, with a progress bar while it is read."""
    with console.progress_bar(f"reading {data_cfg.source}", unit=" docs") as bar:
        return load_corpus_from_config(data_cfg, progress=bar.update)


def join_processes(args: argparse.Namespace) -> bool:
    """Join the job's processes (a no-op without the multi-host options) and quiet the others' logs;
    whether this is the job's first process, the one that prints."""
    distributed.initialize(
        auto=args.distributed,
        coordinator=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
    )
    distributed.configure_process_logging()
    return distributed.is_primary()


def budget_seconds(minutes: float | None) -> float | None:
    """``--minutes`` in seconds (None: not given)."""
    if minutes is None:
        return None
    if not minutes > 0:
        raise UserError(f"--minutes must be > 0, got {minutes}")
    return 60.0 * minutes
