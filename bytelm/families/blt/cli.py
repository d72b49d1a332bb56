"""``bytelm patch``, the BLT family's command (:meth:`BLTTask.add_commands`): a text shown in the
entropy patches of a BLT run's entropy model (or an entropy-model run's), and the BLT-paper figure."""

from __future__ import annotations

import argparse
import sys
import time

from bytelm import console
from bytelm.errors import UserError
from bytelm.families.blt.source import read_patch_source
from bytelm.patching import EntropyModel, format_patches, patch_windows, read_windows
from bytelm.patching.show import CALIBRATION_WINDOWS, PatchTally, open_text
from bytelm.paths import check_output_file


def add_patch(sub) -> None:
    p = sub.add_parser(
        "patch",
        help="show the entropy patches of a text (and the BLT-paper entropy figure)",
        description="Run an entropy model on a text and print the text with '|' between patches (bytes that "
        "are not printable, or UTF-8 split across patches, shown escaped) and the mean patch length. RUN_DIR "
        "is a BLT run (its entropy model and recorded patching settings are used) or an entropy-model run "
        "(family 'byte'; give --threshold or --target-len). A text of any length is read and patched in "
        "windows of the run's train.seq_len + 1 positions, each by itself, as the run patches the windows it "
        "trains on (memory stays bounded; a progress bar on stderr for long files). --png draws the first "
        "window.",
    )
    p.add_argument(
        "run_dir", metavar="RUN_DIR", help="a BLT run directory, or an entropy-model (byte LM) run directory"
    )
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", metavar="TEXT", help="the text to patch")
    text.add_argument("--file", metavar="PATH", help="patch the bytes of this file")
    thr = p.add_mutually_exclusive_group()
    thr.add_argument(
        "--threshold",
        type=float,
        metavar="T",
        help="global entropy threshold in nats: a patch starts after a byte whose next-byte entropy exceeds "
        "T (overrides a BLT run's threshold)",
    )
    thr.add_argument(
        "--target-len",
        type=float,
        metavar="L",
        help="calibrate the threshold on this text itself (its first 256 windows) to give a mean patch "
        "length of L bytes",
    )
    p.add_argument(
        "--png", metavar="PATH", help="also draw per-byte entropy, the threshold and the boundaries to PATH"
    )
    console.command(p, cmd_patch)


def cmd_patch(args: argparse.Namespace) -> int:
    runs: console.RunTools = args.runs
    if args.png:
        check_output_file(args.png, "--png")
    runs.ensure_record(args.run_dir)  # (a damaged run.json is rebuilt, not refused)
    source = read_patch_source(args.run_dir)
    kwargs = source.patch_kwargs(threshold=args.threshold, target_len=args.target_len)
    width = runs.config(source.run_dir).train.seq_len + 1  # the run's windows (bytelm/patching/show.py)
    stream, total = open_text(args.text, args.file)
    tally = PatchTally()
    with stream:
        if not total:
            what = f"the file {args.file} is empty" if args.file is not None else "the text to patch is empty"
            raise UserError(f"{what}; give some text (--text or --file)")
        model = EntropyModel(runs.model(source.entropy_run), width=width)
        source.check_fingerprint(model.fingerprint)
        t0 = time.perf_counter()
        with console.progress_bar("patching", unit="B") as bar:
            for part in patch_windows(model, read_windows(stream, width), width=width, **kwargs):
                sys.stdout.write(("|" if tally.n_windows else "") + format_patches(part.patches()))
                tally.add(part)
                bar.update(tally.n_bytes, total)
        sys.stdout.write("\n")
        seconds = time.perf_counter() - t0
    first = tally.first
    assert first is not None
    if first.calibrated:
        calibrated_on = min(tally.n_windows, CALIBRATION_WINDOWS)
        how = (
            f"calibrated on the first {calibrated_on} window(s) of this text for a target mean patch length "
            f"of {first.target_len:g}"
        )
    elif args.threshold is not None:
        how = "given with --threshold"
    else:
        how = f"from the BLT run {source.run_dir}"
    rows = [("entropy model", f"{source.entropy_run} (fingerprint {model.fingerprint[:16]})")]
    if first.threshold is not None:
        rows.append(("threshold", f"{first.threshold:.6g} nats ({how})"))
    if first.monotonic_threshold is not None:
        rows.append(("monotonic", f"{first.monotonic_threshold:.6g} nats (from the BLT run)"))
    if first.max_patch_len is not None:
        rows.append(("max patch len", str(first.max_patch_len)))
    rows.append(
        (
            "windows",
            f"{tally.n_windows} of {width} positions (the run's train.seq_len + 1), each patched by itself "
            "as the run patches its training windows: a patch starts at each window's first two positions",
        )
    )
    rows.append(
        (
            "mean patch len",
            f"{tally.mean_patch_len:.3f} bytes ({tally.n_bytes} bytes in {tally.n_patches} patches; "
            f"{tally.mean_patch_len_with_bos:.3f} counting the BOS patch, as calibration does)",
        )
    )
    rows.append(("speed", f"{tally.n_bytes / max(seconds, 1e-9) / 1e6:.3f} MB/s ({seconds:.1f}s)"))
    if args.png:
        from bytelm.patching.plot import plot_entropies  # noqa: PLC0415 (matplotlib, on use)

        first_window = f" (first window, {len(first.data)} bytes)" if tally.n_windows > 1 else ""
        plot_entropies(
            args.png,
            first.data,
            first.entropies,
            first.starts,
            threshold=first.threshold,
            monotonic_threshold=first.monotonic_threshold,
            title=f"entropy patching, {source.entropy_run.name}{first_window}",
        )
        the_first = f" (the first window, {len(first.data)} bytes)" if tally.n_windows > 1 else ""
        rows.append(("png", f"{args.png}{the_first}"))
    console.print_rows(rows)
    return 0
