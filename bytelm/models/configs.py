"""One small frozen dataclass per model family: the ``[model]`` table of a config.

Every family config derives from :class:`ModelConfig`, which holds the fields all families share
(compute dtype, vocabulary padding, rotary base, kernel choices) and checks them once. Each
family's own invariants are checked in its ``__post_init__`` and raise ``ValueError`` naming the
values. This module imports no JAX (only :mod:`bytelm.errors`): the config loader reads it, and a config
can be validated without building a model.
"""

from __future__ import annotations

import dataclasses
import math

from bytelm.errors import UserError

DTYPES = ("float32", "bfloat16", "float16")  # compute dtypes; parameters stay float32
ATTENTION_KERNELS = ("auto", "xla", "cudnn", "halving")  # bytelm.models.kernels chooses "auto"
MLP_KERNELS = ("auto", "autodiff", "manual")
BLT_VARIANTS = ("bytelm", "reference")  # BLTConfig.variant


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
    """The rules of hashed n-gram embeddings, the byte LM's and BLT's (:func:`bytelm.models.core.ngram_hashes`;
    the BLT reference variant's exact int64 hash, ``reference_ngram_hashes``, needs both bounds)."""
    if any(not 1 <= n <= 64 for n in ngram_sizes) or len(set(ngram_sizes)) != len(ngram_sizes):
        raise ValueError(f"model.ngram_sizes {list(ngram_sizes)} must be distinct n-gram lengths in [1, 64]")
    if not 1 <= hash_table_size < 2**24:
        raise ValueError(f"model.hash_table_size must be in [1, 2^24) rows per n-gram table, got {hash_table_size}")


def check_ngram_dropout(rate: float, ngram_sizes: tuple[int, ...]) -> None:
    """``model.ngram_dropout``: a probability in [0, 1), and only with n-gram tables to drop from."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"model.ngram_dropout must be in [0, 1) (the probability of dropping a row), got {rate}")
    if rate > 0 and not ngram_sizes:
        raise ValueError(f"model.ngram_dropout = {rate} drops n-gram rows, but model.ngram_sizes is empty: set both, or ngram_dropout = 0")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The fields every family shares. ``family`` picks the dataclass when a config is read."""

    family: str = ""
    rope_base: float = 10000.0
    dtype: str = "float32"  # compute dtype; params stay float32
    vocab_multiple: int = 128  # embedding/logit rows are padded up to a multiple of this
    attention: str = "auto"  # auto | xla | cudnn | halving (bytelm/models/kernels.py)
    mlp: str = "auto"  # auto | autodiff | manual: the SwiGLU backward (bytelm/models/kernels.py)
    remat: str = "none"  # none | block | dots: what each block recomputes in the backward pass (bytelm/models/kernels.py)
    # the deep stacks (the byte/token LM trunk, MegaByte's two, BLT's global) as one scanned block:
    # compile time flat in depth; weights stacked on a leading "layers" axis (bytelm/models/core.py)
    scan_layers: bool = False
    norm_eps: float = 1e-6  # every RMSNorm's epsilon (the BLT reference, and Llama: 1e-5)
    # training only: the probability of zeroing each value of a stack's inputs (the embeddings;
    # MegaByte's global and local inputs; BLT's byte embeddings and patch inputs) and of every
    # block's attention and MLP outputs before their residual add (GPT-2's residual dropout; not
    # the attention probabilities). Regularises small corpora seen for many epochs; 0 = none
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1) (the probability of zeroing a value), got {self.dropout}")
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
class ByteLMConfig(ModelConfig):
    """ByT5-style decoder-only transformer over byte ids (also the BLT entropy model)."""

    family: str = "byte"
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_dim: int = 768  # SwiGLU hidden width
    window: int = 0  # sliding-window attention span in positions; 0 = full causal attention
    # hashed n-gram embeddings (BLT's encoder input, Pagnoni et al. 2024): for each n here the n ids
    # ending at each position are hashed into their own table of hash_table_size rows, and the rows
    # are added to the id's embedding; () = none (the ByT5-style input)
    ngram_sizes: tuple[int, ...] = ()
    hash_table_size: int = 8191
    # every BOS in a training window starts a document: its positions attend only to their own
    # document and their n-grams read nothing before its BOS, as when an evaluation segment (one
    # document, from its BOS) is scored alone; false = the window is one sequence
    document_mask: bool = False
    # training only: the probability of dropping each position's row of each n-gram table (the row
    # zeroed, the kept rows scaled by 1 / (1 - p)), so that the model cannot lean on memorised
    # n-grams alone; 0 = none. Needs model.ngram_sizes
    ngram_dropout: float = 0.0
    # > 0: every logit is squashed into (-logit_softcap, logit_softcap) by logit_softcap *
    # tanh(logit / logit_softcap), in training, evaluation and sampling alike (Gemma 2's final-logit
    # soft-capping, at 30 there); 0 = raw logits
    logit_softcap: float = 0.0
    # each attention head's queries and keys RMS-normalised (a learned gain per head dimension)
    # before the rotary positions (QK-norm), which bounds the attention logits
    qk_norm: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_transformer("model.", self.d_model, self.n_heads, self.n_layers, self.mlp_dim)
        if not (math.isfinite(self.logit_softcap) and self.logit_softcap >= 0):
            raise ValueError(f"model.logit_softcap must be a finite number >= 0 (0 = no cap), got {self.logit_softcap}")
        if self.window < 0:
            raise ValueError(f"model.window must be >= 0 (0 = full attention), got {self.window}")
        check_ngrams(self.ngram_sizes, self.hash_table_size)
        check_ngram_dropout(self.ngram_dropout, self.ngram_sizes)


@dataclasses.dataclass(frozen=True)
class TokenLMConfig(ByteLMConfig):
    """The subword baseline: the same decoder over the ids of a subword tokenizer directory (BPE
    or Unigram)."""

    family: str = "bpe"
    tokenizer: str = ""  # tokenizer directory (bytelm tokenizer train --out DIR)
    # > 0 with a Unigram tokenizer: the train stream's segmentations are drawn with probability
    # proportional to P(segmentation) ** sample_alpha (subword regularisation, Kudo 2018), once per
    # document, seeded by train.seed; evaluation always scores the Viterbi ids
    sample_alpha: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.sample_alpha >= 0 and math.isfinite(self.sample_alpha)):
            raise ValueError(f"model.sample_alpha must be >= 0 (0: Viterbi ids), got {self.sample_alpha}")


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
                f"model.embed_dim {self.embed_dim} = {self.patch_size * self.embed_dim} (the concatenated patch width)"
            )
        check_transformer("model.global_", self.global_d_model, self.global_heads, self.global_layers, self.global_mlp_dim)
        check_transformer("model.local_", self.local_d_model, self.local_heads, self.local_layers, self.local_mlp_dim)

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


@dataclasses.dataclass(frozen=True)
class BLTConfig(ModelConfig):
    """BLT (Pagnoni et al. 2024): entropy patches, a local encoder with hashed n-grams and
    cross-attention pooling, a latent global transformer over patches, a local decoder."""

    family: str = "blt"
    # "entropy": patches from the entropy model (BLT); "space": a patch after every space-like byte
    # (SpaceByte / BLT's space baseline; no entropy model, target_patch_len then only sizes the slots)
    patching: str = "entropy"
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
    local_d_model: int = 128
    encoder_layers: int = 1
    decoder_layers: int = 2
    local_heads: int = 2
    local_mlp_dim: int = 352
    local_window: int = 64  # sliding-window attention span of the local layers
    global_d_model: int = 256
    global_layers: int = 4
    global_heads: int = 4
    global_mlp_dim: int = 704
    ngram_sizes: tuple[int, ...] = (3, 4, 5, 6, 7, 8)  # hashed n-grams ending at each byte
    hash_table_size: int = 30011  # rows per n-gram hash table (one per n): a prime near the reference's default of 30000 (its 1B model: 500002)
    queries_per_patch: int = 2  # k (the reference's cross_attn_k)
    cross_heads: int = 2
    cross_attention: bool = True  # False: pooled patch states / global states enter by projection
    encoder_cross_all_layers: bool = False  # patch queries cross-attend after every encoder layer (else the last)
    decoder_cross_all_layers: bool = True  # bytes cross-attend before every decoder layer (the reference's 1B config)
    global_path: bool = True  # False (an ablation, at evaluation): the decoder reads no global output
    # "reference": the architecture of Meta's released BLT exactly (its n-gram hash, a cross-attention
    # residual that adds the queries twice, no norm after the global stack; docs/interop.md), which
    # converted checkpoints use; "bytelm": this package's own BLT
    variant: str = "bytelm"
    hash_functions: int = 1  # reference variant: hash functions per n-gram size (one table each)
    # training only: the probability of dropping each position's row of each n-gram table (as the
    # byte LM's model.ngram_dropout); 0 = none
    ngram_dropout: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.target_patch_len >= 1.0:
            raise ValueError(f"model.target_patch_len must be >= 1 byte, got {self.target_patch_len}")
        if self.patching not in ("entropy", "space"):
            raise ValueError(f"model.patching must be 'entropy' or 'space', got {self.patching!r}")
        if self.max_patch_len < 1 or self.max_patches < 0 or not self.patch_slots >= 1.0:
            raise ValueError(
                f"model.max_patch_len ({self.max_patch_len}) must be >= 1, model.max_patches ({self.max_patches}) >= 0 "
                f"and model.patch_slots ({self.patch_slots}) >= 1"
            )
        if self.threshold < 0 or self.monotonic_threshold < 0:
            raise ValueError("model.threshold and model.monotonic_threshold must be >= 0 (0 = off / calibrate)")
        check_transformer("model.local_", self.local_d_model, self.local_heads, max(self.encoder_layers, self.decoder_layers), self.local_mlp_dim)
        check_transformer("model.global_", self.global_d_model, self.global_heads, self.global_layers, self.global_mlp_dim)
        if self.local_d_model % self.cross_heads or (self.local_d_model // self.cross_heads) % 2:
            raise ValueError(f"model.local_d_model {self.local_d_model} must split into model.cross_heads {self.cross_heads} even-sized heads")
        check_ngrams(self.ngram_sizes, self.hash_table_size)
        if self.queries_per_patch < 1:
            raise ValueError(f"model.queries_per_patch must be >= 1, got {self.queries_per_patch}")
        if self.local_window < 0:
            raise ValueError(f"model.local_window must be >= 0 (0 = full), got {self.local_window}")
        check_ngram_dropout(self.ngram_dropout, self.ngram_sizes)
        if self.variant not in BLT_VARIANTS:
            raise ValueError(f"model.variant must be one of {BLT_VARIANTS}, got {self.variant!r}")
        if self.hash_functions < 1 or (self.variant == "bytelm" and self.hash_functions != 1):
            raise ValueError(f"model.hash_functions ({self.hash_functions}) must be 1 for variant 'bytelm' and >= 1 for 'reference'")
        if self.variant == "reference":
            if self.encoder_cross_all_layers:
                raise ValueError(
                    "the reference variant pools its patch queries afresh at every encoder layer, so only the last "
                    "cross-attention counts: set model.encoder_cross_all_layers = false"
                )

    def patches_for(self, seq_len: int) -> int:
        """Static number of patch slots for windows of ``seq_len + 1`` ids: ``max_patches``, or
        ``patch_slots`` times the expected number of patches at the target mean length (at least
        2: the first position is a patch of its own), never more than one per position. A window
        that needs more gets the causal slot rule (:func:`bytelm.patching.cap_starts`)."""
        if self.max_patches:
            return self.max_patches
        expected = (seq_len + 1) / self.target_patch_len
        return int(min(seq_len + 1, max(2, math.ceil(self.patch_slots * expected))))


def config_classes() -> dict[str, type[ModelConfig]]:
    """``family -> dataclass`` of every :class:`ModelConfig` subclass defined so far, keyed by the
    default of its ``family`` field (what the config loader reads a ``[model]`` table into; a test
    checks it agrees with the task registry, :data:`bytelm.training.tasks.FAMILIES`)."""
    out: dict[str, type[ModelConfig]] = {}
    todo = list(ModelConfig.__subclasses__())
    while todo:
        cls = todo.pop()
        out[cls.__dataclass_fields__["family"].default] = cls
        todo += cls.__subclasses__()
    return dict(sorted(out.items()))
