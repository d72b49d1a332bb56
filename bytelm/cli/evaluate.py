"""``bytelm eval`` (score runs on the identical held-out bytes) and ``bytelm probe`` (probe them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bytelm import console
from bytelm.cli.options import add_data_option, add_multihost_options, join_processes
from bytelm.errors import UserError
from bytelm.evaluation.evaluator import evaluate_runs
from bytelm.evaluation.report import terminal_report
from bytelm.paths import check_output_dir, check_output_file


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
    add_data_option(p, default="the corpus the runs were trained on, which they must share")
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
    add_multihost_options(
        p,
        "Run the same command on every host: the runs are restored onto a mesh of every host's devices, "
        "each process scores its share of the segments, and process 0 writes the report (the same numbers "
        "as one process).",
    )
    console.command(p, cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    check_output_file(args.json, "--json")
    primary = join_processes(args)
    with console.stages(primary) as (progress, _):
        report = evaluate_runs(
            args.run_dirs,
            data_spec=args.data,
            externals=args.external,
            json_path=args.json if primary else None,  # (process 0 writes the report)
            progress=progress,
        )
    if primary:
        print(terminal_report(report))
        print(f"report: {args.json}")
    return 0


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
    add_data_option(p, default="the corpus the runs were trained on, which they must share")
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
    console.command(p, cmd_probe)


def cmd_probe(args: argparse.Namespace) -> int:
    from bytelm.evaluation.probing import probe_and_report, probe_inputs  # noqa: PLC0415

    if args.items is not None and args.items < 1:
        raise UserError(f"--items must be >= 1, got {args.items}")
    check_output_dir(args.out, "--out")
    inputs = probe_inputs(args.run_dirs, data_spec=args.data)
    if args.export_lm_eval:
        return _export_lm_eval(args, inputs)
    _, text = probe_and_report(inputs, args.out, seed=args.seed, items=args.items, note=console.note)
    print(text)
    out = Path(args.out)
    print(f"wrote {out / 'probes.json'}, {out / 'probes.md'}, {out / 'probes.png'}")
    return 0


def _export_lm_eval(args: argparse.Namespace, inputs) -> int:
    from bytelm.interop.lm_eval import write_probe_tasks  # noqa: PLC0415 (the harness, only when asked)

    check_output_dir(args.export_lm_eval, "--export-lm-eval")
    summary = write_probe_tasks(
        args.export_lm_eval, inputs.eval_set, inputs.corpus, seed=args.seed, items=args.items
    )
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
    console.print_rows(rows)
    print(
        f"wrote {len(summary['tasks'])} tasks to {args.export_lm_eval}; run them with: bytelm-lm-eval "
        f"--model bytelm --model_args run=RUN_DIR --tasks bytelm_heldout,bytelm_probes --include_path "
        f"{args.export_lm_eval}"
    )
    return 0
