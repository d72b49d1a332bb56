"""MegaByte's ``[model]`` table."""

from __future__ import annotations

import dataclasses

from bytelm.errors import UserError
from bytelm.models.configs import ModelConfig, check_transformer


@dataclasses.dataclass(frozen=True)
class MegaByteConfig(ModelConfig):
    """MegaByte (Yu et al. 2023): a global transformer over patches of ``patch_size`` bytes and a
    local transformer within each patch. ``global_d_model`` must equal ``patch_size * embed_dim``."""

    family: str = "megabyte"
    patch_size: int = 8  # bytes per patch
    embed_dim: int = 32  # per-byte global embedding width
    global_d_model: int = 256  # patch_size * embed_dim
    global_layers: int = 4
    global_heads: int = 4
    global_mlp_dim: int = 704
    local_d_model: int = 128
    local_layers: int = 2
    local_heads: int = 2
    local_mlp_dim: int = 352
    pad_to_patch: bool = True  # pad sequences to a multiple of patch_size (masked); False = require it

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.patch_size < 1:
            raise ValueError(f"model.patch_size must be >= 1, got {self.patch_size}")
        if self.embed_dim * self.patch_size != self.global_d_model:
            raise ValueError(
                f"model.global_d_model {self.global_d_model} must equal model.patch_size {self.patch_size} x "
                f"model.embed_dim {self.embed_dim} = {self.patch_size * self.embed_dim} (the concatenated "
                "patch width)"
            )
        check_transformer(
            "model.global_", self.global_d_model, self.global_heads, self.global_layers, self.global_mlp_dim
        )
        check_transformer(
            "model.local_", self.local_d_model, self.local_heads, self.local_layers, self.local_mlp_dim
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
