"""The Mamba-2 layer (Dao & Gu 2024, arXiv 2405.21060): a selective state-space model computed by
the chunked SSD algorithm in training and scoring, and by the same function one position at a time
in decoding (a chunk of one is the recurrent step).

Per head ``h`` (``H`` heads of ``P`` channels, state size ``N``, ``G`` groups of heads sharing
``B`` and ``C``), with ``A_h < 0`` a scalar and ``dt_t > 0`` a step size per position and head:

    s_t = exp(dt_t A) s_{t-1} + dt_t x_t B_t^T      (state ``P x N``)
    y_t = s_t C_t + D x_t

The chunked algorithm (the paper's section 6; ``ssd_minimal.py`` of state-spaces/mamba) splits the
sequence into chunks of ``Q`` positions: within a chunk, the quadratic form (``C_l . B_s`` times the
decay between ``s`` and ``l``, for ``s <= l``); each chunk's final state from its inputs; the
state entering each chunk, every earlier chunk's state decayed to it (one ``(C+1) x (C+1)`` matrix
of decays per head, the call's starting state as a chunk before the first: the reference's minimal
form, no sequential scan); and each position reads the state that entered its chunk, decayed to it.
Decays and cumulative sums stay in float32, the decays across chunks summed segment by segment
(:func:`chunk_decay_matrix`). A sequence that is not a multiple
of ``Q`` is padded with ``dt = 0`` and ``x = 0`` positions, which neither decay nor add to the state.

The layer around it (``mamba_ssm/modules/mamba2.py``): one input projection to ``z, x, B, C, dt``;
a depthwise causal convolution of width ``d_conv`` with bias over ``x, B, C``, then SiLU;
``dt = softplus(dt + dt_bias)``; ``A = -exp(A_log)``; the SSD; ``y + D x``; a gated RMSNorm
(``rmsnorm(y * silu(z)) * w``, per group); the output projection. The decoding state
(:class:`SSMCache`) is the last ``d_conv - 1`` inputs of the convolution and the SSM state of
every head, which a call of any length continues.

Initialisation follows the reference: ``A`` uniform in [1, 16], ``dt`` log-uniform in
[1e-3, 0.1] (floored at 1e-4) through ``dt_bias`` = its inverse softplus, ``D = 1``, the norm's
gain 1. The projections are normal with std ``1/sqrt(fan_in)`` (this package's convention; the
reference keeps PyTorch's uniform of the same bound's order) and the output projection's std is
further divided by ``sqrt(n_layers)`` (the reference's ``rescale_prenorm_residual``), the
convolution's weight and bias uniform in ``+-1/sqrt(d_conv)`` (PyTorch's default for a depthwise
convolution, as the reference leaves it).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from bytelm.models.core import param
from bytelm.models.partitioning import constrain, gathered


@dataclasses.dataclass(frozen=True)
class SSMConfig:
    """A Mamba-2 layer's settings (H-Net's ``[model.ssm]`` table; MambaByte's ``[model]`` fields);
    the defaults are the reference's (state-spaces/mamba, as H-Net's released configs use them)."""

    d_state: int = 128  # N: the state per head channel
    d_conv: int = 4  # the depthwise causal convolution's width
    expand: int = 2  # d_inner = expand x d_model
    head_dim: int = 64  # P: channels per head
    groups: int = 1  # G: groups of heads sharing B and C
    chunk: int = 256  # Q: positions per chunk of the SSD algorithm

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 1:
                raise ValueError(f"ssm.{f.name} must be >= 1, got {getattr(self, f.name)}")

    def check_width(self, d_model: int, where: str) -> None:
        d_inner = self.expand * d_model
        if d_inner % self.head_dim or (d_inner // self.head_dim) % self.groups:
            raise ValueError(
                f"{where}: ssm.expand x d_model = {d_inner} must split into heads of ssm.head_dim "
                f"{self.head_dim}, and the heads into ssm.groups {self.groups}"
            )


class SSMCache(NamedTuple):
    """One Mamba-2 layer's decoding state (the module docstring)."""

    conv_BxKxC: jax.Array  # the last d_conv - 1 inputs of the convolution (zeros before the start)
    ssm_BxHxPxN: jax.Array  # float32


def segment_decay(a_BxCxQxH: jax.Array) -> jax.Array:
    """``B x C x H x Q x Q``: ``exp(sum of a over (s, l])`` for ``s <= l`` within each chunk, else 0
    (the decay from position ``s`` to ``l``), from differences of float32 cumulative sums."""
    cs = jnp.cumsum(a_BxCxQxH.astype(jnp.float32), axis=2)
    cs_BxCxHxQ = jnp.moveaxis(cs, 2, 3)
    diff = cs_BxCxHxQ[..., :, None] - cs_BxCxHxQ[..., None, :]
    Q = a_BxCxQxH.shape[2]
    causal = jnp.tril(jnp.ones((Q, Q), bool))
    causal = causal[None, None, None]
    return jnp.where(causal, jnp.exp(jnp.where(causal, diff, 0.0)), 0.0)


def chunk_decay_matrix(x_BxHxZ: jax.Array) -> jax.Array:
    """``B x H x Z x Z``: ``exp(x_{c+1} + ... + x_z)`` at ``[z, c]`` for ``c <= z`` (1 on the diagonal),
    0 above it. Each sum is accumulated over its own segment (a masked cumulative sum), not taken as a
    difference of two long cumulative sums, so it keeps float32's precision however long the sequence."""
    Z = x_BxHxZ.shape[-1]
    i = jnp.arange(Z)
    terms = jnp.where(i[:, None] > i[None, :], x_BxHxZ.astype(jnp.float32)[..., :, None], 0.0)  # [i, c]
    sums = jnp.cumsum(terms, axis=-2)  # [z, c]: the sum over c < i <= z
    return jnp.where(i[:, None] >= i[None, :], jnp.exp(sums), 0.0)


def ssd_chunked(
    x_BxTxHxP: jax.Array,
    dt_BxTxH: jax.Array,
    A_H: jax.Array,
    B_BxTxGxN: jax.Array,
    C_BxTxGxN: jax.Array,
    chunk: int,
    state_BxHxPxN: jax.Array | None = None,
    dtype=jnp.float32,
) -> tuple[jax.Array, jax.Array]:
    """``(y_BxTxHxP, final state_BxHxPxN)`` of the recurrence in the module docstring (without the
    ``D`` skip), from ``state`` (zeros when None), by chunks of ``min(chunk, T)`` positions. The four
    products take their inputs in ``dtype`` (the compute dtype) and accumulate in float32, as the
    reference's kernels do; the decays, the cumulative sums and the carried state stay float32."""
    Bsz, T, H, P = x_BxTxHxP.shape
    G, N = B_BxTxGxN.shape[2:]
    Q = max(1, min(chunk, T))
    pad = -T % Q
    f32 = jnp.float32
    if pad:
        widths = ((0, 0), (0, pad))
        x_BxTxHxP = jnp.pad(x_BxTxHxP, (*widths, (0, 0), (0, 0)))
        dt_BxTxH = jnp.pad(dt_BxTxH, (*widths, (0, 0)))
        B_BxTxGxN = jnp.pad(B_BxTxGxN, (*widths, (0, 0), (0, 0)))
        C_BxTxGxN = jnp.pad(C_BxTxGxN, (*widths, (0, 0), (0, 0)))
    nC = (T + pad) // Q
    dt = dt_BxTxH.astype(f32).reshape(Bsz, nC, Q, H)
    xbar = (x_BxTxHxP.astype(f32) * dt.reshape(Bsz, nC * Q, H)[..., None]).reshape(Bsz, nC, Q, H, P)
    # heads in groups of R consecutive heads, each group sharing its B and C
    R = H // G
    Bg = B_BxTxGxN.reshape(Bsz, nC, Q, G, N)
    Cg = C_BxTxGxN.reshape(Bsz, nC, Q, G, N)
    xbar_g = xbar.reshape(Bsz, nC, Q, G, R, P)
    a = dt * A_H.astype(f32)[None, None, None, :]  # B x C x Q x H: log decay per position
    cs = jnp.cumsum(a, axis=2)

    def dot(spec, u, v):
        return jnp.einsum(spec, u.astype(dtype), v.astype(dtype), preferred_element_type=f32)

    # 1. within a chunk: y_l = sum_{s <= l} (C_l . B_s) decay(s -> l) xbar_s, the scores once per group
    decay = segment_decay(a).reshape(Bsz, nC, G, R, Q, Q)
    scores = dot("bclgn,bcsgn->bcgls", Cg, Bg)[:, :, :, None] * decay  # B x C x G x R x Q x Q
    y_diag = dot("bcgrls,bcsgrp->bclgrp", scores, xbar_g).reshape(Bsz, nC, Q, H, P)
    # 2. each chunk's own final state: sum_s decay(s -> end) xbar_s B_s^T
    to_end = jnp.exp(cs[:, :, -1:, :] - cs).reshape(Bsz, nC, Q, G, R)  # B x C x Q x G x R
    chunk_states = dot("bcsgn,bcsgrp->bcgrpn", Bg, xbar_g * to_end[..., None]).reshape(Bsz, nC, H, P, N)
    # 3. the state entering each chunk, from every earlier chunk's own state decayed to it (and the state
    # the call started from, as a chunk before the first): one (C+1) x (C+1) decay matrix per head
    start = jnp.zeros((Bsz, H, P, N), f32) if state_BxHxPxN is None else state_BxHxPxN.astype(f32)
    states = jnp.concatenate([start[:, None], chunk_states.astype(f32)], axis=1)  # B x (C+1) x H x P x N
    log_chunk = jnp.pad(cs[:, :, -1, :], ((0, 0), (1, 0), (0, 0)))  # B x (C+1) x H: 0, then each chunk's
    across = chunk_decay_matrix(jnp.moveaxis(log_chunk, 1, 2))  # B x H x (C+1) x (C+1)
    carried = jnp.einsum("bhzc,bchpn->bzhpn", across, states, preferred_element_type=f32)
    entering_BxCxHxPxN, final = carried[:, :-1], carried[:, -1]
    # 4. what the entering state gives each position: C_l . state, decayed from the chunk's start
    entering_g = entering_BxCxHxPxN.reshape(Bsz, nC, G, R, P, N)
    y_off = dot("bclgn,bcgrpn->bclgrp", Cg, entering_g).reshape(Bsz, nC, Q, H, P) * jnp.exp(cs)[..., None]
    y = (y_diag + y_off).reshape(Bsz, nC * Q, H, P)[:, :T]
    return y, final


def ssd_flops_per_position(d_inner: int, groups: int, d_state: int, chunk: float) -> float:
    """Forward FLOPs per position of :func:`ssd_chunked` as it computes them, over ``chunk`` pairs
    per position within a chunk: the ``C . B`` scores (once per group) and their product with the
    inputs, each chunk's state, and each position's read of the entering state."""
    return 2.0 * chunk * groups * d_state + 2.0 * chunk * d_inner + 4.0 * d_inner * d_state


def mamba2_layer_flops(d_model: int, ssm: SSMConfig, seq_len: int, *, dense: bool = False) -> float:
    """Forward FLOPs per position of one :class:`Mamba2` layer over windows of ``seq_len`` positions:
    the input projection (to ``z, x, B, C, dt``), the depthwise convolution over ``x, B, C``, the
    chunked SSD (:func:`ssd_flops_per_position`; within a chunk the causal half of its pairs, or all
    of them ``dense``, as the program computes) and the output projection. Norms, gates, the ``D``
    skip: elementwise, 0 (the convention of :mod:`bytelm.models.flops`)."""
    D, E, N, G = d_model, ssm.expand * d_model, ssm.d_state, ssm.groups
    H = E // ssm.head_dim
    Q = max(1, min(ssm.chunk, seq_len))
    pairs = float(Q) if dense else (Q + 1) / 2  # keys per position within a chunk
    return (
        2.0 * D * (2 * E + 2 * G * N + H)
        + 2.0 * ssm.d_conv * (E + 2 * G * N)
        + ssd_flops_per_position(E, G, N, pairs)
        + 2.0 * E * D
    )


class Mamba2(nnx.Module):
    """One Mamba-2 mixer ``x_BxTxD -> y_BxTxD`` (the module docstring); ``cache=`` continues from a
    decoding state and returns the new one."""

    def __init__(self, d_model: int, ssm: SSMConfig, *, n_layers: int, rngs: nnx.Rngs, dtype=jnp.float32):
        ssm.check_width(d_model, "Mamba2")
        d_state, d_conv, expand, head_dim = ssm.d_state, ssm.d_conv, ssm.expand, ssm.head_dim
        groups, chunk = ssm.groups, ssm.chunk
        d_inner = expand * d_model
        self.d_inner, self.head_dim, self.heads = d_inner, head_dim, d_inner // head_dim
        self.groups, self.d_state, self.d_conv, self.chunk, self.dtype = groups, d_state, d_conv, chunk, dtype
        self.conv_dim = d_inner + 2 * groups * d_state
        proj = 2 * d_inner + 2 * groups * d_state + self.heads
        self.in_proj = param(rngs, (d_model, proj), ("embed", "mlp"))
        bound = 1.0 / math.sqrt(d_conv)
        self.conv_w = nnx.Param(
            jax.random.uniform(rngs.params(), (d_conv, self.conv_dim), jnp.float32, -bound, bound),
            logical_axes=(None, "mlp"),
        )
        self.conv_b = nnx.Param(
            jax.random.uniform(rngs.params(), (self.conv_dim,), jnp.float32, -bound, bound),
            logical_axes=("mlp",),
        )
        H = self.heads
        dt = jnp.exp(jax.random.uniform(rngs.params(), (H,), jnp.float32, math.log(1e-3), math.log(0.1)))
        dt = jnp.maximum(dt, 1e-4)
        self.dt_bias = nnx.Param(dt + jnp.log(-jnp.expm1(-dt)), logical_axes=("heads",))
        A = jax.random.uniform(rngs.params(), (H,), jnp.float32, 1.0, 16.0)
        self.A_log = nnx.Param(jnp.log(A), logical_axes=("heads",))
        self.D = nnx.Param(jnp.ones((H,), jnp.float32), logical_axes=("heads",))
        self.norm_w = nnx.Param(jnp.ones((d_inner,), jnp.float32), logical_axes=("mlp",))
        self.out_proj = param(
            rngs, (d_inner, d_model), ("mlp", "embed"), std=(d_inner**-0.5) / math.sqrt(n_layers)
        )

    def init_cache(self, batch: int) -> SSMCache:
        return SSMCache(
            jnp.zeros((batch, self.d_conv - 1, self.conv_dim), self.dtype),
            jnp.zeros((batch, self.heads, self.head_dim, self.d_state), jnp.float32),
        )

    def __call__(
        self, x_BxTxD: jax.Array, *, cache: SSMCache | None = None
    ) -> tuple[jax.Array, SSMCache | None]:
        dt_, Bsz, T = self.dtype, *x_BxTxD.shape[:2]
        E, G, N, H, P, K = self.d_inner, self.groups, self.d_state, self.heads, self.head_dim, self.d_conv
        zxbcdt = x_BxTxD.astype(dt_) @ gathered(self.in_proj).astype(dt_)
        zxbcdt = constrain(zxbcdt, ("batch", "length", "mlp"))
        z, xbc, dt_raw = jnp.split(zxbcdt, [E, E + self.conv_dim], axis=-1)
        # the depthwise causal convolution, continuing from the cached inputs (zeros at the start)
        history = (
            jnp.zeros((Bsz, K - 1, self.conv_dim), xbc.dtype)
            if cache is None
            else cache.conv_BxKxC.astype(xbc.dtype)
        )
        padded = jnp.concatenate([history, xbc], axis=1)  # B x (K-1+T) x C
        w = self.conv_w[...].astype(dt_)
        conv = sum(padded[:, k : k + T] * w[k][None, None, :] for k in range(K))
        conv = conv + self.conv_b[...].astype(dt_)[None, None, :]
        xbc_act = jax.nn.silu(conv)
        x, Bm, Cm = jnp.split(xbc_act, [E, E + G * N], axis=-1)
        dt = jax.nn.softplus(dt_raw.astype(jnp.float32) + self.dt_bias[...][None, None, :])
        A = -jnp.exp(self.A_log[...])
        y, state = ssd_chunked(
            x.reshape(Bsz, T, H, P),
            dt,
            A,
            Bm.reshape(Bsz, T, G, N),
            Cm.reshape(Bsz, T, G, N),
            self.chunk,
            None if cache is None else cache.ssm_BxHxPxN,
            dtype=dt_,
        )
        y = y + x.reshape(Bsz, T, H, P).astype(jnp.float32) * self.D[...][None, None, :, None]
        # the gated RMSNorm, per group of channels (eps 1e-5)
        g = y.reshape(Bsz, T, E) * jax.nn.silu(z.astype(jnp.float32))
        g = g.reshape(Bsz, T, G, E // G)
        g = g * jax.lax.rsqrt(jnp.mean(g * g, axis=-1, keepdims=True) + 1e-5)
        g = (g.reshape(Bsz, T, E) * self.norm_w[...][None, None, :]).astype(dt_)
        out = g @ gathered(self.out_proj).astype(dt_)
        new = (
            None
            if cache is None
            else SSMCache(padded[:, -(K - 1) :].astype(self.dtype) if K > 1 else history, state)
        )
        return out, new
