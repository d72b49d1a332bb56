"""MambaByte (Wang et al. 2024, arXiv 2401.13660): a flat byte LM of state-space layers, here
Mamba-2's (:mod:`bytelm.models.ssd`; the paper's were Mamba-1's). It reads bytes, so the task is the
seam's three members and every default (:class:`~bytelm.families.base.Task`): the corpus's train
windows, segments ``[BOS, byte+4, ...]``, one position per byte, and the flat decoder over its
carried states."""

from __future__ import annotations

from flax import nnx

from bytelm.families.base import Task, Trunk
from bytelm.families.mambabyte.config import MambaByteConfig
from bytelm.families.mambabyte.flops import forward_flops_per_byte
from bytelm.families.mambabyte.model import MambaByte
from bytelm.models.configs import replace_fields


class MambaByteTask(Task):
    config_class = MambaByteConfig

    @classmethod
    def sized(cls, model_cfg, trunk: Trunk, changes):
        """The trunk's main stack as Mamba-2 layers: its width, two layers per transformer layer (a
        Mamba-2 layer at expand 2 holds about half a transformer layer's weights, the Mamba LMs'
        convention), heads as wide as the trunk's attention heads."""
        main = trunk.main
        sizes = {"d_model": main.d_model, "n_layers": 2 * main.layers, "head_dim": main.d_model // main.heads}
        return replace_fields(model_cfg, {**sizes, **changes})

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        return MambaByte(self.cfg.model, rngs=rngs)

    def forward_flops_per_position(self) -> float:
        return forward_flops_per_byte(self.cfg.model, self.cfg.train.seq_len)
