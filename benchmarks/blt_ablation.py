"""BLT against its peers at the tiny compare budget, with the ablations that show where it stands.

1. ``bytelm compare`` with a preset (default: the shipped ``tiny``) into ``--out``: every family
   at the matched training budget, the entropy model at its own.
2. The same preset plus BLT variants, in the same directory (finished runs are reused): without
   hashed n-grams (``model.ngram_sizes=``) and at target patch length 6.
3. The shipped BLT run evaluated with its global path zeroed (``model.global_path = false``: the
   decoder reads no global output), which measures what the latent transformer is worth.

Prints one table and, last, one JSON line of BPBs. Data and held-out settings come from
``--data`` and ``--set`` (applied to every model, e.g. ``--set data.heldout_fraction=0.1`` for a
small corpus). Takes about 10 minutes on a 2-core CPU.

    python benchmarks/blt_ablation.py [--data SPEC] [--out DIR] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

from results import record

from bytelm.evaluation.evaluator import evaluate_runs
from bytelm.experiments.compare import compare, load_preset
from bytelm.training.host import configure_cpu_devices

VARIANTS = {"blt_no_ngrams": ("model.ngram_sizes=",), "blt_p6": ("model.target_patch_len=6.0",)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", help="compare preset (default: tiny)")
    p.add_argument("--data", help="corpus spec (default: the preset's, stdlib)")
    p.add_argument("--out", default="runs/blt_ablation", help="output directory (default: runs/blt_ablation)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override for every model (repeatable)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="append the JSON line to benchmarks/results/ (printed either way)",
    )
    args = p.parse_args()
    configure_cpu_devices()
    out = Path(args.out)
    preset = load_preset(args.preset)
    preset = dataclasses.replace(preset, overrides=(*preset.overrides, *args.overrides))
    compare(preset, out, data_spec=args.data, note=print)

    blt = next(m for m in preset.members if m.name == "blt")
    extra = tuple(
        dataclasses.replace(blt, name=name, overrides=(*blt.overrides, *sets))
        for name, sets in VARIANTS.items()
    )
    report = compare(
        dataclasses.replace(preset, members=(*preset.members, *extra)), out, data_spec=args.data, note=print
    ).report

    zeroed = out / "runs" / "blt_global_zeroed"
    if zeroed.exists():
        shutil.rmtree(zeroed)
    shutil.copytree(out / "runs" / "blt", zeroed)
    config = zeroed / "config.toml"
    config.write_text(config.read_text().replace("global_path = true", "global_path = false"))
    zero = evaluate_runs([zeroed], data_spec=args.data, json_path=out / "blt_global_zeroed.json")["models"][0]

    rows = [*report["models"], zero]
    print(
        f"\n{'model':<20} {'family':<9} {'BPB':>7} {'own FLOPs':>12} {'total FLOPs':>12} {'bytes/step':>10}  "
        "note"
    )
    for m in rows:
        bpgs = m["mean_bytes_per_global_step"]
        print(
            f"{m['name']:<20} {m['family']:<9} {m['bpb']:7.4f} {m['flops'] or 0:12.3g} "
            f"{m.get('flops_total') or 0:12.3g} {bpgs or 0:10.2f}  {m['note']}"
        )
    result = {"fingerprint": report["fingerprint"], **{m["name"]: round(m["bpb"], 4) for m in rows}}
    print(json.dumps(result))
    if args.record:
        record("blt_ablation", result)


if __name__ == "__main__":
    main()
