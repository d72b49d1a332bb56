"""MambaByte: an embedding of byte ids, ``n_layers`` residual Mamba-2 layers (``x + Mamba2(RMSNorm(x))``),
a final RMSNorm and the output head. It reads every byte (no patches); decoding carries each layer's
convolution inputs and SSM state (:class:`~bytelm.models.ssd.SSMCache`) through the same forward
pass, so a window's logits are the same computed at once or byte by byte."""

from __future__ import annotations

import jax
from flax import nnx

from bytelm.constants import NUM_BYTE_IDS
from bytelm.models.core import (
    COMPUTE_DTYPES,
    Dropout,
    Embed,
    RMSNorm,
    apply_dropout,
    drop_at,
    head_logits,
    head_param,
    make_dropout,
    pad_vocab,
)
from bytelm.models.kernels import REMAT_POLICIES
from bytelm.models.scoring import Scores, next_id_scores
from bytelm.models.ssd import Mamba2, SSMCache


def _layer(norm: RMSNorm, mixer: Mamba2, h_BxTxD: jax.Array) -> jax.Array:
    return mixer(norm(h_BxTxD))[0]


class MambaByte(nnx.Module):
    """``ids_BxT -> logits_BxTxV`` over the byte ids (the module docstring)."""

    n_context = 0  # no n-grams: a cached call needs no ids before the new ones

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.n_valid = NUM_BYTE_IDS
        self.vocab_rows = pad_vocab(NUM_BYTE_IDS, cfg.vocab_multiple)
        self.dtype = COMPUTE_DTYPES[cfg.dtype]
        self.embed = Embed(self.vocab_rows, cfg.d_model, rngs=rngs)
        self.norms = nnx.List([RMSNorm(cfg.d_model, eps=cfg.norm_eps) for _ in range(cfg.n_layers)])
        self.mixers = nnx.List(
            [
                Mamba2(cfg.d_model, cfg.ssm(), n_layers=cfg.n_layers, rngs=rngs, dtype=self.dtype)
                for _ in range(cfg.n_layers)
            ]
        )
        self.norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.head = head_param(rngs, cfg.d_model, NUM_BYTE_IDS, cfg.vocab_multiple)

    def __call__(
        self,
        ids_BxT: jax.Array,
        *,
        drop: Dropout | None = None,
        cache: list[SSMCache] | None = None,
        pos0=0,
        context_BxC: jax.Array | None = None,
    ):
        """Logits ``B x T x V``; ``drop`` (training): dropout on the embeddings (site 0) and on each
        layer's output before its residual add (site ``1 + layer``). ``cache`` (decoding,
        :meth:`init_cache`): the ids continue the cached ones (``pos0`` and ``context_BxC`` are the
        decoders' common arguments; the state needs neither); returns the logits and the new caches."""
        h_BxTxD = apply_dropout(self.embed(ids_BxT).astype(self.dtype), drop_at(drop, 0))
        new = []
        for i, (norm, mixer) in enumerate(zip(self.norms, self.mixers)):
            if cache is None and self.cfg.remat != "none":  # training: recomputed in the backward pass
                y_BxTxD, layer_cache = (
                    nnx.remat(_layer, policy=REMAT_POLICIES[self.cfg.remat])(norm, mixer, h_BxTxD),
                    None,
                )
            else:
                y_BxTxD, layer_cache = mixer(norm(h_BxTxD), cache=None if cache is None else cache[i])
            h_BxTxD = h_BxTxD + apply_dropout(y_BxTxD, drop_at(drop, 1 + i))
            new.append(layer_cache)
        logits_BxTxV = head_logits(self.norm(h_BxTxD), self.head[...], self.n_valid, self.dtype)
        return logits_BxTxV if cache is None else (logits_BxTxV, new)

    def score(self, batch: dict, *, dropout_key: jax.Array | None = None) -> Scores:
        """``batch["ids"]`` is ``(B, T+1)``: inputs ``[:, :-1]`` predict targets ``[:, 1:]``."""
        ids = batch["ids"]
        return next_id_scores(self(ids[:, :-1], drop=make_dropout(self.cfg.dropout, dropout_key)), ids[:, 1:])

    def init_cache(self, batch: int, slots: int) -> list[SSMCache]:
        """Each layer's empty decoding state (``slots``, the decoders' context, is not needed: the
        state has a fixed size however long the sequence)."""
        return [mixer.init_cache(batch) for mixer in self.mixers]
