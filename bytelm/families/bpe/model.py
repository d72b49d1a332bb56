"""The BPE-token LM: the same decoder over ``token id + 4`` (ids 0-3 are the control ids).

Each scored position covers ``len(token_bytes(target))`` bytes, passed in ``batch["nbytes"]``,
so its BPB is measured against real byte counts, never a per-dataset constant.
"""

from __future__ import annotations

from flax import nnx

from bytelm.constants import BYTE_OFFSET
from bytelm.models.lm import DecoderLM


class TokenLM(DecoderLM):
    def __init__(self, cfg, n_tokens: int, *, rngs: nnx.Rngs):
        super().__init__(cfg, n_tokens + BYTE_OFFSET, rngs=rngs)
