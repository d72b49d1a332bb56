"""``bytelm compare``, ``bytelm ablate`` and ``bytelm scaling``: jobs of many runs, and fits over them."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bytelm import console
from bytelm.cli.options import add_data_option, add_multihost_options, budget_seconds, join_processes
from bytelm.evaluation.report import seconds, terminal_report
from bytelm.experiments.ablate import ablate
from bytelm.experiments.compare import compare
from bytelm.paths import check_output_dir


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
    add_data_option(p)
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
    add_multihost_options(
        p,
        "Run the same command on every host, with an --out all of them see (a shared file system): process 0 "
        "prepares the corpus and trains the tokenizer, every run trains and is scored on all processes' "
        "devices, and process 0 writes the report (the numbers of one process).",
    )
    console.command(p, cmd_compare, long=True)


def cmd_compare(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    check_output_dir(args.out, "--out")
    primary = join_processes(args)
    with console.stages(primary) as (progress, note):
        result = compare(
            args.preset,
            args.out,
            data_spec=args.data,
            progress=progress,
            note=note,
            time_budget_s=budget_seconds(args.minutes),
            seeds=args.seeds,
        )
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
    console.command(p, cmd_scaling)


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
    add_data_option(p)
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
    add_multihost_options(
        p,
        "Run the same command on every host, with an --out all of them see (a shared file system; --jobs 1): "
        "every run trains and is scored on all processes' devices, and process 0 writes the outputs.",
    )
    console.command(p, cmd_ablate, long=True)


def cmd_ablate(args: argparse.Namespace) -> int:
    out = args.out or f"runs/ablate-{Path(args.grid).stem}"
    check_output_dir(out, "--out")
    primary = join_processes(args)
    with console.stages(primary) as (progress, note):
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
        console.note(
            f"# {left}; run them, then 'bytelm ablate ... --print-commands' again for the next stage, "
            "or '--collect' for the report"
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
