"""The subword LM's ``[model]`` table."""

from __future__ import annotations

import dataclasses
import math

from bytelm.families.byte.config import ByteLMConfig


@dataclasses.dataclass(frozen=True)
class TokenLMConfig(ByteLMConfig):
    """The subword baseline: the same decoder over the ids of a subword tokenizer directory (BPE
    or Unigram)."""

    family: str = "bpe"
    tokenizer: str = ""  # tokenizer directory (bytelm tokenizer train --out DIR)
    # > 0 with a Unigram tokenizer: the train stream's segmentations are drawn with probability
    # proportional to P(segmentation) ** sample_alpha (subword regularisation, Kudo 2018), once per
    # document, seeded by train.seed; evaluation always scores the Viterbi ids
    sample_alpha: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.sample_alpha >= 0 and math.isfinite(self.sample_alpha)):
            raise ValueError(f"model.sample_alpha must be >= 0 (0: Viterbi ids), got {self.sample_alpha}")
