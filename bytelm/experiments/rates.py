"""The one learning-rate selection of ``bytelm compare`` and ``bytelm ablate``.

A model's rate is chosen by short runs scored on the validation split (never the held-out
segments). The preset's or grid's rates come first; when the best of them lies at an end of what
has been tried, the optimum may lie beyond it, so the search tries one more rate in that direction,
the grid's own ratio away (its two end rates' ratio: ``[3e-3, 1e-2, 3e-2]`` steps up by 3 and down
by 10/3), and looks again, up to ``max_extensions`` times in all. A rate that failed (diverged,
crashed) scores worst. What the extensions could not bracket is reported as still at an edge.

Pure functions of the scores so far: the callers train and score the rates :meth:`RateSearch.next_rates`
names, in as many rounds as it takes (``compare`` in one process; ``ablate`` across invocations,
its ``--print-commands`` printing one round at a time)::

    search = RateSearch((3e-3, 1e-2, 3e-2))
    scores = {}
    while rates := search.next_rates(scores):
        for lr in rates:
            scores[lr] = validation_bpb(lr)   # None for a run that failed
    choice = search.choose(scores)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from bytelm.errors import UserError

MAX_EXTENSIONS = 2


def _key(score: float | None) -> float:
    """A failed or diverged rate (None, NaN, inf) scores worse than any finite one."""
    return score if score is not None and math.isfinite(score) else math.inf


def rate_label(lr: float) -> str:
    """The name a rate gets in run directories and reports (``3e-3 -> '0.003'``)."""
    return f"{lr:g}"


@dataclasses.dataclass(frozen=True)
class RateChoice:
    """The outcome of a search: the chosen rate (None when every rate failed), every rate tried
    with its score, how many rates the extensions added, and whether the choice is still at an end
    of what was tried (then even ``max_extensions`` extensions did not bracket the optimum)."""

    chosen: float | None
    scores: dict[float, float | None]
    extensions: int
    at_edge: bool

    def record(self) -> dict:
        """The JSON form reports keep: rates as labels, in increasing order."""
        return {
            "chosen": self.chosen,
            "validation_bpb": {rate_label(lr): self.scores[lr] for lr in sorted(self.scores)},
            "extensions": self.extensions,
            "at_edge": self.at_edge,
        }


class RateSearch:
    """The rates of ``grid`` (any order, distinct, > 0), then up to ``max_extensions`` more beyond
    whichever end the best rate sits at."""

    def __init__(self, grid, max_extensions: int = MAX_EXTENSIONS):
        rates = tuple(sorted(float(x) for x in grid))
        if not rates or any(not (x > 0 and math.isfinite(x)) for x in rates) or len(set(rates)) != len(rates):
            raise UserError(f"learning rates must be distinct positive numbers, got {list(grid)}")
        if max_extensions < 0:
            raise ValueError(f"max_extensions must be >= 0, got {max_extensions}")
        self.grid, self.max_extensions = rates, max_extensions

    @property
    def ratio_down(self) -> float:
        return self.grid[1] / self.grid[0]

    @property
    def ratio_up(self) -> float:
        return self.grid[-1] / self.grid[-2]

    def extensions(self, scores: Mapping[float, float | None]) -> int:
        return sum(1 for lr in scores if lr not in self.grid)

    @staticmethod
    def best(scores: Mapping[float, float | None]) -> float | None:
        """The rate with the lowest score (ties: the lower rate); None when every rate failed."""
        finite = [lr for lr, s in scores.items() if math.isfinite(_key(s))]
        return min(finite, key=lambda lr: (_key(scores[lr]), lr)) if finite else None

    def _edge(self, scores: Mapping[float, float | None]) -> int:
        """-1 / +1 when the best rate is the lowest / highest tried (of at least two), else 0."""
        best = self.best(scores)
        if best is None or len(scores) < 2:
            return 0
        return -1 if best == min(scores) else 1 if best == max(scores) else 0

    def next_rates(self, scores: Mapping[float, float | None]) -> list[float]:
        """The rates to train next, given ``scores`` (rate -> validation BPB, None for a failed
        run) of every rate trained so far; ``[]`` when the search is over."""
        missing = [lr for lr in self.grid if lr not in scores]
        if missing:
            return missing
        if len(self.grid) < 2 or self.extensions(scores) >= self.max_extensions:
            return []
        edge = self._edge(scores)
        if edge < 0:
            nxt = min(scores) / self.ratio_down
        elif edge > 0:
            nxt = max(scores) * self.ratio_up
        else:
            return []
        nxt = float(f"{nxt:.3g}")  # three significant digits: a readable run directory name
        return [] if nxt in scores else [nxt]

    def choose(self, scores: Mapping[float, float | None]) -> RateChoice:
        """The outcome once :meth:`next_rates` is empty (or as far as the search got)."""
        return RateChoice(
            self.best(scores),
            dict(scores),
            self.extensions(scores),
            self._edge(scores) != 0 and len(self.grid) > 1,
        )
