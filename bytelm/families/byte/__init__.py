"""The ByT5-style byte LM (Xue et al. 2021, decoder-only here): a transformer over byte ids, the
corpus's train stream as is, segments as ``[BOS, b+4, ...]`` (the defaults of
:class:`~bytelm.families.base.Task`). The same family makes BLT's entropy model (a small config of
it)."""

from __future__ import annotations

from typing import ClassVar

from flax import nnx

from bytelm.constants import NUM_BYTE_IDS
from bytelm.families.base import Task, Trunk
from bytelm.families.byte import hf
from bytelm.families.byte.config import ByteLMConfig
from bytelm.families.byte.model import ByteLM
from bytelm.models.configs import ModelConfig, with_stacks
from bytelm.models.flops import decoder_lm_forward_flops_per_position
from bytelm.sampling.decoders import FlatDecoder, byte_of_unit, byte_units


class ByteTask(Task):
    """The byte LM's task (see the module docstring)."""

    family = "byte"
    description = "a byte LM"
    config_class: ClassVar[type[ModelConfig]] = ByteLMConfig

    @classmethod
    def sized(cls, model_cfg, trunk: Trunk, changes):
        return with_stacks(model_cfg, {"": trunk.main}, **changes)

    @classmethod
    def hf_export(cls, model_cfg, artefacts, run_info):
        return hf.hf_export(model_cfg, artefacts, run_info)

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        return ByteLM(self.cfg.model, rngs=rngs)

    def forward_flops_per_position(self) -> float:
        return decoder_lm_forward_flops_per_position(self.cfg.model, NUM_BYTE_IDS, self.cfg.train.seq_len)


def byte_decoder(model, context: int) -> FlatDecoder:
    """The byte LM's decoder: units are ``byte + 4``."""
    return FlatDecoder(model, context, byte_units, byte_of_unit)
