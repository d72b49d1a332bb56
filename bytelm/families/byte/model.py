"""ByT5-style byte LM (Xue et al. 2021, decoder-only here): a transformer over byte ids.

Ids are ``byte + 4`` with ``pad=0, bos=1, eos=2, sep=3`` (:mod:`bytelm.constants`); the 260 valid
ids are padded to ``cfg.vocab_multiple`` rows, and the padding logits are masked. The same class
(with a small config and sliding-window attention) is the BLT entropy model.
"""

from __future__ import annotations

from flax import nnx

from bytelm.constants import NUM_BYTE_IDS
from bytelm.models.lm import DecoderLM


class ByteLM(DecoderLM):
    def __init__(self, cfg, *, rngs: nnx.Rngs):
        super().__init__(cfg, NUM_BYTE_IDS, rngs=rngs)
