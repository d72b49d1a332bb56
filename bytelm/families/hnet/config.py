"""H-Net's ``[model]`` table."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from bytelm.models.configs import ModelConfig, StackConfig, check_transformer
from bytelm.models.hybrid import parse_pattern
from bytelm.models.ssd import SSMConfig

# the paper's Eq. 11 (App. C): N_GPT, the bytes per token of the GPT-2 tokenizer it scales from
N_GPT = 4.6


@dataclasses.dataclass(frozen=True)
class HNetStageConfig:
    """One stage's encoder and decoder (``[model.local]``, ``[model.middle]``): their width, attention
    heads and MLP width, the sliding window of their attention layers (0 = full causal attention),
    and their layers as a pattern in the released configs' notation (:mod:`bytelm.models.hybrid`:
    ``m`` Mamba-2, ``M`` Mamba-2 + MLP, ``t`` attention, ``T`` attention + MLP; ``"m4"``,
    ``"T1m4"``)."""

    d_model: int
    heads: int
    mlp_dim: int
    encoder: str
    decoder: str
    window: int
    # (the depths became patterns: "encoder_layers = 2" is "encoder = 'm2'" or, as before, "'T2'")
    moved_keys: ClassVar[dict[str, str]] = {"encoder_layers": "encoder", "decoder_layers": "decoder"}

    def __post_init__(self) -> None:
        for name in ("encoder", "decoder"):
            parse_pattern(getattr(self, name))
        check_transformer("stack ", self.d_model, self.heads, 1, self.mlp_dim)
        if self.window < 0:
            raise ValueError(f"stack window must be >= 0 (0 = full attention), got {self.window}")

    @property
    def encoder_layers(self) -> int:
        return len(parse_pattern(self.encoder))

    @property
    def decoder_layers(self) -> int:
        return len(parse_pattern(self.decoder))

    def uses_ssm(self) -> bool:
        return any(kind == "ssm" for kind, _ in parse_pattern(self.encoder) + parse_pattern(self.decoder))


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One level of an H-Net, from the outside in: its stacks' shapes and its chunking target."""

    d_model: int
    heads: int
    mlp_dim: int
    encoder: str  # the encoder's layer pattern
    decoder: str
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
    # stage 1 (bytes): its encoder and decoder, Mamba-2 layers as the released configs' outer stages
    # ("m4"; "T2" = two attention blocks, the attention-outer variant)
    local: HNetStageConfig = HNetStageConfig(
        d_model=128, heads=2, mlp_dim=352, encoder="m4", decoder="m4", window=64
    )
    # stage 2 (stages = 2 only): the same over stage 1's chunks (the released 2-stage layout's inner
    # stage is "T1m4" / "m4T1")
    middle: HNetStageConfig = HNetStageConfig(
        d_model=128, heads=2, mlp_dim=352, encoder="T1m2", decoder="m2T1", window=32
    )
    # the Mamba-2 layers' settings, shared by every stage ([model.ssm])
    ssm: SSMConfig = SSMConfig()
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
    # learning-rate multipliers from the outside in (stage 1, [stage 2,] main network); () = the
    # paper's rule, Eq. 11 (lr_rule_scales)
    lr_scales: tuple[float, ...] = ()
    # every BOS of a packed training window starts a document: attention stays within it and the
    # moving average restarts there; false (as the byte LM's default) = the window is one sequence.
    # The router marks a boundary at every BOS either way
    document_mask: bool = False
    moved_keys: ClassVar[dict[str, str]] = {
        "encoder_layers": "local.encoder",
        "decoder_layers": "local.decoder",
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
        for name, table in (("local", self.local), ("middle", self.middle))[: self.stages]:
            if table.uses_ssm():
                self.ssm.check_width(table.d_model, f"model.{name}")
                if self.document_mask:
                    raise ValueError(
                        f"model.document_mask: the Mamba-2 layers of model.{name} ({table.encoder!r}, "
                        f"{table.decoder!r}) do not restart their state at a document start; use attention "
                        "layers there (e.g. encoder = 'T2') or leave document_mask false"
                    )
        if self.lr_scales and (
            len(self.lr_scales) != self.stages + 1 or not all(s > 0 for s in self.lr_scales)
        ):
            raise ValueError(
                f"model.lr_scales {list(self.lr_scales)} must hold {self.stages + 1} positive multipliers "
                "(each stage from the outside in, then the main network), or be empty"
            )

    def stage_specs(self) -> list[StageSpec]:
        """The stages from the outside in."""
        scales = self.lr_scales or self.lr_rule_scales()
        tables = [(self.local, self.target_chunk_len)]
        if self.stages == 2:
            tables.append((self.middle, self.inner_target_chunk_len))
        specs = [
            StageSpec(t.d_model, t.heads, t.mlp_dim, t.encoder, t.decoder, t.window, target, scale)
            for (t, target), scale in zip(tables, scales)
        ]
        return specs

    def lr_rule_scales(self) -> tuple[float, ...]:
        """The paper's learning-rate multipliers (App. C, Eq. 11), outside in, the main network last:
        ``lambda_s = sqrt(N_GPT * prod_{i>=s} N_i / prod_i N_i * D_S / D_s)``, with ``N_i`` the
        stages' targets (``N_S = 1`` for the main network), ``D_s`` the widths (``D_S`` the main
        network's) and ``N_GPT = 4.6``. One stage at N = 6, widths 1024 and 1536 (1stage_L): 2.63
        and 0.88. A stage's updates scale with its positions per main-network position and with its
        narrowness."""
        targets = [*self.targets(), 1.0]
        widths = [
            self.local.d_model,
            *([self.middle.d_model] if self.stages == 2 else []),
            self.global_.d_model,
        ]
        total = math.prod(targets)
        return tuple(
            math.sqrt(N_GPT * math.prod(targets[s:]) / total * widths[-1] / widths[s])
            for s in range(len(targets))
        )

    def main_lr_scale(self) -> float:
        return (self.lr_scales or self.lr_rule_scales())[-1]

    def layout(self) -> list:
        """The layers in the released configs' ``arch_layout`` notation: ``["m4", ["T3"], "m4"]``."""
        inner: list = [f"T{self.global_.layers}"]
        for spec in reversed(self.stage_specs()):
            inner = [spec.encoder, inner, spec.decoder]
        return inner

    def targets(self) -> tuple[float, ...]:
        """N of each stage, from the outside in."""
        return (self.target_chunk_len, self.inner_target_chunk_len)[: self.stages]

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
