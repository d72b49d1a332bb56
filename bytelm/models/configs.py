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


@register_model("bpe")
@dataclasses.dataclass(frozen=True)
class TokenLMConfig(ByteLMConfig):
    """The subword baseline: the same decoder over the ids of a BPE tokenizer directory."""

    family: str = "bpe"
    tokenizer: str = ""  # tokenizer directory (bytelm tokenizer train --out DIR)


@register_model("megabyte")
@dataclasses.dataclass(frozen=True)
class MegaByteConfig:
    """MegaByte (Yu et al. 2023): a global transformer over patches of ``patch_size`` bytes and a
    local transformer within each patch. ``global_d_model`` must equal ``patch_size * embed_dim``."""

    family: str = "megabyte"
    patch_size: int = 8  # P
    embed_dim: int = 32  # d_G: per-byte global embedding width
    global_d_model: int = 256  # P * d_G
    global_layers: int = 4
    global_heads: int = 4
    global_mlp_dim: int = 704
    local_d_model: int = 128  # d_L
    local_layers: int = 2
    local_heads: int = 2
    local_mlp_dim: int = 352
    pad_to_patch: bool = True  # pad sequences to a multiple of P (masked); False = require T % P == 0
    rope_base: float = 10000.0
    dtype: str = "float32"
    vocab_multiple: int = 128

    def __post_init__(self) -> None:
        if self.patch_size < 1:
            raise ValueError(f"model.patch_size must be >= 1, got {self.patch_size}")
        if self.embed_dim * self.patch_size != self.global_d_model:
            raise ValueError(
                f"model.global_d_model {self.global_d_model} must equal model.patch_size {self.patch_size} x "
                f"model.embed_dim {self.embed_dim} = {self.patch_size * self.embed_dim} (the concatenated patch width)"
            )
        _check_transformer("model.global_", self.global_d_model, self.global_heads, self.global_layers, self.global_mlp_dim)
        _check_transformer("model.local_", self.local_d_model, self.local_heads, self.local_layers, self.local_mlp_dim)
        if self.dtype not in _DTYPES:
            raise ValueError(f"model.dtype {self.dtype!r} is not one of {_DTYPES}")
