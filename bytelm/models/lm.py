"""A decoder-only LM over a flat id sequence: the core stack with an embedding and a head.

Both the ByT5-style byte LM (ids = byte + 4) and the BPE-token LM (ids = token + 4) are this
model; they differ in vocabulary and in the bytes each position covers.
"""

from __future__ import annotations

from typing import overload

import jax
from flax import nnx

from bytelm.models.cache import KVCache, offset_positions
from bytelm.models.core import (
    COMPUTE_DTYPES,
    Dropout,
    Embed,
    NgramEmbed,
    RMSNorm,
    apply_dropout,
    document_spans,
    drop_at,
    head_logits,
    head_param,
    make_dropout,
    pad_vocab,
)
from bytelm.models.kernels import resolve_kernels
from bytelm.models.scoring import Scores, next_id_scores
from bytelm.models.stack import Transformer

# model.ngram_dropout's masks: the step's dropout key folded with this (model.dropout's sites are
# folded with 0, the embeddings, and 1, the stack)
NGRAM_DROPOUT_SITE = 2


class DecoderLM(nnx.Module):
    """``ids_BxT -> logits_BxTxV`` with ``V = n_valid`` rounded up to ``cfg.vocab_multiple``."""

    def __init__(self, cfg, n_valid: int, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.n_valid = n_valid
        self.vocab_rows = pad_vocab(n_valid, cfg.vocab_multiple)
        dtype = COMPUTE_DTYPES[cfg.dtype]
        self.dtype = dtype
        kernels = resolve_kernels(cfg.attention, cfg.mlp, dtype=cfg.dtype, remat=cfg.remat)
        self.embed = Embed(self.vocab_rows, cfg.d_model, rngs=rngs)
        # hashed n-gram embeddings added to the id's (model.ngram_sizes); none: the ByT5-style input
        self.ngrams = (
            NgramEmbed(cfg.ngram_sizes, cfg.hash_table_size, cfg.d_model, rngs=rngs)
            if cfg.ngram_sizes
            else None
        )
        self.stack = Transformer(
            cfg.d_model,
            cfg.n_layers,
            cfg.n_heads,
            cfg.mlp_dim,
            rngs=rngs,
            kernels=kernels,
            window=cfg.window,
            rope_base=cfg.rope_base,
            dtype=dtype,
            scan=cfg.scan_layers,
            norm_eps=cfg.norm_eps,
            qk_norm=cfg.qk_norm,
        )
        self.norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.head = head_param(rngs, cfg.d_model, n_valid, cfg.vocab_multiple)

    @property
    def n_context(self) -> int:
        """The ids before a continuation that a cached call needs (its n-grams reach back)."""
        return self.ngrams.n_context if self.ngrams is not None else 0

    def embed_ids(
        self,
        ids_BxT: jax.Array,
        context_BxC: jax.Array | None = None,
        reach_BxT: jax.Array | None = None,
        ngram_drop: Dropout | None = None,
    ) -> jax.Array:
        """The stack's input: each id's embedding plus, with ``model.ngram_sizes``, the hashed
        embeddings of the n-grams ending at it (``context_BxC``: the ids before a continuation;
        ``reach_BxT``: how far back each position's document reaches, :func:`document_spans`;
        ``ngram_drop``: training's ``model.ngram_dropout``)."""
        e_BxTxD = self.embed(ids_BxT)
        if self.ngrams is not None:
            e_BxTxD = e_BxTxD + self.ngrams(ids_BxT, context_BxC, reach_BxT, drop=ngram_drop)
        return e_BxTxD.astype(self.dtype)

    @overload
    def __call__(
        self,
        ids_BxT: jax.Array,
        *,
        drop: Dropout | None = None,
        ngram_drop: Dropout | None = None,
        cache: None = None,
        pos0=0,
        context_BxC: jax.Array | None = None,
    ) -> jax.Array: ...

    @overload
    def __call__(
        self,
        ids_BxT: jax.Array,
        *,
        drop: Dropout | None = None,
        ngram_drop: Dropout | None = None,
        cache: list[KVCache],
        pos0=0,
        context_BxC: jax.Array | None = None,
    ) -> tuple[jax.Array, list[KVCache]]: ...

    def __call__(
        self,
        ids_BxT: jax.Array,
        *,
        drop: Dropout | None = None,
        ngram_drop: Dropout | None = None,
        cache: list[KVCache] | None = None,
        pos0=0,
        context_BxC: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, list[KVCache]]:
        """Logits ``B x T x V``. ``drop`` (training): dropout on the embeddings (site 0) and in the
        stack (site 1); ``ngram_drop``: on the n-gram tables' rows. With ``model.document_mask``,
        every BOS of a window starts a document that nothing before it reaches.

        ``cache`` (decoding, :meth:`init_cache`): the ids are new ones at absolute positions
        ``pos0 ..`` after the cached ones, one document; returns the logits and the updated caches.
        With n-gram embeddings, ``context_BxC`` holds the :attr:`n_context` ids just before the new
        ones (PAD before the start)."""
        segments_BxT = reach_BxT = positions_BxT = None
        if cache is not None:
            if self.n_context and (context_BxC is None or context_BxC.shape[1] != self.n_context):
                raise ValueError(
                    f"this model's n-grams need the {self.n_context} ids before the new ones (context_BxC)"
                )
            positions_BxT = offset_positions(pos0, *ids_BxT.shape[:2])
        elif self.cfg.document_mask:
            segments_BxT, reach_BxT = document_spans(ids_BxT)
        h_BxTxD = apply_dropout(
            self.embed_ids(ids_BxT, context_BxC, reach_BxT=reach_BxT, ngram_drop=ngram_drop), drop_at(drop, 0)
        )
        h_BxTxD, cache = self.stack.apply(
            h_BxTxD,
            positions_BxT=positions_BxT,
            segments_BxT=segments_BxT,
            drop=drop_at(drop, 1),
            cache=cache,
        )
        logits_BxTxV = head_logits(
            self.norm(h_BxTxD), self.head[...], self.n_valid, self.dtype, self.cfg.logit_softcap
        )
        return logits_BxTxV if cache is None else (logits_BxTxV, cache)

    def score(self, batch: dict, *, dropout_key: jax.Array | None = None) -> Scores:
        """``batch["ids"]`` is ``(B, T+1)``: inputs ``[:, :-1]`` predict targets ``[:, 1:]``.

        Bytes per position come from ``batch["nbytes"]`` when given (tokens), else 1 per scored
        position. ``dropout_key`` (training only) turns on ``model.dropout`` and
        ``model.ngram_dropout`` (its own stream: the key folded with :data:`NGRAM_DROPOUT_SITE`)."""
        ids = batch["ids"]
        drop = make_dropout(self.cfg.dropout, dropout_key)
        ngram_drop = drop_at(make_dropout(self.cfg.ngram_dropout, dropout_key), NGRAM_DROPOUT_SITE)
        return next_id_scores(
            self(ids[:, :-1], drop=drop, ngram_drop=ngram_drop), ids[:, 1:], batch.get("nbytes")
        )

    def init_cache(self, batch: int, slots: int) -> list[KVCache]:
        """Empty key/value caches for decoding: ``slots`` positions (the training context) per layer."""
        return self.stack.init_cache(batch, slots)
