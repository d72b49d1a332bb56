"""MambaByte's ``[model]`` table."""

from __future__ import annotations

import dataclasses

from bytelm.models.configs import ModelConfig
from bytelm.models.ssd import SSMConfig


@dataclasses.dataclass(frozen=True)
class MambaByteConfig(ModelConfig):
    """A flat byte LM of Mamba-2 layers (MambaByte, Wang et al. 2024, arXiv 2401.13660, used Mamba-1
    layers: d_state 16, no heads; this family's layers are Mamba-2's, :mod:`bytelm.models.ssd`).
    Each layer is ``x + Mamba2(RMSNorm(x))``, with no MLP between them (the Mamba LM's layout).
    The defaults of the layer's own settings are the Mamba-2 reference's."""

    family: str = "mambabyte"
    d_model: int = 256
    n_layers: int = 8
    d_state: int = 128  # N: the state per head channel
    d_conv: int = 4  # the depthwise causal convolution's width
    expand: int = 2  # d_inner = expand x d_model
    head_dim: int = 64  # P: channels per head (heads = d_inner / head_dim)
    groups: int = 1  # G: groups of heads sharing B and C
    chunk: int = 256  # Q: positions per chunk of the SSD algorithm (a window shorter than it: one chunk)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("d_model", "n_layers", "d_state", "d_conv", "expand", "head_dim", "groups", "chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        d_inner = self.expand * self.d_model
        if d_inner % self.head_dim or (d_inner // self.head_dim) % self.groups:
            raise ValueError(
                f"model.expand x model.d_model = {d_inner} must split into heads of model.head_dim "
                f"{self.head_dim}, and the heads into model.groups {self.groups}"
            )

    def ssm(self) -> SSMConfig:
        """The layers' settings, as the Mamba-2 layer takes them."""
        return SSMConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(SSMConfig)})
        if self.scan_layers:
            raise ValueError(
                "model.scan_layers is a setting of the transformer stack; a mambabyte model's layers "
                "are not scanned: leave it false (model.remat = block or dots recomputes its layers)"
            )
