"""One small frozen dataclass per model family, registered as ``[model]`` configs.

Invariants are checked in ``__post_init__`` and raise ``ValueError`` naming the values.
"""

from __future__ import annotations

import dataclasses

from bytelm.config import register_model

_DTYPES = ("float32", "bfloat16", "float16")


def _check_transformer(prefix: str, d_model: int, n_heads: int, n_layers: int, mlp_dim: int) -> None:
    if d_model < 1 or n_heads < 1 or n_layers < 0 or mlp_dim < 1:
        raise ValueError(
            f"{prefix}d_model ({d_model}), n_heads ({n_heads}), mlp_dim ({mlp_dim}) must be >= 1 "
            f"and n_layers ({n_layers}) >= 0"
        )
    if d_model % n_heads:
        raise ValueError(f"{prefix}d_model {d_model} is not divisible by n_heads {n_heads}")
    if (d_model // n_heads) % 2:
        raise ValueError(
            f"{prefix}head dimension d_model/n_heads = {d_model // n_heads} must be even for rotary positions"
        )


@register_model("byte")
@dataclasses.dataclass(frozen=True)
class ByteLMConfig:
    """ByT5-style decoder-only transformer over byte ids (also the BLT entropy model)."""

    family: str = "byte"
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_dim: int = 768  # SwiGLU hidden width
    window: int = 0  # sliding-window attention span in positions; 0 = full causal attention
    rope_base: float = 10000.0
    dtype: str = "float32"  # compute dtype; params stay float32
    vocab_multiple: int = 128  # embedding/logit rows are padded up to a multiple of this

    def __post_init__(self) -> None:
        _check_transformer("model.", self.d_model, self.n_heads, self.n_layers, self.mlp_dim)
        if self.dtype not in _DTYPES:
            raise ValueError(f"model.dtype {self.dtype!r} is not one of {_DTYPES}")
        if self.window < 0:
            raise ValueError(f"model.window must be >= 0 (0 = full attention), got {self.window}")
        if self.vocab_multiple < 1:
            raise ValueError(f"model.vocab_multiple must be >= 1, got {self.vocab_multiple}")
