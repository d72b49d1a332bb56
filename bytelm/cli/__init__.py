"""The ``bytelm`` command: argument parsing and console output only.

One module per group of commands; in each, every command is a pair: ``add_<command>(subparsers)``
declares its arguments and ``cmd_<command>(args)`` calls an importable library function and prints
the result. How a command runs (bad input as one line on stderr with exit status 2, signals,
progress bars, summaries) is :mod:`bytelm.console`'s, written once. A model family may add
commands of its own (:meth:`bytelm.families.Task.add_commands`: ``bytelm patch`` is BLT's,
``bytelm chunks`` H-Net's). The ``bytelm`` executable enters through :func:`bytelm.__main__.entry`.
"""

from __future__ import annotations

import argparse
import importlib.metadata

from bytelm import console, families
from bytelm.cli.compile import add_compile
from bytelm.cli.data import add_data
from bytelm.cli.evaluate import add_eval, add_probe
from bytelm.cli.experiments import add_ablate, add_compare, add_scaling
from bytelm.cli.interop import add_convert, add_export
from bytelm.cli.sample import add_sample
from bytelm.cli.tokenizer import add_tokenizer
from bytelm.cli.train import add_run, add_train
from bytelm.config import load_run_config
from bytelm.training.host import configure_cpu_devices, enable_compilation_cache, keep_jax_off_absent_tpu
from bytelm.training.restore import ensure_run_record, restore_model

__all__ = ["build_parser", "main"]

# what a command gets as ``args.runs`` to open run directories with (bytelm.console.RunTools)
RUNS = console.RunTools(ensure_record=ensure_run_record, model=restore_model, config=load_run_config)


def add_family_commands(sub) -> None:
    """The commands of every registered family (:meth:`bytelm.families.Task.add_commands`), in the
    order of the families' names; a family that inherits another's commands adds them once."""
    added: set[type] = set()
    for name in families.names():
        task = families.task_class(name)
        owner = next(c for c in task.__mro__ if "add_commands" in vars(c))  # (the class defining them)
        if owner not in added:
            added.add(owner)
            task.add_commands(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bytelm",
        description="Tokenizer-free language modelling in JAX: byte LMs, MegaByte, BLT and a BPE "
        "baseline, all scored in bits per byte on the identical held-out bytes.",
    )
    parser.add_argument("--version", action="version", version=f"bytelm {_version()}")
    parser.set_defaults(runs=RUNS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, help="what to do")
    for add in (
        add_data,
        add_run,
        add_train,
        add_compile,
        add_family_commands,
        add_tokenizer,
        add_eval,
        add_probe,
        add_compare,
        add_ablate,
        add_scaling,
        add_sample,
        add_convert,
        add_export,
    ):
        add(sub)
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose and args.quiet:
        parser.error("-v/--verbose and -q/--quiet cannot be given together")
    console.configure_logging(args.verbose, args.quiet)
    enable_compilation_cache()
    keep_jax_off_absent_tpu()  # (libtpu installed, no TPU here: the CPU, without libtpu's complaints)
    configure_cpu_devices()  # before the first computation starts JAX's CPU backend
    return console.run(args)
