"""What a run records as it trains besides its checkpoints: the lines of ``metrics.jsonl`` (also
sent to TensorBoard and Weights & Biases when asked: :class:`Metrics`), and the throughput and MFU
its progress lines report (:class:`Throughput`)."""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

from bytelm.atomic import atomic_write_text
from bytelm.errors import UserError
from bytelm.rundir import RunDir, upload_directory, write_text
from bytelm.training.distributed import is_primary

log = logging.getLogger(__name__)


class Metrics:
    """Appends JSON lines to the run's ``metrics.jsonl``; on resume, drops records past the restored
    step (and a torn last line). Only the primary process writes (the others' records are the same
    numbers). In an object store, where nothing can be appended, the records (and TensorBoard's
    event files, written to a local staging directory) are uploaded whole by :meth:`sync`: at each
    checkpoint, every :attr:`SYNC_S` seconds and at the end."""

    SYNC_S = 60.0

    def __init__(
        self,
        files: RunDir,
        resume_step: int,
        *,
        tensorboard: bool = False,
        wandb_project: str = "",
        config: dict | None = None,
    ):
        self.files = files
        self.file = None
        self.board = None
        self.wandb = None
        self.lines: list[str] | None = None  # (a run in an object store: every record, uploaded whole)
        self.staging: Path | None = None
        self.synced = time.monotonic()
        if not is_primary():
            return
        path = files.metrics_path
        kept = [r for r in files.metrics() if r.get("step", 0) <= resume_step]
        if files.remote:
            self.lines = [json.dumps(r) + "\n" for r in kept]
            self.staging = Path(tempfile.mkdtemp(prefix="bytelm-run-"))
        else:
            if path.exists():
                atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
            self.file = open(path, "a")
        local = self.staging if self.staging is not None else files.path
        if tensorboard:
            from tensorboardX import SummaryWriter  # noqa: PLC0415

            # (a resumed run's writer purges the events past its step, as metrics.jsonl drops them)
            self.board = SummaryWriter(str(local / "tensorboard"), purge_step=resume_step + 1, flush_secs=10)
        if wandb_project:
            try:
                import wandb  # noqa: PLC0415
            except ImportError:
                raise UserError(
                    f"train.wandb_project = {wandb_project!r} needs Weights & Biases: "
                    "pip install -e '.[wandb]' (or set train.wandb_project = \"\")"
                ) from None
            # one W&B run per run directory, resumed with it (its id derives from the directory)
            where = str(files.path) if files.remote else str(files.path.absolute())
            run_id = hashlib.sha256(where.encode()).hexdigest()[:16]
            self.wandb = wandb.init(
                project=wandb_project,
                dir=str(local),
                id=run_id,
                name=files.path.name,
                resume="allow",
                config=config or {},
            )

    def write(self, record: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        elif self.lines is not None:
            self.lines.append(json.dumps(record) + "\n")
            if time.monotonic() - self.synced > self.SYNC_S:
                self.sync()
        if (self.board is None and self.wandb is None) or record.get("kind") not in ("train", "eval"):
            return
        scalars = {
            f"{record['kind']}/{k}": v
            for k, v in record.items()
            if k not in ("kind", "step") and isinstance(v, int | float) and not isinstance(v, bool)
        }
        if self.board is not None:
            for tag, value in scalars.items():
                self.board.add_scalar(tag, value, record["step"])
        if self.wandb is not None:
            self.wandb.log(scalars, step=record["step"])

    def sync(self) -> None:
        """Upload the records and the event files (a run in an object store; on disk they are
        written as they come)."""
        if self.lines is None:
            return
        write_text(self.files.metrics_path, "".join(self.lines))
        if self.board is not None:
            self.board.flush()
            upload_directory(self.staging / "tensorboard", self.files.path / "tensorboard")  # type: ignore[operator]
        self.synced = time.monotonic()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.board is not None:
            self.board.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.lines is not None:
            try:
                self.sync()
            finally:
                shutil.rmtree(self.staging, ignore_errors=True)  # type: ignore[arg-type]
                self.lines = None


class Throughput:
    """The rates of the progress lines: seconds per step, bytes per second and MFU, averaged over the
    log intervals of the last :attr:`WINDOW_S` seconds of training time (evaluations excluded), so
    that consecutive lines are comparable. ``peak_total``: the job's peak FLOP/s (None: no MFU)."""

    WINDOW_S = 30.0

    def __init__(self, flops_per_step: float, peak_total: float | None, peak_source: str) -> None:
        self.flops_per_step, self.peak_total, self.peak_source = flops_per_step, peak_total, peak_source
        self.intervals: collections.deque = collections.deque()  # (seconds, steps, bytes) of recent logs
        self.warned_peak = False

    def window(self, step_s: float, steps_logged: int, nbytes: float) -> tuple[float, float]:
        """``(seconds per step, bytes per second)`` over the recent intervals (this one included)."""
        self.intervals.append((step_s * steps_logged, steps_logged, nbytes * steps_logged))
        while len(self.intervals) > 1 and sum(x[0] for x in self.intervals) - self.intervals[0][0] >= (
            self.WINDOW_S
        ):
            self.intervals.popleft()
        seconds_ = sum(x[0] for x in self.intervals)
        return seconds_ / sum(x[1] for x in self.intervals), sum(x[2] for x in self.intervals) / seconds_

    def mfu(self, step_s: float) -> tuple[float | None, float | None]:
        """``(MFU, FLOP/s over the peak)``: MFU when there is a peak and the ratio is at most 1; a
        ratio above 1 is not an MFU (the configured peak is below what was achieved) and is returned
        second, with a warning once."""
        if self.peak_total is None or step_s <= 0:
            return None, None
        ratio = self.flops_per_step / step_s / self.peak_total
        if ratio <= 1.0:
            return ratio, None
        if not self.warned_peak:
            log.warning(
                "the achieved %.3g FLOP/s exceed the peak MFU is measured against (%.3g, %s): no MFU is "
                "printed; set train.peak_flops to the devices' real peak",
                self.flops_per_step / step_s,
                self.peak_total,
                self.peak_source,
            )
            self.warned_peak = True
        return None, ratio
