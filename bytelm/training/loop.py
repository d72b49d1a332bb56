"""The one training loop: :func:`train` runs (or resumes) a run directory, around a
:class:`~bytelm.training.trainer.Trainer`: checkpoints (periodic, on SIGTERM/SIGINT, keep last N),
``metrics.jsonl`` (:mod:`bytelm.training.metrics`), periodic held-out BPB, ``run.json``, the time
budget. Batches are a pure function of ``(seed, step)`` and the state is restored bit for bit, so a
resumed run reproduces the uninterrupted one on the same machine.

The files of a run directory are :class:`~bytelm.rundir.RunDir`'s.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import jax

from bytelm.config import Config, config_to_dict, dump_config
from bytelm.data.prefetch import Prefetch
from bytelm.errors import UserError
from bytelm.families import STATS_KEY
from bytelm.paths import check_output_dir
from bytelm.rundir import RunDir, check_output_url, run_path, upload_directory
from bytelm.training.check import metrics_line
from bytelm.training.checkpoint import Checkpointer, CheckpointUnreadable
from bytelm.training.clock import Clock
from bytelm.training.distributed import agree, barrier, is_primary, load_job_corpus
from bytelm.training.flop_budget import FlopBudget
from bytelm.training.metrics import Metrics, Throughput
from bytelm.training.peak import device_peak, measure_matmul_peak
from bytelm.training.restore import ensure_run_record, make_task, run_record
from bytelm.training.trainer import (
    Trainer,
    TrainingDiverged,
    TrainResult,
    check_fingerprints,
    check_run_config,
)

log = logging.getLogger(__name__)


class _SignalFlag:
    """Set by SIGTERM/SIGINT; the loop saves a checkpoint (once: a step already saved is not saved
    again) and stops at the end of the step. Installed for the whole of :func:`train`, so a signal
    during the set-up (restoring, compiling) stops the run after its first step, checkpointed."""

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


def eval_slice(corpus, eval_bytes: int) -> list[bytes]:
    """The first segments of the evaluation set, up to ``eval_bytes`` bytes (periodic evals)."""
    out, total = [], 0
    for seg in corpus.segments:
        if total >= eval_bytes:
            break
        out.append(corpus.segment_bytes_of(seg))
        total += seg.length
    return out


def _finished_result(run_dir: Path, cfg: Config) -> TrainResult | None:
    run = RunDir(run_dir).info_or_empty()
    if not run:
        return None
    if run.get("status") != "finished" or (
        run.get("step") != cfg.train.steps and not (cfg.train.time_budget_s or cfg.train.flop_budget)
    ):
        return None  # (a budgeted run's config matches the finished one: check_run_config)
    return TrainResult(
        run_dir,
        run["step"],
        run.get("final_loss", float("nan")),
        run.get("final_eval_bpb"),
        train_s=run.get("train_s"),
    )


class _Run:
    """One invocation of :func:`train` on a run directory: its checkpoints, metrics, periodic
    evaluations and ``run.json``, around the trainer's steps."""

    def __init__(
        self, cfg: Config, run_dir: Path, trainer: Trainer, corpus, extended_from: int | None = None
    ):
        self.cfg, self.run_dir, self.trainer, self.task = cfg, run_dir, trainer, trainer.task
        self.files = RunDir(run_dir)
        self.files.metrics()  # (read first: a damaged record stops the run before any file is touched)
        self.ckpt = Checkpointer(self.files.checkpoints_path, keep=cfg.train.keep_checkpoints)
        self.wall0, self.train_s0, self.horizon0, self.flop_mark0 = 0.0, 0.0, None, None
        # the batches' host-side counts over the whole run (kept in checkpoints)
        self.stats_run: dict[str, float] = {}
        self.last_good_step: int | None = None
        if self.ckpt.steps():
            self.last_good_step, _, skipped = self.ckpt.restore_newest(self._resume)
            if skipped:  # newer checkpoints that do not restore: moved aside, out of the next saves' way
                if is_primary():
                    for step in skipped:
                        log.warning("checkpoint %d moved to %s", step, self.files.set_aside(step))
                barrier("bytelm: damaged checkpoints set aside")
                self.ckpt.reload()
        self.budgeted = cfg.train.time_budget_s > 0
        self.flops_per_step = self.task.train_flops_per_position() * self.task.positions_per_step()
        self.ledger = self.task.ledger()  # own + auxiliary FLOPs (bytelm/ledger.py)
        # a family that measures what its steps spend (H-Net): charged that, and with train.flop_budget
        # trained until it reaches the budget (bytelm/training/flop_budget.py)
        self.measures = self.task.measures_flops()
        self.flops = self._flop_budget() if self.measures else None
        self.flop_budgeted = self.flops is not None and self.flops.budget > 0
        horizon = self.flops.horizon if self.flops is not None and self.flop_budgeted else cfg.train.steps
        self.clock = Clock(
            cfg.train.time_budget_s,
            self.train_s0,
            self.horizon0 if self.budgeted else horizon,
            cfg.train.warmup_steps,
        )
        trainer.horizon = self.clock.horizon if self.clock.horizon is not None else Clock.UNPLANNED
        self.peak_total = self._peak_flops()
        self.throughput = Throughput(self.flops_per_step, self.peak_total, self.peak_source)
        self.info = self._run_info(corpus)
        # an extended run: its schedule's segments (docs/architecture.md, "Extending a run")
        extensions = list(self.files.info_or_empty().get("extensions", [])) if trainer.step else []
        if extended_from is not None and trainer.step:
            extensions.append({"from": trainer.step, "to": cfg.train.steps, "steps_before": extended_from})
            log.info(
                "extending %s from %d to %d steps: the schedule warms up again at step %d and decays to "
                "its floor at %d",
                run_dir,
                extended_from,
                cfg.train.steps,
                trainer.step,
                cfg.train.steps,
            )
        if extended_from is not None and trainer.step:
            trainer.segment_start = trainer.step  # (kept in every checkpoint from here: meta)
        if extensions:
            self.info["extensions"] = extensions
        self.metrics: Metrics | None = Metrics(
            self.files,
            trainer.step,
            tensorboard=cfg.train.tensorboard,
            wandb_project=cfg.train.wandb_project,
            config=config_to_dict(cfg),
        )
        if trainer.step and is_primary():  # (a resumed run: its curves' records up to here)
            lost = metrics_line(run_dir, cfg.train.log_every, trainer.step)
            if lost:
                log.warning("%s", lost)
        self.segments = eval_slice(corpus, cfg.eval.eval_bytes) if cfg.eval.every else []
        self.t_start = time.perf_counter()
        self.last_loss, self.last_eval, self.stopped_by_signal = float("nan"), None, False
        self.signum: int | None = None  # the signal that stopped this process, if its own
        self.profile_staging: Path | None = None  # (a run in a store: the trace's local directory)
        self.stats_log: dict[str, float] = {}  # the batches' host-side counts since the last log line
        self.input_wait_s = 0.0  # time spent waiting for batches since the last log line
        self.finished_agreed: bool | None = None  # the loop's last finished decision, as every process agreed

    # -- setup ----------------------------------------------------------------------------
    def _resume(self, step: int) -> None:
        tree, meta = self.ckpt.restore(step, self.trainer.state_tree())
        data = meta.get("data")
        if not isinstance(data, dict) or data.get("step") != step or data.get("seed") != self.cfg.train.seed:
            raise CheckpointUnreadable(
                step, self.ckpt.directory, f"its data-iterator state {data} is not step {step}'s of this seed"
            )
        self.stats_run = dict(meta.get("stats", {}))
        self.trainer.load_state_tree(tree)
        self.trainer.step = step
        self.wall0 = float(meta.get("wall_s", 0.0))
        self.train_s0 = float(meta.get("train_s", self.wall0))
        self.horizon0 = meta.get("horizon")
        self.flop_mark0 = meta.get("flop_mark")
        self.trainer.segment_start = int(meta.get("segment_start", 0))
        log.info("resumed %s at step %d", self.run_dir, self.trainer.step)

    def _flop_budget(self) -> FlopBudget:
        """The measured FLOPs so far (``stats_run["flops_measured"]``, kept in checkpoints; a run
        checkpointed before they were measured: the planned figure of its steps) and the budget."""
        t, step = self.cfg.train, self.trainer.step
        if t.flop_budget and t.time_budget_s:
            raise UserError("train.flop_budget and train.time_budget_s are two budgets: set one of them")
        spent = float(self.stats_run.get("flops_measured", self.flops_per_step * step))
        self.stats_run["flops_measured"] = spent
        mark = self.flop_mark0
        return FlopBudget(
            t.flop_budget,
            self.ledger,
            int(self.horizon0) if t.flop_budget and self.horizon0 is not None else t.steps,
            t.warmup_steps,
            spent=spent,
            step=step,
            mark=(int(mark[0]), float(mark[1])) if mark else None,
        )

    def _peak_flops(self) -> float | None:
        """The MFU denominator (:mod:`bytelm.training.peak`): the configured per-device peak, else
        the datasheet's bf16 peak of an accelerator, else on an accelerator a measured matmul peak,
        times the job's devices; None on a CPU without ``train.peak_flops`` (no MFU)."""
        n_devices = self.trainer.mesh.devices.size
        backend = jax.default_backend()
        peak, self.peak_source = device_peak(backend, jax.devices()[0].device_kind, self.cfg.train.peak_flops)
        return None if peak is None else peak * n_devices

    def _run_info(self, corpus) -> dict:
        return run_record(self.task, self.trainer, corpus, self.peak_total, self.peak_source)

    # -- records ----------------------------------------------------------------------------
    def wall_s(self) -> float:
        return self.wall0 + time.perf_counter() - self.t_start

    def write_status(self, status: str, **extra) -> None:
        if not is_primary():
            return
        record = {
            **self.info,
            "status": status,
            "step": self.trainer.step,
            # the steps the run is to make (a time or FLOP budget's: the horizon planned so far)
            "planned_steps": self.clock.horizon
            if self.budgeted or self.flop_budgeted
            else self.cfg.train.steps,
            **self.task.stats_record(self.stats_run),
            **self.flops_record(),
            **extra,
        }
        self.files.write_info(record)

    def save(self, step: int) -> None:
        meta = {
            "step": step,
            "wall_s": self.wall_s(),
            "train_s": self.clock.spent(),
            "horizon": self.clock.horizon,
            "data": {"step": step, "seed": self.cfg.train.seed},
            "stats": self.stats_run,
            "segment_start": self.trainer.segment_start,
            **(self.flops.meta() if self.flops is not None else {}),
        }
        self.ckpt.save(step, self.trainer.state_tree(), meta)
        self.last_good_step = step
        if self.metrics is not None:
            self.metrics.sync()  # (a run in an object store: its records up to this checkpoint)

    def bytes_seen(self) -> float:
        return self.trainer.step * self.task.positions_per_step() * self.task.bytes_per_position()

    def finished(self) -> bool:
        """The run has trained for ``train.steps``, or spent its time budget (or reached its planned
        horizon), or its measured FLOPs reached its FLOP budget (:meth:`FlopBudget.reached`, on this
        step's measurement: the loop reads it first when the step is :meth:`FlopBudget.near` the end)."""
        if self.budgeted:
            return self.clock.exhausted(self.trainer.step)
        if self.flop_budgeted:
            return self.flops.step == self.trainer.step and self.flops.reached()  # type: ignore[union-attr]
        return self.trainer.step >= self.cfg.train.steps

    def flops_record(self) -> dict:
        """A measuring run's own training FLOPs through the last step read: ``flops_measured`` (what it
        is charged) and ``flops_planned`` (at the family's planned rates); ``{}`` for any other run."""
        if self.flops is None:
            return {}
        return {"flops_measured": self.flops.spent, "flops_planned": self.flops_per_step * self.flops.step}

    def flops_fields(self) -> dict:
        """The FLOP fields of a metrics record: ``flops`` and ``flops_total`` (the ledger's), measured
        for a measuring run, with ``flops_planned`` beside them."""
        step = self.trainer.step
        if self.flops is None:
            return {"flops": self.flops_per_step * step, "flops_total": self.ledger.total(step)}
        return {
            "flops": self.flops.spent,
            "flops_total": self.flops.total(),
            "flops_planned": self.flops_per_step * self.flops.step,
        }

    def _profile_dir(self) -> Path:
        """Where jax.profiler writes its trace: the run's ``profile/``, or for a run in an object
        store a local staging directory uploaded there when the window ends."""
        if not self.files.remote:
            return self.run_dir / "profile"
        staging = self.profile_staging = Path(tempfile.mkdtemp(prefix="bytelm-profile-"))
        return staging

    def _stop_profile(self) -> None:
        jax.profiler.stop_trace()
        staging = self.profile_staging
        if staging is not None:
            try:
                upload_directory(staging, self.run_dir / "profile")
            finally:
                shutil.rmtree(staging, ignore_errors=True)
                self.profile_staging = None

    def _write(self, record: dict) -> None:
        """A record to ``metrics.jsonl`` (once the loop has opened it)."""
        if self.metrics is not None:
            self.metrics.write(record)

    def log_train(self, m: dict, loss: float, step_s: float, progress, steps_logged: int = 1) -> None:
        trainer, steps = self.trainer, self.clock.horizon
        nbytes = float(m["bytes"])
        window_step_s, window_bytes_s = self.throughput.window(step_s, steps_logged, nbytes)
        mfu, over = self.throughput.mfu(window_step_s)
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
            "mfu": mfu,  # (over the window; None: no peak, or achieved FLOP/s above it)
            **({"flops_over_peak": over} if over is not None else {}),
            "window_bytes_s": window_bytes_s,
            **self.flops_fields(),
            "bytes_seen": self.bytes_seen(),
            "train_s": self.clock.spent(),
            # the time a step waited for its batch (0 while the input pipeline keeps ahead)
            "input_wait_s": self.input_wait_s / max(steps_logged, 1),
            **self.task.stats_record(self.stats_log),
        }
        self.stats_log = {}
        self.input_wait_s = 0.0
        self._write(rec)
        if progress:
            progress(
                trainer.step,
                steps,
                f"loss {loss:.3f} bpb {rec['bpb']:.3f} {window_bytes_s:,.0f} B/s"
                + (f" mfu {mfu:.2f}" if mfu is not None else " mfu >1?" if over is not None else ""),
            )

    def replanned_flops(self) -> None:
        """The FLOP budget re-planned the horizon: the schedule follows, a ``plan`` record says so."""
        flops = self.flops
        assert flops is not None
        self.clock.horizon = self.trainer.horizon = flops.horizon
        self._write(
            {
                "kind": "plan",
                "step": self.trainer.step,
                "planned_steps": flops.horizon,
                "flops_per_step": flops.pace,
                "flops_total": flops.total(),
                "flop_budget": flops.budget,
            }
        )
        log.info(
            "FLOP budget %.3g: %.3g measured FLOPs per step, horizon planned at step %d",
            flops.budget,
            flops.pace,
            flops.horizon,
        )

    def evaluate(self) -> None:
        with self.clock.paused():  # evaluations do not count as training time
            scores = self.trainer.evaluate(self.segments)
        self._write(
            {
                "kind": "eval",
                "step": self.trainer.step,
                "bpb": scores.bpb,
                "nats": scores.total_nats,
                "bytes": scores.total_bytes,
                **self.flops_fields(),
                "bytes_seen": self.bytes_seen(),
            }
        )
        self.last_eval = scores.bpb

    # -- the loop ---------------------------------------------------------------------------
    def loop(self, flag: _SignalFlag, progress, stop_after: int | None) -> None:
        """Train until ``train.steps`` or the time budget (or a signal, or ``stop_after`` steps of
        this invocation), logging, evaluating and checkpointing on their schedules."""
        cfg, trainer = self.cfg, self.trainer
        self.write_status("running")
        batches = self.task.train_batches(trainer.step, jax.process_index(), jax.process_count())
        if cfg.data.prefetch:
            batches = Prefetch(batches, cfg.data.prefetch)
        try:
            self._loop(batches, flag, progress, stop_after)
        finally:
            if isinstance(batches, Prefetch):
                batches.close()

    def _loop(self, batches, flag: _SignalFlag, progress, stop_after: int | None) -> None:
        cfg, trainer, tcfg, clock = self.cfg, self.trainer, self.cfg.train, self.clock
        t_log, steps_since_log, steps_this_run = time.perf_counter(), 0, 0
        pending: tuple[int, dict] | None = None  # the step whose loss has not been read yet, and its metrics

        def settle() -> None:
            """Read the pending step's loss (the host waits for that step only); stop on a non-finite one."""
            nonlocal pending
            if pending is None:
                return
            step, m = pending
            pending = None
            loss = float(m["loss"])
            stats = {key: float(value) for key, value in (m.get("stats") or {}).items()}
            for key, value in stats.items():  # a family's counts from its model (H-Net)
                self.stats_log[key] = self.stats_log.get(key, 0) + value
                self.stats_run[key] = self.stats_run.get(key, 0) + value
            if self.flops is not None:  # what the step spent (the planned figure if its stats do not tell)
                measured = self.task.measured_train_flops(stats)
                self.flops.add(step, self.flops_per_step if measured is None else measured)
                self.stats_run["flops_measured"] = self.flops.spent
            if not math.isfinite(loss):
                self.write_status("diverged", diverged_at_step=step, last_good_checkpoint=self.last_good_step)
                raise TrainingDiverged(
                    f"loss became {loss} at step {step}; the last good checkpoint "
                    f"(step {self.last_good_step}) is kept in {self.files.checkpoints_path}. Lower "
                    "train.learning_rate or raise train.warmup_steps, then resume or start a new run."
                )
            self.last_loss = loss

        clock.start()
        # one finished() decision per step (a time budget can run out between two looks), agreed by
        # every process (see distributed.agree)
        last = self.finished()  # (on entry every process holds the same restored state)
        window, profiling = tcfg.profile_window(), False
        while not (steps_this_run == 0 and last):
            t_wait = time.perf_counter()
            batch = next(batches)
            self.input_wait_s += time.perf_counter() - t_wait
            if window is not None and trainer.step + 1 == window[0]:
                jax.profiler.start_trace(str(self._profile_dir()))
                profiling = True
            for key, n in batch.pop(STATS_KEY, {}).items():
                self.stats_log[key] = self.stats_log.get(key, 0) + n
                self.stats_run[key] = self.stats_run.get(key, 0) + n
            m = trainer.train_step(batch)  # dispatched: the device runs it while the host goes on
            if profiling and trainer.step >= window[1]:  # type: ignore[index]
                jax.block_until_ready(m)
                self._stop_profile()
                profiling = False
                log.info("profile of steps %d:%d written to %s", *window, self.run_dir / "profile")  # type: ignore[misc]
            steps_since_log += 1
            steps_this_run += 1
            if pending is not None:
                settle()  # the previous step's loss, read one step late so the device queue never empties
            pending = (trainer.step, m)
            if clock.plan(trainer.step, steps_this_run) and clock.horizon is not None:
                trainer.horizon = clock.horizon
                self._write(
                    {
                        "kind": "plan",
                        "step": trainer.step,
                        "planned_steps": clock.horizon,
                        "step_s": clock.step_s,
                        "train_s": clock.spent(),
                        "time_budget_s": tcfg.time_budget_s,
                    }
                )
                log.info(
                    "time budget %.0fs: %.3fs per step, horizon planned at step %d",
                    tcfg.time_budget_s,
                    clock.step_s,
                    clock.horizon,
                )
            if self.flop_budgeted:
                if self.flops.near(trainer.step):  # type: ignore[union-attr]
                    settle()  # (the stop is decided on this step's measured FLOPs)
                if self.flops.plan(trainer.step):  # type: ignore[union-attr]
                    self.replanned_flops()
            signalled, last, horizon = agree(flag.signum is not None, self.finished(), clock.horizon)
            if horizon != clock.horizon:  # (another process: process 0's plan is the job's)
                clock.horizon = horizon
                trainer.horizon = horizon if horizon is not None else Clock.UNPLANNED
            log_now = trainer.step % tcfg.log_every == 0 or last
            eval_now = bool(cfg.eval.every) and (trainer.step % cfg.eval.every == 0 or last)
            save_now = trainer.step % tcfg.checkpoint_every == 0
            stop_now = signalled or (stop_after is not None and steps_this_run >= stop_after)
            if log_now or eval_now or save_now or stop_now or last:
                settle()  # this step's loss is needed (or its state is about to be kept)
            if log_now:
                now = time.perf_counter()
                self.log_train(m, self.last_loss, (now - t_log) / steps_since_log, progress, steps_since_log)
                t_log, steps_since_log = now, 0
            if eval_now:
                self.evaluate()
            if save_now:
                self.save(trainer.step)
            if signalled:
                if self.last_good_step != trainer.step:  # (a step saved on schedule is not saved twice)
                    self.save(trainer.step)
                self.stopped_by_signal, self.signum = True, flag.signum
                if flag.signum is not None:
                    log.warning(
                        "signal %d: saved checkpoint at step %d and stopped", flag.signum, trainer.step
                    )
                else:
                    log.warning(
                        "another process got a signal: saved checkpoint at step %d and stopped", trainer.step
                    )
                break
            if stop_after is not None and steps_this_run >= stop_after:
                break
            if last:
                break
        if profiling:  # (the run ended inside the window)
            self._stop_profile()
        if pending is not None:
            settle()
        clock.stop()
        self.finished_agreed = last
        if last and self.last_good_step != trainer.step:  # (the agreed decision: a collective save)
            self.save(trainer.step)

    def close(self) -> None:
        self.ckpt.close()
        if self.metrics is not None:
            self.metrics.close()

    def result(self) -> TrainResult:
        """Record the final status in ``run.json`` and return the result."""
        finished = self.finished_agreed if self.finished_agreed is not None else self.finished()
        done = finished and not self.stopped_by_signal
        budget = {}
        if self.budgeted:
            budget = {"time_budget_s": self.cfg.train.time_budget_s, "planned_steps": self.clock.horizon}
        if self.flop_budgeted:
            budget = {"flop_budget": self.cfg.train.flop_budget, "planned_steps": self.clock.horizon}
        self.write_status(
            "finished" if done else "stopped",
            wall_s=self.wall_s(),
            train_s=self.clock.spent(),
            final_loss=self.last_loss,
            final_eval_bpb=self.last_eval,
            **budget,
        )
        return TrainResult(
            self.run_dir,
            self.trainer.step,
            self.last_loss,
            self.last_eval,
            self.stopped_by_signal,
            self.clock.spent(),
            signum=self.signum,
            trainer=self.trainer,
        )


CPU_DAY_FLOPS = 1e14  # below this many training FLOPs no CPU takes a day (1e14 / 86,400 s = 1.2 GFLOP/s)


def check_not_stranded_on_cpu(cfg: Config, task) -> None:
    """Stop a run that JAX would train on the CPU for more than a day (a small or base preset on a
    machine whose jax is the CPU build) with one line naming the fix; time-budgeted runs pass."""
    if jax.default_backend() != "cpu" or cfg.train.time_budget_s:
        return
    flops = task.train_flops_per_position() * task.positions_per_step() * cfg.train.steps
    if flops < CPU_DAY_FLOPS:
        return
    peak = measure_matmul_peak(1024)
    hours = flops / peak / 3600
    if hours > 24:
        raise UserError(
            f"JAX found no GPU or TPU (its backend is the CPU): this run's {flops:.2e} training FLOPs "
            f"would take about {hours:,.0f} hours at this machine's measured {peak / 1e9:,.0f} GFLOP/s. "
            "Install JAX's accelerator build (pip install -e '.[cuda]' or '.[tpu]'; docs/scaling.md), "
            "or pass --allow-cpu to train here anyway"
        )


def train(
    cfg: Config,
    run_dir: str | Path,
    *,
    progress: Callable[[int, int, str], None] | None = None,
    corpus=None,
    stop_after: int | None = None,
    allow_cpu: bool = True,
) -> TrainResult:
    """Train (or resume) the run in ``run_dir``. ``stop_after`` ends early after that many steps
    of this invocation (tests use it to simulate an interruption). ``allow_cpu=False`` (``bytelm
    train`` without ``--allow-cpu``): a run that would take more than a day on this CPU stops
    before anything is allocated, saying how to get JAX's accelerator build."""
    run_dir = run_path(run_dir)
    files = RunDir(run_dir)
    if files.remote:  # (a missing bucket or no permission: said before anything is written)
        check_output_url(run_dir, "the run directory")
    if files.converted():
        raise UserError(
            f"{run_dir} holds a converted checkpoint (parameters only, no optimizer state): training does "
            "not resume from it; train into a new --out"
        )
    if not files.remote:
        check_output_dir(run_dir, "the run directory")
    created = not files.remote and not Path(run_dir).exists()
    try:
        return _train_locked(cfg, run_dir, files, progress, corpus, stop_after, allow_cpu)
    except BaseException:
        # a run that failed before it wrote anything leaves no directory behind (only its .lock)
        if created and is_primary() and not files.has_config():
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _train_locked(cfg, run_dir, files, progress, corpus, stop_after, allow_cpu) -> TrainResult:
    with files.lock() if is_primary() else contextlib.nullcontext():  # one writer at a time
        extended_from = check_run_config(run_dir, cfg)
        if files.checkpoint_steps():
            ensure_run_record(run_dir, corpus=corpus)
        finished = _finished_result(run_dir, cfg)
        if finished is not None:  # nothing left to do: leave the run as it is
            return finished
        corpus = corpus if corpus is not None else load_job_corpus(cfg.data)
        task = make_task(cfg, corpus, run_dir)
        if not allow_cpu:
            check_not_stranded_on_cpu(cfg, task)
        check_fingerprints(run_dir, task)
        # a run whose evaluations cannot fit its context stops now, not after training
        task.check_context(corpus.segment_data())
        if is_primary():
            files.write_config(dump_config(cfg))
        with _SignalFlag() as flag:
            run = _Run(cfg, run_dir, Trainer(cfg, task), corpus, extended_from=extended_from)
            try:
                run.loop(flag, progress, stop_after)
            except TrainingDiverged:  # (recorded as "diverged" already)
                run.close()
                raise
            except BaseException as e:
                run.close()
                run.write_status("failed", error=f"{type(e).__name__}: {e}"[:1000])
                raise
            run.close()
            result = run.result()
    barrier("bytelm: train returns")  # every process returns after process 0 has written the records
    return result
