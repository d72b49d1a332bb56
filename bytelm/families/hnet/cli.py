"""``bytelm chunks``, the H-Net family's command (:meth:`HNetTask.add_commands`): a text shown in
the chunks an H-Net run's router makes of it, stage by stage."""

from __future__ import annotations

import argparse
from pathlib import Path

from bytelm import console
from bytelm.errors import UserError
from bytelm.families.hnet.model import HNet
from bytelm.families.hnet.show import chunk_text
from bytelm.patching import format_patches
from bytelm.patching.show import read_text
from bytelm.paths import check_output_file


def add_chunks(sub) -> None:
    p = sub.add_parser(
        "chunks",
        help="show the chunks an H-Net run learned to make of a text",
        description="Run an H-Net (family 'hnet') on a text and print the text with '|' between the chunks "
        "its router makes, one line per stage (stage 2's chunks are groups of stage 1's), with each stage's "
        "mean chunk length on this text. Bytes that are not printable, or UTF-8 split across chunks, are "
        "shown escaped. The text must fit the model's context (train.seq_len - 1 bytes after the BOS).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="an H-Net run directory")
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", metavar="TEXT", help="the text to chunk")
    text.add_argument("--file", metavar="PATH", help="chunk the bytes of this file")
    p.add_argument(
        "--step", type=int, metavar="N", help="use checkpoint N (default: the newest that restores)"
    )
    p.add_argument(
        "--png",
        metavar="PATH",
        help="also draw stage 1's boundary probability per byte, the 0.5 threshold and its chunk boundaries "
        "to PATH",
    )
    console.command(p, cmd_chunks)


def cmd_chunks(args: argparse.Namespace) -> int:
    runs: console.RunTools = args.runs
    if args.png:
        check_output_file(args.png, "--png")
    data = read_text(args.text, args.file)
    model = runs.model(args.run_dir, step=args.step)
    if not isinstance(model, HNet):
        raise UserError(
            f"{args.run_dir} is not an H-Net run (its model is {type(model).__name__}); 'bytelm chunks' "
            "shows an H-Net's learned chunks ('bytelm patch' shows a BLT's entropy patches)"
        )
    result = chunk_text(model, data, runs.config(args.run_dir).train.seq_len)
    rows = []
    for stage in range(len(result.starts)):
        print(f"stage {stage + 1}: " + format_patches(result.chunks(stage)))
        rows.append(
            (
                f"stage {stage + 1} chunks",
                f"{len(result.chunks(stage))}, mean {result.mean_chunk_len(stage):.3f} bytes "
                f"(target N = {model.cfg.targets()[stage]:g} {'bytes' if stage == 0 else 'stage-1 chunks'})",
            )
        )
    if args.png:
        from bytelm.patching.plot import plot_entropies  # noqa: PLC0415 (matplotlib, on use)

        plot_entropies(
            args.png,
            data,
            result.probs,
            result.starts[0],
            threshold=0.5,
            title=f"H-Net stage 1 chunks, {Path(args.run_dir).name}",
            quantity="boundary probability p",
            unit="chunk",
            units="chunks",
        )
        rows.append(("png", args.png))
    console.print_rows(rows)
    return 0
