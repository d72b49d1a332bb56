"""Choosing the next id from a model's logits: greedy, or sampled with temperature, top-k and top-p."""

from __future__ import annotations

import dataclasses

import numpy as np

from bytelm.errors import UserError


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
    """``greedy``: the most likely id. Otherwise a draw from ``softmax(logits / temperature)``,
    restricted to the ``top_k`` most likely ids (0: all) and to the smallest set whose probability
    reaches ``top_p`` (1: all)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.greedy and not self.temperature > 0:
            raise UserError(f"temperature must be > 0 (or use greedy decoding), got {self.temperature}")
        if self.top_k < 0:
            raise UserError(f"top_k must be >= 0 (0: no limit), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p}")


def choose(
    logits_V: np.ndarray, allowed_V: np.ndarray, options: SamplingOptions, rng: np.random.Generator
) -> int:
    """The next id among the ``allowed`` ones."""
    logits = np.where(allowed_V, np.asarray(logits_V, np.float64), -np.inf)
    if options.greedy:
        return int(np.argmax(logits))
    logits = logits / options.temperature
    if options.top_k:
        kth = np.sort(logits)[-min(options.top_k, int(allowed_V.sum()))]
        logits = np.where(logits >= kth, logits, -np.inf)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    if options.top_p < 1:
        order = np.argsort(-p, kind="stable")
        keep = np.cumsum(p[order]) - p[order] < options.top_p  # the smallest prefix reaching top_p
        mask = np.zeros_like(p, dtype=bool)
        mask[order[keep]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return int(rng.choice(len(p), p=p))
