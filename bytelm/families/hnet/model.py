"""H-Net (Hwang, Wang & Gu 2025, "Dynamic Chunking for End-to-End Hierarchical Sequence Modeling",
arXiv 2507.07955), written here on the shared transformer core.

A **stage** maps ``T`` positions of width ``d_in`` to ``T`` outputs of the same width:

1. **Pad** the input to the stage's width ``d`` with a learned vector (zero-initialised).
2. **Encoder**: the stage's layers (:mod:`bytelm.models.hybrid`: Mamba-2 layers in the released
   configs' outer stages, ``"m4"``; attention blocks with a sliding window, ``"T2"``), then an
   RMSNorm: ``h``.
3. **Router**: ``q = W_q h``, ``k = W_k h`` (bias-free, initialised to the identity),
   ``p_t = clamp((1 - cos(q_{t-1}, k_t)) / 2, 0, 1)``; ``p_t = 1`` at the first position and at
   every document start (a BOS) of a packed window. Boundary ``b_t = p_t > 0.5``; the confidence
   ``c_t`` is the probability of the side chosen (``p_t`` at a boundary, ``1 - p_t`` elsewhere).
4. **Chunk**: the encoder outputs at the boundaries, in order, into a static number of slots
   (:meth:`HNetConfig.slots_for`). A window whose router marks more boundaries than there are slots
   keeps the first ones (a causal rule: whether position ``t`` is kept depends on ``b_{<=t}``
   only); the overflow is counted in the stage's statistics.
5. **Main network** over the chunks: for one stage, pad to ``global.d_model``, the causal
   transformer, an RMSNorm, slice back; for two, another stage.
6. **Dechunk**: an exponential moving average over the chunks,
   ``z_j = P_j zhat_j + (1 - P_j) z_{j-1}`` with ``P_j`` the chunk's ``p`` clamped to
   ``[1e-4, 1 - 1e-4]`` (a ``jax.lax.associative_scan``; with ``model.document_mask`` the
   average restarts at a document's first chunk: ``z_{j-1} = 0`` there, as a packed sequence's own
   scan would); each position reads the newest chunk at or before it (index ``cumsum(b) - 1``),
   times ``c_t + stop_gradient(1 - c_t)`` (1 in the forward pass; the router's gradient in the
   backward pass).
7. **Residual**: plus the encoder output through a zero-initialised float32 linear map.
8. **Decoder**: the stage's decoder layers, an RMSNorm, and the output sliced to ``d_in``.

The **ratio loss** of a stage (the paper's eq. 10), ``N/(N-1) ((N-1) F G + (1-F)(1-G))`` with ``F``
the fraction of positions the router marks and ``G`` the mean ``p`` over the real positions of the
batch, is minimal (1) at ``F = G = 1/N``; the model's auxiliary loss is ``ratio_loss_weight`` times
the sum over stages. Everything is causal: the output at ``t`` depends on inputs ``<= t`` only.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from bytelm.constants import BOS_ID, NUM_BYTE_IDS, PAD_ID
from bytelm.models.core import (
    COMPUTE_DTYPES,
    Dropout,
    Embed,
    RMSNorm,
    document_spans,
    drop_at,
    head_logits,
    head_param,
    make_dropout,
    pad_vocab,
)
from bytelm.models.hybrid import HybridStack
from bytelm.models.kernels import resolve_kernels
from bytelm.models.scoring import Scores, next_id_scores
from bytelm.models.slots import chunk_positions, keep_boundaries
from bytelm.models.stack import Transformer

P_CLAMP = 1e-4  # the dechunking EMA's p is clamped to [P_CLAMP, 1 - P_CLAMP]


# -- the equations, as functions of arrays (tests/test_hnet.py checks them against numpy) ----------
def _normalize(x: jax.Array) -> jax.Array:
    """``x / max(|x|, 1e-12)`` along the last axis (as ``torch.nn.functional.normalize``)."""
    norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
    return x / jnp.maximum(norm, 1e-12)


def router_probs(q_BxTxD: jax.Array, k_BxTxD: jax.Array, starts_BxT: jax.Array) -> jax.Array:
    """``p_t = clamp((1 - cos(q_{t-1}, k_t)) / 2, 0, 1)``, 1 at ``t = 0`` and where ``starts``; float32."""
    q = _normalize(q_BxTxD.astype(jnp.float32))
    k = _normalize(k_BxTxD.astype(jnp.float32))
    cos_BxT1 = jnp.sum(q[:, :-1] * k[:, 1:], axis=-1)
    p_BxT1 = jnp.clip((1.0 - cos_BxT1) / 2.0, 0.0, 1.0)
    p_BxT = jnp.concatenate([jnp.ones_like(p_BxT1[:, :1]), p_BxT1], axis=1)
    return jnp.where(starts_BxT, 1.0, p_BxT)


def ratio_loss(b_BxT: jax.Array, p_BxT: jax.Array, valid_BxT: jax.Array, target: float):
    """``(loss, F, G)``: the ratio loss of one stage over the ``valid`` positions."""
    v = valid_BxT.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(v), 1.0)
    F = jnp.sum(b_BxT.astype(jnp.float32) * v) / n
    G = jnp.sum(p_BxT * v) / n
    N = float(target)
    return N / (N - 1.0) * ((N - 1.0) * F * G + (1.0 - F) * (1.0 - G)), F, G


def ema_scan(zhat_BxMxD: jax.Array, p_BxM: jax.Array, restart_BxM: jax.Array) -> jax.Array:
    """``z_j = P_j zhat_j + (1 - P_j) z_{j-1}`` (``P`` = ``p`` clamped; ``z_{j-1} = 0`` where
    ``restart``) along the chunks, in float32, as an associative scan of affine maps."""
    P_BxM = jnp.clip(p_BxM.astype(jnp.float32), P_CLAMP, 1.0 - P_CLAMP)
    a_BxMx1 = jnp.where(restart_BxM, 0.0, 1.0 - P_BxM)[..., None]
    u_BxMxD = P_BxM[..., None] * zhat_BxMxD.astype(jnp.float32)

    def combine(left, right):
        a1, u1 = left
        a2, u2 = right
        return a1 * a2, a2 * u1 + u2

    _, z_BxMxD = jax.lax.associative_scan(combine, (a_BxMx1, u_BxMxD), axis=1)
    return z_BxMxD


def straight_through(c: jax.Array) -> jax.Array:
    """``c + stop_gradient(1 - c)``: 1 forward, ``c``'s gradient backward."""
    return c + jax.lax.stop_gradient(1.0 - c)


class StageOut(NamedTuple):
    y_BxTxD: jax.Array
    aux: jax.Array  # the sum over this stage and those inside it of their ratio losses
    stats: dict  # scalar sums per stage (s1_..., s2_...)
    boundaries: list  # each stage's kept boundaries (outside in), ``B x T`` at this stage's positions
    probs: list  # each stage's router probabilities p, likewise
    chunk_positions: list  # each stage's slot -> position map (``B x M``) and filled slots (``B``)


def _tag_lr(module: nnx.Module, scale: float) -> None:
    """Give ``module``'s parameters the learning-rate multiplier ``scale`` (read by the optimizer,
    :mod:`bytelm.training.optim`); none for 1."""
    if scale == 1.0:
        return
    for _, node in nnx.iter_graph(module):
        if isinstance(node, nnx.Param):
            node.set_metadata(lr_scale=float(scale))


def _pad_param(d_in: int, d: int) -> nnx.Param | None:
    """The learned vector that widens a ``d_in``-wide input to ``d`` (zero-initialised); None when equal."""
    return nnx.Param(jnp.zeros((d - d_in,), jnp.float32), logical_axes=(None,)) if d > d_in else None


def _widen(pad: nnx.Param | None, x_BxTxD: jax.Array, dtype) -> jax.Array:
    """``x`` in ``dtype``, with ``pad`` appended to every position's vector."""
    if pad is None:
        return x_BxTxD.astype(dtype)
    tail = jnp.broadcast_to(pad[...].astype(dtype), (*x_BxTxD.shape[:-1], pad.shape[0]))
    return jnp.concatenate([x_BxTxD.astype(dtype), tail], axis=-1)


def _matrix(value: jax.Array) -> nnx.Param:
    return nnx.Param(value.astype(jnp.float32), logical_axes=(None, None))


class Main(nnx.Module):
    """The innermost network: pad to ``global.d_model``, the causal stack, an RMSNorm, slice back."""

    def __init__(self, cfg, d_in: int, *, rngs: nnx.Rngs, kernels, dtype):
        G = cfg.global_.d_model
        self.d_in, self.dtype = d_in, dtype
        self.pad = _pad_param(d_in, G)
        self.stack = Transformer(
            G,
            cfg.global_.layers,
            cfg.global_.heads,
            cfg.global_.mlp_dim,
            rngs=rngs,
            kernels=kernels,
            rope_base=cfg.rope_base,
            dtype=dtype,
            scan=cfg.scan_layers,
            norm_eps=cfg.norm_eps,
        )
        self.norm = RMSNorm(G, eps=cfg.norm_eps)
        _tag_lr(self, cfg.main_lr_scale())

    def widen(self, x_BxTxD: jax.Array) -> jax.Array:
        return _widen(self.pad, x_BxTxD, self.dtype)

    def __call__(self, x_BxTxD, starts_BxT, valid_BxT, segments_BxT, drop: Dropout | None) -> StageOut:
        y = self.norm(self.stack(self.widen(x_BxTxD), segments_BxT=segments_BxT, drop=drop))
        return StageOut(y[..., : self.d_in], jnp.zeros((), jnp.float32), {}, [], [], [])


class Stage(nnx.Module):
    """One stage (see the module docstring); ``level`` 0 is the outermost."""

    def __init__(self, cfg, level: int, d_in: int, *, rngs: nnx.Rngs, kernels, dtype):
        spec = cfg.stage_specs()[level]
        d = spec.d_model
        self.level, self.d_in, self.d, self.dtype = level, d_in, d, dtype
        self.cfg, self.target = cfg, spec.target
        self.pad = _pad_param(d_in, d)

        def stack(pattern: str) -> HybridStack:
            return HybridStack(
                d,
                pattern,
                heads=spec.heads,
                mlp_dim=spec.mlp_dim,
                ssm=cfg.ssm,
                rngs=rngs,
                kernels=kernels,
                window=spec.window,
                rope_base=cfg.rope_base,
                dtype=dtype,
                norm_eps=cfg.norm_eps,
            )

        self.encoder = stack(spec.encoder)
        self.encoder_norm = RMSNorm(d, eps=cfg.norm_eps)
        self.wq = _matrix(jnp.eye(d))
        self.wk = _matrix(jnp.eye(d))
        self.residual = _matrix(jnp.zeros((d, d)))
        self.decoder = stack(spec.decoder)
        self.decoder_norm = RMSNorm(d, eps=cfg.norm_eps)
        _tag_lr(self, spec.lr_scale)  # (before the inner network exists: it tags its own)
        self.inner: Stage | Main = (
            Stage(cfg, level + 1, d, rngs=rngs, kernels=kernels, dtype=dtype)
            if level + 1 < cfg.stages
            else Main(cfg, d, rngs=rngs, kernels=kernels, dtype=dtype)
        )

    def slots(self, positions: int) -> int:
        """This stage's chunk slots over ``positions`` positions (:meth:`HNetConfig.slots_for`)."""
        return self.cfg.slots_for(positions, self.target)

    def widen(self, x_BxTxD: jax.Array) -> jax.Array:
        return _widen(self.pad, x_BxTxD, self.dtype)

    def route(self, h_prev: jax.Array, h: jax.Array) -> jax.Array:
        """The router's un-forced ``p`` between consecutive encoder outputs ``h_prev`` and ``h``."""
        q = _normalize(h_prev.astype(jnp.float32) @ self.wq[...])
        k = _normalize(h.astype(jnp.float32) @ self.wk[...])
        return jnp.clip((1.0 - jnp.sum(q * k, axis=-1)) / 2.0, 0.0, 1.0)

    def __call__(self, x_BxTxD, starts_BxT, valid_BxT, segments_BxT, drop: Dropout | None) -> StageOut:
        B, T = starts_BxT.shape
        M = self.slots(T)
        base = 8 * self.level  # dropout sites of this stage
        h = self.encoder_norm(
            self.encoder(self.widen(x_BxTxD), segments_BxT=segments_BxT, drop=drop_at(drop, base))
        )
        # router
        q = h.astype(jnp.float32) @ self.wq[...]
        k = h.astype(jnp.float32) @ self.wk[...]
        p_BxT = router_probs(q, k, starts_BxT)
        b_BxT = p_BxT > 0.5
        keep_BxT = keep_boundaries(b_BxT, M)
        # chunk
        pos_BxM, n_B = chunk_positions(keep_BxT, M)
        filled_BxM = jnp.arange(M)[None, :] < n_B[:, None]
        chunks_BxMxD = jnp.take_along_axis(h, pos_BxM[..., None], axis=1)
        take = lambda a: jnp.take_along_axis(a, pos_BxM, axis=1)  # noqa: E731
        starts_BxM = take(starts_BxT) & filled_BxM
        valid_BxM = take(valid_BxT) & filled_BxM
        segments_BxM = None if segments_BxT is None else take(segments_BxT)
        inner = self.inner(chunks_BxMxD, starts_BxM, valid_BxM, segments_BxM, drop_at(drop, base + 1))
        # dechunk
        restart_BxM = starts_BxM if self.cfg.document_mask else jnp.zeros_like(starts_BxM)
        z_BxMxD = ema_scan(inner.y_BxTxD, take(p_BxT), restart_BxM)
        index_BxT = jnp.cumsum(keep_BxT.astype(jnp.int32), axis=1) - 1
        spread_BxTxD = jnp.take_along_axis(z_BxMxD, index_BxT[..., None], axis=1)
        if segments_BxM is not None:  # a document whose start lost its slot reads no earlier document's chunk
            same_BxT = jnp.take_along_axis(segments_BxM, jnp.maximum(index_BxT, 0), axis=1) == segments_BxT
            spread_BxTxD = jnp.where(same_BxT[..., None], spread_BxTxD, 0.0)
        c_BxT = jnp.where(keep_BxT, p_BxT, 1.0 - p_BxT)
        out = spread_BxTxD * straight_through(c_BxT)[..., None] + h.astype(jnp.float32) @ self.residual[...]
        y = self.decoder_norm(
            self.decoder(out.astype(self.dtype), segments_BxT=segments_BxT, drop=drop_at(drop, base + 2))
        )
        # the ratio loss and the statistics, over the real positions
        loss, _, _ = ratio_loss(b_BxT, p_BxT, valid_BxT, self.target)
        s = f"s{self.level + 1}_"
        v = valid_BxT
        wanted_B = jnp.sum(b_BxT & v, axis=1)
        stats = {
            s + "positions": jnp.sum(v, dtype=jnp.float32),
            s + "chunks": jnp.sum(keep_BxT & v, dtype=jnp.float32),
            s + "dropped": jnp.sum((b_BxT & ~keep_BxT) & v, dtype=jnp.float32),
            s + "overflow_windows": jnp.sum(wanted_B > jnp.sum(keep_BxT & v, axis=1), dtype=jnp.float32),
            s + "windows": jnp.asarray(B, jnp.float32),
            s + "ratio_loss": loss * B,  # (a sum over windows, as the counts: the log divides)
            s + "p_sum": jnp.sum(p_BxT * v),
        }
        return StageOut(
            y[..., : self.d_in],
            loss + inner.aux,
            {**stats, **inner.stats},
            [keep_BxT, *inner.boundaries],
            [p_BxT, *inner.probs],
            [(pos_BxM, n_B), *inner.chunk_positions],
        )


class HNet(nnx.Module):
    """Byte ids -> logits over byte ids through the stages of ``cfg``."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dtype = COMPUTE_DTYPES[cfg.dtype]
        self.dtype = dtype
        kernels = resolve_kernels(cfg.attention, cfg.mlp, dtype=cfg.dtype, remat=cfg.remat)
        self.vocab_rows = pad_vocab(NUM_BYTE_IDS, cfg.vocab_multiple)
        d0 = cfg.local.d_model
        self.embed = Embed(self.vocab_rows, d0, rngs=rngs)
        self.stage = Stage(cfg, 0, d0, rngs=rngs, kernels=kernels, dtype=dtype)
        self.head = head_param(rngs, d0, NUM_BYTE_IDS, cfg.vocab_multiple)
        outer = cfg.stage_specs()[0].lr_scale
        _tag_lr(self.embed, outer)
        if outer != 1.0:
            self.head.set_metadata(lr_scale=float(outer))

    def forward(self, ids_BxT: jax.Array, *, drop: Dropout | None = None) -> tuple[jax.Array, StageOut]:
        """Logits for every position of ``ids`` and the stages' output (boundaries, losses, counts)."""
        T = ids_BxT.shape[1]
        starts_BxT = (ids_BxT == BOS_ID) | (jnp.arange(T)[None, :] == 0)
        valid_BxT = ids_BxT != PAD_ID
        segments_BxT = document_spans(ids_BxT)[0] if self.cfg.document_mask else None
        out = self.stage(self.embed(ids_BxT).astype(self.dtype), starts_BxT, valid_BxT, segments_BxT, drop)
        return head_logits(out.y_BxTxD, self.head[...], NUM_BYTE_IDS, self.dtype), out

    def __call__(self, ids_BxT: jax.Array) -> jax.Array:
        return self.forward(ids_BxT)[0]

    def score(self, batch: dict, *, dropout_key: jax.Array | None = None) -> Scores:
        """``batch["ids"]`` is ``(B, T+1)``, ``[BOS, bytes...]`` windows as for the byte LM: inputs
        ``[:, :-1]`` predict ``[:, 1:]``. The scores carry the ratio loss (times
        ``ratio_loss_weight``) as the training's auxiliary loss, the stages' counts, and each row's
        innermost chunks over its real positions (the main network's positions)."""
        ids = batch["ids"]
        inputs = ids[:, :-1]
        logits, out = self.forward(inputs, drop=make_dropout(self.cfg.dropout, dropout_key))
        return next_id_scores(logits, ids[:, 1:])._replace(
            aux=self.cfg.ratio_loss_weight * out.aux,
            stats=out.stats,
            steps_B=_innermost_real_chunks(out.chunk_positions, inputs != PAD_ID),
        )

    def byte_boundaries(self, ids_BxT: jax.Array) -> tuple[list[jax.Array], jax.Array]:
        """``(starts, p)``: each stage's kept boundaries as input positions (``B x T`` bool, outside in:
        where the chunks of stage ``s`` start), and stage 1's router probabilities (``B x T``)."""
        _, out = self.forward(ids_BxT)
        B, T = ids_BxT.shape
        result = []
        to_input = jnp.broadcast_to(
            jnp.arange(T, dtype=jnp.int32)[None, :], (B, T)
        )  # a level's position -> input's
        for level, keep in enumerate(out.boundaries):
            if level:
                pos_BxM, n_B = out.chunk_positions[level - 1]
                to_input = jnp.take_along_axis(to_input, pos_BxM, axis=1)
                keep = keep & (jnp.arange(keep.shape[1])[None, :] < n_B[:, None])
            result.append(jnp.zeros((B, T), bool).at[jnp.arange(B)[:, None], to_input].max(keep))
        return result, out.probs[0]

    # -- decoding (bytelm/families/hnet/decoder.py) ------------------------------------------------
    def stages(self) -> list[Stage]:
        """The stages, from the outside in."""
        out: list[Stage] = []
        s: Stage | Main = self.stage
        while isinstance(s, Stage):
            out.append(s)
            s = s.inner
        return out

    def main_network(self) -> Main:
        inner = self.stages()[-1].inner
        assert isinstance(inner, Main)
        return inner


def _innermost_real_chunks(chunk_positions: list, valid_BxT: jax.Array) -> jax.Array:
    """Per row, the innermost stage's filled slots whose boundary is a real (non-PAD) input."""
    real = valid_BxT
    for pos_BxM, n_B in chunk_positions:
        filled = jnp.arange(pos_BxM.shape[1])[None, :] < n_B[:, None]
        real = jnp.take_along_axis(real, pos_BxM, axis=1) & filled
    return jnp.sum(real, axis=1).astype(jnp.float32)
