"""Runs brought back: a task with the artefact runs its family names (an entropy model) restored,
and a run's model restored from its checkpoint (a :class:`~bytelm.training.scorer.Scorer`, no
optimizer), to score, sample or export."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import jax
from flax import nnx

from bytelm.config import Config, load_run_config
from bytelm.data import load_corpus_from_config
from bytelm.errors import UserError
from bytelm.families import ARTEFACT_KINDS, FAMILIES, Task, task_class
from bytelm.rundir import RunDir, RunRecordDamaged, run_path
from bytelm.training.checkpoint import Checkpointer
from bytelm.training.distributed import barrier, is_primary
from bytelm.training.scorer import Scorer
from bytelm.training.trainer import Trainer, check_fingerprints, default_mesh

log = logging.getLogger(__name__)


def make_task(cfg: Config, corpus, run_dir: Path | None = None) -> Task:
    """The family's task for ``cfg``, with the run directories it names as artefacts (an entropy
    model) restored and handed over as modules."""
    if cfg.model is None:
        raise UserError("the config has no [model] section: set model.family (e.g. --set model.family=byte)")
    cls = task_class(cfg.model.family)
    modules, records = {}, {}
    for field, kind_name in cls.artefacts_of(cfg.model).items():
        kind = ARTEFACT_KINDS[kind_name]
        if kind.run_family is not None:
            modules[field], records[field] = _restore_artefact_run(getattr(cfg.model, field), field, kind)
    record = {}
    if run_dir is not None:
        try:
            record = RunDir(run_dir).info_or_empty()
        except RunRecordDamaged:  # (being rebuilt: what the task would read is derived again)
            record = {}
    return cls(cfg, corpus, run_dir, modules=modules, records=records, record=record)


def _restore_artefact_run(value: str, field: str, kind) -> tuple[nnx.Module, dict]:
    """The artefact run's model and its ``run.json`` record."""
    if not value:
        raise UserError(
            f"model.{field} is empty: point it at the run directory of the {kind.noun} (train one with "
            f"'{kind.made_by}')"
        )
    run_dir = run_path(value)
    record = RunDir(run_dir).info(
        what="a finished run directory", how=f"train the {kind.noun} first ({kind.made_by})"
    )
    family = record.get("family")
    if family != kind.run_family:
        raise UserError(
            f"model.{field} {run_dir} is a {family!r} run; the {kind.noun} must be "
            f"{FAMILIES[kind.run_family].description} (family {kind.run_family!r})"
        )
    return restore_model(run_dir), record


def run_record(
    task: Task, trainer: Trainer | Scorer, corpus, peak_total: float | None, peak_source: str
) -> dict:
    """What ``run.json`` says of a run besides its progress: family, fingerprints, parameters, the
    FLOP and byte rates, the MFU peak, the task's own record (tokenizer, ledger...)."""
    return {
        "family": task.family,
        "fingerprint": corpus.fingerprint,
        "data": corpus.summary(),
        "params": trainer.param_counts,
        "train_flops_per_byte": task.train_flops_per_byte(),
        "train_flops_per_position": task.train_flops_per_position(),
        "bytes_per_position": task.bytes_per_position(),
        "positions_per_step": task.positions_per_step(),
        "peak_flops": peak_total,
        "peak_source": peak_source,
        "devices": trainer.mesh.devices.size,
        "backend": jax.default_backend(),
        **task.run_info(),
    }


def ensure_run_record(run_dir: str | Path, *, corpus=None) -> None:
    """Rebuild a damaged ``run.json`` (:class:`~bytelm.rundir.RunRecordDamaged`) from the run's
    ``config.toml``, its newest checkpoint that restores and ``metrics.jsonl``, with a warning naming
    what was lost; a readable record, or none, is left as it is. The rebuilt record carries
    ``"rebuilt"``: its artefacts' and held-out bytes' fingerprints are today's, not those the run
    was trained with."""
    files = RunDir(run_dir)
    try:
        files.info_or_empty()
        return
    except RunRecordDamaged as damage:
        why = damage.why
    record = rebuild_run_record(run_dir, why, corpus=corpus)
    if is_primary():
        files.write_info(record)
    barrier("bytelm: run record rebuilt")
    log.warning(
        "%s %s: rebuilt from config.toml, checkpoint %d and metrics.jsonl (status %s)",
        files.info_path,
        why,
        record["step"],
        record["status"],
    )


def rebuild_run_record(run_dir: str | Path, why: str, *, corpus=None) -> dict:
    """The record :func:`ensure_run_record` writes (see there)."""
    from bytelm.training.peak import device_peak  # noqa: PLC0415

    files = RunDir(run_dir)
    cfg = _run_config(run_dir)
    if not files.checkpoint_steps():
        raise UserError(
            f"{files.info_path} {why}, and {run_dir} has no checkpoint to rebuild it from: retrain the run"
        )
    corpus = corpus if corpus is not None else load_corpus_from_config(cfg.data)
    task = make_task(cfg, corpus, run_path(run_dir))
    trainer = Scorer(cfg, task, _restore_mesh(cfg, run_path(run_dir)))
    ckpt = Checkpointer(files.checkpoints_path, keep=cfg.train.keep_checkpoints)
    try:
        step, (_, meta), _ = ckpt.restore_newest(lambda s: ckpt.restore_params(s, trainer.params))
    finally:
        ckpt.close()
    peak, source = device_peak(jax.default_backend(), jax.devices()[0].device_kind, cfg.train.peak_flops)
    budgeted = cfg.train.time_budget_s > 0
    planned = meta.get("horizon") if budgeted or cfg.train.flop_budget else cfg.train.steps
    measured = (meta.get("stats") or {}).get("flops_measured")  # (a family that measures its FLOPs)
    metrics = files.metrics()
    losses = [r["loss"] for r in metrics if r.get("kind") == "train" and r.get("step") == step]
    evals = [r["bpb"] for r in metrics if r.get("kind") == "eval" and r.get("step") == step]
    return {
        **run_record(
            task, trainer, corpus, None if peak is None else peak * trainer.mesh.devices.size, source
        ),
        "status": "finished" if planned is not None and step >= planned else "stopped",
        "step": step,
        "planned_steps": planned,
        "wall_s": meta.get("wall_s"),
        "train_s": meta.get("train_s"),
        **({"time_budget_s": cfg.train.time_budget_s} if budgeted else {}),
        **(
            {"flops_measured": measured, "flops_planned": task.ledger().own(step)}
            if measured is not None
            else {}
        ),
        "final_loss": losses[-1] if losses else None,
        "final_eval_bpb": evals[-1] if evals else None,
        "rebuilt": {
            "why": why,
            "from_checkpoint": step,
            "note": "fingerprints recorded at the rebuild, not at training",
        },
    }


def restore_scorer(
    run_dir: str | Path, *, corpus=None, step: int | None = None, load_corpus: bool = True
) -> Scorer:
    """The model of ``run_dir`` to score and sample with (:class:`~bytelm.training.scorer.Scorer`:
    its task, its weights of the latest or ``step`` checkpoint, or with ``train.ema_decay`` their
    average, and the scoring program; no optimizer). ``load_corpus=False`` (with no ``corpus``): a
    scorer for the model alone, whose task cannot make batches (sampling, conversion)."""
    cfg = _run_config(run_dir)
    if corpus is None and load_corpus:
        corpus = load_corpus_from_config(cfg.data)
    return _restore(run_path(run_dir), cfg, corpus, step)


def restore_model(run_dir: str | Path, *, step: int | None = None) -> nnx.Module:
    """The model of ``run_dir`` with its latest (or ``step``) weights (their average with
    ``train.ema_decay``), its corpus not loaded."""
    return _restore(run_path(run_dir), _run_config(run_dir), None, step).model


def _run_config(run_dir: str | Path) -> Config:
    return load_run_config(run_dir)


def _restore(run_dir: Path, cfg: Config, corpus, step: int | None) -> Scorer:
    ensure_run_record(run_dir, corpus=corpus)
    task = make_task(cfg, corpus, run_dir)
    check_fingerprints(run_dir, task)
    scorer = Scorer(cfg, task, _restore_mesh(cfg, run_dir))
    files = RunDir(run_dir)
    if not files.checkpoint_steps():
        raise UserError(f"the run directory {run_dir} has no checkpoint yet")
    ckpt = Checkpointer(files.checkpoints_path, keep=cfg.train.keep_checkpoints)
    key = "ema" if cfg.train.ema_decay > 0 else "params"
    try:
        _, (scorer.params, meta), _ = ckpt.restore_newest(
            lambda s: ckpt.restore_params(s, scorer.params, key=key), step
        )
    finally:
        ckpt.close()
    scorer.step = int(meta["step"])
    return scorer


def _restore_mesh(cfg: Config, run_dir: Path):
    """The run's own mesh where this process's devices can hold it; otherwise (a run trained on more
    devices or hosts than are here) the default layout: the checkpoint is resharded on restore."""
    t = cfg.train
    try:
        return default_mesh(cfg)
    except UserError:
        fallback = dataclasses.replace(
            cfg, train=dataclasses.replace(t, mesh_data=-1, mesh_fsdp=1, mesh_tensor=1)
        )
        log.info(
            "%s was trained on a mesh (data=%d, fsdp=%d, tensor=%d) that %d devices cannot hold: restoring "
            "data-parallel",
            run_dir,
            t.mesh_data,
            t.mesh_fsdp,
            t.mesh_tensor,
            jax.device_count(),
        )
        return default_mesh(fallback)
