"""The time budget of a run: its training time, summed across resumes, and the learning-rate
schedule's horizon planned from its pace (``train.time_budget_s``)."""

from __future__ import annotations

import contextlib
import os
import time

# A test-only hook: this process's clock runs at this rate (tests/test_multihost.py skews one
# process's clock to check that every process follows process 0's).
_RATE = float(os.environ.get("BYTELM_TEST_CLOCK_RATE", "1") or 1)


def _now() -> float:
    return time.perf_counter() * _RATE


class Clock:
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
        self.t0, self.paused_s = _now(), 0.0
        self.stopped_at: float | None = None
        self.mark: float | None = None
        self.mark_steps = 0
        self.step_s: float | None = None

    def start(self) -> None:
        """The clock runs from the training loop's start (set-up, e.g. a matmul-peak measurement, is not
        training)."""
        self.t0, self.paused_s, self.stopped_at = _now(), 0.0, None

    def stop(self) -> None:
        """Training has stopped: the final checkpoint and records do not count."""
        self.stopped_at = self.spent()

    def spent(self) -> float:
        if self.stopped_at is not None:
            return self.stopped_at
        return self.spent0 + _now() - self.t0 - self.paused_s

    @contextlib.contextmanager
    def paused(self):
        t = _now()
        try:
            yield
        finally:
            self.paused_s += _now() - t

    def plan(self, step: int, steps_this_run: int) -> bool:
        """Called after every step; True when it has just (re)planned :attr:`horizon`."""
        if not self.replanning:
            return False
        if steps_this_run == 1:
            self.mark, self.mark_steps = self.spent(), 1
            return False
        planned = self.horizon
        if planned is None:  # the first plan: after the probe steps
            if steps_this_run != 1 + self.PROBE_STEPS:
                return False
        else:  # a re-plan: at a doubling of the run's steps
            if steps_this_run & (steps_this_run - 1) or steps_this_run <= 1 + self.PROBE_STEPS:
                return False
            # a warmup that does not fit the planned horizon (a budget of a few steps) is not re-planned:
            # a later horizon would stretch the warmup the steps already taken ran with
            if not self.warmup < planned - 1:  # else the horizon stays
                self.replanning = False
                return False
            if step >= planned:  # the run has ended (the caller stops at the horizon)
                return False
        spent = self.spent()
        mark = spent if self.mark is None else self.mark
        step_s = (spent - mark) / (steps_this_run - self.mark_steps)
        self.mark, self.mark_steps = spent, steps_this_run
        if planned is not None and not self._early(
            step, planned
        ):  # late: only a plan that misses the budget is corrected
            end_s = spent + (planned - step) * step_s
            if abs(end_s - self.budget_s) <= self.LATE_MISS * self.budget_s:
                return False
        self.step_s = step_s
        horizon = step + max(0, int((self.budget_s - spent) / max(step_s, 1e-9)))
        # a re-plan keeps the warmup whole, so the steps already taken keep their learning rates
        self.horizon = max(horizon, self.warmup + 2) if planned is not None else horizon
        return True

    def _early(self, step: int, horizon: int) -> bool:
        """Inside the warmup, or the first :attr:`REPLAN_DECAY` of the decay, of the plan ending at
        ``horizon``."""
        return step < self.warmup or step - self.warmup <= self.REPLAN_DECAY * (horizon - self.warmup)

    def exhausted(self, step: int) -> bool:
        return self.spent() >= self.budget_s or (self.horizon is not None and step >= self.horizon)
