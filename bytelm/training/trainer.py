"""The one trainer (docs/architecture.md): every family, one loop.

Shape-first initialisation on a mesh (``eval_shape`` -> shardings -> ``jit(init,
out_shardings=...)``), a jitted step with donated state and gradient accumulation, metrics to
``metrics.jsonl``, periodic held-out BPB, orbax checkpoints (periodic, on SIGTERM/SIGINT, keep
last N) and exact resumption: batches are a pure function of ``(seed, step)`` and the state is
restored bit for bit, so a resumed run reproduces the uninterrupted one on CPU.

Run directory layout::

    config.toml      the resolved config
    run.json         family, corpus fingerprint, parameter counts, FLOPs per byte, status
    metrics.jsonl    one JSON object per log/eval event ("kind": "train" | "eval")
    checkpoints/     orbax checkpoints (step numbers)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bytelm.atomic import atomic_write_text
from bytelm.config import Config, TrainConfig, config_to_dict, dump_config, load_config
from bytelm.data import load_corpus_from_config
from bytelm.errors import UserError
from bytelm.bpb import LN2, score_segments
from bytelm.models.core import is_hashed_ngram_table, is_lookup_table
from bytelm.rundir import RunDir
from bytelm.training.checkpoint import Checkpointer
from bytelm.training.distributed import barrier, gather_rows, is_primary
from bytelm.training.peak import measure_matmul_peak
from bytelm.training.optim import learning_rate_schedule, make_optimizer, schedule_plan
from bytelm.training.sharding import batch_sharding, make_mesh, param_shardings
from bytelm.families import ARTEFACT_KINDS, FAMILIES, STATS_KEY, Task, task_class

log = logging.getLogger(__name__)

# Keys that may differ between a run directory's config and a resumed invocation.
RESUMABLE_CHANGES = {
    ("train", "log_every"),
    ("train", "checkpoint_every"),
    ("train", "keep_checkpoints"),
    ("train", "peak_flops"),
    ("eval", "every"),
    ("data", "cache_dir"),
    ("model", "attention"),  # kernels change speed, not parameters or results
    ("model", "mlp"),
    ("model", "remat"),  # recomputation changes memory and speed, not parameters
    # the mesh (and the number of hosts): batches are a function of (seed, step) alone, and the
    # checkpoint restores onto any mesh (resharded by orbax)
    ("train", "mesh_data"),
    ("train", "mesh_fsdp"),
    ("train", "mesh_tensor"),
}


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


@dataclasses.dataclass
class TrainResult:
    run_dir: Path
    step: int
    loss: float
    eval_bpb: float | None
    stopped_by_signal: bool = False
    train_s: float | None = None  # training time (compilation included, evaluations not), summed across resumes
    # the trainer at the end of this invocation (None when the run had finished before): its state is
    # the last checkpoint's, so evaluating it equals evaluating the restored run, without the restore
    trainer: Trainer | None = dataclasses.field(default=None, repr=False, compare=False)


def count_params(state: nnx.State) -> dict:
    """``total``, ``embedding`` and ``non_embedding`` parameter counts, and ``ngram``: the hashed
    n-gram tables among the embeddings (lookup capacity beyond one row per id). An embedding is a lookup
    table, told by its logical axes (first axis ``vocab``: byte/token embeddings, n-gram hash
    tables), not by its name; an output head (``embed, vocab``) is a non-embedding matrix."""
    total = embedding = ngram = 0
    for v in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable)):
        n = int(np.prod(v.shape))
        total += n
        if is_lookup_table(v):
            embedding += n
            ngram += n if is_hashed_ngram_table(v) else 0
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding, "ngram": ngram}


def check_run_config(run_dir: Path, cfg: Config) -> None:
    """Refuse to resume a run directory whose recorded config disagrees with ``cfg``."""
    rd = RunDir(run_dir)
    if not rd.has_config():
        return
    try:
        old = config_to_dict(load_config(rd.config_path))
    except UserError as e:
        raise UserError(f"the run directory {run_dir} has an unreadable config ({e}); use a new --out") from None
    new = config_to_dict(cfg)
    diffs = []
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section, {}), new.get(section, {})
        for key in sorted(set(a) | set(b)):
            if (section, key) in RESUMABLE_CHANGES:
                continue
            if a.get(key) != b.get(key):
                diffs.append(f"{section}.{key}: checkpoint has {a.get(key)!r}, now {b.get(key)!r}")
    if diffs:
        raise UserError(
            f"the run directory {run_dir} holds a run with a different config, so it cannot be resumed: "
            + "; ".join(diffs)
            + ". Use a new --out directory, or the original config."
        )


def default_mesh(cfg: Config):
    """The config's mesh; on one CPU host with the default layout (data=-1, fsdp=tensor=1), the
    largest number of (virtual) devices that divides both the micro-batch and the eval batch, so
    any batch size works (see :mod:`bytelm.training.host`). Several processes use every device."""
    t = cfg.train
    devices = jax.devices()
    if jax.default_backend() == "cpu" and jax.process_count() == 1 and (t.mesh_data, t.mesh_fsdp, t.mesh_tensor) == (-1, 1, 1):
        micro = t.batch_size // t.grad_accum
        n = max(k for k in range(1, len(devices) + 1) if micro % k == 0 and cfg.eval.batch_size % k == 0)
        devices = devices[:n]
    return make_mesh(t, devices)


def check_fingerprints(run_dir: Path, task: Task) -> None:
    """The artefacts a run depends on (tokenizer, entropy model) must be the ones it was trained with."""
    recorded = RunDir(run_dir).info_or_empty()
    for what, (value, where) in task.fingerprints().items():
        key = f"{what}_fingerprint"
        if key in recorded and recorded[key] != value:
            raise UserError(
                f"the {what} model/files now at {where} have fingerprint {value[:16]}..., but the run "
                f"{run_dir} was trained with {recorded[key][:16]}...: restore the original {what} or retrain"
            )


class _SignalFlag:
    """Set by SIGTERM/SIGINT; the loop saves a checkpoint and stops at the end of the step."""

    def __init__(self):
        self.signum: int | None = None
        self._old = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signum = signum

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


class _Metrics:
    """Appends JSON lines to the run's ``metrics.jsonl``; on resume, drops records past the restored
    step (and a torn last line). Only the primary process writes (the others' records are the same numbers)."""

    def __init__(self, files: RunDir, resume_step: int):
        self.file = None
        if not is_primary():
            return
        path = files.metrics_path
        if path.exists():
            kept = [r for r in files.metrics() if r.get("step", 0) <= resume_step]
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
        self.file = open(path, "a")

    def write(self, record: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


# Runs of one shape in one process share their jitted step and scoring functions (so a sweep, the
# seeds of a cell or a grid's budgets trace and compile them once): keyed by everything the
# functions close over. The train config enters without the fields that never reach them (the
# learning rate, warmup and horizon are arguments, `plan`; the rest is host-side).
_RUNTIME_TRAIN_FIELDS = ("steps", "seed", "learning_rate", "warmup_steps", "log_every", "checkpoint_every",
                         "keep_checkpoints", "peak_flops", "time_budget_s", "ema_decay")
_PROGRAMS: dict = {}
_PROGRAMS_LIMIT = 64


class _Programs:
    """The pure step and scoring functions of one model shape and optimizer, jitted once."""

    def __init__(self, graphdef, tcfg) -> None:
        self.graphdef = graphdef
        self.tcfg = tcfg
        self.tx = make_optimizer(tcfg)
        self.train_step = jax.jit(self._step_fn, donate_argnums=(0, 1))
        self.train_step_ema = jax.jit(self._step_ema_fn, donate_argnums=(0, 1, 5))
        self.score_positions = jax.jit(self._score_positions_fn)
        self.opt_init = jax.jit(self.tx.init)
        schedule = learning_rate_schedule(tcfg)
        self.lr = jax.jit(lambda count, plan: schedule(count, plan["horizon"], plan["peak"], plan["warmup"]))  # one call, not a dozen eager ops

    def _scores(self, params, batch, dropout_key=None):
        return nnx.merge(self.graphdef, params).score(batch, dropout_key=dropout_key)

    def _sums(self, params, batch, dropout_key=None):
        s = self._scores(params, batch, dropout_key)
        return jnp.sum(s.nll_BxT), (jnp.sum(s.mask_BxT), jnp.sum(s.nbytes_BxT))

    def _step_fn(self, params, opt_state, batch, plan, seed_step=None):
        """One optimizer step. ``seed_step`` (uint32 ``[train.seed, step]``) keys the step's dropout
        (``model.dropout``; micro-batch ``i`` of a gradient accumulation folds in ``i``); None: no
        dropout."""
        accum = self.tcfg.grad_accum
        grad_fn = jax.value_and_grad(self._sums, has_aux=True)
        key = None if seed_step is None else dropout_key(seed_step)
        if accum == 1:
            (nll, (count, nbytes)), grads = grad_fn(params, batch, key)
        else:
            micro = jax.tree.map(lambda x: x.reshape(accum, x.shape[0] // accum, *x.shape[1:]), batch)

            def body(carry, xs):
                g_acc, nll_acc, c_acc, b_acc = carry
                mb, i = xs
                (nll, (c, b)), g = grad_fn(params, mb, None if key is None else jax.random.fold_in(key, i))
                return (jax.tree.map(jnp.add, g_acc, g), nll_acc + nll, c_acc + c, b_acc + b), None

            zeros = jax.tree.map(jnp.zeros_like, params)
            (grads, nll, count, nbytes), _ = jax.lax.scan(body, (zeros, 0.0, 0.0, 0.0), (micro, jnp.arange(accum, dtype=jnp.int32)))
        count = jnp.maximum(count, 1.0)
        grads = jax.tree.map(lambda g: g / count, grads)
        updates, opt_state = self.tx.update(grads, opt_state, params, plan=plan)
        params = jax.tree.map(jnp.add, params, updates)
        metrics = {
            "loss": nll / count,
            "bpb": nll / (jnp.maximum(nbytes, 1.0) * LN2),
            "grad_norm": jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads))),
            "positions": count,
            "bytes": nbytes,
        }
        return params, opt_state, metrics

    def _step_ema_fn(self, params, opt_state, batch, plan, seed_step, ema, weight):
        """:meth:`_step_fn`, then the weight average moved ``weight`` of the way to the new params
        (:func:`ema_weight`), in one program."""
        params, opt_state, metrics = self._step_fn(params, opt_state, batch, plan, seed_step)
        return params, opt_state, metrics, jax.tree.map(lambda m, p: m + weight * (p - m), ema, params)

    def _score_positions_fn(self, params, batch):
        s = self._scores(params, batch)
        return s.nll_BxT, s.nbytes_BxT


def ema_weight(decay: float, step: int) -> float:
    """How far step ``step``'s (1-based) weights move the average (``train.ema_decay``):
    ``(1 - decay) / (1 - decay**step)``, Adam's bias correction, so the average after ``t`` steps is
    ``sum_i (1 - decay) decay^(t-i) p_i / (1 - decay^t)``, a weighted mean of the iterates with
    weights summing to 1 (the first step's weight is 1: the initialisation never enters)."""
    return (1.0 - decay) / (1.0 - decay**step)


DROPOUT_STREAM = 0x64726F70  # folded into the seed's key: dropout draws apart from the initialisation's


def dropout_key(seed_step: jax.Array) -> jax.Array:
    """The dropout key of a training step from uint32 ``[train.seed, step]``: a function of the two
    alone, so a resumed run draws the masks the uninterrupted one would."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed_step[0]), DROPOUT_STREAM), seed_step[1])


_INITS: dict = {}


def shared_init(graphdef, mesh, shardings, build_model):
    """The jitted initialisation ``seed -> params`` of a model shape on a mesh, shared like
    :func:`shared_programs` (the seed is an argument: the runs of a sweep or of several seeds
    initialise with one program). ``build_model(rngs)`` builds the model the graphdef describes;
    equal graphdefs (they hold the model's config) build equal models."""
    key = (graphdef, mesh)
    init = _INITS.get(key)
    if init is None:
        if len(_INITS) >= _PROGRAMS_LIMIT:
            _INITS.clear()
        init = _INITS[key] = jax.jit(
            lambda seed: nnx.state(build_model(nnx.Rngs(jax.random.key(seed))), nnx.Param), out_shardings=shardings
        )
    return init


def shared_programs(graphdef, train_cfg) -> _Programs:
    """The :class:`_Programs` of a model shape and train config, shared by every run of the process
    that has the same ones (the mesh enters through the arguments' shardings)."""
    tcfg = dataclasses.replace(train_cfg, **{f: getattr(TrainConfig(), f) for f in _RUNTIME_TRAIN_FIELDS})
    key = (graphdef, tcfg)
    programs = _PROGRAMS.get(key)
    if programs is None:
        if len(_PROGRAMS) >= _PROGRAMS_LIMIT:
            _PROGRAMS.clear()
        programs = _PROGRAMS[key] = _Programs(graphdef, tcfg)
    return programs


class Trainer:
    """Holds the compiled step and state for one run; :func:`train` drives it."""

    def __init__(self, cfg: Config, task: Task, mesh=None, *, init: bool = True):
        """``init=False``: the parameters and the optimizer state are abstract (shapes, dtypes and
        shardings, nothing allocated or compiled), for a trainer whose parameters a checkpoint is
        about to fill (:func:`restore_trainer`)."""
        self.cfg = cfg
        self.task = task
        self.mesh = mesh if mesh is not None else default_mesh(cfg)
        n_batch_shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        micro = cfg.train.batch_size // cfg.train.grad_accum
        if micro % n_batch_shards:
            raise UserError(
                f"the micro-batch train.batch_size/train.grad_accum = {micro} is not divisible by the "
                f"data-parallel mesh size (data x fsdp = {n_batch_shards}); change train.batch_size or the mesh"
            )
        if cfg.eval.batch_size % n_batch_shards:
            raise UserError(
                f"eval.batch_size {cfg.eval.batch_size} is not divisible by the data-parallel mesh size {n_batch_shards}"
            )
        seed = cfg.train.seed
        abstract_model = nnx.eval_shape(lambda: task.build_model(nnx.Rngs(jax.random.key(seed))))
        self.graphdef, abstract_state = nnx.split(abstract_model, nnx.Param)
        self.param_shardings = param_shardings(abstract_state, self.mesh)
        # nnx.Rngs(seed) and nnx.Rngs(jax.random.key(seed)) draw the same numbers
        if init:
            self.params = shared_init(self.graphdef, self.mesh, self.param_shardings, task.build_model)(np.int32(seed))
        else:
            self.params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, self.param_shardings)
        self.programs = shared_programs(self.graphdef, cfg.train)
        self.tx = self.programs.tx
        self._lr = self.programs.lr
        # the step at which the schedule ends: train.steps, or what a time-budgeted run plans
        self.horizon = cfg.train.steps
        # Every leaf on the mesh from the start (the step counts too, replicated): a leaf that only
        # lands on the mesh after the first step would make the second step compile again.
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        if init:
            self.opt_state = jax.tree.map(
                lambda x: x if isinstance(x.sharding, jax.sharding.NamedSharding) else jax.device_put(x, replicated),
                self.programs.opt_init(self.params),
            )
        else:
            self.opt_state = jax.eval_shape(self.programs.opt_init, self.params)
        # train.ema_decay: the weight average (what evaluate scores; the checkpoints' "ema"), else None
        self.ema = None
        if cfg.train.ema_decay > 0:
            self.ema = jax.tree.map(jnp.copy, self.params) if init else self.params
        self.step = 0
        self.last_plan: dict | None = None  # the schedule_plan of the latest step
        self._train_step, self._score_positions = self._on_mesh(self.programs.train_step), self.programs.score_positions
        self._train_step_ema = self._on_mesh(self.programs.train_step_ema)
        self.param_counts = count_params(self.params)

    def _on_mesh(self, fn):
        """``fn`` called with this trainer's mesh as the context mesh (``jax.set_mesh``), which the
        optimizer reads to share Muon's Newton-Schulz work across data-parallel devices."""

        def call(*args):
            with jax.set_mesh(self.mesh):
                return fn(*args)

        return call

    # -- pure functions (shared by the runs of one shape: _Programs) -------------------------
    def _scores(self, params, batch):
        return self.programs._scores(params, batch)

    # -- host side ------------------------------------------------------------------------
    def device_batch(self, batch: dict, *, whole: bool = False) -> dict:
        """The batch's arrays on the mesh (its host-side counts, ``batch[STATS_KEY]``, stay behind).
        The rows are this process's (training batches are made per process); ``whole``: the batch
        is the global one, the same on every process, which keeps the rows its devices hold."""
        out = {}
        for k, v in batch.items():
            if k == STATS_KEY:
                continue
            sharding = batch_sharding(self.mesh, v.ndim)
            if whole and jax.process_count() > 1:
                index = sharding.addressable_devices_indices_map(v.shape).values()
                lo = min(i[0].start or 0 for i in index)
                hi = max(len(v) if i[0].stop is None else i[0].stop for i in index)
                out[k] = jax.make_array_from_process_local_data(sharding, v[lo:hi], v.shape)
            else:
                out[k] = jax.make_array_from_process_local_data(sharding, v)
        return out

    def train_step(self, batch: dict) -> dict:
        # arguments: a new horizon (or learning rate, or warmup) does not compile the step again
        plan = self.last_plan = schedule_plan(self.cfg.train, self.horizon)
        seed_step = np.asarray([self.cfg.train.seed, self.step], np.uint32)
        if self.ema is None:
            self.params, self.opt_state, metrics = self._train_step(self.params, self.opt_state, self.device_batch(batch), plan, seed_step)
        else:
            weight = np.float32(ema_weight(self.cfg.train.ema_decay, self.step + 1))
            self.params, self.opt_state, metrics, self.ema = self._train_step_ema(
                self.params, self.opt_state, self.device_batch(batch), plan, seed_step, self.ema, weight
            )
        self.step += 1
        return metrics

    @property
    def model_params(self):
        """The weights that are the run's model: the average (``train.ema_decay``), else the params."""
        return self.params if self.ema is None else self.ema

    def evaluate(
        self, segments: list[bytes], *, on_batch: Callable[[dict, int], None] | None = None, batch_size: int | None = None
    ):
        """Score ``segments`` with the model's weights (:attr:`model_params`; the evaluation protocol), ``batch_size``
        (default ``eval.batch_size``) segments per batch.

        ``on_batch(batch, n_real_rows)`` sees every host-side eval batch (with its family-specific
        arrays, e.g. BLT patch lengths) before it is scored; the evaluator counts global steps and
        reports progress with it."""

        def rows(batch):
            # per-position values summed here in float64, in one fixed order: a segment's total does
            # not pick up the float32 reduction order of a program shaped by its batch
            # (every process builds the same global batch, scores its rows, and gets every row back)
            nll_BxT, nbytes_BxT = self._score_positions(self.model_params, self.device_batch(batch, whole=True))
            return gather_rows(nll_BxT).astype(np.float64).sum(axis=1), gather_rows(nbytes_BxT).astype(np.float64).sum(axis=1)

        def observed(batches):
            for batch, n_real in batches:
                on_batch(batch, n_real)
                yield batch, n_real

        batches = self.task.eval_batches(segments, batch_size or self.cfg.eval.batch_size)
        if on_batch is not None:
            batches = observed(batches)
        return score_segments(rows, batches, [len(s) for s in segments])

    def state_tree(self) -> dict:
        tree = {"params": self.params, "opt_state": self.opt_state}
        if self.ema is not None:
            tree["ema"] = self.ema
        return tree

    def load_state_tree(self, tree: dict) -> None:
        # onto the live state's shardings: orbax may restore scalars (the optimizer's step count) onto a
        # single device, which a step jitted over several devices then refuses
        mesh_devices = set(self.mesh.devices.flat)
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())

        def place(new, old):
            return jax.device_put(new, old.sharding if set(old.sharding.device_set) == mesh_devices else replicated)

        tree = jax.tree.map(place, tree, self.state_tree())
        self.params, self.opt_state, self.ema = tree["params"], tree["opt_state"], tree.get("ema")


def _finished_result(run_dir: Path, cfg: Config) -> TrainResult | None:
    run = RunDir(run_dir).info_or_empty()
    if not run:
        return None
    if run.get("status") != "finished" or (run.get("step") != cfg.train.steps and not cfg.train.time_budget_s):
        return None  # (a time-budgeted run's config matches the finished one: check_run_config)
    return TrainResult(run_dir, run["step"], run.get("final_loss", float("nan")), run.get("final_eval_bpb"), train_s=run.get("train_s"))


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
    record = RunDir(run_dir).info_or_empty() if run_dir is not None else {}
    return cls(cfg, corpus, run_dir, modules=modules, records=records, record=record)


def _restore_artefact_run(value: str, field: str, kind) -> tuple[nnx.Module, dict]:
    """The artefact run's model and its ``run.json`` record."""
    if not value:
        raise UserError(
            f"model.{field} is empty: point it at the run directory of the {kind.noun} (train one with '{kind.made_by}')"
        )
    run_dir = Path(value)
    record = RunDir(run_dir).info(what="a finished run directory", how=f"train the {kind.noun} first ({kind.made_by})")
    family = record.get("family")
    if family != kind.run_family:
        raise UserError(
            f"model.{field} {run_dir} is a {family!r} run; the {kind.noun} must be {FAMILIES[kind.run_family].description} "
            f"(family {kind.run_family!r})"
        )
    return restore_model(run_dir), record


def restore_trainer(run_dir: str | Path, *, corpus=None, step: int | None = None, load_corpus: bool = True) -> Trainer:
    """Rebuild the trainer of ``run_dir`` from its config and load the model's weights of its latest
    (or ``step``) checkpoint, to score and sample with: the parameters, or with ``train.ema_decay``
    their average, as ``params`` (its optimizer state stays abstract: training resumes through
    :func:`train`). ``load_corpus=False`` (with no ``corpus``): a
    trainer for the model alone, whose task cannot make batches (sampling, conversion)."""
    cfg = _run_config(run_dir)
    if corpus is None and load_corpus:
        corpus = load_corpus_from_config(cfg.data)
    return _restore(Path(run_dir), cfg, corpus, step)


def restore_model(run_dir: str | Path, *, step: int | None = None) -> nnx.Module:
    """The model of ``run_dir`` with its latest (or ``step``) weights (their average with
    ``train.ema_decay``), its corpus not loaded."""
    trainer = _restore(Path(run_dir), _run_config(run_dir), None, step)
    return nnx.merge(trainer.graphdef, trainer.params)


def _run_config(run_dir: str | Path) -> Config:
    return load_config(RunDir(run_dir).require_config())


def _restore(run_dir: Path, cfg: Config, corpus, step: int | None) -> Trainer:
    task = make_task(cfg, corpus, run_dir)
    check_fingerprints(run_dir, task)
    trainer = Trainer(cfg, task, mesh=_restore_mesh(cfg, run_dir), init=False)
    trainer.ema = None  # the average, if any, is read into params: it is the model
    ckpt = Checkpointer(RunDir(run_dir).checkpoints_path, keep=cfg.train.keep_checkpoints)
    try:
        step = ckpt.latest_step() if step is None else step
        if step is None:
            raise UserError(f"the run directory {run_dir} has no checkpoint yet")
        trainer.params, meta = ckpt.restore_params(step, trainer.params, key="ema" if cfg.train.ema_decay > 0 else "params")
    finally:
        ckpt.close()
    trainer.step = int(meta["step"])
    return trainer


def _restore_mesh(cfg: Config, run_dir: Path):
    """The run's own mesh where this process's devices can hold it; otherwise (a run trained on more
    devices or hosts than are here) the default layout: the checkpoint is resharded on restore."""
    t = cfg.train
    try:
        return default_mesh(cfg)
    except UserError:
        fallback = dataclasses.replace(cfg, train=dataclasses.replace(t, mesh_data=-1, mesh_fsdp=1, mesh_tensor=1))
        log.info("%s was trained on a mesh (data=%d, fsdp=%d, tensor=%d) that %d devices cannot hold: restoring data-parallel",
                 run_dir, t.mesh_data, t.mesh_fsdp, t.mesh_tensor, jax.device_count())
        return default_mesh(fallback)


def eval_slice(corpus, eval_bytes: int) -> list[bytes]:
    """The first segments of the evaluation set, up to ``eval_bytes`` bytes (periodic evals)."""
    out, total = [], 0
    for seg in corpus.segments:
        if total >= eval_bytes:
            break
        out.append(corpus.segment_bytes_of(seg))
        total += seg.length
    return out


class _Clock:
    """A run's training time, summed across resumes: compilation, steps, logs and checkpoints
    count; evaluations (inside :meth:`paused`) do not. For a time-budgeted run
    (``train.time_budget_s``) it also plans the schedule's horizon: after the first step of an
    invocation (which compiles), it times the next :attr:`PROBE_STEPS` steps and plans the horizon
    at the step where the remaining budget runs out at that pace. The first steps after a
    compilation are slower than the rest (measured on a 2-core CPU: 0.93 s, then 0.67 s, then a
    steady 0.53 s per step), so a plan from the probe alone ended a 100 s run after 63 s. The plan
    is therefore made again at every doubling of the run's steps (8, 16, 32, ...) from the pace
    since the previous plan, while the run is inside its warmup (there the learning rate does not
    depend on the horizon) or inside the first :attr:`REPLAN_DECAY` of its cosine decay (there
    the cosine is flat: a horizon 10% later raises the learning rate by under 2%). Planned
    only inside the warmup, runs of 10 minutes still ended 6-14% early: the pace kept improving
    for hundreds of steps. Later doublings re-plan only to correct a plan that, at the pace since
    the previous doubling, would end more than :attr:`LATE_MISS` of the budget early or late (a
    slow spell of the machine over steps 128-256 once left a 10-minute run planned to stop after
    550 s). A resumed run keeps the horizon it was checkpointed with."""

    PROBE_STEPS = 3
    REPLAN_DECAY = 0.2  # re-plans go on through this fraction of the cosine decay
    LATE_MISS = 0.03  # after it, a doubling re-plans only if the plan would miss the budget by more
    UNPLANNED = 10**9  # the horizon until it is planned: warmup is unaffected, the cosine barely starts

    def __init__(self, budget_s: float, spent_s: float, horizon: int | None, warmup: int = 0):
        self.budget_s, self.spent0, self.horizon, self.warmup = budget_s, spent_s, horizon, warmup
        self.replanning = budget_s > 0 and horizon is None  # planned in this invocation (not restored)
        self.t0, self.paused_s, self.stopped_at = time.perf_counter(), 0.0, None
        self.mark: float | None = None
        self.mark_steps = 0
        self.step_s: float | None = None

    def start(self) -> None:
        """The clock runs from the training loop's start (set-up, e.g. a matmul-peak measurement, is not training)."""
        self.t0, self.paused_s, self.stopped_at = time.perf_counter(), 0.0, None

    def stop(self) -> None:
        """Training has stopped: the final checkpoint and records do not count."""
        self.stopped_at = self.spent()

    def spent(self) -> float:
        if self.stopped_at is not None:
            return self.stopped_at
        return self.spent0 + time.perf_counter() - self.t0 - self.paused_s

    @contextlib.contextmanager
    def paused(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.paused_s += time.perf_counter() - t

    def plan(self, step: int, steps_this_run: int) -> bool:
        """Called after every step; True when it has just (re)planned :attr:`horizon`."""
        if not self.replanning:
            return False
        if steps_this_run == 1:
            self.mark, self.mark_steps = self.spent(), 1
            return False
        first = self.horizon is None and steps_this_run == 1 + self.PROBE_STEPS
        again = (self.horizon is not None and steps_this_run & (steps_this_run - 1) == 0 and steps_this_run > 1 + self.PROBE_STEPS)
        if not (first or again):
            return False
        # a warmup that does not fit the planned horizon (a budget of a few steps) is not re-planned:
        # a later horizon would stretch the warmup the steps already taken ran with
        if again and not self.warmup < self.horizon - 1:  # else the horizon stays
            self.replanning = False
            return False
        if again and step >= self.horizon:  # the run has ended (the caller stops at the horizon)
            return False
        spent = self.spent()
        step_s = (spent - self.mark) / (steps_this_run - self.mark_steps)
        self.mark, self.mark_steps = spent, steps_this_run
        if again and not self._early(step):  # late: only a plan that misses the budget is corrected
            end_s = spent + (self.horizon - step) * step_s
            if abs(end_s - self.budget_s) <= self.LATE_MISS * self.budget_s:
                return False
        self.step_s = step_s
        horizon = step + max(0, int((self.budget_s - spent) / max(self.step_s, 1e-9)))
        # a re-plan keeps the warmup whole, so the steps already taken keep their learning rates
        self.horizon = max(horizon, self.warmup + 2) if again else horizon
        return True

    def _early(self, step: int) -> bool:
        """Inside the warmup, or the first :attr:`REPLAN_DECAY` of the decay, of the current plan."""
        return step < self.warmup or step - self.warmup <= self.REPLAN_DECAY * (self.horizon - self.warmup)

    def exhausted(self, step: int) -> bool:
        return self.spent() >= self.budget_s or (self.horizon is not None and step >= self.horizon)


class _Run:
    """One invocation of :func:`train` on a run directory: its checkpoints, metrics, periodic
    evaluations and ``run.json``, around the trainer's steps."""

    def __init__(self, cfg: Config, run_dir: Path, trainer: Trainer, corpus):
        self.cfg, self.run_dir, self.trainer, self.task = cfg, run_dir, trainer, trainer.task
        self.files = RunDir(run_dir)
        self.ckpt = Checkpointer(self.files.checkpoints_path, keep=cfg.train.keep_checkpoints)
        self.wall0, self.train_s0, self.horizon0 = 0.0, 0.0, None
        self.stats_run: dict[str, int] = {}  # the batches' host-side counts over the whole run (kept in checkpoints)
        self.last_good_step = self.ckpt.latest_step()
        if self.last_good_step is not None:
            self._resume(self.last_good_step)
        self.budgeted = cfg.train.time_budget_s > 0
        self.clock = _Clock(cfg.train.time_budget_s, self.train_s0, self.horizon0 if self.budgeted else cfg.train.steps,
                            cfg.train.warmup_steps)
        trainer.horizon = self.clock.horizon if self.clock.horizon is not None else _Clock.UNPLANNED
        self.peak_total = self._peak_flops()
        self.flops_per_step = self.task.train_flops_per_position() * self.task.positions_per_step()
        self.ledger = self.task.ledger()  # own + auxiliary FLOPs (bytelm/ledger.py)
        self.info = self._run_info(corpus)
        self.metrics: _Metrics | None = None
        self.segments = eval_slice(corpus, cfg.eval.eval_bytes) if cfg.eval.every else []
        self.t_start = time.perf_counter()
        self.last_loss, self.last_eval, self.stopped_by_signal = float("nan"), None, False
        self.stats_log: dict[str, int] = {}  # the batches' host-side counts since the last log line

    # -- setup ----------------------------------------------------------------------------
    def _resume(self, step: int) -> None:
        tree, meta = self.ckpt.restore(step, self.trainer.state_tree())
        self.stats_run = dict(meta.get("stats", {}))
        self.trainer.load_state_tree(tree)
        self.trainer.step = int(meta["step"])
        if meta["data"]["seed"] != self.cfg.train.seed or meta["data"]["step"] != self.trainer.step:
            raise UserError(f"checkpoint {step} in {self.run_dir} has an inconsistent data-iterator state {meta['data']}")
        self.wall0 = float(meta.get("wall_s", 0.0))
        self.train_s0 = float(meta.get("train_s", self.wall0))
        self.horizon0 = meta.get("horizon")
        log.info("resumed %s at step %d", self.run_dir, self.trainer.step)

    def _peak_flops(self) -> float:
        """The MFU denominator: the configured per-device peak, or a measured matmul peak (on CPU
        all virtual devices share one set of cores, so the peak is the machine's)."""
        n_devices = self.trainer.mesh.devices.size
        if self.cfg.train.peak_flops > 0:
            return self.cfg.train.peak_flops * n_devices
        peak = measure_matmul_peak()
        return peak if jax.default_backend() == "cpu" else peak * n_devices

    def _run_info(self, corpus) -> dict:
        task, trainer = self.task, self.trainer
        return {
            "family": self.cfg.model.family,
            "fingerprint": corpus.fingerprint,
            "data": corpus.summary(),
            "params": trainer.param_counts,
            "train_flops_per_byte": task.train_flops_per_byte(),
            "train_flops_per_position": task.train_flops_per_position(),
            "bytes_per_position": task.bytes_per_position(),
            "positions_per_step": task.positions_per_step(),
            "peak_flops": self.peak_total,
            "devices": trainer.mesh.devices.size,
            "backend": jax.default_backend(),
            **task.run_info(),
        }

    # -- records ----------------------------------------------------------------------------
    def wall_s(self) -> float:
        return self.wall0 + time.perf_counter() - self.t_start

    def write_status(self, status: str, **extra) -> None:
        if not is_primary():
            return
        record = {**self.info, "status": status, "step": self.trainer.step, **self.task.stats_record(self.stats_run), **extra}
        self.files.write_info(record)

    def save(self, step: int) -> None:
        meta = {
            "step": step, "wall_s": self.wall_s(), "train_s": self.clock.spent(), "horizon": self.clock.horizon,
            "data": {"step": step, "seed": self.cfg.train.seed}, "stats": self.stats_run,
        }
        self.ckpt.save(step, self.trainer.state_tree(), meta)
        self.last_good_step = step

    def bytes_seen(self) -> float:
        return self.trainer.step * self.task.positions_per_step() * self.task.bytes_per_position()

    def finished(self) -> bool:
        """The run has trained for ``train.steps``, or spent its time budget (or reached its planned horizon)."""
        return self.clock.exhausted(self.trainer.step) if self.budgeted else self.trainer.step >= self.cfg.train.steps

    def log_train(self, m: dict, loss: float, step_s: float, progress) -> None:
        trainer, steps = self.trainer, self.clock.horizon
        nbytes = float(m["bytes"])
        rec = {
            "kind": "train",
            "step": trainer.step,
            "loss": loss,
            "bpb": float(m["bpb"]),
            "grad_norm": float(m["grad_norm"]),
            "lr": float(trainer._lr(trainer.step - 1, trainer.last_plan)),  # the schedule the step ran with
            "step_s": step_s,
            "bytes_s": nbytes / step_s,
            "tokens_s": float(m["positions"]) / step_s,
            "mfu": self.flops_per_step / step_s / self.peak_total,
            "flops": self.flops_per_step * trainer.step,
            "flops_total": self.ledger.total(trainer.step),
            "bytes_seen": self.bytes_seen(),
            "train_s": self.clock.spent(),
            **self.task.stats_record(self.stats_log),
        }
        self.stats_log = {}
        self.metrics.write(rec)
        if progress:
            progress(trainer.step, steps, f"loss {loss:.3f} bpb {rec['bpb']:.3f} {rec['bytes_s']:,.0f} B/s mfu {rec['mfu']:.2f}")

    def evaluate(self) -> None:
        with self.clock.paused():  # evaluations do not count as training time
            scores = self.trainer.evaluate(self.segments)
        self.metrics.write(
            {
                "kind": "eval",
                "step": self.trainer.step,
                "bpb": scores.bpb,
                "nats": scores.total_nats,
                "bytes": scores.total_bytes,
                "flops": self.flops_per_step * self.trainer.step,
                "flops_total": self.ledger.total(self.trainer.step),
                "bytes_seen": self.bytes_seen(),
            }
        )
        self.last_eval = scores.bpb

    # -- the loop ---------------------------------------------------------------------------
    def loop(self, progress, stop_after: int | None) -> None:
        """Train until ``train.steps`` or the time budget (or a signal, or ``stop_after`` steps of
        this invocation), logging, evaluating and checkpointing on their schedules."""
        cfg, trainer, tcfg, clock = self.cfg, self.trainer, self.cfg.train, self.clock
        self.write_status("running")
        self.metrics = _Metrics(self.files, trainer.step)
        batches = self.task.train_batches(trainer.step, jax.process_index(), jax.process_count())
        t_log, steps_since_log, steps_this_run = time.perf_counter(), 0, 0
        pending: tuple[int, dict] | None = None  # the step whose loss has not been read yet, and its metrics

        def settle() -> None:
            """Read the pending step's loss (the host waits for that step only); stop on a non-finite one."""
            nonlocal pending
            step, m = pending
            pending = None
            loss = float(m["loss"])
            if not math.isfinite(loss):
                self.write_status("diverged", diverged_at_step=step, last_good_checkpoint=self.last_good_step)
                raise TrainingDiverged(
                    f"loss became {loss} at step {step}; the last good checkpoint "
                    f"(step {self.last_good_step}) is kept in {self.files.checkpoints_path}. Lower train.learning_rate or "
                    "raise train.warmup_steps, then resume or start a new run."
                )
            self.last_loss = loss

        clock.start()
        with _SignalFlag() as flag:
            # one finished() decision per step (a time budget can run out between two looks)
            while not (steps_this_run == 0 and self.finished()):
                batch = next(batches)
                for key, n in batch.pop(STATS_KEY, {}).items():
                    self.stats_log[key] = self.stats_log.get(key, 0) + n
                    self.stats_run[key] = self.stats_run.get(key, 0) + n
                m = trainer.train_step(batch)  # dispatched: the device runs it while the host goes on
                steps_since_log += 1
                steps_this_run += 1
                if pending is not None:
                    settle()  # the previous step's loss, read one step late so the device queue never empties
                pending = (trainer.step, m)
                if clock.plan(trainer.step, steps_this_run):
                    trainer.horizon = clock.horizon
                    self.metrics.write(
                        {"kind": "plan", "step": trainer.step, "planned_steps": clock.horizon, "step_s": clock.step_s,
                         "train_s": clock.spent(), "time_budget_s": tcfg.time_budget_s}
                    )
                    log.info("time budget %.0fs: %.3fs per step, horizon planned at step %d", tcfg.time_budget_s, clock.step_s, clock.horizon)
                last = self.finished()
                log_now = trainer.step % tcfg.log_every == 0 or last
                eval_now = bool(cfg.eval.every) and (trainer.step % cfg.eval.every == 0 or last)
                save_now = trainer.step % tcfg.checkpoint_every == 0
                stop_now = flag.signum is not None or (stop_after is not None and steps_this_run >= stop_after)
                if log_now or eval_now or save_now or stop_now or last:
                    settle()  # this step's loss is needed (or its state is about to be kept)
                if log_now:
                    now = time.perf_counter()
                    self.log_train(m, self.last_loss, (now - t_log) / steps_since_log, progress)
                    t_log, steps_since_log = now, 0
                if eval_now:
                    self.evaluate()
                if save_now:
                    self.save(trainer.step)
                if flag.signum is not None:
                    self.save(trainer.step)
                    self.stopped_by_signal = True
                    log.warning("signal %d: saved checkpoint at step %d and stopped", flag.signum, trainer.step)
                    break
                if stop_after is not None and steps_this_run >= stop_after:
                    break
                if last:
                    break
            if pending is not None:
                settle()
            clock.stop()
            if self.finished() and self.last_good_step != trainer.step:
                self.save(trainer.step)

    def close(self) -> None:
        self.ckpt.close()
        if self.metrics is not None:
            self.metrics.close()

    def result(self) -> TrainResult:
        """Record the final status in ``run.json`` and return the result."""
        done = self.finished() and not self.stopped_by_signal
        budget = {}
        if self.budgeted:
            budget = {"time_budget_s": self.cfg.train.time_budget_s, "planned_steps": self.clock.horizon}
        self.write_status(
            "finished" if done else "stopped", wall_s=self.wall_s(), train_s=self.clock.spent(), final_loss=self.last_loss,
            final_eval_bpb=self.last_eval, **budget,
        )
        return TrainResult(self.run_dir, self.trainer.step, self.last_loss, self.last_eval, self.stopped_by_signal, self.clock.spent(),
                           trainer=self.trainer)


def train(
    cfg: Config,
    run_dir: str | Path,
    *,
    progress: Callable[[int, int, str], None] | None = None,
    corpus=None,
    stop_after: int | None = None,
) -> TrainResult:
    """Train (or resume) the run in ``run_dir``. ``stop_after`` ends early after that many steps
    of this invocation (tests use it to simulate an interruption)."""
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]+:/", str(run_dir)):  # gs://..., s3://... (a Path keeps one slash)
        raise UserError(
            f"the run directory {run_dir} is a URL; bytelm writes runs to a file system (for a bucket, mount it, e.g. "
            "with gcsfuse, and give the mounted path: every host must see the same directory)"
        )
    run_dir = Path(run_dir)
    if RunDir(run_dir).converted():
        raise UserError(
            f"{run_dir} holds a converted checkpoint (parameters only, no optimizer state): training does not resume "
            "from it; train into a new --out"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    check_run_config(run_dir, cfg)
    finished = _finished_result(run_dir, cfg)
    if finished is not None:  # nothing left to do: leave the run as it is
        return finished
    if is_primary():
        RunDir(run_dir).write_config(dump_config(cfg))
    corpus = corpus if corpus is not None else load_corpus_from_config(cfg.data)
    task = make_task(cfg, corpus, run_dir)
    check_fingerprints(run_dir, task)
    run = _Run(cfg, run_dir, Trainer(cfg, task), corpus)
    try:
        run.loop(progress, stop_after)
    finally:
        run.close()
    result = run.result()
    barrier("bytelm: train returns")  # every process returns after process 0 has written the records
    return result
