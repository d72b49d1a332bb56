"""Hugging Face checkpoints <-> bytelm run directories, for the families that have a Hugging Face
counterpart (today: Meta's BLT, ``BltForCausalLM`` with its entropy patcher, both ways; the byte
LM out as a Llama-style model).

The formats are read and written here without ``transformers`` or ``torch``: a folder is a
``config.json`` and safetensors (:mod:`bytelm.interop.safetensors`). What each side computes is
pinned by the parity tests (``tests/test_hf_interop.py``), which build models with ``transformers``
itself; the architectural differences between bytelm's BLT and the reference, and why the
``reference`` variant exists, are in ``docs/interop.md``.

Weights move by one table per model (:mod:`bytelm.models.hf_layout`; a family builds its own in
its folder and hands it over through :meth:`~bytelm.families.Task.hf_export` and
:meth:`~bytelm.families.Task.hf_import`): each row names a bytelm parameter, the Hugging Face
tensor and how one becomes the other, so conversion and export are the same table read in the two
directions, and every tensor's shape is checked against the config before anything is written (an
error names the tensor).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from bytelm.atomic import atomic_write_text
from bytelm.config import Config, dump_config, load_run_config, with_overrides, with_values
from bytelm.errors import UserError
from bytelm.families import ARTEFACT_KINDS, FAMILIES, Task, names, task_class
from bytelm.interop.safetensors import SafetensorsFolder, write_safetensors
from bytelm.models.hf_layout import Entry, hf_shape, to_bytelm, to_hf
from bytelm.rundir import RunDir, is_url, run_path
from bytelm.training.checkpoint import Checkpointer
from bytelm.training.restore import restore_model
from bytelm.training.scorer import count_params

CONFIG_FILE = "config.json"


# -- bytelm parameters by flat path ---------------------------------------------------------
_STACKS = ("stack", "global_stack", "local_stack")  # Transformer attributes that may hold a scanned stack


def _flat_params(model: nnx.Module) -> dict[tuple, tuple[nnx.Variable, int | None]]:
    """The model's parameters by flat path, as ``(variable, layer)``: a scanned stack's layers
    appear under ``blocks, i`` paths with their index into the stacked array."""
    out: dict[tuple, tuple[nnx.Variable, int | None]] = {}
    for key, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        path = tuple(key)
        i = path.index("layers") if "layers" in path else -1
        if i > 0 and path[i - 1] in _STACKS:
            for layer in range(var.get_value().shape[0]):
                out[(*path[:i], "blocks", layer, *path[i + 1 :])] = (var, layer)
        else:
            out[path] = (var, None)
    return out


def _shape(flat, path) -> tuple[int, ...]:
    var, layer = flat[path]
    shape = tuple(var.get_value().shape)
    return shape if layer is None else shape[1:]


def _read(flat, path) -> np.ndarray:
    var, layer = flat[path]
    a = np.asarray(jax.device_get(var.get_value()))
    return a if layer is None else a[layer]


def load_entries(
    model: nnx.Module,
    entries: list[Entry],
    tensors: SafetensorsFolder,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Set every parameter of ``model`` (concrete, or abstract from ``nnx.eval_shape``) from
    ``tensors`` by ``entries``. All shapes are checked before any parameter is set, and a parameter
    that no entry fills is an error."""
    flat = _flat_params(model)
    unfilled = sorted(set(flat) - {e.path for e in entries}, key=str)
    if unfilled or any(e.path not in flat for e in entries):
        raise AssertionError(f"the weight table and the model disagree: unfilled {unfilled[:3]}")
    problems = []
    for e in entries:
        if e.kind == "identity":
            if len(set(_shape(flat, e.path))) != 1:
                problems.append(
                    f"{'.'.join(map(str, e.path))} of shape {_shape(flat, e.path)} cannot be the identity"
                )
            continue
        if e.hf not in tensors:
            problems.append(f"{e.hf} is missing")
            continue
        target, have = _shape(flat, e.path), tensors.shape(e.hf)
        if e.kind == "rows_slice":
            if len(have) != 2 or have[1] != target[1] or have[0] < e.rows[1]:
                problems.append(
                    f"{e.hf} has shape {have}; the config implies at least ({e.rows[1]}, {target[1]})"
                )
        elif have != hf_shape(e, target):
            problems.append(f"{e.hf} has shape {have}; the config implies {hf_shape(e, target)}")
    if problems:
        raise UserError(f"{tensors.path}: the tensors do not match config.json: " + "; ".join(problems[:6]))
    buffers: dict[int, tuple[nnx.Variable, np.ndarray]] = {}  # whole arrays, filled layer by layer
    for i, e in enumerate(entries):
        if progress:
            progress(i, len(entries))
        var, layer = flat[e.path]
        target = _shape(flat, e.path)
        if e.kind == "identity":
            value = np.eye(target[0], dtype=np.float32)
        else:
            hf = tensors.get(e.hf)
            value = to_bytelm(e, hf[e.rows[0] : e.rows[1]] if e.kind == "rows_slice" else hf, target)
        if id(var) not in buffers:
            buffers[id(var)] = (var, np.zeros(var.get_value().shape, np.float32))
        buf = buffers[id(var)][1]
        if layer is None:
            buf[...] = value
        else:
            buf[layer] = value
    for var, buf in buffers.values():
        var.set_value(jax.numpy.asarray(buf, var.get_value().dtype))
    if progress:
        progress(len(entries), len(entries))


def export_entries(
    model: nnx.Module, entries: list[Entry], progress: Callable[[int, int], None] | None = None
) -> dict[str, np.ndarray]:
    """The Hugging Face tensors of ``model`` by ``entries`` (fused tables put back together)."""
    flat = _flat_params(model)
    out: dict[str, np.ndarray] = {}
    fused: dict[str, list[tuple[tuple[int, int], np.ndarray]]] = {}
    for i, e in enumerate(entries):
        if progress:
            progress(i + 1, len(entries))
        w = _read(flat, e.path)
        if e.kind == "identity":
            if not np.array_equal(w, np.eye(w.shape[0], dtype=w.dtype)):
                raise UserError(
                    f"{'.'.join(map(str, e.path))} is not the identity, but the reference has no such "
                    "projection at these widths (queries_per_patch x local.d_model = global.d_model): the "
                    "model cannot be written in its format"
                )
        elif e.kind == "rows_slice":
            fused.setdefault(e.hf, []).append((e.rows, w))
        else:
            out[e.hf] = to_hf(e, w)
    for name, parts in fused.items():
        parts.sort(key=lambda p: p[0][0])
        out[name] = np.concatenate([w for _, w in parts]).astype(np.float32)
    return out


# -- config.json ---------------------------------------------------------------------------------
def read_config_json(hf_dir: str | os.PathLike) -> dict:
    path = Path(hf_dir) / CONFIG_FILE
    if not path.is_file():
        raise UserError(
            f"{hf_dir} has no {CONFIG_FILE}: point at a folder written by save_pretrained (or downloaded "
            "whole)"
        )
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise UserError(f"{path} is not JSON ({e})") from None


# -- run directories ----------------------------------------------------------------------------
def _stage(progress: Callable[..., None] | None, name: str) -> Callable[[int, int], None] | None:
    """``progress(stage, done, total)`` as a ``(done, total)`` callback for one stage."""
    return None if progress is None else (lambda done, total: progress(name, done, total))


def write_run(
    out: str | os.PathLike, cfg: Config, model: nnx.Module, info: dict, *, modules: dict | None = None
) -> Path:
    """A run directory holding ``cfg``, ``model``'s parameters as its one checkpoint (step 0, the
    parameters alone: no optimizer state) and a ``run.json`` (``info`` added), which every
    command that restores runs for scoring or sampling reads like a trained one (training does
    not resume from it). ``modules`` are the artefacts the family needs, in memory (a BLT's
    entropy model), instead of restored from their run directories. Refuses a directory that
    already holds a run."""
    out = Path(out).absolute()
    files = RunDir(out)
    if files.started():
        raise UserError(f"{out} already holds a run: choose a new --out (conversion never overwrites a run)")
    task = task_class(cfg.require_model().family)(cfg, None, None, modules=modules or {})
    params = nnx.state(model, nnx.Param)
    out.mkdir(parents=True, exist_ok=True)
    files.write_config(dump_config(cfg))
    ckpt = Checkpointer(files.checkpoints_path, keep=cfg.train.keep_checkpoints)
    try:
        meta = {
            "step": 0,
            "wall_s": 0.0,
            "train_s": 0.0,
            "data": {"step": 0, "seed": cfg.train.seed},
            "parameters_only": True,
        }
        ckpt.save(0, {"params": params}, meta)
    finally:
        ckpt.close()
    record = {
        "family": task.family,
        "status": "finished",
        "step": 0,
        "params": count_params(params),
        "train_flops_per_position": task.train_flops_per_position(),
        "bytes_per_position": task.bytes_per_position(),
        "positions_per_step": task.positions_per_step(),
        **task.run_info(),
        **info,
    }
    files.write_info(record)
    return out


def _abstract_model(cfg: Config, modules: dict | None = None) -> nnx.Module:
    """The model ``cfg`` describes with shapes only (no random initialisation, no compile)."""
    task = task_class(cfg.require_model().family)(cfg, None, None, modules=modules or {})
    return nnx.eval_shape(lambda: task.build_model(nnx.Rngs(0)))


def _exports(task: type[Task]) -> bool:
    """Whether the family has a Hugging Face format (its task defines :meth:`Task.hf_export`)."""
    return any("hf_export" in vars(c) for c in task.__mro__ if c not in (Task, object))


def _exporters() -> list[str]:
    return [f for f in names() if _exports(FAMILIES[f])]


def family_of_model_type(model_type: str | None, where: str) -> type[Task]:
    """The family that converts a Hugging Face ``model_type``; :class:`UserError` naming the types
    bytelm converts otherwise."""
    types = {FAMILIES[f].hf_model_type: FAMILIES[f] for f in names() if FAMILIES[f].hf_model_type}
    if model_type not in types:
        raise UserError(
            f"{where}: model_type {model_type!r} is not one bytelm converts ({', '.join(sorted(types))}); "
            f"bytelm exports, but does not convert, {', '.join(_exporters())} runs of other types"
        )
    return types[model_type]


def convert_hf(
    hf_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    artefacts_out: Mapping[str, str | os.PathLike] | None = None,
    overrides: tuple[str, ...] = (),
    progress: Callable[..., None] | None = None,
    model_type: str | None = None,
    **options,
) -> tuple[Path, dict[str, Path]]:
    """A Hugging Face folder (``config.json`` + safetensors) as bytelm run directories: the model at
    ``out`` and every artefact the folder also holds (a BLT's entropy model: its patcher) at
    ``artefacts_out[field]``, default ``out/<field without _run>`` (``out/entropy``), each run
    pointing at its artefacts. The family is the one whose :attr:`~bytelm.families.Task.hf_model_type`
    is the folder's ``model_type``; ``options`` go to its :meth:`~bytelm.families.Task.hf_import`
    (BLT: ``seq_len``, ``max_patch_len``, ``max_patches``). ``overrides`` (``--set`` strings) apply to
    every run's config (e.g. ``eval.batch_size=4``). Every tensor is checked before anything is
    written. ``progress(stage, done, total)`` hears of the tensors read. ``model_type``: the type
    the folder must have (and is taken to have where its ``config.json`` names none). Returns
    ``(run, {field: artefact run})``."""
    hf_dir, out = Path(hf_dir), Path(out).absolute()
    if RunDir(out).started():
        raise UserError(f"{out} already holds a run: choose a new --out (conversion never overwrites a run)")
    config = read_config_json(hf_dir)
    where = str(hf_dir / CONFIG_FILE)
    have = config.get("model_type", model_type)
    if model_type is not None and have != model_type:
        raise UserError(f"{where}: model_type {have!r} is not {model_type!r}")
    task = family_of_model_type(have, where)  # (said before the weights are looked for)
    fields = dict(artefacts_out or {})
    wanted = {f: str(Path(fields.get(f) or out / f.removesuffix("_run")).absolute()) for f in task.artefacts}
    for d in wanted.values():
        if RunDir(d).started():
            raise UserError(
                f"{d} already holds a run: choose a new --out (conversion never overwrites a run)"
            )
    tensors = SafetensorsFolder(hf_dir)
    made = task.hf_import(config, where, artefact_runs=wanted, **options)
    cfg = with_overrides(with_values(Config(model=made.model), dict(made.settings)), overrides)
    art_cfgs = {
        f: with_overrides(with_values(Config(model=m), dict(made.settings)), overrides)
        for f, m in made.artefacts.items()
    }
    entries, art_entries, ignored = made.tables(
        cfg.require_model(), {f: c.require_model() for f, c in art_cfgs.items()}
    )
    known = {e.hf for e in [*entries, *(e for t in art_entries.values() for e in t)]}
    unknown = [
        n
        for n in tensors.names()
        if n not in known and not n.startswith(ignored) and not n.endswith("inv_freq")
    ]
    if unknown:
        raise UserError(
            f"{hf_dir}: tensors that this config has no place for (a different architecture?): {unknown[:5]}"
        )
    modules = {}
    for f, c in art_cfgs.items():
        modules[f] = _abstract_model(c)
        load_entries(
            modules[f], art_entries[f], tensors, _stage(progress, f"read the {f.removesuffix('_run')}")
        )
    model = _abstract_model(cfg, modules)
    load_entries(model, entries, tensors, _stage(progress, f"read the {task.family} model"))
    source = {"converted_from": str(hf_dir.absolute()), "source_format": made.source}
    for f, c in art_cfgs.items():
        write_run(wanted[f], c, modules[f], source)
    write_run(out, cfg, model, source, modules=modules)
    return out, {f: Path(d) for f, d in wanted.items()}


def export_hf(
    run_dir: str | os.PathLike, out: str | os.PathLike, progress: Callable[..., None] | None = None
) -> str:
    """Write a bytelm run as a Hugging Face folder (``config.json`` + ``model.safetensors``) in its
    family's format (:meth:`~bytelm.families.Task.hf_export`: a BLT in the ``reference`` variant as
    ``BltForCausalLM``, its entropy model as the patcher; a byte LM as ``LlamaForCausalLM``). Returns
    the architecture written; refuses what the format cannot hold, from the configs, before any
    checkpoint is read. ``progress(stage, done, total)`` hears of the tensors gathered."""
    run_dir, out = run_path(run_dir), Path(out)
    if (out / CONFIG_FILE).exists():
        raise UserError(f"{out} already holds a {CONFIG_FILE}: choose a new --out")
    cfg = load_run_config(run_dir)
    if cfg.model is None:
        raise UserError(f"{run_dir} is not a run directory (its config has no [model] table)")
    m = cfg.model
    task = task_class(m.family)
    if not _exports(task):
        raise UserError(f"{run_dir} is a {m.family!r} run; bytelm exports {', '.join(_exporters())} runs")
    artefact_runs = {
        f: str(getattr(m, f)) for f, kind in task.artefacts_of(m).items() if ARTEFACT_KINDS[kind].run_family
    }
    artefacts = {f: load_run_config(d).require_model() for f, d in artefact_runs.items()}
    files = RunDir(run_dir)
    info = files.info(what="a finished run directory") if files.has_info() else {}
    try:
        layout = task.hf_export(m, artefacts, info)
    except UserError as e:
        raise UserError(f"{run_dir}: {e}") from None
    meta = {"format": "pt", "bytelm_run": str(run_dir) if is_url(run_dir) else str(run_dir.absolute())}
    tensors = export_entries(restore_model(run_dir), layout.entries, _stage(progress, "gather"))
    for f, entries in layout.artefact_entries.items():
        tensors.update(
            export_entries(
                restore_model(artefact_runs[f]),
                entries,
                _stage(progress, f"gather the {f.removesuffix('_run')}"),
            )
        )
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "model.safetensors", tensors, meta)
    atomic_write_text(out / CONFIG_FILE, json.dumps(layout.config, indent=1))
    return layout.arch
