"""``bytelm compile``: compile a config's programs for a TPU slice, here, and say whether they fit."""

from __future__ import annotations

import argparse
import json

from bytelm import console
from bytelm.atomic import atomic_write_text
from bytelm.cli.options import add_config_options
from bytelm.paths import check_output_file
from bytelm.training.host import quiet_libtpu_without_tpu


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
    add_config_options(p, with_config=False)
    console.command(p, cmd_compile)


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def cmd_compile(args: argparse.Namespace) -> int:
    from bytelm.training.aot import compile_config, compile_sweep, diagnosis, headline  # noqa: PLC0415
    from bytelm.training.topology import parse_topology  # noqa: PLC0415

    if args.json:
        check_output_file(args.json, "--json")
    quiet_libtpu_without_tpu()
    topology = parse_topology(args.topology)
    kwargs = dict(slices=args.slices, chips_per_host=args.chips_per_host, vocab_size=args.vocab_size)
    if args.sweep:
        rows = compile_sweep(args.config, args.overrides, topology, args.sweep, note=console.note, **kwargs)
        _print_sweep(args.config, args.slices, topology, rows)
        if args.json:
            atomic_write_text(args.json, json.dumps(rows, indent=1))
        console.print_json({"config": args.config, "topology": topology.name, "sweep": rows})
        return 0
    report = compile_config(args.config, args.overrides, topology, **kwargs)
    _print_report(args.config, report)
    if args.json:
        atomic_write_text(args.json, json.dumps(report, indent=1))
    console.print_json(headline(args.config, report))
    if not report["fits"]:
        console.warn(f"{args.config} on {report['topology']['name']}: {diagnosis(report)}")
        return 1
    return 0


def _print_report(config: str, report: dict) -> None:
    c, t = report["config"], report["topology"]
    mesh = " x ".join(f"{k} {v}" for k, v in c["mesh"].items())
    print(
        f"{config} ({c['family']}, {c['params'] / 1e6:.1f}M parameters, batch {c['batch_size']} x "
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
    xla = report["programs"][0]["xla_flops"]
    analytic = report["analytic_train_flops_per_device"]
    counted = f"{xla:.4g}" if xla is not None else "n/a (not compiled)"
    print(
        f"  FLOPs per chip per step: XLA {counted}, analytic {analytic:.4g}"
        + (f" (XLA / analytic {xla / analytic:.3f})" if xla and analytic else "")
        + ("; XLA counts a scanned stack's loop body once" if c.get("scan_layers") else "")
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


def _print_sweep(config: str, slices: int, topology, rows: list[dict]) -> None:
    where = f"{slices} x {topology.name} ({topology.chips} chips per slice)"
    print(f"{config} on {where}; the roofline columns are an estimate (a lower bound of the step time)")
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
