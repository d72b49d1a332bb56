"""The FLOP budget of a run whose family measures what its steps spend (``train.flop_budget``,
:meth:`~bytelm.families.base.Task.measured_train_flops`): its measured own FLOPs, summed across
resumes, the step at which it stops, and the learning-rate schedule's horizon planned from them,
as :mod:`bytelm.training.clock` plans a time budget's from its pace.

An H-Net's planned FLOPs assume its target chunk rate, but its router learns another one (at the
default compare, 4.32 bytes per chunk in training against N = 6: its main network ran on more
chunks than planned, about 1.11x the planned FLOPs). With a FLOP budget such a run is charged what
every step measured and trains until that reaches the budget; ``train.steps`` is the first plan."""

from __future__ import annotations

from bytelm.ledger import Ledger
from bytelm.training.clock import Clock


class FlopBudget:
    """A run's measured own training FLOPs (:attr:`spent`, through step :attr:`step`: the steps
    whose measurement has been read) and, with a budget (> 0), its stop and its horizon.

    **The stop**: after the first step ``k`` whose total (measured own + the ledger's auxiliary
    FLOPs) reaches the budget less half the mean cost of a step so far (own + auxiliary, the total
    over ``k``): the step whose total is nearest the budget, as :meth:`Ledger.steps_for` rounds, so
    the final total is within about half a step of it. The rule reads the measured total and the
    step only, both kept in checkpoints, so a resumed run stops where the uninterrupted one does.

    **The horizon**: ``train.steps`` (planned on the target rates) until the measurements re-plan
    it, at every doubling of the run's steps (2, 4, 8, ...) from the FLOPs per step since the
    previous doubling, while the run is inside its warmup or the first :attr:`Clock.REPLAN_DECAY`
    of its decay, and later only to correct a plan that would end more than
    :attr:`Clock.LATE_MISS` of the budget early or late. Unlike a time budget's, the plan of a
    resumed run goes on (its horizon and the previous doubling's mark are checkpointed: the plans
    are a function of the measurements, which a resumed run reproduces)."""

    def __init__(
        self,
        budget: float,
        ledger: Ledger,
        horizon: int,
        warmup: int,
        *,
        spent: float = 0.0,
        step: int = 0,
        mark: tuple[int, float] | None = None,
    ):
        self.budget, self.ledger, self.horizon, self.warmup = budget, ledger, horizon, warmup
        self.spent, self.step = spent, step
        self.mark = mark if mark is not None else (step, spent)  # (step, spent) at the previous doubling
        self.pace: float | None = None  # FLOPs per step (own + auxiliary) of the latest plan

    def add(self, step: int, flops: float) -> None:
        """Step ``step`` (the next one) spent ``flops`` own training FLOPs."""
        self.spent += flops
        self.step = step

    def total(self) -> float:
        """Own + auxiliary FLOPs through :attr:`step`."""
        return self.spent + self.ledger.auxiliary(self.step)

    def per_step(self) -> float:
        """The mean cost of a step so far, own + auxiliary (the planned one before any)."""
        if not self.step:
            return self.ledger.own_per_step + self.ledger.auxiliary_per_step
        return (self.spent + self.ledger.auxiliary_per_step * self.step) / self.step

    def reached(self) -> bool:
        """The stop rule (above) holds at :attr:`step`."""
        return self.budget > 0 and self.total() + self.per_step() / 2 >= self.budget

    def near(self, step: int) -> bool:
        """Step ``step`` (its measurement not read yet) might end the run: the total through
        :attr:`step`, the unread steps at twice the mean cost and half a step more reach the budget.
        The loop reads such a step's measurement before it decides (elsewhere it reads each step's
        one step late, so the device queue never empties)."""
        if not self.budget:
            return False
        return self.total() + (2 * (step - self.step) + 0.5) * self.per_step() >= self.budget

    def plan(self, step: int) -> bool:
        """Called after every step (``step``: the run's); True when it has just re-planned
        :attr:`horizon`."""
        if not self.budget or step < 2 or step & (step - 1):  # at doublings of the run's steps
            return False
        if not self.warmup < self.horizon - 1 or step >= self.horizon:
            return False  # a warmup that does not fit the horizon stays whole; an ended run stays
        mark_step, mark_spent = self.mark
        if self.step <= mark_step:
            return False
        own = (self.spent - mark_spent) / (self.step - mark_step)
        self.mark = (self.step, self.spent)
        cost = self.pace = own + self.ledger.auxiliary_per_step  # a step from here on, own + auxiliary
        early = step < self.warmup or step - self.warmup <= Clock.REPLAN_DECAY * (self.horizon - self.warmup)
        if not early:  # late: only a plan that misses the budget is corrected
            end = self.total() + (self.horizon - self.step) * cost
            if abs(end - self.budget) <= Clock.LATE_MISS * self.budget:
                return False
        horizon = self.step + max(0, round((self.budget - self.total()) / max(cost, 1e-30)))
        horizon = max(horizon, self.warmup + 2)  # the warmup stays whole: the steps taken keep their rates
        if horizon == self.horizon:
            return False
        self.horizon = horizon
        return True

    def meta(self) -> dict:
        """What a checkpoint keeps besides the measured total (``stats``) and the horizon."""
        return {"flop_mark": list(self.mark)}
