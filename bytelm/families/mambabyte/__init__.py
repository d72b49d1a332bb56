"""MambaByte (Wang et al. 2024, arXiv 2401.13660): a flat byte LM of state-space layers, here
Mamba-2's (:mod:`bytelm.models.ssd`; the paper's were Mamba-1's). It reads bytes, so the task is the
seam's three members and every default (:class:`~bytelm.families.base.Task`): the corpus's train
windows, segments ``[BOS, byte+4, ...]``, one position per byte, and the flat decoder over its
carried states."""

from __future__ import annotations

from flax import nnx

from bytelm.families.base import Task
from bytelm.families.mambabyte.config import MambaByteConfig
from bytelm.families.mambabyte.flops import forward_flops_per_byte
from bytelm.families.mambabyte.model import MambaByte


class MambaByteTask(Task):
    config_class = MambaByteConfig

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        return MambaByte(self.cfg.model, rngs=rngs)

    def forward_flops_per_position(self) -> float:
        return forward_flops_per_byte(self.cfg.model, self.cfg.train.seq_len)
