"""The ``bytelm`` command: argument parsing and console output only.

Every command calls an importable library function; bad input raises
:class:`~bytelm.errors.UserError`, printed here as one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from bytelm.errors import UserError

EXIT_USER_ERROR = 2


def _add_config_options(p: argparse.ArgumentParser, *, with_config: bool = True) -> None:
    if with_config:
        p.add_argument(
            "--config",
            metavar="FILE",
            help="TOML config file (its [data] section applies; see configs/)",
        )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set data.heldout_fraction=0.1 (repeatable)",
    )


def _add_data_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        metavar="SPEC",
        help="corpus spec: 'stdlib' (default: the running Python's standard library), "
        "'files:PATH[?split=paragraph|line]' (a file, directory or glob), or "
        "'tfds:NAME[/CONFIG][:SPLIT][?field=text&data_dir=DIR]' (needs the tfds extra)",
    )


def _resolve_config(args: argparse.Namespace):
    from bytelm.config import load_config  # noqa: PLC0415

    overrides = list(args.overrides)
    if getattr(args, "data", None):
        overrides.append(f"data.source={args.data}")
    return load_config(getattr(args, "config", None), overrides)


def _load_corpus(data_cfg):
    from bytelm.data import load_corpus  # noqa: PLC0415
    from bytelm.progress import ProgressBar  # noqa: PLC0415

    bar = ProgressBar(f"reading {data_cfg.source}", unit=" docs")
    try:
        return load_corpus(
            data_cfg.source,
            split_seed=data_cfg.split_seed,
            heldout_fraction=data_cfg.heldout_fraction,
            segment_bytes=data_cfg.segment_bytes,
            max_eval_bytes=data_cfg.max_eval_bytes,
            cache_dir=data_cfg.cache_dir or None,
            progress=bar.update,
        )
    finally:
        bar.close()


# -- data ---------------------------------------------------------------------------------
def cmd_data_info(args: argparse.Namespace) -> int:
    cfg = _resolve_config(args)
    corpus = _load_corpus(cfg.data)
    s = corpus.summary()
    rows = [
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
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


# -- train --------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path  # noqa: PLC0415

    from bytelm.config import load_config  # noqa: PLC0415
    from bytelm.progress import ProgressBar  # noqa: PLC0415
    from bytelm.training.trainer import TrainingDiverged, train  # noqa: PLC0415

    cfg = load_config(args.config, args.overrides)
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    bar = ProgressBar(f"train {out}", unit=" steps")
    try:
        result = train(cfg, out, progress=lambda done, total, suffix: bar.update(done, total, suffix))
    except TrainingDiverged as e:
        bar.close()
        print(f"bytelm: training stopped: {e}", file=sys.stderr)
        return 1
    bar.close()
    bpb = f", held-out BPB {result.eval_bpb:.4f}" if result.eval_bpb is not None else ""
    state = "stopped by signal" if result.stopped_by_signal else "done"
    print(f"{state}: {out} at step {result.step}, train loss {result.loss:.4f}{bpb}")
    return 0


# -- parser -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bytelm",
        description="Tokenizer-free language modelling in JAX: byte LMs, MegaByte, BLT and a BPE "
        "baseline, all scored in bits per byte on the identical held-out bytes.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, help="what to do")

    data = sub.add_parser("data", help="inspect and export corpora", description="Inspect and export corpora.")
    data_sub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True, help="data command")
    info = data_sub.add_parser(
        "info",
        help="print documents, bytes, split sizes, evaluation segments and the fingerprint",
        description="Prepare (or reuse from the cache) a corpus and print its summary: documents, "
        "bytes, train/held-out sizes, the number of evaluation segments and the 64-hex fingerprint "
        "of the scored held-out bytes.",
    )
    _add_data_option(info)
    _add_config_options(info)
    info.set_defaults(func=cmd_data_info)

    tr = sub.add_parser(
        "train",
        help="train (or resume) a model from a config file",
        description="Train any model family from a TOML config. Re-running with the same --out resumes "
        "from the latest checkpoint (the config must match). SIGTERM/SIGINT save a checkpoint and stop.",
    )
    tr.add_argument("config", help="TOML config file, e.g. configs/tiny/byte.toml")
    tr.add_argument("--out", metavar="RUN_DIR", help="run directory (default: runs/<config name>)")
    _add_config_options(tr, with_config=False)
    tr.set_defaults(func=cmd_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:
        for noisy in ("absl", "jax", "orbax"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except UserError as e:
        print(f"bytelm: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("bytelm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
