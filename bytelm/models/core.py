"""The one transformer core every family runs on (Flax NNX).

RMSNorm, rotary positions, a SwiGLU MLP, multi-head attention through
``jax.nn.dot_product_attention`` (causal, optional sliding window, optional cross-attention with
an explicit mask) and a pre-norm transformer stack. Parameters are float32; the compute dtype is a
constructor argument (bfloat16 on accelerators, float32 on CPU by default). Every weight carries
``logical_axes`` metadata (``embed``, ``mlp``, ``heads``, ``kv``, ``vocab``) that
:mod:`bytelm.training.sharding` maps to mesh axes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

Dtype = jnp.dtype


def param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...], *, std: float | None = None, fan_in: int | None = None) -> nnx.Param:
    """A float32 normal-initialised weight tagged with its logical axes.

    ``std`` defaults to ``1/sqrt(fan_in)`` (``fan_in`` defaults to ``shape[0]``).
    """
    if len(shape) != len(axes):
        raise ValueError(f"shape {shape} and logical axes {axes} differ in rank")
    if std is None:
        std = (fan_in or shape[0]) ** -0.5
    return nnx.Param(jax.random.normal(rngs.params(), shape, jnp.float32) * std, logical_axes=axes)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, *, eps: float = 1e-6):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), logical_axes=("embed",))
        self.eps = eps

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        x32 = x_BxTxD.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        scale = self.scale[...].reshape((1,) * (x32.ndim - 1) + (-1,))
        return (normed * scale).astype(x_BxTxD.dtype)


def rotary_tables(positions_BxT: jax.Array | None, T: int, head_dim: int, base: float) -> tuple[jax.Array, jax.Array]:
    """``(cos, sin)`` of the rotary angles, each ``B x T x head_dim/2`` (``1 x T x ...`` when
    ``positions_BxT`` is None, meaning positions ``0 .. T-1``: then they are constants, computed
    here once in float32 instead of by ``sin``/``cos`` ops that XLA may fuse into, and repeat in,
    every consumer loop)."""
    half = head_dim // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float32) / np.float32(half))
    if positions_BxT is None:
        angles = np.arange(T, dtype=np.float32)[None, :, None] * inv_freq.astype(np.float32)[None, None, :]
        return jnp.asarray(np.cos(angles)), jnp.asarray(np.sin(angles))
    angles_BxTxK2 = positions_BxT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
    return jnp.cos(angles_BxTxK2), jnp.sin(angles_BxTxK2)


def apply_rotary(x, cos, sin) -> jax.Array:
    """Rotate the two halves of ``x``'s last axis (rotate-half form) by angles whose ``cos`` and
    ``sin`` broadcast against ``x[..., :half]``."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def rotary(x_BxTxHxK: jax.Array, positions_BxT: jax.Array | None, base: float) -> jax.Array:
    """Rotary position embedding (rotate-half form) at integer ``positions`` (None: 0 .. T-1)."""
    cos_BxTxK2, sin_BxTxK2 = rotary_tables(positions_BxT, x_BxTxHxK.shape[1], x_BxTxHxK.shape[-1], base)
    return apply_rotary(x_BxTxHxK, cos_BxTxK2[:, :, None, :], sin_BxTxK2[:, :, None, :])


def blocked_causal_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, *, window: int = 0, block: int = 128) -> jax.Array:
    """Causal (optionally windowed) self-attention that skips key blocks wholly in the future.

    Queries are cut into blocks of ``block`` positions; query block ``i`` attends, through
    ``jax.nn.dot_product_attention``, only to keys ``[start_i, end_i)`` that some query of the block
    may see (``end_i`` = the block's end; ``start_i`` = 0, or the window's reach). Every query's
    softmax runs over all of its visible keys, so the result equals dense masked attention; the
    work on a causal ``T x T`` score matrix falls to about ``(n + 1) / 2n`` of it for ``n`` blocks.
    """
    T = q_BxTxHxK.shape[1]
    outs = []
    for qs in range(0, T, block):
        qe = min(T, qs + block)
        ks = 0 if window <= 0 else max(0, qs - (window - 1))
        q_pos = np.arange(qs, qe)[:, None]
        k_pos = np.arange(ks, qe)[None, :]
        allowed = k_pos <= q_pos
        if window > 0:
            allowed &= q_pos - k_pos < window
        outs.append(
            jax.nn.dot_product_attention(
                q_BxTxHxK[:, qs:qe],
                k_BxTxHxK[:, ks:qe],
                v_BxTxHxK[:, ks:qe],
                mask=jnp.asarray(allowed)[None, None],
            )
        )
    return jnp.concatenate(outs, axis=1)


def _softmax_part(q_NxQxK, k_NxSxK, v_NxSxK, *, causal: bool):
    """Attention of the queries over all the given keys (``causal``: Q == S, lower triangle).

    Leading dims ``N...`` are batch (heads included). Returns the normalised output ``N...xQxK``
    and the log-sum-exp of the scores ``N...xQ``, so that parts over disjoint key sets merge
    exactly."""
    scale = q_NxQxK.shape[-1] ** -0.5
    f32 = jnp.float32  # the softmax and the merges in fp32 whatever the compute dtype
    s_NxQxS = jnp.einsum("...qk,...sk->...qs", q_NxQxK * scale, k_NxSxK, preferred_element_type=f32)
    if causal:
        n = q_NxQxK.shape[-2]
        s_NxQxS = jnp.where(np.tril(np.ones((n, n), bool)), s_NxQxS, -jnp.inf)
    # the max only keeps exp in range: the output and the log-sum-exp do not depend on its value
    m_NxQx1 = jax.lax.stop_gradient(jnp.max(s_NxQxS, axis=-1, keepdims=True))
    p_NxQxS = jnp.exp(s_NxQxS - m_NxQx1)
    l_NxQ = jnp.sum(p_NxQxS, axis=-1)
    pv_NxQxK = jnp.einsum("...qs,...sk->...qk", p_NxQxS.astype(v_NxSxK.dtype), v_NxSxK, preferred_element_type=f32)
    return pv_NxQxK / l_NxQ[..., None], m_NxQx1[..., 0] + jnp.log(l_NxQ)


def _merge_parts(out_a, lse_a, out_b, lse_b):
    """Attention over the union of two disjoint key sets, from the attention over each."""
    lse = jnp.logaddexp(lse_a, lse_b)
    return out_a * jnp.exp(lse_a - lse)[..., None] + out_b * jnp.exp(lse_b - lse)[..., None], lse


def halving_causal_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, *, block: int = 128):
    """Causal self-attention that skips the masked half of the score matrix without slicing loops.

    The sequence is halved recursively: each half attends causally to itself (both halves as one
    batched call, through a free reshape), and the second half's queries also attend to all of the
    first half's keys (a dense, unmasked product); the two parts merge exactly through their
    log-sum-exp, as in flash attention. Down to ``block`` positions, the work is ``(1 + 1/n) / 2``
    of dense attention for ``n = T / block`` (5/8 at T=512, block 128), with only matmuls,
    one masked softmax per leaf and small merges of ``T x K`` outputs: on XLA CPU this needs
    about 30% less work than slicing the queries into blocks (``benchmarks/RESULTS.md``).
    This form takes ``B x T x H x K``; :class:`Attention` calls :func:`halving_attention_bhtk`
    on heads-major projections, where every reshape of the recursion is free.
    """
    to_bhtk = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731
    out = halving_attention_bhtk(to_bhtk(q_BxTxHxK), to_bhtk(k_BxTxHxK), to_bhtk(v_BxTxHxK), block=block)
    return jnp.swapaxes(out, 1, 2)


def halving_attention_bhtk(q_BxHxTxK, k_BxHxTxK, v_BxHxTxK, *, block: int = 128):
    """:func:`halving_causal_attention` on ``B x H x T x K`` arrays (heads before positions)."""
    shape = q_BxHxTxK.shape
    flat = lambda x: x.reshape(-1, *x.shape[-2:])  # noqa: E731
    out_NxTxK, _ = _halving(flat(q_BxHxTxK), flat(k_BxHxTxK), flat(v_BxHxTxK), block)
    return out_NxTxK.reshape(shape).astype(q_BxHxTxK.dtype)


def _halving(q_NxTxK, k_NxTxK, v_NxTxK, block):
    """Recursion of :func:`halving_causal_attention` on ``N x T x K`` (every level folds its two
    halves into the batch, so the rank stays 3 however deep it goes: XLA CPU's YNNPACK dots
    reject operands of rank 8 or more)."""
    N, T, K = q_NxTxK.shape
    if T <= block or T % 2:
        return _softmax_part(q_NxTxK, k_NxTxK, v_NxTxK, causal=True)
    half = T // 2
    q2, k2, v2 = (x.reshape(N, 2, half, K) for x in (q_NxTxK, k_NxTxK, v_NxTxK))
    # each half over itself, causally, both halves as one batch of 2N
    out_d, lse_d = _halving(q_NxTxK.reshape(2 * N, half, K), k_NxTxK.reshape(2 * N, half, K), v_NxTxK.reshape(2 * N, half, K), block)
    out_d, lse_d = out_d.reshape(N, 2, half, K), lse_d.reshape(N, 2, half)
    # the second half's queries over all of the first half's keys, merged into their own part
    out_x, lse_x = _softmax_part(q2[:, 1], k2[:, 0], v2[:, 0], causal=False)
    out_2, lse_2 = _merge_parts(out_d[:, 1], lse_d[:, 1], out_x, lse_x)
    out = jnp.stack([out_d[:, 0], out_2], axis=1).reshape(N, T, K)
    lse = jnp.stack([lse_d[:, 0], lse_2], axis=1).reshape(N, T)
    return out, lse


class Attention(nnx.Module):
    """Multi-head attention. Self-attention when ``kv_BxSxD`` is None, else cross-attention.

    Masks: ``causal`` (self-attention only), ``window`` > 0 for a sliding window of that many
    positions (the current one included), and an explicit boolean ``mask_BxTxS`` (True = may
    attend). Rotary positions apply to self-attention only.
    """

    def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs, d_kv: int | None = None, rope_base: float = 10000.0, dtype: Dtype = jnp.float32, attention_block: int = 128):
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        d_kv = d_kv or d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.rope_base = rope_base
        self.dtype = dtype
        self.block = attention_block
        hk = (n_heads, self.head_dim)
        self.wq = param(rngs, (d_model, *hk), ("embed", "heads", "kv"), fan_in=d_model)
        self.wk = param(rngs, (d_kv, *hk), ("embed", "heads", "kv"), fan_in=d_kv)
        self.wv = param(rngs, (d_kv, *hk), ("embed", "heads", "kv"), fan_in=d_kv)
        self.wo = param(rngs, (*hk, d_model), ("heads", "kv", "embed"), fan_in=d_model)

    def __call__(
        self,
        x_BxTxD: jax.Array,
        *,
        kv_BxSxD: jax.Array | None = None,
        positions_BxT: jax.Array | None = None,
        causal: bool = True,
        window: int = 0,
        mask_BxTxS: jax.Array | None = None,
    ) -> jax.Array:
        dt = self.dtype
        x = x_BxTxD.astype(dt)
        src = x if kv_BxSxD is None else kv_BxSxD.astype(dt)
        if kv_BxSxD is not None:
            causal = False
        q_BxTxHxK = jnp.einsum("btd,dhk->bthk", x, self.wq[...].astype(dt))
        k_BxSxHxK = jnp.einsum("bsd,dhk->bshk", src, self.wk[...].astype(dt))
        v_BxSxHxK = jnp.einsum("bsd,dhk->bshk", src, self.wv[...].astype(dt))
        if kv_BxSxD is None:
            cos, sin = rotary_tables(positions_BxT, x.shape[1], self.head_dim, self.rope_base)
            cos, sin = cos[:, :, None], sin[:, :, None]  # B x T x 1 x K/2
            q_BxTxHxK = apply_rotary(q_BxTxHxK, cos, sin)
            k_BxSxHxK = apply_rotary(k_BxSxHxK, cos, sin)
        # On CPU, long causal self-attention skips the masked half of the scores; accelerators keep
        # jax.nn.dot_product_attention, whose fused kernels (e.g. cuDNN) skip it themselves.
        long_causal = causal and mask_BxTxS is None and x.shape[1] >= 2 * self.block
        long_causal = long_causal and jax.default_backend() == "cpu"
        if long_causal and window <= 0:
            # heads-major once: the recursion's reshapes and products then need no transposes
            heads_major = lambda y: jnp.swapaxes(y, 1, 2)  # noqa: E731
            out_BxHxTxK = halving_attention_bhtk(
                heads_major(q_BxTxHxK), heads_major(k_BxSxHxK), heads_major(v_BxSxHxK), block=self.block
            )
            return jnp.einsum("bhtk,hkd->btd", out_BxHxTxK, self.wo[...].astype(dt))
        if long_causal:
            out_BxTxHxK = blocked_causal_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, window=window, block=self.block)
        else:
            out_BxTxHxK = jax.nn.dot_product_attention(
                q_BxTxHxK,
                k_BxSxHxK,
                v_BxSxHxK,
                mask=None if mask_BxTxS is None else mask_BxTxS[:, None, :, :],
                is_causal=causal,
                local_window_size=(window - 1, 0) if window > 0 else None,
            )
        return jnp.einsum("bthk,hkd->btd", out_BxTxHxK, self.wo[...].astype(dt))


class MLP(nnx.Module):
    """SwiGLU: ``down(silu(x W_gate) * (x W_up))``."""

    def __init__(self, d_model: int, d_hidden: int, *, rngs: nnx.Rngs, dtype: Dtype = jnp.float32):
        self.w_gate = param(rngs, (d_model, d_hidden), ("embed", "mlp"))
        self.w_up = param(rngs, (d_model, d_hidden), ("embed", "mlp"))
        self.w_down = param(rngs, (d_hidden, d_model), ("mlp", "embed"))
        self.dtype = dtype

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        dt = self.dtype
        x_NxD = x_BxTxD.astype(dt).reshape(-1, x_BxTxD.shape[-1])
        w = (self.w_gate[...].astype(dt), self.w_up[...].astype(dt), self.w_down[...].astype(dt))
        return swiglu_mlp(x_NxD, *w).reshape(x_BxTxD.shape)


@jax.custom_vjp
def swiglu_mlp(x_NxD, w_gate_DxF, w_up_DxF, w_down_FxD):
    """``(silu(x W_gate) * (x W_up)) W_down`` with a hand-written backward.

    The backward recomputes the sigmoid once in one elementwise pass (autodiff through ``silu``
    left XLA CPU several fusions that each recomputed it), and forms every weight gradient as a
    plain row-major product of an explicitly transposed activation (``x^T``, shared by the gate
    and up weights, and ``dy^T``) instead of letting the compiler transpose the wide ``N x F``
    gradients inside strided elementwise loops.
    """
    return _swiglu_mlp_fwd(x_NxD, w_gate_DxF, w_up_DxF, w_down_FxD)[0]


def _swiglu_mlp_fwd(x_NxD, w_gate_DxF, w_up_DxF, w_down_FxD):
    gate_NxF = x_NxD @ w_gate_DxF
    up_NxF = x_NxD @ w_up_DxF
    out = (gate_NxF * jax.nn.sigmoid(gate_NxF) * up_NxF) @ w_down_FxD
    return out, (x_NxD, gate_NxF, up_NxF, w_gate_DxF, w_up_DxF, w_down_FxD)


def _swiglu_mlp_bwd(res, dy_NxD):
    x_NxD, gate_NxF, up_NxF, w_gate_DxF, w_up_DxF, w_down_FxD = res
    sig_NxF = jax.nn.sigmoid(gate_NxF)
    silu_NxF = gate_NxF * sig_NxF
    dh_NxF = dy_NxD @ w_down_FxD.T
    d_w_down_FxD = (dy_NxD.T @ (silu_NxF * up_NxF)).T
    d_gate_NxF = dh_NxF * up_NxF * sig_NxF * (1 + gate_NxF * (1 - sig_NxF))  # silu' = s + g s (1 - s)
    d_up_NxF = dh_NxF * silu_NxF
    x_DxN = x_NxD.T
    dx_NxD = d_gate_NxF @ w_gate_DxF.T + d_up_NxF @ w_up_DxF.T
    return dx_NxD, x_DxN @ d_gate_NxF, x_DxN @ d_up_NxF, d_w_down_FxD


swiglu_mlp.defvjp(_swiglu_mlp_fwd, _swiglu_mlp_bwd)


class Block(nnx.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``."""

    def __init__(self, d_model: int, n_heads: int, d_hidden: int, *, rngs: nnx.Rngs, rope_base: float = 10000.0, dtype: Dtype = jnp.float32):
        self.attn_norm = RMSNorm(d_model)
        self.attn = Attention(d_model, n_heads, rngs=rngs, rope_base=rope_base, dtype=dtype)
        self.mlp_norm = RMSNorm(d_model)
        self.mlp = MLP(d_model, d_hidden, rngs=rngs, dtype=dtype)

    def __call__(self, x_BxTxD: jax.Array, *, positions_BxT=None, window: int = 0, causal: bool = True, mask_BxTxS=None) -> jax.Array:
        h = x_BxTxD + self.attn(
            self.attn_norm(x_BxTxD), positions_BxT=positions_BxT, window=window, causal=causal, mask_BxTxS=mask_BxTxS
        ).astype(x_BxTxD.dtype)
        return h + self.mlp(self.mlp_norm(h)).astype(h.dtype)


class Transformer(nnx.Module):
    """A stack of ``n_layers`` causal blocks (with an optional sliding window)."""

    def __init__(self, d_model: int, n_layers: int, n_heads: int, d_hidden: int, *, rngs: nnx.Rngs, window: int = 0, rope_base: float = 10000.0, dtype: Dtype = jnp.float32):
        self.blocks = nnx.List(
            [Block(d_model, n_heads, d_hidden, rngs=rngs, rope_base=rope_base, dtype=dtype) for _ in range(n_layers)]
        )
        self.window = window

    def __call__(self, x_BxTxD: jax.Array, *, positions_BxT=None, mask_BxTxS=None) -> jax.Array:
        for block in self.blocks:
            x_BxTxD = block(x_BxTxD, positions_BxT=positions_BxT, window=self.window, mask_BxTxS=mask_BxTxS)
        return x_BxTxD


class Embed(nnx.Module):
    def __init__(self, n_rows: int, dim: int, *, rngs: nnx.Rngs, axes=("vocab", "embed")):
        self.table = param(rngs, (n_rows, dim), axes, std=1.0)

    def __call__(self, ids) -> jax.Array:
        """Rows for integer ``ids``; a floating ``ids`` array is read as one-hot weights over rows
        (``ids @ table``), which lets causality tests take gradients with respect to the inputs."""
        if jnp.issubdtype(ids.dtype, jnp.floating):
            return ids @ self.table[...]
        return jnp.take(self.table[...], ids, axis=0)


def pad_vocab(n_valid: int, multiple: int) -> int:
    """Rows of the embedding/logit tables: ``n_valid`` rounded up to a multiple of ``multiple``."""
    return -(-n_valid // multiple) * multiple
