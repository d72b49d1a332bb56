"""The compute ledger of a trained model: what it cost to make it, all of it.

A model's **own** FLOPs are its training (analytic, :mod:`bytelm.models.flops` and each family's formula:
FLOPs per step x steps). Its **auxiliary** FLOPs are what it could not exist without: for an entropy-patched
BLT, the training of its entropy model and that model's forward pass over every training byte (the
patches of each batch) and over the calibration sample. **Total** = own + auxiliary, and a
matched budget (``bytelm compare``, ``bytelm ablate``) matches the total: :meth:`Ledger.steps_for`.

Auxiliary work comes in two kinds: per training step (the entropy model's forward over the
step's bytes) and once (the entropy model's training, the calibration), which
:attr:`Ledger.auxiliary_fixed` names one by one. Training a tokenizer is not neural compute and is
not on the ledger (reports say so), nor is a learning-rate selection (every compared model has
one, reported with its runs).

Every run records its ledger in ``run.json`` (``"ledger"``: :meth:`Ledger.record`); evaluation and
reports read it back with :meth:`Ledger.from_record`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from bytelm.errors import UserError


@dataclasses.dataclass(frozen=True)
class Ledger:
    own_per_step: float  # the model's training FLOPs per step (forward + backward)
    auxiliary_per_step: float = (
        0.0  # auxiliary FLOPs per step (an entropy model's forward over the step's bytes)
    )
    auxiliary_fixed: Mapping[str, float] = dataclasses.field(default_factory=dict)  # paid once: name -> FLOPs
    unknown: tuple[
        str, ...
    ] = ()  # auxiliary costs that exist but are not known (a converted entropy model's training)
    per_step_name: str = "auxiliary work per step"  # what auxiliary_per_step pays for, for reports

    def own(self, steps: int) -> float:
        return self.own_per_step * steps

    def auxiliary(self, steps: int) -> float:
        return self.auxiliary_per_step * steps + sum(self.auxiliary_fixed.values())

    def total(self, steps: int) -> float:
        return self.own(steps) + self.auxiliary(steps)

    def steps_for(self, budget: float, *, what: str = "the model") -> int:
        """The steps whose total matches ``budget`` (at least one): ``(budget - fixed) / (own + auxiliary
        per step)``. :class:`UserError` when the one-off costs alone exceed the budget."""
        fixed = sum(self.auxiliary_fixed.values())
        if fixed >= budget:
            parts = ", ".join(f"{name} {flops:.3g}" for name, flops in self.auxiliary_fixed.items())
            raise UserError(
                f"{what} cannot train inside a budget of {budget:.3g} FLOPs: what it needs before its first "
                f"step costs {fixed:.3g} FLOPs ({parts}); raise the budget or give the auxiliary model a "
                "smaller budget"
            )
        return max(1, int(round((budget - fixed) / (self.own_per_step + self.auxiliary_per_step))))

    def record(self) -> dict:
        return {
            "own_per_step": self.own_per_step,
            "auxiliary_per_step": self.auxiliary_per_step,
            "auxiliary_fixed": dict(self.auxiliary_fixed),
            "unknown": list(self.unknown),
            "per_step_name": self.per_step_name,
        }

    @classmethod
    def from_record(cls, record: Mapping) -> Ledger:
        return cls(
            float(record["own_per_step"]),
            float(record.get("auxiliary_per_step", 0.0)),
            {str(k): float(v) for k, v in (record.get("auxiliary_fixed") or {}).items()},
            tuple(record.get("unknown") or ()),
            str(record.get("per_step_name") or cls.per_step_name),
        )

    @classmethod
    def of_run(cls, info: Mapping) -> Ledger | None:
        """The ledger a run's ``run.json`` records; a run from before ledgers were recorded has its
        own FLOPs only (None when even those are unknown: a converted checkpoint)."""
        if info.get("ledger"):
            return cls.from_record(info["ledger"])
        per_position, positions = info.get("train_flops_per_position"), info.get("positions_per_step")
        if per_position is None or positions is None:
            return None
        return cls(float(per_position) * float(positions))

    def summary(self, steps: int) -> dict:
        """``flops_own``, ``flops_auxiliary`` and ``flops_total`` after ``steps``, and the auxiliary parts."""
        return {
            "flops_own": self.own(steps),
            "flops_auxiliary": self.auxiliary(steps),
            "flops_total": self.total(steps),
            "auxiliary": {
                **dict(self.auxiliary_fixed),
                **({self.per_step_name: self.auxiliary_per_step * steps} if self.auxiliary_per_step else {}),
            },
        }


def run_total_flops(info: Mapping) -> float | None:
    """The total FLOPs of a finished run from its ``run.json`` (None when unknown)."""
    ledger = Ledger.of_run(info)
    if ledger is None or ledger.unknown:
        return None
    return ledger.total(int(info.get("step") or 0))
