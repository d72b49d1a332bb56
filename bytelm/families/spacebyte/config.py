"""SpaceByte's ``[model]`` table."""

from __future__ import annotations

import dataclasses
import math

from bytelm.models.configs import EncoderDecoderConfig, ModelConfig, StackConfig


@dataclasses.dataclass(frozen=True)
class SpaceByteConfig(ModelConfig):
    """SpaceByte (Slagle 2024, arXiv 2404.14408): a byte transformer whose larger global blocks run
    only at "spacelike" boundaries (:func:`~bytelm.families.spacebyte.model.global_starts`), between
    local blocks over every byte (``[model.local]``: the encoder's blocks before the global ones, the
    decoder's after, sliding-window attention). The global stack (``[model.global]``) runs over at
    most ``ceil(T / bytes_per_slot)`` positions of a window of ``T`` bytes (the paper: ``T / 6``)."""

    family: str = "spacebyte"
    local: EncoderDecoderConfig = EncoderDecoderConfig(
        d_model=128, heads=2, mlp_dim=352, encoder_layers=2, decoder_layers=2, window=128
    )
    global_: StackConfig = StackConfig(d_model=256, layers=3, heads=4, mlp_dim=704)
    # the global stack's slots per window: ceil(T / bytes_per_slot); a window with more boundaries keeps
    # the first ones (a causal rule: whether position t is global depends on bytes <= t only) and the
    # overflow is logged and reported
    bytes_per_slot: float = 6.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.global_.d_model < self.local.d_model:
            raise ValueError(
                f"model.global.d_model ({self.global_.d_model}) must be >= model.local.d_model "
                f"({self.local.d_model}): the global stack reads the local features zero-padded to its width"
            )
        if not (math.isfinite(self.bytes_per_slot) and self.bytes_per_slot >= 1.0):
            raise ValueError(f"model.bytes_per_slot must be >= 1, got {self.bytes_per_slot}")

    def slots_for(self, positions: int) -> int:
        """The global stack's positions over windows of ``positions`` bytes (at least 1)."""
        return max(1, min(positions, math.ceil(positions / self.bytes_per_slot)))
