"""``bytelm data``: inspect, prepare and export corpora."""

from __future__ import annotations

import argparse
import os
import time

from bytelm import console
from bytelm.cli.options import add_config_options, add_data_option, load_corpus, resolve_config
from bytelm.data import load_corpus_from_config
from bytelm.errors import UserError
from bytelm.evaluation.external import export_heldout
from bytelm.evaluation.results import EvalSet
from bytelm.paths import check_output_dir, check_output_file


def add_data(sub) -> None:
    data = sub.add_parser(
        "data", help="inspect and export corpora", description="Inspect and export corpora."
    )
    data_sub = data.add_subparsers(
        dest="data_command", metavar="SUBCOMMAND", required=True, help="data command"
    )
    add_data_info(data_sub)
    add_data_prepare(data_sub)
    add_data_export_heldout(data_sub)


# -- data info --------------------------------------------------------------------------------
def add_data_info(sub) -> None:
    p = sub.add_parser(
        "info",
        help="print documents, bytes, split sizes, evaluation segments and the fingerprint",
        description="Prepare (or reuse from the cache) a corpus and print its summary: documents, "
        "bytes, train/held-out sizes, the number of evaluation segments and the 64-hex fingerprint "
        "of the scored held-out bytes.",
    )
    add_data_option(p)
    add_config_options(p)
    console.command(p, cmd_data_info)


def cmd_data_info(args: argparse.Namespace) -> int:
    s = load_corpus(resolve_config(args).data).summary()
    console.print_rows(
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
    add_data_option(p)
    add_config_options(p)
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
    console.command(p, cmd_data_prepare, long=True)


def cmd_data_prepare(args: argparse.Namespace) -> int:
    if args.out:
        check_output_dir(args.out, "--out")
        args.overrides = [*args.overrides, f"data.cache_dir={args.out}"]
    workers = args.workers if args.workers is not None else len(os.sched_getaffinity(0))
    if workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
    cfg = resolve_config(args).data
    t0 = time.perf_counter()
    with console.progress_bar(f"prepare {cfg.source}", unit=" docs") as bar:
        corpus = load_corpus_from_config(
            cfg, progress=lambda done, total: bar.update(done, total or None), workers=workers
        )
    seconds = time.perf_counter() - t0
    s = corpus.summary()
    rate = s["bytes"] / 1e6 / max(seconds, 1e-9)
    console.print_rows(
        [
            ("source", s["source"]),
            ("documents", f"{s['documents']:,} ({s['bytes']:,} bytes, {len(corpus.shards)} shard(s))"),
            ("held-out", f"{s['heldout_documents']:,} documents, fingerprint {s['fingerprint']}"),
            ("time", f"{seconds:.1f} s with {workers} worker(s) ({rate:,.1f} MB of documents/s)"),
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
    add_data_option(p)
    add_config_options(p)
    p.add_argument("--out", required=True, metavar="FILE.jsonl", help="the JSON Lines file to write")
    console.command(p, cmd_data_export_heldout)


def cmd_data_export_heldout(args: argparse.Namespace) -> int:
    check_output_file(args.out, "--out")
    header = export_heldout(EvalSet.from_corpus(load_corpus(resolve_config(args).data)), args.out)
    print(
        f"wrote {args.out}: {header['segments']:,} segments, {header['bytes']:,} bytes, fingerprint "
        f"{header['fingerprint']}"
    )
    return 0
