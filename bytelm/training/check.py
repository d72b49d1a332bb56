"""``bytelm run check RUN``: verify a run directory, repair what can be repaired, say what cannot.

What is checked, in order (each a line of the report):

- ``config.toml``: it parses, ends with its end marker, and holds a model (else nothing else can be
  checked: the run cannot be used);
- ``run.json``: readable and matching its checksum; a damaged one is rebuilt from the config, the
  newest checkpoint that restores and ``metrics.jsonl``
  (:func:`~bytelm.training.restore.ensure_run_record`): *repaired*;
- every checkpoint: its files against the digests written with it
  (:mod:`bytelm.training.checkpoint`) and its parameters restored; one that fails is *damaged*
  (a resumed training moves it aside and continues from the newest that restores);
- ``metrics.jsonl``: every line readable, and a train record at every ``train.log_every`` steps up to
  the run's step: the records lost, and from which step (the figures of the run's curves; nothing
  else depends on them).

The run is usable when its config is and some checkpoint restores.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from bytelm.errors import UserError
from bytelm.rundir import RunDir, RunRecordDamaged, run_path

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Finding:
    what: str  # the file or checkpoint
    state: str  # "ok", "repaired", "damaged", "lost records", "unusable"
    detail: str = ""


def metrics_gaps(run_dir, log_every: int, step: int) -> tuple[int, int, int | None]:
    """``(expected, lost, first lost step)`` of the train records ``metrics.jsonl`` should hold up to
    ``step``: one at every multiple of ``log_every`` (a torn or unreadable last line counts as lost)."""
    files = RunDir(run_dir)
    try:
        records = files.metrics()
    except UserError:
        records = []
    logged = {r.get("step") for r in records if isinstance(r, dict) and r.get("kind") == "train"}
    expected = list(range(log_every, step + 1, log_every))
    lost = [s for s in expected if s not in logged]
    return len(expected), len(lost), (lost[0] if lost else None)


def metrics_line(run_dir, log_every: int, step: int) -> str | None:
    """A sentence on the records ``metrics.jsonl`` lost, or None when none are."""
    expected, lost, first = metrics_gaps(run_dir, log_every, step)
    if not lost:
        return None
    return (
        f"{RunDir(run_dir).metrics_path} lost {lost} of its {expected} train records (from step {first}): "
        "the run's curves have a gap there; its checkpoints and scores are not affected"
    )


def check_run(run_dir: str | Path) -> list[Finding]:
    """The findings of ``bytelm run check`` (see the module docstring)."""
    from bytelm.config import load_run_config  # noqa: PLC0415
    from bytelm.training.checkpoint import Checkpointer, verify_digests  # noqa: PLC0415
    from bytelm.training.restore import _restore_mesh, ensure_run_record, make_task  # noqa: PLC0415
    from bytelm.training.trainer import Trainer  # noqa: PLC0415

    path = run_path(run_dir)
    files = RunDir(path)
    findings: list[Finding] = []
    try:
        cfg = load_run_config(path)
    except UserError as e:
        return [Finding(str(files.config_path), "unusable", str(e))]
    findings.append(Finding(str(files.config_path), "ok"))
    if not files.checkpoint_steps():
        return findings + [Finding(str(files.checkpoints_path), "unusable", "no checkpoint: retrain the run")]
    try:
        files.info()
        findings.append(Finding(str(files.info_path), "ok"))
    except RunRecordDamaged as e:
        try:
            ensure_run_record(path)
        except UserError as failed:
            return findings + [Finding(str(files.info_path), "unusable", str(failed))]
        findings.append(
            Finding(str(files.info_path), "repaired", f"{e.why}; rebuilt (its 'rebuilt' key says from what)")
        )
    info = files.info()
    from bytelm.data import load_corpus_from_config  # noqa: PLC0415

    task = make_task(cfg, load_corpus_from_config(cfg.data), path)
    trainer = Trainer(cfg, task, mesh=_restore_mesh(cfg, path), init=False)
    ckpt = Checkpointer(files.checkpoints_path, keep=cfg.train.keep_checkpoints)
    usable = False
    try:
        for step in files.checkpoint_steps():
            where = f"{files.checkpoints_path}/{step}"
            damaged = verify_digests(Path(where)) if not files.remote else None
            if damaged is None:
                try:
                    ckpt.restore_params(step, trainer.params)
                except UserError as e:
                    damaged = str(e)
            if damaged is None:
                usable = True
                findings.append(Finding(where, "ok"))
            else:
                findings.append(
                    Finding(
                        where,
                        "damaged",
                        f"{damaged}; a resumed training moves it aside and goes on from the newest that "
                        "restores",
                    )
                )
    finally:
        ckpt.close()
    line = metrics_line(path, cfg.train.log_every, int(info.get("step") or 0))
    findings.append(Finding(str(files.metrics_path), "lost records" if line else "ok", line or ""))
    if not usable:
        findings.append(Finding(str(path), "unusable", "no checkpoint restores: retrain the run"))
    return findings


def findings_json(findings: list[Finding]) -> str:
    return json.dumps([dataclasses.asdict(f) for f in findings], indent=1)
