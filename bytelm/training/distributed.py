"""Multi-host training on JAX's own runtime: ``jax.distributed``, one process per host.

Every process runs the same program on its own slice of each batch (the global batch is split by
``jax.process_index()``, :class:`~bytelm.data.batches.WindowBatches`); the mesh spans every
process's devices, so XLA's collectives (NCCL on GPU, ICI on TPU, Gloo on CPU) do the rest.
Process 0 alone writes the run's records (``config.toml``, ``run.json``, ``metrics.jsonl``);
orbax writes checkpoints collectively (each process its own shards, process 0 the metadata).

Ways to start (``bytelm train ... --distributed`` or ``--coordinator``, docs/scaling.md):

- **auto** (``--distributed``): ``jax.distributed.initialize()`` with no arguments, which reads
  the cluster from the environment on Cloud TPU VMs, SLURM (``srun``), Open MPI and Kubernetes
  JobSets;
- **explicit** (``--coordinator HOST:PORT --num-processes N --process-id I``): any cluster, and
  two processes on one machine (the tests do this with CPU devices and Gloo collectives).
"""

from __future__ import annotations

import logging

import jax
import numpy as np

from bytelm.errors import UserError

log = logging.getLogger(__name__)


def initialize(
    *,
    auto: bool = False,
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
    """Join the job's processes (module docstring); returns False when nothing was asked for.

    Must run before the first JAX computation. Raises :class:`~bytelm.errors.UserError` for an
    incomplete or inconsistent explicit layout, naming the option to fix.
    """
    explicit = {"--coordinator": coordinator, "--num-processes": num_processes, "--process-id": process_id}
    given = {k for k, v in explicit.items() if v is not None}
    if not auto and not given:
        return False
    if auto and given:
        raise UserError(
            f"--distributed reads the cluster from the environment; drop {', '.join(sorted(given))} or "
            "--distributed"
        )
    if given and len(given) < 3:
        missing = sorted(set(explicit) - given)
        raise UserError(
            "an explicit process layout needs --coordinator, --num-processes and --process-id; missing "
            f"{', '.join(missing)}"
        )
    if coordinator is not None and num_processes is not None and process_id is not None:  # all three given
        if ":" not in coordinator or not coordinator.rsplit(":", 1)[1].isdigit():
            raise UserError(
                f"--coordinator {coordinator!r} must be HOST:PORT (the address of process 0), e.g. "
                "10.0.0.1:1234"
            )
        if num_processes < 1:
            raise UserError(f"--num-processes must be >= 1, got {num_processes}")
        if not 0 <= process_id < num_processes:
            raise UserError(
                f"--process-id must lie in [0, --num-processes {num_processes}), got {process_id}"
            )
    # CPU devices need a collectives implementation to talk across processes (GPU and TPU have theirs)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if given:
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
        )
    else:
        try:
            jax.distributed.initialize()
        except (ValueError, RuntimeError) as e:
            raise UserError(
                "--distributed could not find the cluster from the environment "
                f"({str(e).splitlines()[0][:200]}); outside TPU pods, SLURM, Open MPI and Kubernetes give "
                "--coordinator, --num-processes and --process-id"
            ) from None
    # (process 0 at INFO; the others before their logging is quieted: DEBUG, as their INFO would be)
    log.log(
        logging.INFO if jax.process_index() == 0 else logging.DEBUG,
        "process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return True


def is_primary() -> bool:
    """Whether this process writes the run's records (process 0; the only one without ``jax.distributed``)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Every process waits here until all have arrived (a no-op in a single process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def gather_rows(x) -> np.ndarray:
    """A (possibly multi-process) array as one host numpy array, the same on every process."""
    if jax.process_count() == 1 or getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def load_job_corpus(data_cfg, *, progress=None):
    """The job's corpus: process 0 prepares it (or finds it prepared); the others wait for it at a
    barrier and then open it, never build it (N hosts building one corpus is N-1 wasted builds,
    or N copies). A host that cannot see process 0's cache gets an error naming the fix."""
    from bytelm.data import load_corpus_from_config

    def prepare():
        return load_corpus_from_config(data_cfg, progress=progress, workers=data_cfg.workers)

    if jax.process_count() == 1:
        return prepare()
    corpus, failure = None, None
    if is_primary():
        try:
            corpus = prepare()
        except Exception as e:  # (the others must still pass the barrier, then fail in turn)
            failure = e
    barrier("bytelm: the corpus is prepared")
    if failure is not None:
        raise failure
    return corpus if corpus is not None else load_corpus_from_config(data_cfg, build=False)


def agree(signalled: bool, finished: bool, horizon: int | None) -> tuple[bool, bool, int | None]:
    """One decision for every process after a step (a no-op in one process): stop for a signal if
    **any** process got one (a preempted host stops the whole job at the same step, checkpointed,
    instead of leaving the others waiting in the next collective), and process 0's clock for the
    time budget: whether the run is finished and the schedule's planned horizon (so every host
    trains with the same learning rate and stops at the same step, whatever its own clock says).
    One small all-gather of three integers per step."""
    if jax.process_count() == 1:
        return signalled, finished, horizon
    from jax.experimental import multihost_utils

    mine = np.array([int(signalled), int(finished), -1 if horizon is None else int(horizon)], np.int64)
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), 3)
    first = every[0]
    return bool(every[:, 0].any()), bool(first[1]), None if first[2] < 0 else int(first[2])


def configure_process_logging(process_index: int | None = None, process_count: int | None = None) -> None:
    """In a job of several processes, process 0 logs as configured (progress, INFO, summaries); every
    other process logs WARNING and above only, each line prefixed with its index, so a pod's log
    is one process's log plus the others' problems."""
    index = jax.process_index() if process_index is None else process_index
    count = jax.process_count() if process_count is None else process_count
    if count == 1 or index == 0:
        return
    root = logging.getLogger()
    root.setLevel(max(root.level, logging.WARNING))
    for handler in root.handlers:
        fmt = (
            handler.formatter._fmt if handler.formatter is not None else "%(levelname)s %(name)s: %(message)s"
        )
        handler.setFormatter(logging.Formatter(f"[process {index}] {fmt}"))
