"""Outside models on the identical held-out bytes: export the segments, read back their scores.

**Held-out file** (``bytelm data export-heldout --out heldout.jsonl``), JSON Lines, UTF-8. The
first line is a header, then one line per segment in canonical order::

    {"format": "bytelm-heldout", "version": 1, "fingerprint": "<64 hex>", "protocol": 2, "segments": 1024,
     "bytes": 262144, "spec": "stdlib", "segment_bytes": 256, "max_eval_bytes": 262144,
     "python": "3.11.7"}
    {"id": "0:asyncio/base_events.py@0", "group": "asyncio", "length": 256, "bytes": "<base64>"}
    ...

``bytes`` is the standard base64 (RFC 4648, with padding) of the segment's exact bytes, which
need not be valid UTF-8. ``protocol`` is the evaluation protocol that chose the segments
(docs/evaluation.md). The fingerprint is the sha256 of ``b"bytelm-eval-protocol 2\0"``, the
segments, each prefixed by its length as 8 little-endian bytes, then ``b"total"`` and the total
length as 8 little-endian bytes (:func:`bytelm.data.split.fingerprint_segments`).

**Scores file** (``bytelm eval --external NAME=scores.jsonl``), JSON Lines. A header line, then
one line per segment (any order, every id exactly once)::

    {"format": "bytelm-scores", "version": 1, "fingerprint": "<the held-out file's fingerprint>",
     "family": "hf-gpt2", "params": {"total": 124439808, "embedding": 38597376, "non_embedding": 85842432}}
    {"id": "0:asyncio/base_events.py@0", "nats": 301.25, "global_steps": 71}
    ...

``nats`` is the segment's total negative log-likelihood in nats, every byte predicted exactly
once, the segment scored on its own from the model's start-of-sequence state (no context from
other segments; end-of-text not scored). A tokenizer-based model sums its token NLLs over the
segment encoded on its own. ``global_steps`` (optional) is the number of positions the model ran
for the segment (tokens for a subword model), giving its mean bytes per global step. In the
header, ``family`` (a string, default ``"external"``) and ``params`` are optional; ``params`` is an
object holding any of ``total``, ``embedding`` and ``non_embedding`` (non-negative integers; a
model that knows only its size gives ``{"total": N}``). BPB = sum of nats / (held-out bytes x ln 2).

A file that breaks these rules is refused with one line naming the file, the line and the field.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bytelm.atomic import atomic_write_text
from bytelm.bpb import SegmentScores
from bytelm.data import fingerprint_segments
from bytelm.errors import UserError
from bytelm.evaluation.results import EvalSet, ModelResult

HELDOUT_FORMAT = "bytelm-heldout"
SCORES_FORMAT = "bytelm-scores"
VERSION = 1


def heldout_lines(eval_set: EvalSet) -> Iterator[str]:
    """The lines of the held-out file (see the module docstring), without newlines."""
    d = eval_set.describe()
    header = {
        "format": HELDOUT_FORMAT,
        "version": VERSION,
        "fingerprint": eval_set.fingerprint,
        "protocol": d["protocol"],
        "segments": len(eval_set.segments),
        "bytes": eval_set.n_bytes,
        "spec": d["spec"],
        "segment_bytes": d["segment_bytes"],
        "max_eval_bytes": d["max_eval_bytes"],
        "python": d["python"],
    }
    yield json.dumps(header)
    for seg, data in zip(eval_set.segments, eval_set.data):
        yield json.dumps(
            {
                "id": seg.id,
                "group": seg.group,
                "length": len(data),
                "bytes": base64.b64encode(data).decode("ascii"),
            }
        )


def export_heldout(eval_set: EvalSet, path: str | Path) -> dict:
    """Write the held-out file atomically; returns its header."""
    lines = list(heldout_lines(eval_set))
    atomic_write_text(path, "\n".join(lines) + "\n")
    return json.loads(lines[0])


def read_heldout(path: str | Path) -> tuple[dict, list[dict]]:
    """Parse a held-out file: ``(header, [{"id", "group", "length", "data": bytes}, ...])``.

    Checks the fingerprint against the decoded bytes (a damaged or edited file is refused)."""
    (_, header), rows = _read_jsonl(path, HELDOUT_FORMAT)
    out: list[dict[str, Any]] = []
    for n, row in rows:
        try:
            data = base64.b64decode(row["bytes"], validate=True)
        except (KeyError, TypeError, binascii.Error) as e:
            raise UserError(
                f"{path} line {n}: no valid base64 'bytes' ({e}); re-export with 'bytelm data export-heldout'"
            ) from None
        out.append({"id": row.get("id"), "group": row.get("group"), "length": len(data), "data": data})
    protocol = header.get("protocol", 1)  # (files of protocol 1 had no such key)
    actual = fingerprint_segments(
        [r["data"] for r in out], protocol=protocol if isinstance(protocol, int) else 1
    )
    if actual != header.get("fingerprint"):
        raise UserError(
            f"{path}: its segments have fingerprint {actual[:16]}... but its header says "
            f"{str(header.get('fingerprint'))[:16]}...; the file was changed, re-export it"
        )
    return header, out


def _read_jsonl(path: str | Path, fmt: str) -> tuple[tuple[int, dict], list[tuple[int, dict]]]:
    """``((header line number, header), [(line number, row), ...])`` of a JSON Lines file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}; give an existing {fmt} JSONL file") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text; a {fmt} file is JSON Lines") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(
                f"{path} line {n} is not JSON ({e.msg}); a {fmt} file has one JSON object per line"
            ) from None
        if not isinstance(obj, dict):
            raise UserError(f"{path} line {n} is not a JSON object")
        rows.append((n, obj))
    if not rows or rows[0][1].get("format") != fmt:
        where = (
            f"{path} line {rows[0][0]}: header field 'format' is {rows[0][1].get('format')!r}"
            if rows
            else f"{path} is empty"
        )
        raise UserError(
            f"{where}; the file must start with a {fmt} header line "
            f'({{"format": "{fmt}", "version": {VERSION}, '
            "\"fingerprint\": ...}); see the format in 'bytelm data export-heldout --help'"
        )
    n, header = rows[0]
    if header.get("version") != VERSION:
        raise UserError(
            f"{path} line {n}: header field 'version' is {header.get('version')!r}; this bytelm reads {fmt} "
            f"version {VERSION}"
        )
    return rows[0], rows[1:]


PARAM_KEYS = ("total", "embedding", "non_embedding")


def _header_params(where: str, header: dict) -> dict | None:
    """The header's optional ``params``: any of :data:`PARAM_KEYS`, each a non-negative integer."""
    params = header.get("params")
    if params is None:
        return None
    if not isinstance(params, dict):
        raise UserError(
            f"{where}: header field 'params' must be an object such as {{\"total\": 124439808}}, got "
            f"{params!r}"
        )
    for key, value in params.items():
        if key not in PARAM_KEYS:
            raise UserError(f"{where}: header field 'params.{key}' is not one of {', '.join(PARAM_KEYS)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(
                f"{where}: header field 'params.{key}' must be a non-negative integer, got {value!r}"
            )
    return dict(params)


def read_external_scores(path: str | Path, eval_set: EvalSet, *, name: str) -> ModelResult:
    """Read a scores file and check it against ``eval_set``: same fingerprint, every segment id
    exactly once, finite non-negative nats. Returns a :class:`ModelResult` of kind ``"external"``."""
    (hline, header), rows = _read_jsonl(path, SCORES_FORMAT)
    where = f"{path} line {hline}"
    params = _header_params(where, header)
    family = header.get("family", "external")
    if not isinstance(family, str) or not family:
        raise UserError(f"{where}: header field 'family' must be a non-empty string, got {family!r}")
    fp = header.get("fingerprint")
    if fp != eval_set.fingerprint:
        raise UserError(
            f"{where}: header field 'fingerprint' is {str(fp)[:16]}... (the external scores {name}), but the "
            f"models here are scored on {eval_set.fingerprint[:16]}...; export the held-out segments of this "
            "data (bytelm data export-heldout with the same --data and segment settings) and score them again"
        )
    index = {sid: i for i, sid in enumerate(eval_set.ids)}
    nats = np.full(len(index), np.nan)
    steps = np.full(len(index), np.nan)
    for n, row in rows:
        sid = row.get("id")
        if "id" not in row:
            raise UserError(
                f"{path} line {n}: field 'id' is missing (every line after the header scores one segment)"
            )
        if not isinstance(sid, str) or sid not in index:
            raise UserError(f"{path} line {n}: field 'id' {sid!r} is not a segment of this evaluation set")
        i = index[sid]
        if not math.isnan(nats[i]):
            raise UserError(f"{path} line {n}: field 'id' {sid!r} is scored twice")
        value = row.get("nats")
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise UserError(
                f"{path} line {n}: field 'nats' must be a finite number >= 0 (total NLL of the segment), got "
                f"{value!r}"
            )
        nats[i] = float(value)
        if "global_steps" in row:
            gs = row["global_steps"]
            if isinstance(gs, bool) or not isinstance(gs, int | float) or not gs > 0:
                raise UserError(
                    f"{path} line {n}: field 'global_steps' must be a positive number, got {gs!r}"
                )
            steps[i] = float(gs)
    missing = [eval_set.ids[i] for i in np.flatnonzero(np.isnan(nats))]
    if missing:
        raise UserError(
            f"{path} has no score for {len(missing)} of {len(index)} segments (first: {missing[0]!r}); score "
            "every segment of the held-out file"
        )
    scores = SegmentScores(nats, np.asarray([len(d) for d in eval_set.data], np.int64))
    return ModelResult(
        name=name,
        family=family,
        kind="external",
        fingerprint=fp,
        scores=scores,
        global_steps=None if np.isnan(steps).any() else steps,
        run_dir=str(path),
        params=params,
        note=f"scored outside bytelm ({Path(path).name})",
    )


def write_scores(path: str | Path, ids: list[str], nats: list[float], fingerprint: str, **header) -> None:
    """Write a scores file (for tests and for Python users scoring a model in-process)."""
    lines = [json.dumps({"format": SCORES_FORMAT, "version": VERSION, "fingerprint": fingerprint, **header})]
    lines += [json.dumps({"id": i, "nats": float(x)}) for i, x in zip(ids, nats)]
    atomic_write_text(path, "\n".join(lines) + "\n")


def parse_external_arg(text: str) -> tuple[str, str]:
    """``NAME=PATH`` -> ``(name, path)``."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path:
        raise UserError(f"--external {text!r} is not of the form NAME=SCORES.jsonl")
    return name.strip(), path
