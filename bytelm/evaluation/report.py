"""Reports: the ``report.json`` schema, its validator, and tables for terminals and Markdown.

``report.json`` (written by ``bytelm eval`` and ``bytelm compare``) is one object; its schema is
:data:`REPORT_SCHEMA` (JSON Schema, draft 2020-12 subset), checked by :func:`validate` before
every write. In short::

    {"format": "bytelm-report", "version": 1,
     "fingerprint": "<64 hex: the scored held-out bytes>",
     "data": {"spec", "source", "python", "eval_segments", "eval_bytes", "segment_bytes", ...},
     "models": [ModelEntry, ...],      # trained runs and external scores, in table order
     "baselines": [ModelEntry, ...],   # reference models (unigram byte models)
     "compare": {...} | null}          # preset, budget and stage wall times (bytelm compare)

    ModelEntry = {"name", "family", "kind": "run" | "external" | "baseline", "run_dir", "step",
      "bpb", "nats", "bytes", "segments",
      "params": {["total"], ["embedding"], ["non_embedding"], ["ngram"]} | null (each key optional;
                 ngram: the hashed n-gram tables, part of embedding),
      "flops": the model's own training FLOPs (analytic; a family that measures what its steps spend,
      H-Net: measured) | null, "flops_planned": a measured model's own FLOPs at its planned rates | null,
      "train_flops_per_byte" | null,
      "flops_own" (= flops), "flops_auxiliary", "flops_total": the compute ledger (bytelm/ledger.py:
      auxiliary = what the model needs besides its own training, BLT's entropy model) | null,
      "auxiliary_flops": {what: FLOPs} | null,
      "inference_flops_per_byte", "entropy_inference_flops_per_byte" (a BLT's entropy model),
      "total_inference_flops_per_byte": forward FLOPs per byte (bytelm/models/flops.py) | null,
      "pipeline_stats": {name: rate} from the input pipeline on the eval set (BLT: patch_overflow_*) | null,
      "bytes_seen": training bytes | null,
      "mean_bytes_per_global_step": eval-set bytes per position of the outermost stack | null,
      "wall_s": training wall time | null, "fingerprint", "note",
      "groups": {group: Breakdown}, "dirs": {top-level directory: Breakdown}}

    Breakdown = {"segments", "nats", "bytes", "bpb", ["global_steps", "mean_bytes_per_global_step"]}

Non-finite numbers (a diverged model's BPB) are written as ``null``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

from bytelm.atomic import atomic_write_text
from bytelm.bpb import top_directory
from bytelm.evaluation import stats
from bytelm.evaluation.results import EvalSet, ModelResult

FORMAT = "bytelm-report"
VERSION = 2  # 2: bpb_ci95 and seeds per model and breakdown, statistics, data.protocol

_NUM = {"type": ["number", "null"]}
_COUNT = {"type": "integer", "minimum": 0}
_FP = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
_CI = {"type": ["array", "null"], "items": _NUM}
_BREAKDOWN = {
    "type": "object",
    "required": ["segments", "nats", "bytes", "bpb"],
    "properties": {
        "segments": _COUNT,
        "nats": _NUM,
        "bytes": _COUNT,
        "bpb": _NUM,
        "global_steps": _NUM,
        "mean_bytes_per_global_step": _NUM,
        "documents": _COUNT,
        "bpb_ci95": _CI,
    },
    "additionalProperties": False,
}
# every key optional: outside models may know only their total (bytelm/evaluation/external.py)
_PARAMS = {
    "type": ["object", "null"],
    "properties": {"total": _COUNT, "embedding": _COUNT, "non_embedding": _COUNT, "ngram": _COUNT},
    "additionalProperties": False,
}
_MODEL = {
    "type": "object",
    "required": [
        "name",
        "family",
        "kind",
        "bpb",
        "nats",
        "bytes",
        "segments",
        "params",
        "flops",
        "bytes_seen",
        "mean_bytes_per_global_step",
        "wall_s",
        "fingerprint",
        "groups",
        "dirs",
    ],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "family": {"type": "string", "minLength": 1},
        "kind": {"enum": ["run", "external", "baseline"]},
        "run_dir": {"type": ["string", "null"]},
        "step": {"type": ["integer", "null"]},
        "bpb": _NUM,
        "bpb_ci95": _CI,
        "seeds": {"type": "integer", "minimum": 1},
        "complete": {"type": ["boolean", "null"]},
        "partial": {"type": ["string", "null"]},
        "nats": _NUM,
        "bytes": {"type": "integer", "minimum": 1},
        "segments": {"type": "integer", "minimum": 1},
        "params": _PARAMS,
        "flops": _NUM,
        "flops_own": _NUM,
        "flops_planned": _NUM,
        "flops_auxiliary": _NUM,
        "flops_total": _NUM,
        "auxiliary_flops": {"type": ["object", "null"], "additionalProperties": _NUM},
        "train_flops_per_byte": _NUM,
        "inference_flops_per_byte": _NUM,
        "entropy_inference_flops_per_byte": _NUM,
        "total_inference_flops_per_byte": _NUM,
        "pipeline_stats": {"type": ["object", "null"], "additionalProperties": _NUM},
        "bytes_seen": _NUM,
        "mean_bytes_per_global_step": _NUM,
        "wall_s": _NUM,
        "fingerprint": _FP,
        "note": {"type": "string"},
        "groups": {"type": "object", "additionalProperties": _BREAKDOWN},
        "dirs": {"type": "object", "additionalProperties": _BREAKDOWN},
    },
    "additionalProperties": False,
}
REPORT_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "bytelm report",
    "type": "object",
    "required": ["format", "version", "fingerprint", "data", "models", "baselines"],
    "properties": {
        "format": {"const": FORMAT},
        "version": {"const": VERSION},
        "fingerprint": _FP,
        "data": {
            "type": "object",
            "required": ["spec", "python", "eval_segments", "eval_bytes", "segment_bytes", "max_eval_bytes"],
            "properties": {
                "spec": {"type": "string"},
                "source": {"type": "string"},
                "python": {"type": "string"},
                "protocol": {"type": "integer", "minimum": 1},
                "eval_segments": _COUNT,
                "eval_bytes": _COUNT,
                "segment_bytes": _COUNT,
                "max_eval_bytes": _COUNT,
                "heldout_documents": _COUNT,
                "scored_documents": _COUNT,
                "heldout_groups": _COUNT,
                "train_bytes": _COUNT,
            },
        },
        "models": {"type": "array", "items": _MODEL},
        "baselines": {"type": "array", "items": _MODEL},
        "compare": {"type": ["object", "null"]},
        "probes": {"type": ["object", "null"]},
        "statistics": {
            "type": "object",
            "required": ["method", "confidence", "resamples", "seed", "documents", "ranking", "pairs"],
            "properties": {
                "pairs": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["a", "b", "diff", "ci95", "flip", "separable"],
                        "properties": {
                            "a": {"type": "string"},
                            "b": {"type": "string"},
                            "diff": _NUM,
                            "ci95": _CI,
                            "flip": _NUM,
                            "separable": {"type": "boolean"},
                        },
                        "additionalProperties": False,
                    },
                },
            },
        },
    },
    "additionalProperties": False,
}


# -- validation ------------------------------------------------------------------------------
_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def schema_errors(value, schema: dict, path: str = "$") -> list[str]:
    """Violations of ``schema`` by ``value`` (the JSON Schema keywords used in this module:
    type, const, enum, required, properties, additionalProperties, items, minimum, minLength,
    pattern). An empty list means valid."""
    errors: list[str] = []
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            return [f"{path}: expected {' or '.join(types)}, got {type(value).__name__} {value!r:.60}"]
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: expected {schema['const']!r}, got {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and "minimum" in schema
        and value < schema["minimum"]
    ):
        errors.append(f"{path}: {value} < minimum {schema['minimum']}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: string shorter than {schema['minLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing required key {key!r}")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                errors += schema_errors(item, props[key], f"{path}.{key}")
            elif extra is False:
                errors.append(f"{path}: unexpected key {key!r}")
            elif isinstance(extra, dict):
                errors += schema_errors(item, extra, f"{path}[{key!r}]")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def validate(report: dict) -> None:
    """Raise ``ValueError`` listing every way ``report`` violates :data:`REPORT_SCHEMA`."""
    errors = schema_errors(report, REPORT_SCHEMA)
    if errors:
        raise ValueError("report does not match its schema: " + "; ".join(errors[:10]))


# -- building --------------------------------------------------------------------------------
def _finite_or_none(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite_or_none(v) for v in x]
    return x


def build_report(
    eval_set: EvalSet,
    models: Sequence[ModelResult],
    baselines: Sequence[ModelResult] = (),
    compare: dict | None = None,
    *,
    resamples: int = stats.RESAMPLES,
    seed: int = stats.SEED,
) -> dict:
    """The report of ``models`` and ``baselines`` on ``eval_set``, with its statistics: every BPB
    with its interval, and the paired differences of ``models`` (:mod:`bytelm.evaluation.stats`)."""
    everyone = [*models, *baselines]
    ds = stats.document_scores(eval_set, everyone)
    statistics = stats.statistics(ds, [m.name for m in models], resamples=resamples, seed=seed)
    entries = [m.to_dict(eval_set) for m in everyone]
    for e in entries:
        e["bpb_ci95"] = statistics["ci95"][e["name"]]
    for key, labels in (("groups", ds.groups), ("dirs", [top_directory(n) for n in ds.doc_names])):
        intervals = stats.group_intervals(ds.bits, ds.nbytes, labels, resamples=resamples, seed=seed + 1)
        documents = {g: labels.count(g) for g in intervals}
        for i, e in enumerate(entries):
            for g, row in e[key].items():
                # (one document cannot be resampled: no interval)
                one = documents.get(g, 0) < 2 or g not in intervals
                row["bpb_ci95"] = None if one else [float(x) for x in intervals[g][i]]
                row["documents"] = documents.get(g, 0)
    del statistics["ci95"]
    report = {
        "format": FORMAT,
        "version": VERSION,
        "fingerprint": eval_set.fingerprint,
        "data": eval_set.describe(),
        "models": entries[: len(models)],
        "baselines": entries[len(models) :],
        "compare": compare,
        "statistics": statistics,
    }
    report = _finite_or_none(report)
    validate(report)
    return report


def write_report_json(report: dict, path) -> None:
    validate(report)
    atomic_write_text(path, json.dumps(report, indent=1, allow_nan=False) + "\n")


def scores_path(report_path) -> Path:
    """Where the per-document scores of a report go: ``scores.jsonl`` beside ``report.json``,
    ``NAME.scores.jsonl`` beside any other ``NAME.json``."""
    p = Path(report_path)
    return p.with_name("scores.jsonl" if p.stem == "report" else f"{p.stem}.scores.jsonl")


def write_scores(path, eval_set: EvalSet, results: Sequence[ModelResult]) -> None:
    """The bits and bytes of every (model, seed, segment) and (model, seed, document): the data every
    figure of the report is computed from (:func:`bytelm.evaluation.stats.scores_lines`)."""
    stats.write_scores(path, eval_set, stats.document_scores(eval_set, results), results)


# -- tables ----------------------------------------------------------------------------------
def human(x: float | None, unit: str = "") -> str:
    """``1234567 -> '1.23M'`` (SI prefixes), ``None -> '-'``."""
    if x is None:
        return "-"
    for div, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div * 0.9995:  # what rounds to 1000 of a prefix is 1 of the next ("1T", not "1e+03G")
            return f"{x / div:.3g}{p}{unit}"
    return f"{x:.3g}{unit}"


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    m, sec = divmod(int(round(s)), 60)
    return f"{m}m{sec:02d}s" if m else f"{s:.1f}s"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> str:
    """A pipe table that is valid Markdown and aligned for a terminal. ``align`` is one letter
    per column (``l``/``r``; default: first column left, the rest right)."""
    align = align or "l" + "r" * (len(headers) - 1)
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    widths = [max(w, 3) for w in widths]

    def line(cells):
        out = [str(c).ljust(w) if a == "l" else str(c).rjust(w) for c, w, a in zip(cells, widths, align)]
        return "| " + " | ".join(out) + " |"

    rule = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if a == "r" else (":" + "-" * (w + 1)) for w, a in zip(widths, align)
        )
        + "|"
    )
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def _bpb(x) -> str:
    return "diverged" if x is None else f"{x:.4f}"


def interval_cell(ci, digits: int = 3) -> str:
    """``[low, high]`` of an interval, ``-`` when there is none."""
    if not ci or ci[0] is None or ci[1] is None:
        return "-"
    return f"[{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def params_cell(p: dict | None) -> str:
    """``"emb / non-emb"`` when both are known, else ``"<total> total"``, else ``"-"``."""
    if p and "embedding" in p and "non_embedding" in p:
        return f"{human(p['embedding'])} / {human(p['non_embedding'])}"
    if p and "total" in p:
        return f"{human(p['total'])} total"
    return "-"


def results_table(report: dict) -> str:
    """The main table: one row per model, then the reference rows."""
    headers = [
        "model",
        "family",
        "BPB",
        "95% interval",
        "params (emb / non-emb)",
        "n-gram params",
        "own FLOPs",
        "auxiliary FLOPs",
        "total FLOPs",
        "bytes seen",
        "bytes/global step",
        "entropy FLOPs/B",
        "inference FLOPs/B",
        "wall",
    ]
    rows = []
    for m in [*report["models"], *report["baselines"]]:
        params = params_cell(m["params"])
        bpgs = m["mean_bytes_per_global_step"]
        entropy = m.get("entropy_inference_flops_per_byte")
        ngram = (m["params"] or {}).get("ngram")
        rows.append(
            [
                m["name"] + (f" (PARTIAL: {m['partial']})" if m.get("partial") else ""),
                m["family"] + (f" x{m['seeds']} seeds" if m.get("seeds", 1) > 1 else ""),
                _bpb(m["bpb"]),
                interval_cell(m.get("bpb_ci95")),
                params,
                human(ngram) if ngram else "-",
                human(m["flops"]),
                human(m.get("flops_auxiliary"))
                if m.get("flops_auxiliary")
                else ("0" if m.get("flops_total") is not None else "-"),
                human(m.get("flops_total")),
                human(m["bytes_seen"], "B"),
                f"{bpgs:.2f}" if bpgs is not None else "-",
                human(entropy) if entropy else "-",
                human(m.get("total_inference_flops_per_byte")),
                seconds(m["wall_s"]),
            ]
        )
    return table(headers, rows, "llrrrrrrrrrrrr")


# below this many held-out documents a ranking speaks for those documents more than for the corpus
FEW_HELDOUT_DOCUMENTS = 20


def heldout_lines(data: dict) -> list[str]:
    """How much the held-out part can tell: the documents scored (of those held out) and their
    groups, and a warning when they are few."""
    docs, groups = data.get("scored_documents", data.get("heldout_documents")), data.get("heldout_groups")
    if docs is None:
        return []
    held = data.get("heldout_documents")
    of = f" of {held:,} held out" if held is not None and held != docs else ""
    counted = f"{docs:,} held-out document{'s' * (docs != 1)}{of}" + (
        f" in {groups:,} group{'s' * (groups != 1)}" if groups is not None else ""
    )
    if docs >= FEW_HELDOUT_DOCUMENTS:
        return [f"the scores cover {counted}"]
    return [
        f"WARNING: the scores cover only {counted}: a ranking then speaks for these documents "
        "alone, and intervals resampled from so few documents are unreliable (a corpus of parallel "
        "translations, one file per language, holds out whole languages). For a firmer ranking use more "
        "documents: a larger corpus, or one document per paragraph or line (files:PATH?split=paragraph, "
        "?split=line)"
    ]


def statistics_lines(report: dict) -> list[str]:
    """What the intervals are, the ranking with its inseparable neighbours joined by ``~``."""
    st = report.get("statistics")
    if not st:
        return []
    seeds = sorted(set((st.get("seeds") or {}).values()))
    seeded = f"; seeds per model: {', '.join(map(str, seeds))}" if seeds and seeds != [1] else ""
    lines = [
        f"intervals: {st['confidence']:.0%} {st.get('interval', 'percentile')} intervals, {st['method']}, "
        f"{st['documents']:,} documents, {st['resamples']:,} resamples, seed {st['seed']}{seeded}"
    ]
    if st["ranking"]:
        sep = {(p["a"], p["b"]): p["separable"] for p in st["pairs"]}
        text = st["ranking"][0]
        for a, b in zip(st["ranking"], st["ranking"][1:]):
            text += (" < " if sep.get((a, b), False) else " ~ ") + b
        lines.append(
            f"ranking (lower BPB first; '~': the paired difference of the neighbours is not separable from "
            f"zero at {st['confidence']:.0%}): {text}"
        )
    return lines


def pairs_table(report: dict) -> str | None:
    """Every pair of compared models: the paired BPB difference, its interval, how often resampling
    flips the order, and whether the interval excludes zero."""
    st = report.get("statistics") or {}
    if not st.get("pairs"):
        return None
    rows = [
        [
            f"{p['a']} - {p['b']}",
            "-" if p["diff"] is None else f"{p['diff']:+.4f}",
            interval_cell(p["ci95"], 4),
            "-" if p["flip"] is None else f"{p['flip']:.1%}",
            "yes" if p["separable"] else "NO",
        ]
        for p in st["pairs"]
    ]
    return table(
        ["pair (better - worse)", "BPB difference", "95% interval", "order flips", "separable"], rows
    )


def partial_lines(report: dict) -> list[str]:
    """A loud line per run scored before it finished (its figures are a partial run's)."""
    return [
        f"PARTIAL: {m['name']} is at {m['partial']}: its figures are those of a run that has not finished"
        for m in report["models"]
        if m.get("partial")
    ]


def pipeline_lines(report: dict) -> list[str]:
    """One line per model whose input pipeline reported rates (a BLT's patch-slot overflow)."""
    lines = []
    for m in report["models"]:
        stats = m.get("pipeline_stats") or {}
        if stats:
            shown = ", ".join(f"{k.replace('_', ' ')} {v:.2%}" for k, v in stats.items())
            lines.append(f"{m['name']}: {shown} of the evaluation set")
    return lines


def breakdown_table(
    report: dict, key: str = "dirs", *, metric: str = "bpb", max_rows: int = 20
) -> str | None:
    """Rows = groups (largest first), columns = models; ``metric`` is ``bpb`` or
    ``mean_bytes_per_global_step``. None when there is a single group."""
    models = [*report["models"], *report["baselines"][:1]]
    if not models:
        return None
    first = models[0][key]
    if len(first) < 2:
        return None
    names = sorted(first, key=lambda g: -first[g]["bytes"])[:max_rows]
    rows = []
    for g in names:
        cells = [g, str(first[g].get("documents", "-")), str(first[g]["bytes"])]
        for m in models:
            row = m[key].get(g, {})
            v = row.get(metric)
            cell = "-" if v is None else (f"{v:.4f}" if metric == "bpb" else f"{v:.2f}")
            if metric == "bpb" and row.get("bpb_ci95"):
                cell += " " + interval_cell(row["bpb_ci95"])
            cells.append(cell)
        rows.append(cells)
    return table(
        [key[:-1] if key.endswith("s") else key, "documents", "bytes", *[m["name"] for m in models]], rows
    )


def header_lines(report: dict) -> list[str]:
    d = report["data"]
    return [
        f"fingerprint {report['fingerprint']}",
        f"data {d['spec']} ({d.get('source', d['spec'])}), Python {d['python']}: {d['eval_segments']:,} "
        f"segments, {d['eval_bytes']:,} held-out bytes (segment_bytes {d['segment_bytes']}"
        + (f", evaluation protocol v{d['protocol']})" if d.get("protocol") else ")"),
    ]


def terminal_report(report: dict) -> str:
    parts = [
        results_table(report),
        "",
        *header_lines(report),
        *partial_lines(report),
        *heldout_lines(report["data"]),
        *statistics_lines(report),
        *pipeline_lines(report),
    ]
    pairs = pairs_table(report)
    if pairs:
        parts += ["", "Paired differences (the same resampled documents for both models):", pairs]
    dirs = breakdown_table(report, "dirs")
    if dirs:
        parts += ["", "BPB per top-level directory:", dirs]
    return "\n".join(parts)
