"""Benchmark results as data: every measurement is one JSON line in ``benchmarks/results/<benchmark>.jsonl``.

A line holds the benchmark's name, the date, the machine (its CPU as ``lscpu`` names it, its GPU as
``nvidia-smi`` does, cores), the command, the git revision it ran at (``+dirty`` when the working
tree had changes), the figures the benchmark printed as its last JSON line, and a note. The human
page, ``benchmarks/RESULTS.md``, is generated from these files by ``python benchmarks/results_table.py``:
the current figure of every benchmark. History lives in git.

    from results import record             # (benchmarks/ is on the path of a benchmark script)
    record("bpe", {"train_ratio": 0.86, ...})
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

DIR = Path(__file__).resolve().parent / "results"
FIELDS = ("benchmark", "date", "machine", "command", "revision", "figures", "note")


def machine() -> str:
    """This machine in words: its CPU (``lscpu``'s model name, or the platform's), its cores, and any
    NVIDIA GPU (``nvidia-smi``'s name)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
                break
    except (OSError, subprocess.SubprocessError):
        pass
    parts = [f"{cpu}, {os.cpu_count()} cores"]
    try:
        gpus = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.split("\n")
        parts += [g.strip() for g in gpus if g.strip()]
    except (OSError, subprocess.SubprocessError):
        pass
    return "; ".join(parts)


def revision() -> str | None:
    """The git revision of the working tree (``+dirty`` with uncommitted changes), or None outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if rev.returncode:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def record(
    benchmark: str, figures: dict, *, note: str = "", command: str | None = None, directory: Path = DIR
) -> Path:
    """Append one measurement of ``benchmark`` (its headline ``figures``) to its results file in
    ``directory``."""
    line = {
        "benchmark": benchmark,
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "command": command
        or "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
        "revision": revision(),
        "figures": figures,
        "note": note,
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{benchmark}.jsonl"
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
    return path


def load(directory: Path = DIR) -> dict[str, list[dict]]:
    """Every benchmark's measurements, oldest first; a line without the fields is refused with its place."""
    out: dict[str, list[dict]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        rows = []
        for n, text in enumerate(path.read_text().splitlines(), 1):
            if not text.strip():
                continue
            row = json.loads(text)
            missing = [k for k in FIELDS if k not in row]
            if missing or row["benchmark"] != path.stem or not isinstance(row["figures"], dict):
                raise ValueError(
                    f"{path} line {n}: not a result line (missing {missing}, or another benchmark's)"
                )
            rows.append(row)
        out[path.stem] = rows
    return out
