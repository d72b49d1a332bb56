"""``bytelm convert`` and ``bytelm export``: checkpoints in other libraries' formats, in and out."""

from __future__ import annotations

import argparse

from bytelm import console
from bytelm.cli.options import add_config_options
from bytelm.errors import UserError
from bytelm.interop.hf import convert_hf, export_hf
from bytelm.paths import check_output_dir


# -- convert --------------------------------------------------------------------------------------
def add_convert(sub) -> None:
    p = sub.add_parser(
        "convert",
        help="read checkpoints in other formats into bytelm run directories",
        description="Read a checkpoint written by another library into bytelm run directories that "
        "'bytelm eval', 'bytelm patch' and 'bytelm sample' take like trained runs.",
    )
    conv = p.add_subparsers(
        dest="convert_command", metavar="FORMAT", required=True, help="the format to read"
    )
    q = conv.add_parser(
        "hf-blt",
        help="a Hugging Face BLT folder (BltForCausalLM with its entropy patcher, e.g. Meta's BLT-1B)",
        description="Convert a Hugging Face BLT folder (config.json + safetensors, as save_pretrained writes "
        "it) into a BLT run in the reference variant (RUN_DIR) and its entropy model's run (RUN_DIR/entropy "
        "unless --entropy-out). Every tensor's name and shape is checked against config.json before anything "
        "is written. The architecture notes are docs/interop.md.",
    )
    q.add_argument(
        "hf_dir", metavar="HF_DIR", help="the folder holding config.json and model.safetensors (or its index)"
    )
    q.add_argument(
        "--out", required=True, metavar="RUN_DIR", help="the BLT run directory to write (must not hold a run)"
    )
    q.add_argument(
        "--entropy-out", metavar="DIR", help="the entropy model's run directory (default: RUN_DIR/entropy)"
    )
    q.add_argument(
        "--seq-len",
        type=int,
        default=1024,
        metavar="N",
        help="the context the runs score with (train.seq_len; held-out segments of at most N bytes) "
        "(default: 1024)",
    )
    q.add_argument(
        "--max-patch-len",
        type=int,
        metavar="N",
        help="split patches longer than N bytes (default: the reference's max_patch_length, else 64; the "
        "reference then keeps longer patches whole, so a window holding one scores differently unless N "
        "covers it; memory grows with N)",
    )
    q.add_argument(
        "--max-patches",
        type=int,
        metavar="N",
        help="patch slots per window (default: seq-len + 1, so no window ever runs out; fewer is faster)",
    )
    add_config_options(q, with_config=False)
    console.command(q, cmd_convert_hf_blt)


def cmd_convert_hf_blt(args: argparse.Namespace) -> int:
    for name in ("seq_len", "max_patch_len", "max_patches"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    check_output_dir(args.out, "--out")
    if args.entropy_out:
        check_output_dir(args.entropy_out, "--entropy-out")
    with console.stages() as (progress, _):
        blt, artefacts = convert_hf(
            args.hf_dir,
            args.out,
            artefacts_out={"entropy_run": args.entropy_out} if args.entropy_out else None,
            model_type="blt",
            seq_len=args.seq_len,
            max_patch_len=args.max_patch_len,
            max_patches=args.max_patches,
            overrides=tuple(args.overrides),
            progress=progress,
        )
    print(f"BLT run: {blt}\nentropy model run: {artefacts['entropy_run']}")
    return 0


# -- export ---------------------------------------------------------------------------------------
def add_export(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write bytelm runs in other formats",
        description="Write a bytelm run's latest checkpoint in another library's format.",
    )
    exp = p.add_subparsers(dest="export_command", metavar="FORMAT", required=True, help="the format to write")
    q = exp.add_parser(
        "hf",
        help="a Hugging Face folder: BLT (reference variant) as BltForCausalLM, a byte LM as "
        "LlamaForCausalLM",
        description="Write RUN_DIR as a Hugging Face folder (config.json + model.safetensors) that "
        "transformers loads with from_pretrained: a BLT run in the reference variant as BltForCausalLM (its "
        "entropy model as the patcher), a byte LM without a sliding window as LlamaForCausalLM. What the "
        "format cannot hold is refused, naming it.",
    )
    q.add_argument("run_dir", metavar="RUN_DIR", help="a run directory")
    q.add_argument(
        "--out", required=True, metavar="HF_DIR", help="the folder to write (must not hold a config.json)"
    )
    console.command(q, cmd_export_hf)


def cmd_export_hf(args: argparse.Namespace) -> int:
    check_output_dir(args.out, "--out")
    with console.stages() as (progress, _):
        arch = export_hf(args.run_dir, args.out, progress=progress)
    print(f"{arch}: {args.out}")
    return 0
