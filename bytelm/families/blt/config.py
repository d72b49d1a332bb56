"""BLT's ``[model]`` table."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Literal, get_args

from bytelm.models.configs import (
    EncoderDecoderConfig,
    ModelConfig,
    StackConfig,
    check_ngram_dropout,
    check_ngrams,
)

Variant = Literal["bytelm", "reference"]  # BLTConfig.variant
VARIANTS: tuple[str, ...] = get_args(Variant)
Patching = Literal["entropy", "space"]


@dataclasses.dataclass(frozen=True)
class BLTConfig(ModelConfig):
    """BLT (Pagnoni et al. 2024): entropy patches, a local encoder with hashed n-grams and
    cross-attention pooling, a latent global transformer over patches, a local decoder."""

    family: str = "blt"
    # "entropy": patches from the entropy model (BLT); "space": a patch after every space-like byte
    # (SpaceByte / BLT's space baseline; no entropy model, target_patch_len then only sizes the slots)
    patching: Patching = "entropy"
    entropy_run: str = ""  # run directory of the entropy model (bytelm train configs/tiny/entropy.toml)
    target_patch_len: float = 4.0  # theta is calibrated on training data to hit this mean patch length
    threshold: float = 0.0  # > 0: use this global entropy threshold (nats) instead of calibrating
    monotonic_threshold: float = 0.0  # > 0: also start a patch where H_t - H_{t-1} exceeds this
    max_patch_len: int = 16  # longer patches are split
    max_patches: int = 0  # patch slots per window (static shape); 0 = patch_slots x the expected count
    # with max_patches = 0: slots per expected patch of a window ((seq_len + 1) / target_patch_len); a
    # window that needs more gets the causal slot rule. 2: on the tiny compare's stdlib held-out windows,
    # 0.96% overflow (1.5: 12.6%; held-out patches run shorter than the training mean)
    patch_slots: float = 2.0
    # the local encoder and decoder ([model.local]; window: their sliding-window attention span)
    local: EncoderDecoderConfig = EncoderDecoderConfig(
        d_model=128, heads=2, mlp_dim=352, encoder_layers=1, decoder_layers=2, window=64
    )
    global_: StackConfig = StackConfig(d_model=256, layers=4, heads=4, mlp_dim=704)  # [model.global]
    ngram_sizes: tuple[int, ...] = (3, 4, 5, 6, 7, 8)  # hashed n-grams ending at each byte
    # rows per n-gram hash table (one per n): a prime near the reference's default of 30000 (its 1B model:
    # 500002)
    hash_table_size: int = 30011
    queries_per_patch: int = 2  # k (the reference's cross_attn_k)
    cross_heads: int = 2
    cross_attention: bool = True  # False: pooled patch states / global states enter by projection
    encoder_cross_all_layers: bool = (
        False  # patch queries cross-attend after every encoder layer (else the last)
    )
    decoder_cross_all_layers: bool = (
        True  # bytes cross-attend before every decoder layer (the reference's 1B config)
    )
    global_path: bool = True  # False (an ablation, at evaluation): the decoder reads no global output
    # "reference": the architecture of Meta's released BLT exactly (its n-gram hash, a cross-attention
    # residual that adds the queries twice, no norm after the global stack; docs/interop.md), which
    # converted checkpoints use; "bytelm": this package's own BLT
    variant: Variant = "bytelm"
    hash_functions: int = 1  # reference variant: hash functions per n-gram size (one table each)
    # training only: the probability of dropping each position's row of each n-gram table (as the
    # byte LM's model.ngram_dropout); 0 = none
    ngram_dropout: float = 0.0
    moved_keys: ClassVar[dict[str, str]] = {
        "encoder_layers": "local.encoder_layers",
        "decoder_layers": "local.decoder_layers",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.target_patch_len >= 1.0:
            raise ValueError(f"model.target_patch_len must be >= 1 byte, got {self.target_patch_len}")
        if self.patching not in ("entropy", "space"):
            raise ValueError(f"model.patching must be 'entropy' or 'space', got {self.patching!r}")
        if self.max_patch_len < 1 or self.max_patches < 0 or not self.patch_slots >= 1.0:
            raise ValueError(
                f"model.max_patch_len ({self.max_patch_len}) must be >= 1, model.max_patches "
                f"({self.max_patches}) >= 0 and model.patch_slots ({self.patch_slots}) >= 1"
            )
        if self.threshold < 0 or self.monotonic_threshold < 0:
            raise ValueError(
                "model.threshold and model.monotonic_threshold must be >= 0 (0 = off / calibrate)"
            )
        if self.local.d_model % self.cross_heads or (self.local.d_model // self.cross_heads) % 2:
            raise ValueError(
                f"model.local.d_model {self.local.d_model} must split into model.cross_heads "
                f"{self.cross_heads} even-sized heads"
            )
        check_ngrams(self.ngram_sizes, self.hash_table_size)
        if self.queries_per_patch < 1:
            raise ValueError(f"model.queries_per_patch must be >= 1, got {self.queries_per_patch}")
        check_ngram_dropout(self.ngram_dropout, self.ngram_sizes)
        if self.variant not in VARIANTS:
            raise ValueError(f"model.variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.hash_functions < 1 or (self.variant == "bytelm" and self.hash_functions != 1):
            raise ValueError(
                f"model.hash_functions ({self.hash_functions}) must be 1 for variant 'bytelm' and >= 1 for "
                "'reference'"
            )
        if self.variant == "reference":
            if self.encoder_cross_all_layers:
                raise ValueError(
                    "the reference variant pools its patch queries afresh at every encoder layer, so only "
                    "the last cross-attention counts: set model.encoder_cross_all_layers = false"
                )

    def cross_layers(self) -> tuple[int, int]:
        """``(encoder, decoder)`` cross-attention layers (the model builds these, the FLOP formula
        counts these): the encoder's after its last layer, or after each of them (at least one); the
        decoder's before its first layer, or before each of them; none without cross-attention."""
        if not self.cross_attention:
            return 0, 0
        enc = max(self.local.encoder_layers, 1) if self.encoder_cross_all_layers else 1
        dec = max(self.local.decoder_layers, 1) if self.decoder_cross_all_layers else 1
        return enc, dec

    def patches_for(self, seq_len: int) -> int:
        """Static number of patch slots for windows of ``seq_len + 1`` ids: ``max_patches``, or
        ``patch_slots`` times the expected number of patches at the target mean length (at least
        2: the first position is a patch of its own), never more than one per position. A window
        that needs more gets the causal slot rule (:func:`bytelm.patching.cap_starts`)."""
        if self.max_patches:
            return self.max_patches
        expected = (seq_len + 1) / self.target_patch_len
        return int(min(seq_len + 1, max(2, math.ceil(self.patch_slots * expected))))
