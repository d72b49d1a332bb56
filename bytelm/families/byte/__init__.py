"""The ByT5-style byte LM (Xue et al. 2021, decoder-only here): a transformer over byte ids, the
corpus's train stream as is, segments as ``[BOS, b+4, ...]``. The same family makes BLT's entropy
model (a small config of it)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from flax import nnx

from bytelm.constants import BOS_ID, BYTE_OFFSET, NUM_BYTE_IDS
from bytelm.data import Stream
from bytelm.families.base import Task, Trunk
from bytelm.families.byte.config import ByteLMConfig
from bytelm.families.byte.model import ByteLM
from bytelm.models.configs import ModelConfig, with_stacks
from bytelm.models.flops import decoder_lm_forward_flops_per_position
from bytelm.sampling.decoders import Decoder, FlatDecoder, byte_of_unit, byte_units


class ByteTask(Task):
    """The byte LM's task (see the module docstring)."""

    family = "byte"
    description = "a byte LM"
    config_class: ClassVar[type[ModelConfig]] = ByteLMConfig

    @classmethod
    def sized(cls, model_cfg, trunk: Trunk, changes):
        return with_stacks(model_cfg, {"": trunk.main}, **changes)

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        return ByteLM(self.cfg.model, rngs=rngs)

    def train_stream(self) -> Stream:
        return self.require_corpus().train_stream

    def decoder(self, model: nnx.Module) -> Decoder:
        return byte_decoder(model, self.cfg.train.seq_len)

    def encode_segment(self, data: bytes):
        ids = np.empty(len(data) + 1, np.int32)
        ids[0] = BOS_ID
        ids[1:] = np.frombuffer(data, np.uint8).astype(np.int32) + BYTE_OFFSET
        return ids, None

    def forward_flops_per_position(self) -> float:
        return decoder_lm_forward_flops_per_position(self.cfg.model, NUM_BYTE_IDS, self.cfg.train.seq_len)


def byte_decoder(model, context: int) -> FlatDecoder:
    """The byte LM's decoder: units are ``byte + 4``."""
    return FlatDecoder(model, context, byte_units, byte_of_unit)
