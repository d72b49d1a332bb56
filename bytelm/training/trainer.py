"""The one trainer (docs/architecture.md): every family's model, its state on a mesh, and its
compiled step (:mod:`bytelm.training.programs`). Shape-first initialisation on a mesh
(``eval_shape`` -> shardings -> ``jit(init, out_shardings=...)``), a jitted step with donated state
and gradient accumulation, scoring for evaluations. The loop around it is
:mod:`bytelm.training.loop`; restoring a run, :mod:`bytelm.training.restore`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bytelm.config import Config, config_to_dict, load_run_config
from bytelm.errors import UserError
from bytelm.families import Task
from bytelm.rundir import RunDir
from bytelm.training.optim import schedule_plan
from bytelm.training.programs import StepSpec, ema_weight, shared_init, shared_programs
from bytelm.training.scorer import check_eval_batch, count_params, place_batch, score_rows, scoring_program
from bytelm.training.sharding import make_mesh, param_shardings, state_shardings

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
    train_s: float | None = (
        None  # training time (compilation included, evaluations not), summed across resumes
    )
    # the signal this process received (SIGINT: a user's Ctrl-C; SIGTERM: a scheduler's notice), None
    # when another process's signal stopped the job or none did
    signum: int | None = None
    # the trainer at the end of this invocation (None when the run had finished before): its state is
    # the last checkpoint's, so evaluating it equals evaluating the restored run, without the restore
    trainer: Trainer | None = dataclasses.field(default=None, repr=False, compare=False)


def check_run_config(run_dir: Path, cfg: Config) -> int | None:
    """Refuse to resume a run directory whose recorded config disagrees with ``cfg``, naming every key
    that differs, except ``train.steps`` raised (a step-planned run is extended: docs/architecture.md,
    "Extending a run"); returns the recorded ``train.steps`` then, else None."""
    rd = RunDir(run_dir)
    if not rd.has_config():
        return None
    try:
        old = config_to_dict(load_run_config(rd))
    except UserError as e:
        raise UserError(
            f"the run directory {run_dir} has an unreadable config ({e}); use a new --out"
        ) from None
    new = config_to_dict(cfg)
    diffs = []
    extended_from = None
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section, {}), new.get(section, {})
        for key in sorted(set(a) | set(b)):
            if (section, key) in RESUMABLE_CHANGES:
                continue
            if a.get(key) == b.get(key):
                continue
            budgeted = any(x.get(k) for x in (a, b) for k in ("time_budget_s", "flop_budget"))
            if (section, key) == ("train", "steps") and not budgeted and b[key] > a[key]:
                extended_from = int(a[key])  # an extension: more steps, the rest the same
                continue
            why = ""
            if (section, key) == ("train", "steps"):
                why = " (a run can be extended to more steps, not shortened; a time-budgeted one by time)"
            diffs.append(f"{section}.{key}: checkpoint has {a.get(key)!r}, now {b.get(key)!r}{why}")
    if diffs:
        raise UserError(
            f"the run directory {run_dir} holds a run with a different config, so it cannot be resumed: "
            + "; ".join(diffs)
            + ". Use a new --out directory, or the original config."
        )
    return extended_from


def default_mesh(cfg: Config):
    """The config's mesh; on one CPU host with the default layout (data=-1, fsdp=tensor=1), the
    largest number of (virtual) devices that divides both the micro-batch and the eval batch, so
    any batch size works (see :mod:`bytelm.training.host`). Several processes use every device."""
    t = cfg.train
    devices = jax.devices()
    if (
        jax.default_backend() == "cpu"
        and jax.process_count() == 1
        and (t.mesh_data, t.mesh_fsdp, t.mesh_tensor) == (-1, 1, 1)
    ):
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


class Trainer:
    """Holds the compiled step and state for one run; :func:`train` drives it."""

    def __init__(self, cfg: Config, task: Task, mesh=None, *, init: bool = True):
        """``init=False``: the parameters and the optimizer state are abstract (shapes, dtypes and
        shardings, nothing allocated or compiled), for a trainer whose state a checkpoint is about
        to fill (to score, :func:`~bytelm.training.restore.restore_scorer` fills a
        :class:`~bytelm.training.scorer.Scorer` instead)."""
        self.cfg = cfg
        self.task = task
        self.mesh = mesh if mesh is not None else default_mesh(cfg)
        n_batch_shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        micro = cfg.train.batch_size // cfg.train.grad_accum
        if micro % n_batch_shards:
            raise UserError(
                f"the micro-batch train.batch_size/train.grad_accum = {micro} is not divisible by the "
                f"data-parallel mesh size (data x fsdp = {n_batch_shards}); change train.batch_size or the "
                "mesh"
            )
        check_eval_batch(cfg, self.mesh)
        seed = cfg.train.seed
        abstract_model = nnx.eval_shape(lambda: task.build_model(nnx.Rngs(jax.random.key(seed))))
        self.graphdef, abstract_state = nnx.split(abstract_model, nnx.Param)
        self.param_shardings = param_shardings(abstract_state, self.mesh)
        # nnx.Rngs(seed) and nnx.Rngs(jax.random.key(seed)) draw the same numbers
        if init:
            self.params = shared_init(self.graphdef, self.mesh, self.param_shardings, task.build_model)(
                np.int32(seed)
            )
        else:
            self.params = jax.tree.map(
                lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                abstract_state,
                self.param_shardings,
            )
        self.programs = shared_programs(self.graphdef, StepSpec.of(cfg.train))
        self.tx = self.programs.tx
        self._lr = self.programs.lr
        # the step at which the schedule ends: train.steps, or what a time-budgeted run plans
        self.horizon = cfg.train.steps
        # the step the schedule's current segment began at: 0, or where the run was extended
        self.segment_start = 0
        # Every leaf on the mesh from the start, placed as the parameters are (FSDP shards Adam's moments
        # too), the step counts replicated (sharding.state_shardings): a leaf that only lands on the mesh
        # after the first step would make the second step compile again.
        abstract_opt = jax.eval_shape(self.programs.opt_init, self.params)
        self.opt_shardings = state_shardings(abstract_opt, self.params)
        if init:
            self.opt_state = self.programs.placed_opt_init(self.mesh, self.opt_shardings)(self.params)
        else:
            self.opt_state = jax.tree.map(
                lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                abstract_opt,
                self.opt_shardings,
            )
        # train.ema_decay: the weight average (what evaluate scores; the checkpoints' "ema"), else None
        self.ema = None
        if cfg.train.ema_decay > 0:
            self.ema = jax.tree.map(jnp.copy, self.params) if init else self.params
        self.step = 0
        self.last_plan: dict | None = None  # the schedule_plan of the latest step
        self._train_step, self._score_positions = (
            self._on_mesh(self.programs.train_step),
            scoring_program(self.graphdef),
        )
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
        """The batch on this trainer's mesh (:func:`~bytelm.training.scorer.place_batch`)."""
        return place_batch(self.mesh, batch, whole=whole)

    def train_step(self, batch: dict) -> dict:
        # arguments: a new horizon (or learning rate, or warmup) does not compile the step again
        plan = self.last_plan = schedule_plan(self.cfg.train, self.horizon, self.segment_start)
        seed_step = np.asarray([self.cfg.train.seed, self.step], np.uint32)
        if self.ema is None:
            self.params, self.opt_state, metrics = self._train_step(
                self.params, self.opt_state, self.device_batch(batch), plan, seed_step
            )
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
        self,
        segments: list[bytes],
        *,
        on_batch: Callable[[dict, int], None] | None = None,
        batch_size: int | None = None,
    ):
        """Score ``segments`` with the model's weights (:attr:`model_params`; the evaluation protocol,
        :func:`~bytelm.training.scorer.score_rows`), ``batch_size`` (default ``eval.batch_size``)
        segments per batch; ``on_batch(batch, n_real_rows)`` sees every host-side eval batch."""
        return score_rows(
            self.task,
            self._score_positions,
            self.model_params,
            self.mesh,
            segments,
            batch_size or self.cfg.eval.batch_size,
            on_batch,
        )

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
            return jax.device_put(
                new, old.sharding if set(old.sharding.device_set) == mesh_devices else replicated
            )

        tree = jax.tree.map(place, tree, self.state_tree())
        self.params, self.opt_state, self.ema = tree["params"], tree["opt_state"], tree.get("ema")
