"""A run's model for scoring and sampling: its family's task, its parameters on a mesh and the
jitted scoring program, and nothing of training (no optimizer, no optimizer state, no weight
average beside the weights scored). :func:`bytelm.training.restore.restore_scorer` fills one from
a checkpoint; the trainer scores its evaluations through the same functions
(:func:`place_batch`, :func:`score_rows`)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from flax import nnx

from bytelm.bpb import SegmentScores, score_segments
from bytelm.config import Config
from bytelm.errors import UserError
from bytelm.families import STATS_KEY, Task
from bytelm.models.core import is_hashed_ngram_table, is_lookup_table
from bytelm.training.distributed import gather_rows
from bytelm.training.sharding import batch_sharding, param_shardings

# scoring programs by model graph, shared by every scorer of one model shape in the process
_SCORING: dict = {}
_SCORING_LIMIT = 64


def scoring_program(graphdef) -> Callable:
    """``(params, batch) -> (nll_BxT, nbytes_BxT, steps_B)``: the family's ``model.score`` jitted,
    once per model shape."""
    program = _SCORING.get(graphdef)
    if program is None:
        if len(_SCORING) >= _SCORING_LIMIT:
            _SCORING.clear()

        def positions(params, batch):
            s = nnx.merge(graphdef, params).score(batch)
            return s.nll_BxT, s.nbytes_BxT, s.steps_B

        program = _SCORING[graphdef] = jax.jit(positions)
    return program


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


def place_batch(mesh, batch: dict, *, whole: bool = False) -> dict:
    """The batch's arrays on ``mesh``, rows split over its data axes (its host-side counts,
    ``batch[STATS_KEY]``, stay behind). The rows are this process's (training batches are made per
    process); ``whole``: the batch is the global one, the same on every process, which keeps the rows
    its devices hold."""
    out = {}
    for k, v in batch.items():
        if k == STATS_KEY:
            continue
        sharding = batch_sharding(mesh, v.ndim)
        if whole and jax.process_count() > 1:
            index = [i for i in sharding.addressable_devices_indices_map(v.shape).values() if i is not None]
            lo = min(i[0].start or 0 for i in index)
            hi = max(len(v) if i[0].stop is None else i[0].stop for i in index)
            out[k] = jax.make_array_from_process_local_data(sharding, v[lo:hi], v.shape)
        else:
            out[k] = jax.make_array_from_process_local_data(sharding, v)
    return out


def score_rows(
    task: Task,
    program: Callable,
    params,
    mesh,
    segments: list[bytes],
    batch_size: int,
    on_batch: Callable[[dict, int], None] | None = None,
) -> SegmentScores:
    """Score ``segments`` with ``params`` by ``program`` (:func:`scoring_program`), ``batch_size``
    segments per batch (the evaluation protocol). ``on_batch(batch, n_real_rows)`` sees every
    host-side eval batch (with its family-specific arrays, e.g. BLT patch lengths) before it is
    scored."""

    def rows(batch):
        # per-position values summed here in float64, in one fixed order: a segment's total does
        # not pick up the float32 reduction order of a program shaped by its batch
        # (every process builds the same global batch, scores its rows, and gets every row back)
        nll_BxT, nbytes_BxT, steps_B = program(params, place_batch(mesh, batch, whole=True))
        return (
            gather_rows(nll_BxT).astype(np.float64).sum(axis=1),
            gather_rows(nbytes_BxT).astype(np.float64).sum(axis=1),
            None if steps_B is None else gather_rows(steps_B).astype(np.float64),
        )

    def observed(batches, see: Callable[[dict, int], None]):
        for batch, n_real in batches:
            see(batch, n_real)
            yield batch, n_real

    batches = task.eval_batches(segments, batch_size)
    if on_batch is not None:
        batches = observed(batches, on_batch)
    return score_segments(rows, batches, [len(s) for s in segments])


def check_eval_batch(cfg: Config, mesh) -> None:
    """``eval.batch_size`` must split over the data-parallel devices."""
    n_batch_shards = mesh.shape["data"] * mesh.shape["fsdp"]
    if cfg.eval.batch_size % n_batch_shards:
        raise UserError(
            f"eval.batch_size {cfg.eval.batch_size} is not divisible by the data-parallel mesh size "
            f"{n_batch_shards}"
        )


class Scorer:
    """A run's model (see the module docstring): :attr:`params` start abstract (shapes, dtypes and
    shardings on ``mesh``) until a checkpoint fills them; :attr:`step` is the checkpoint's."""

    def __init__(self, cfg: Config, task: Task, mesh):
        check_eval_batch(cfg, mesh)
        self.cfg, self.task, self.mesh = cfg, task, mesh
        abstract_model = nnx.eval_shape(lambda: task.build_model(nnx.Rngs(jax.random.key(cfg.train.seed))))
        self.graphdef, abstract_state = nnx.split(abstract_model, nnx.Param)
        self.param_shardings = param_shardings(abstract_state, mesh)
        self.params = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            abstract_state,
            self.param_shardings,
        )
        self.step = 0
        self._program = scoring_program(self.graphdef)

    @property
    def model_params(self):
        """The weights scored (the run's average with ``train.ema_decay``: what its checkpoint keeps)."""
        return self.params

    @property
    def model(self) -> nnx.Module:
        """The model with its weights, for sampling and export."""
        return nnx.merge(self.graphdef, self.params)

    @property
    def param_counts(self) -> dict:
        return count_params(self.params)

    def evaluate(
        self,
        segments: list[bytes],
        *,
        on_batch: Callable[[dict, int], None] | None = None,
        batch_size: int | None = None,
    ) -> SegmentScores:
        """Score ``segments`` (:func:`score_rows`), ``batch_size`` (default ``eval.batch_size``) per batch."""
        return score_rows(
            self.task,
            self._program,
            self.params,
            self.mesh,
            segments,
            batch_size or self.cfg.eval.batch_size,
            on_batch,
        )
