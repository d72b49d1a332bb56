"""Probing trained runs as ``bytelm probe`` does: the runs' shared held-out bytes, the probe set
built from them, every run probed (:func:`~bytelm.evaluation.probes.probe_runs`), and the report
written as ``probes.json``, ``probes.md`` and ``probes.png``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from bytelm.atomic import atomic_write_text
from bytelm.data import Corpus
from bytelm.errors import UserError
from bytelm.evaluation.evaluator import eval_sets_for_runs
from bytelm.evaluation.results import EvalSet


@dataclasses.dataclass(frozen=True)
class ProbeInputs:
    """The runs to probe, by the name each has in the tables, and what they are probed on."""

    runs: dict[str, str | Path]  # name -> run directory
    eval_set: EvalSet
    corpus: Corpus  # the first run's (the runs share its held-out bytes)


def probe_inputs(run_dirs: Sequence[str | Path], *, data_spec: str | None = None) -> ProbeInputs:
    """The runs named by their directories' names (which must differ) and their one evaluation set
    (:func:`~bytelm.evaluation.evaluator.eval_sets_for_runs`)."""
    names = [Path(r).name or str(r) for r in run_dirs]
    if len(set(names)) != len(names):
        raise UserError("two runs would share a name in one table: give run directories distinct names")
    eval_set, per_run = eval_sets_for_runs(run_dirs, data_spec=data_spec)
    return ProbeInputs(dict(zip(names, run_dirs)), eval_set, per_run[str(run_dirs[0])])


def probe_and_report(
    inputs: ProbeInputs,
    out: str | Path,
    *,
    seed: int = 0,
    items: int | None = None,
    note: Callable[[str], None] | None = None,
) -> tuple[dict, str]:
    """Probe every run of ``inputs`` (a run probed earlier on the same probe set at the same step is
    reused from ``out``) and write the report into ``out``; returns the record and its text table."""
    from bytelm.evaluation.plots import plot_probes  # noqa: PLC0415 (matplotlib, on use)
    from bytelm.evaluation.probe_tables import probe_lines  # noqa: PLC0415
    from bytelm.evaluation.probes import probe_runs  # noqa: PLC0415

    out = Path(out)
    record = probe_runs(
        inputs.eval_set, inputs.corpus, inputs.runs, seed=seed, items=items, out=out, note=note
    )
    record["data"] = inputs.eval_set.describe()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "probes.json", json.dumps(record, indent=1) + "\n")
    text = "\n".join(probe_lines(record))
    atomic_write_text(out / "probes.md", text + "\n")
    plot_probes(out / "probes.png", record, subtitle=f"probe set {record['fingerprint'][:16]}")
    return record, text
