"""MegaByte (Yu et al. 2023): a global transformer over fixed patches of P bytes and a local
transformer within each patch (:mod:`bytelm.families.megabyte.model`); the byte LM's windows and
segments, with the BOS as the first byte of the first patch."""

from __future__ import annotations

import numpy as np
from flax import nnx

from bytelm.errors import UserError
from bytelm.families.base import Task, Trunk
from bytelm.families.megabyte.config import MegaByteConfig
from bytelm.families.megabyte.decoder import MegaByteDecoder
from bytelm.families.megabyte.flops import forward_flops_per_byte
from bytelm.families.megabyte.model import MegaByte
from bytelm.models.configs import with_stacks
from bytelm.sampling.decoders import Decoder


class MegaByteTask(Task):
    """MegaByte: the same byte windows and segments as the byte LM, the BOS in its first patch."""

    family = "megabyte"
    description = "a MegaByte model"
    global_step = "patch of P bytes"
    config_class = MegaByteConfig

    @classmethod
    def sized(cls, model_cfg, trunk: Trunk, changes):
        P = changes.get("patch_size", model_cfg.patch_size)
        if trunk.main.d_model % P:
            raise UserError(
                f"the size rule's width {trunk.main.d_model} is not divisible by model.patch_size {P} "
                "(embed_dim = width / P)"
            )
        return with_stacks(
            model_cfg,
            {"global": trunk.main, "local": trunk.local},
            **{"embed_dim": trunk.main.d_model // P, **changes},
        )

    def __init__(self, cfg, corpus, run_dir=None, *, modules=None, records=None, record=None):
        super().__init__(cfg, corpus, run_dir, modules=modules, records=records, record=record)
        cfg.model.padded_length(cfg.train.seq_len + 1, what="a window (the BOS and train.seq_len bytes) of")

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        return MegaByte(self.cfg.model, rngs=rngs)

    def decoder(self, model: nnx.Module) -> Decoder:
        return MegaByteDecoder(model, self.cfg.train.seq_len)

    def global_steps(self, batch: dict, n_real: int) -> np.ndarray:
        return super().global_steps(batch, n_real) / float(self.cfg.model.patch_size)

    def forward_flops_per_position(self) -> float:
        return forward_flops_per_byte(self.cfg.model, self.cfg.train.seq_len)

    def mean_bytes_per_global_step(self) -> float:
        return float(self.cfg.model.patch_size)
