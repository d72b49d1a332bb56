"""What every family's ``[model]`` table shares, and the checks its own dataclass reuses.

Each family's config is one small frozen dataclass deriving from :class:`ModelConfig` (which
holds the fields all families share: compute dtype, vocabulary padding, rotary base, kernel
choices, and checks them once), defined in the family's folder (``bytelm/families/<name>/config.py``)
and registered with it (:mod:`bytelm.families`). A family's own invariants are checked in its
``__post_init__`` and raise ``ValueError`` naming the values. :class:`StackConfig` is the one
typed description of a transformer stack (width, depth, heads, MLP width) that sizing and
conversion build configs from. This module imports no JAX (only :mod:`bytelm.errors`): a config
can be validated without building a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, get_args

Dtype = Literal["float32", "bfloat16", "float16"]  # compute dtypes; parameters stay float32
AttentionKernel = Literal["auto", "xla", "cudnn", "halving"]  # bytelm.models.kernels chooses "auto"
MlpKernel = Literal["auto", "autodiff", "manual"]
Remat = Literal["none", "block", "dots"]
DTYPES: tuple[str, ...] = get_args(Dtype)
ATTENTION_KERNELS: tuple[str, ...] = get_args(AttentionKernel)
MLP_KERNELS: tuple[str, ...] = get_args(MlpKernel)


def check_transformer(prefix: str, d_model: int, n_heads: int, n_layers: int, mlp_dim: int) -> None:
    """The shape rules of one transformer stack (``prefix`` names its config keys)."""
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


def check_ngrams(ngram_sizes: tuple[int, ...], hash_table_size: int) -> None:
    """The rules of hashed n-gram embeddings, the byte LM's and BLT's
    (:func:`bytelm.models.core.ngram_hashes`; the BLT reference variant's exact int64 hash,
    ``reference_ngram_hashes``, needs both bounds)."""
    if any(not 1 <= n <= 64 for n in ngram_sizes) or len(set(ngram_sizes)) != len(ngram_sizes):
        raise ValueError(f"model.ngram_sizes {list(ngram_sizes)} must be distinct n-gram lengths in [1, 64]")
    if not 1 <= hash_table_size < 2**24:
        raise ValueError(
            f"model.hash_table_size must be in [1, 2^24) rows per n-gram table, got {hash_table_size}"
        )


def check_ngram_dropout(rate: float, ngram_sizes: tuple[int, ...]) -> None:
    """``model.ngram_dropout``: a probability in [0, 1), and only with n-gram tables to drop from."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(
            f"model.ngram_dropout must be in [0, 1) (the probability of dropping a row), got {rate}"
        )
    if rate > 0 and not ngram_sizes:
        raise ValueError(
            f"model.ngram_dropout = {rate} drops n-gram rows, but model.ngram_sizes is empty: set both, or "
            "ngram_dropout = 0"
        )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The fields every family shares. ``family`` picks the dataclass when a config is read."""

    family: str = ""
    rope_base: float = 10000.0
    dtype: Dtype = "float32"  # compute dtype; params stay float32
    vocab_multiple: int = 128  # embedding/logit rows are padded up to a multiple of this
    attention: AttentionKernel = "auto"  # auto | xla | cudnn | halving (bytelm/models/kernels.py)
    mlp: MlpKernel = "auto"  # auto | autodiff | manual: the SwiGLU backward (bytelm/models/kernels.py)
    # none | block | dots: what each block recomputes in the backward pass (bytelm/models/kernels.py)
    remat: Remat = "none"
    # the deep stacks (the byte/token LM trunk, MegaByte's two, BLT's global) as one scanned block:
    # compile time flat in depth; weights stacked on a leading "layers" axis (bytelm/models/stack.py)
    scan_layers: bool = False
    norm_eps: float = 1e-6  # every RMSNorm's epsilon (the BLT reference, and Llama: 1e-5)
    # training only: the probability of zeroing each value of a stack's inputs (the embeddings;
    # MegaByte's global and local inputs; BLT's byte embeddings and patch inputs) and of every
    # block's attention and MLP outputs before their residual add (GPT-2's residual dropout; not
    # the attention probabilities). Regularises small corpora seen for many epochs; 0 = none
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(
                f"model.dropout must be in [0, 1) (the probability of zeroing a value), got {self.dropout}"
            )
        if not self.norm_eps > 0:
            raise ValueError(f"model.norm_eps must be > 0, got {self.norm_eps}")
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype {self.dtype!r} is not one of {DTYPES}")
        if self.vocab_multiple < 1:
            raise ValueError(f"model.vocab_multiple must be >= 1, got {self.vocab_multiple}")
        if self.attention not in ATTENTION_KERNELS:
            raise ValueError(f"model.attention {self.attention!r} is not one of {ATTENTION_KERNELS}")
        if self.mlp not in MLP_KERNELS:
            raise ValueError(f"model.mlp {self.mlp!r} is not one of {MLP_KERNELS}")


@dataclasses.dataclass(frozen=True)
class StackConfig:
    """One transformer stack: a ``[model.<stack>]`` table (MegaByte's ``global`` and ``local``, BLT's
    and H-Net's ``global``), what a size rule gives (``bytelm ablate``) and what a converter reads
    (``bytelm import hf``)."""

    d_model: int
    layers: int
    heads: int
    mlp_dim: int

    def __post_init__(self) -> None:
        check_transformer("stack ", self.d_model, self.heads, self.layers, self.mlp_dim)


@dataclasses.dataclass(frozen=True)
class EncoderDecoderConfig:
    """The byte-level stacks around a global one (BLT's ``[model.local]``, H-Net's ``[model.local]``
    and ``[model.middle]``): an encoder and a decoder of the same width, heads and MLP width, their
    own depths, sliding-window attention over ``window`` positions (0 = full causal attention)."""

    d_model: int
    heads: int
    mlp_dim: int
    encoder_layers: int
    decoder_layers: int
    window: int

    def __post_init__(self) -> None:
        check_transformer(
            "stack ", self.d_model, self.heads, max(self.encoder_layers, self.decoder_layers), self.mlp_dim
        )
        if self.window < 0:
            raise ValueError(f"stack window must be >= 0 (0 = full attention), got {self.window}")


def field_name(cls: type, key: str) -> str | None:
    """The attribute of dataclass ``cls`` that the config key ``key`` names: the key itself, or the
    key with a trailing underscore for a Python keyword (``[model.global]`` is ``global_``); None when
    there is none."""
    names = {f.name for f in dataclasses.fields(cls)}
    return key if key in names else key + "_" if key + "_" in names else None


def key_name(field: str) -> str:
    """The config key of a dataclass field (the inverse of :func:`field_name`)."""
    return field[:-1] if field.endswith("_") else field


def replace_fields(obj, changes: Mapping[str, Any]):
    """``obj`` (a frozen dataclass) with ``changes`` set, keys dotted into nested tables
    (``{"global.d_model": 64, "dropout": 0.1}``), each table rebuilt with ``dataclasses.replace`` so
    its invariants are checked on the result."""
    own: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        head, dot, rest = key.partition(".")
        name = field_name(type(obj), head)
        if name is None:
            raise ValueError(f"{type(obj).__name__} has no field {head!r}")
        if dot:
            nested.setdefault(name, {})[rest] = value
        else:
            own[name] = value
    for name, sub in nested.items():
        own[name] = replace_fields(own.get(name, getattr(obj, name)), sub)
    return dataclasses.replace(obj, **own)


def with_stacks(cfg: ModelConfig, stacks: Mapping[str, StackConfig], **changes) -> ModelConfig:
    """``cfg`` with each stack named in ``stacks`` resized (``""``: a flat LM's fields; an
    encoder-decoder table keeps its own depths and window) and any other ``changes`` on top (dotted
    keys reach into tables; any table that is not a :class:`StackConfig` is resized in place: its width,
    heads and MLP width), as one replacement, so the config's invariants are checked once, on the
    result."""
    values: dict[str, Any] = {}
    for name, stack in stacks.items():
        if not name:
            values.update(d_model=stack.d_model, n_layers=stack.layers, n_heads=stack.heads)
            values["mlp_dim"] = stack.mlp_dim
        elif not isinstance(getattr(cfg, field_name(type(cfg), name) or name), StackConfig):
            values.update({f"{name}.d_model": stack.d_model, f"{name}.heads": stack.heads})
            values[f"{name}.mlp_dim"] = stack.mlp_dim
        else:
            values[name] = stack
    return replace_fields(cfg, {**values, **changes})
