"""Every ``small`` and ``base`` preset compiled for ``v5e-256``, ``v5p-128`` and ``v6e-256`` with
``bytelm compile`` (on this machine: libtpu describes the slices, no TPU is used), as the table in
docs/scaling.md: memory per chip and HBM free, compile seconds, the collectives of a train step,
XLA's FLOPs over the analytic count, and the roofline estimate.

    python benchmarks/compile_table.py [--reports DIR] [--topologies ...] [--configs small/hnet,...]

``--reports DIR``: read the ``--json`` reports a previous run left in DIR (``<config>-<slice>.json``,
``/`` as ``_``) instead of compiling again; missing ones are compiled. The BPE presets compile at
their tokenizer's 32,768 ids (``--vocab-size``); the ``small`` presets (64 sequences per step) on
the 256-chip slices use ``train.mesh_tensor=4`` (64 data-parallel rows x 4-way tensor parallelism:
a batch of 64 cannot be spread over 256 chips otherwise). The last line is one JSON object: per
config and slice, ``fits``, ``hbm_free_fraction`` and ``train_gib``, and the smallest HBM free.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

from results import record

CONFIGS = [
    "small/byte", "small/bpe", "small/megabyte", "small/blt", "small/entropy", "small/hnet",
    "base/byte", "base/byte_tp", "base/bpe", "base/megabyte", "base/blt", "base/entropy", "base/hnet",
]  # fmt: skip
GIB = 1 << 30


def arguments(config: str, topology: str) -> list[str]:
    extra = ["--vocab-size", "32768"] if config.endswith("/bpe") else []
    if config.startswith("small/") and topology in ("v5e-256", "v6e-256"):
        extra += ["--set", "train.mesh_tensor=4"]
    return extra


def report_for(config: str, topology: str, reports: Path) -> tuple[dict | None, list[str]]:
    path = reports / f"{config.replace('/', '_')}-{topology}.json"
    extra = arguments(config, topology)
    if not path.is_file():
        from bytelm import cli

        with contextlib.redirect_stdout(io.StringIO()):
            rc = cli.main(["compile", config, "--topology", topology, *extra, "--json", str(path)])
        if rc not in (0, 1) or not path.is_file():
            return None, extra
    return json.loads(path.read_text()), extra


def row(config: str, topology: str, report: dict, extra: list[str]) -> str:
    train, evaluate = report["programs"]
    mesh = "x".join(str(v) for v in report["config"]["mesh"].values())
    used = ", ".join(
        f"{k} {v['count']} ({v['bytes'] / GIB:.2f})" for k, v in train["collectives"].items() if v["count"]
    )
    xla = train["xla_flops"]
    ratio = f"{xla / report['analytic_train_flops_per_device']:.2f}" if xla else "-"
    r = report["roofline"]
    rate = r["bytes_per_s_per_chip_upper_bound"]
    note = " (tensor 4)" if "train.mesh_tensor=4" in extra else ""
    return (
        f"| `{config}` | {topology} | {mesh}{note} | {train['memory']['total'] / GIB:.2f} "
        f"({report['hbm_free_fraction']:.0%} free) | {evaluate['memory']['total'] / GIB:.2f} | "
        f"{train['compile_s'] + evaluate['compile_s']:.0f} | {used} | {ratio} | "
        f"{r['step_s_lower_bound'] * 1e3:.0f} ({r['binding']}) | {f'{rate:,.0f}' if rate else '-'} |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reports", help="where the --json reports are kept (default: a new temporary directory)")
    p.add_argument("--topologies", default="v5e-256,v5p-128,v6e-256")
    p.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help="comma-separated presets (default: every small and base preset); the table and the JSON "
        "line then cover these alone",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="append the JSON line to benchmarks/results/ (printed either way)",
    )
    args = p.parse_args(argv)
    reports = Path(args.reports or tempfile.mkdtemp(prefix="bytelm-compile-"))
    reports.mkdir(parents=True, exist_ok=True)
    lines = [
        "| config | slice | mesh (data x fsdp x tensor) | train GiB/chip | eval GiB/chip | compile s | "
        "collectives per train step (GiB) | XLA / analytic FLOPs | step >= ms (bound) | bytes/s/chip <= |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    headline: dict = {"cases": {}}
    for topology in args.topologies.split(","):
        for config in args.configs.split(","):
            report, extra = report_for(config, topology, reports)
            if report is None:
                lines.append(f"| `{config}` | {topology} | did not compile | | | | | | | |")
                headline["cases"][f"{config}@{topology}"] = None
                continue
            lines.append(row(config, topology, report, extra))
            headline["cases"][f"{config}@{topology}"] = {
                "fits": report["fits"],
                "hbm_free_fraction": round(report["hbm_free_fraction"], 4),
                "train_gib": round(report["programs"][0]["memory"]["total"] / GIB, 3),
            }
            print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))
    free = [c["hbm_free_fraction"] for c in headline["cases"].values() if c]
    headline["all_fit"] = all(c and c["fits"] for c in headline["cases"].values())
    headline["min_hbm_free_fraction"] = min(free) if free else None
    print(json.dumps(headline))
    if args.record:
        record("compile_table", headline)  # (a part of the table has its own command, so its own row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
