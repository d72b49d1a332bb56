"""H-Net's ``[model]`` table."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from bytelm.models.configs import EncoderDecoderConfig, ModelConfig, StackConfig


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One level of an H-Net, from the outside in: its stacks' shapes and its chunking target."""

    d_model: int
    heads: int
    mlp_dim: int
    encoder_layers: int
    decoder_layers: int
    window: int
    target: float  # N: the mean chunk length (in this level's positions) the ratio loss aims at
    lr_scale: float


@dataclasses.dataclass(frozen=True)
class HNetConfig(ModelConfig):
    """H-Net (Hwang, Wang & Gu 2025, arXiv 2507.07955): dynamic chunking learned end to end. Each
    stage runs an encoder over its positions, a router that marks chunk boundaries, the main network
    over the chunks (for two stages, itself a stage), an exponential moving average that spreads the
    chunks' outputs back over the positions, a residual from the encoder and a decoder. Stage 1 works
    on bytes (``[model.local]``); stage 2 (``stages = 2``) on stage 1's chunks (``[model.middle]``);
    the main network (``[model.global]``) on the innermost chunks. Widths grow inwards (each stage pads its
    input with a learned vector and slices its output back)."""

    family: str = "hnet"
    stages: int = 1  # 1 or 2
    # stage 1 (bytes): its encoder and decoder, sliding-window attention blocks of the shared core
    local: EncoderDecoderConfig = EncoderDecoderConfig(
        d_model=128, heads=2, mlp_dim=352, encoder_layers=2, decoder_layers=2, window=64
    )
    # stage 2 (stages = 2 only): the same over stage 1's chunks
    middle: EncoderDecoderConfig = EncoderDecoderConfig(
        d_model=128, heads=2, mlp_dim=352, encoder_layers=1, decoder_layers=1, window=32
    )
    # the main network over the innermost chunks (full causal attention)
    global_: StackConfig = StackConfig(d_model=192, layers=3, heads=2, mlp_dim=512)
    # N per stage: the ratio loss pulls stage 1's mean chunk length (bytes per chunk) towards
    # target_chunk_len, and stage 2's (stage-1 chunks per chunk) towards inner_target_chunk_len (the
    # paper: N = 6 for one stage, 3 and 3 for two)
    target_chunk_len: float = 6.0
    inner_target_chunk_len: float = 3.0
    ratio_loss_weight: float = 0.03  # alpha
    # chunk slots per window of a stage: chunk_slots x the expected chunks at its target (at least 2,
    # at most one per position); a window whose router marks more boundaries keeps the first ones that
    # fit (a causal rule) and the overflow rate is logged
    chunk_slots: float = 2.0
    # learning-rate multipliers from the outside in (stage 1, [stage 2,] main network); () = all 1.
    # The paper trains outer stages with larger multipliers; the values are the preset's choice
    lr_scales: tuple[float, ...] = ()
    # every BOS of a packed training window starts a document: attention stays within it and the
    # moving average restarts there; false (as the byte LM's default) = the window is one sequence.
    # The router marks a boundary at every BOS either way
    document_mask: bool = False
    moved_keys: ClassVar[dict[str, str]] = {
        "encoder_layers": "local.encoder_layers",
        "decoder_layers": "local.decoder_layers",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.stages not in (1, 2):
            raise ValueError(f"model.stages must be 1 or 2, got {self.stages}")
        widths = [self.local.d_model, self.global_.d_model]
        names = ["model.local.d_model", "model.global.d_model"]
        if self.stages == 2:
            widths.insert(1, self.middle.d_model)
            names.insert(1, "model.middle.d_model")
        for (a, na), (b, nb) in zip(zip(widths, names), zip(widths[1:], names[1:])):
            if b < a:
                raise ValueError(
                    f"{nb} ({b}) must be >= {na} ({a}): an inner stage pads its input to its own width"
                )
        for name in ("target_chunk_len", "inner_target_chunk_len"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 1.0):
                raise ValueError(f"model.{name} must be > 1 (N, positions per chunk), got {value}")
        if not (self.ratio_loss_weight >= 0 and math.isfinite(self.ratio_loss_weight)):
            raise ValueError(f"model.ratio_loss_weight must be >= 0, got {self.ratio_loss_weight}")
        if not self.chunk_slots >= 1.0:
            raise ValueError(f"model.chunk_slots must be >= 1, got {self.chunk_slots}")
        if self.lr_scales and (
            len(self.lr_scales) != self.stages + 1 or not all(s > 0 for s in self.lr_scales)
        ):
            raise ValueError(
                f"model.lr_scales {list(self.lr_scales)} must hold {self.stages + 1} positive multipliers "
                "(each stage from the outside in, then the main network), or be empty"
            )

    def stage_specs(self) -> list[StageSpec]:
        """The stages from the outside in."""
        scales = self.lr_scales or (1.0,) * (self.stages + 1)
        tables = [(self.local, self.target_chunk_len)]
        if self.stages == 2:
            tables.append((self.middle, self.inner_target_chunk_len))
        specs = [
            StageSpec(
                t.d_model, t.heads, t.mlp_dim, t.encoder_layers, t.decoder_layers, t.window, target, scale
            )
            for (t, target), scale in zip(tables, scales)
        ]
        return specs

    def main_lr_scale(self) -> float:
        return self.lr_scales[-1] if self.lr_scales else 1.0

    def targets(self) -> tuple[float, ...]:
        """N of each stage, from the outside in."""
        return tuple(s.target for s in self.stage_specs())

    def slots_for(self, positions: int, target: float) -> int:
        """Static chunk slots of a stage over ``positions`` positions with target ``target``:
        ``chunk_slots`` times the expected chunks, at least 2, at most ``positions``."""
        return max(2, min(positions, math.ceil(self.chunk_slots * positions / target)))

    def slot_plan(self, positions: int) -> tuple[int, ...]:
        """The chunk slots of each stage for windows of ``positions`` positions, outside in."""
        out, n = [], positions
        for target in self.targets():
            n = self.slots_for(n, target)
            out.append(n)
        return tuple(out)
