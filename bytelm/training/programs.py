"""The compiled programs of training: the step (with gradient accumulation, dropout and the weight
average) and the scoring function, jitted once per model shape and :class:`StepSpec`, and shared by
every run of the process that has the same ones; the shared initialisation."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from bytelm.bpb import LN2
from bytelm.config import TrainConfig
from bytelm.training.optim import learning_rate_schedule, make_optimizer
from bytelm.training.scorer import scoring_program


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Everything of the train config that the compiled step closes over: the optimizer and its
    settings, the learning-rate schedule's floor, the gradient accumulation. The programs are built
    from this alone, so no other field can reach them, and runs with equal specs (and models) share
    them: the schedule's peak, warmup and horizon, the seed, the EMA weight and every host-side
    setting enter as arguments or stay on the host."""

    optimizer: str
    beta1: float
    beta2: float
    muon_momentum: float
    weight_decay: float
    grad_clip: float
    embedding_lr_scale: float
    min_lr_ratio: float
    grad_accum: int

    @classmethod
    def of(cls, train: TrainConfig) -> StepSpec:
        return cls(**{f.name: getattr(train, f.name) for f in dataclasses.fields(cls)})


# Runs of one shape in one process share their jitted step and scoring functions (so a sweep, the
# seeds of a cell or a grid's budgets trace and compile them once): keyed by the model's graph and
# the step's spec.
_PROGRAMS: dict = {}
_PROGRAMS_LIMIT = 64


class Programs:
    """The pure step and scoring functions of one model shape and step spec, jitted once."""

    def __init__(self, graphdef, spec: StepSpec) -> None:
        self.graphdef = graphdef
        self.spec = spec
        self.tx = make_optimizer(spec)
        self.train_step = jax.jit(self._step_fn, donate_argnums=(0, 1))
        self.train_step_ema = jax.jit(self._step_ema_fn, donate_argnums=(0, 1, 5))
        self.score_positions = scoring_program(graphdef)  # (the scorer's: one per model shape)
        self.opt_init = jax.jit(self.tx.init)
        self._placed_inits: dict = {}
        schedule = learning_rate_schedule(spec)
        self.lr = jax.jit(
            lambda count, plan: schedule(count, plan["horizon"], plan["peak"], plan["warmup"], plan["start"])
        )  # one call, not a dozen eager ops

    def placed_opt_init(self, mesh, shardings):
        """The optimizer's initialisation with its state placed by ``shardings`` (a function of this
        model shape and ``mesh``: :func:`bytelm.training.sharding.state_shardings`), jitted once per mesh."""
        init = self._placed_inits.get(mesh)
        if init is None:
            init = self._placed_inits[mesh] = jax.jit(self.tx.init, out_shardings=shardings)
        return init

    def _scores(self, params, batch, dropout_key=None):
        return nnx.merge(self.graphdef, params).score(batch, dropout_key=dropout_key)

    def _sums(self, params, batch, dropout_key=None):
        """``(objective, (nll, count, nbytes, stats))``: the objective is the summed NLL plus a
        family's auxiliary loss times the (constant) count, so that after the division by the
        count the gradient is that of ``mean NLL + aux``."""
        s = self._scores(params, batch, dropout_key)
        nll, count = jnp.sum(s.nll_BxT), jnp.sum(s.mask_BxT)
        objective = nll if s.aux is None else nll + s.aux * jax.lax.stop_gradient(count)
        return objective, (nll, count, jnp.sum(s.nbytes_BxT), dict(s.stats or {}))

    def _step_fn(self, params, opt_state, batch, plan, seed_step=None):
        """One optimizer step. ``seed_step`` (uint32 ``[train.seed, step]``) keys the step's dropout
        (``model.dropout``; micro-batch ``i`` of a gradient accumulation folds in ``i``); None: no
        dropout."""
        accum = self.spec.grad_accum
        grad_fn = jax.value_and_grad(self._sums, has_aux=True)
        key = None if seed_step is None else dropout_key(seed_step)
        if accum == 1:
            (_, (nll, count, nbytes, stats)), grads = grad_fn(params, batch, key)
        else:
            micro = jax.tree.map(lambda x: x.reshape(accum, x.shape[0] // accum, *x.shape[1:]), batch)
            stats_shape = jax.eval_shape(
                lambda mb: self._sums(params, mb)[1][3], jax.tree.map(lambda x: x[0], micro)
            )

            def body(carry, xs):
                g_acc, nll_acc, c_acc, b_acc, s_acc = carry
                mb, i = xs
                (_, (nll, c, b, s)), g = grad_fn(
                    params, mb, None if key is None else jax.random.fold_in(key, i)
                )
                s_acc = jax.tree.map(jnp.add, s_acc, s)
                return (jax.tree.map(jnp.add, g_acc, g), nll_acc + nll, c_acc + c, b_acc + b, s_acc), None

            zeros = jax.tree.map(jnp.zeros_like, params)
            stats0 = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), stats_shape)
            (grads, nll, count, nbytes, stats), _ = jax.lax.scan(
                body, (zeros, 0.0, 0.0, 0.0, stats0), (micro, jnp.arange(accum, dtype=jnp.int32))
            )
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
            "stats": stats,  # a family's summed counts (Scores.stats): the loop adds them to its log's
        }
        return params, opt_state, metrics

    def _step_ema_fn(self, params, opt_state, batch, plan, seed_step, ema, weight):
        """:meth:`_step_fn`, then the weight average moved ``weight`` of the way to the new params
        (:func:`ema_weight`), in one program."""
        params, opt_state, metrics = self._step_fn(params, opt_state, batch, plan, seed_step)
        return params, opt_state, metrics, jax.tree.map(lambda m, p: m + weight * (p - m), ema, params)


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
            lambda seed: nnx.state(build_model(nnx.Rngs(jax.random.key(seed))), nnx.Param),
            out_shardings=shardings,
        )
    return init


def shared_programs(graphdef, spec: StepSpec) -> Programs:
    """The :class:`Programs` of a model shape and step spec, shared by every run of the process that
    has the same ones (the mesh enters through the arguments' shardings)."""
    key = (graphdef, spec)
    programs = _PROGRAMS.get(key)
    if programs is None:
        if len(_PROGRAMS) >= _PROGRAMS_LIMIT:
            _PROGRAMS.clear()
        programs = _PROGRAMS[key] = Programs(graphdef, spec)
    return programs
