"""The byte LM's ``[model]`` table (also the BLT entropy model's)."""

from __future__ import annotations

import dataclasses
import math

from bytelm.models.configs import ModelConfig, check_ngram_dropout, check_ngrams, check_transformer


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
            raise ValueError(
                f"model.logit_softcap must be a finite number >= 0 (0 = no cap), got {self.logit_softcap}"
            )
        if self.window < 0:
            raise ValueError(f"model.window must be >= 0 (0 = full attention), got {self.window}")
        check_ngrams(self.ngram_sizes, self.hash_table_size)
        check_ngram_dropout(self.ngram_dropout, self.ngram_sizes)
