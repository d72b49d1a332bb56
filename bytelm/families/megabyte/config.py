"""MegaByte's ``[model]`` table."""

from __future__ import annotations

import dataclasses

from bytelm.errors import UserError
from bytelm.models.configs import ModelConfig, StackConfig


@dataclasses.dataclass(frozen=True)
class MegaByteConfig(ModelConfig):
    """MegaByte (Yu et al. 2023): a global transformer over patches of ``patch_size`` bytes and a
    local transformer within each patch (the ``[model.global]`` and ``[model.local]`` tables).
    ``global.d_model`` must equal ``patch_size * embed_dim``."""

    family: str = "megabyte"
    patch_size: int = 8  # bytes per patch
    embed_dim: int = 32  # per-byte global embedding width
    # d_model = patch_size x embed_dim
    global_: StackConfig = StackConfig(d_model=256, layers=4, heads=4, mlp_dim=704)
    local: StackConfig = StackConfig(d_model=128, layers=2, heads=2, mlp_dim=352)
    pad_to_patch: bool = True  # pad sequences to a multiple of patch_size (masked); False = require it

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.patch_size < 1:
            raise ValueError(f"model.patch_size must be >= 1, got {self.patch_size}")
        if self.embed_dim * self.patch_size != self.global_.d_model:
            raise ValueError(
                f"model.global.d_model {self.global_.d_model} must equal model.patch_size "
                f"{self.patch_size} x model.embed_dim {self.embed_dim} = {self.patch_size * self.embed_dim} "
                "(the concatenated patch width)"
            )

    def padded_length(self, length: int, *, what: str = "sequence length") -> int:
        """``length`` rounded up to whole patches; raises :class:`UserError` when it is not a
        multiple of the patch size and padding is off (the one place this rule lives)."""
        P = self.patch_size
        if length % P and not self.pad_to_patch:
            raise UserError(
                f"{what} {length} is not a multiple of model.patch_size {P} and model.pad_to_patch is "
                "false: set model.pad_to_patch = true or use a length divisible by the patch size"
            )
        return -(-length // P) * P
