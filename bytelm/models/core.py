"""The layers every family runs on (Flax NNX); :mod:`bytelm.models.stack` builds the transformer
stack of them.

RMSNorm, rotary positions, a SwiGLU MLP, multi-head attention (through
:func:`bytelm.models.attention.attend`: causal, optional sliding window, optional cross-attention
with an explicit mask; with a :class:`~bytelm.models.cache.KVCache`, over the cached positions
too), embeddings and the output head.
Dropout (:class:`Dropout`, ``model.dropout``) applies in training only, where the trainer hands
a forward pass a key; scoring without one is deterministic. Parameters are float32; the compute
dtype is a constructor argument (bfloat16 on accelerators, float32 on CPU by default), and kernels come
resolved from :mod:`bytelm.models.kernels`. Every weight carries ``logical_axes`` metadata (``embed``,
``mlp``, ``heads``, ``kv``, ``vocab``; ``layers`` for a scanned stack) that :mod:`bytelm.training.sharding`
maps to mesh axes; a table whose first logical axis is ``vocab`` is an embedding (rows gathered by id),
which is how parameters are counted.
"""

from __future__ import annotations

import functools
from typing import overload

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bytelm.constants import BOS_ID, PAD_ID
from bytelm.models.attention import attend
from bytelm.models.cache import KVCache, offset_positions
from bytelm.models.partitioning import constrain, gathered

Dtype = jnp.dtype
COMPUTE_DTYPES = {
    "float32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "float16": jnp.float16,
}  # model.dtype names
EMBEDDING_AXIS = "vocab"  # the first logical axis of a lookup table (embeddings, n-gram hash tables)
LAYER_AXIS = "layers"  # the leading axis of a scanned stack's weights (bytelm.models.stack)


def is_hashed_ngram_table(v) -> bool:
    """Whether ``v`` is a hashed n-gram table (:class:`Embed` with ``hashed=True``)."""
    return isinstance(v, nnx.Variable) and bool(v.get_metadata().get("hashed_ngrams"))


def is_lookup_table(v) -> bool:
    """Whether ``v`` is a lookup table (embeddings, n-gram hash tables): an ``nnx.Variable`` whose
    first logical axis is :data:`EMBEDDING_AXIS`. An output head (``embed, vocab``) is not."""
    axes = v.get_metadata().get("logical_axes") if isinstance(v, nnx.Variable) else None
    return axes is not None and len(axes) > 0 and axes[0] == EMBEDDING_AXIS


def param(
    rngs: nnx.Rngs,
    shape: tuple[int, ...],
    axes: tuple[str | None, ...],
    *,
    std: float | None = None,
    fan_in: int | None = None,
    truncated: bool = False,
) -> nnx.Param:
    """A float32 normal-initialised weight tagged with its logical axes.

    ``std`` defaults to ``1/sqrt(fan_in)`` (``fan_in`` defaults to ``shape[0]``); ``truncated``
    draws from the normal cut at 3 standard deviations (``std`` is the uncut one's, as torch's
    ``trunc_normal_``).
    """
    if len(shape) != len(axes):
        raise ValueError(f"shape {shape} and logical axes {axes} differ in rank")
    if std is None:
        std = (fan_in or shape[0]) ** -0.5
    return nnx.Param(_draw(rngs.params(), tuple(shape), bool(truncated), jnp.float32(std)), logical_axes=axes)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _draw(key: jax.Array, shape: tuple[int, ...], truncated: bool, std: jax.Array) -> jax.Array:
    """``std`` times a standard normal (cut at 3 when ``truncated``) draw: one compiled program per
    shape, where building a model outside ``jit`` would otherwise compile each step of it per shape."""
    unit = (
        jax.random.truncated_normal(key, -3.0, 3.0, shape, jnp.float32)
        if truncated
        else jax.random.normal(key, shape, jnp.float32)
    )
    return unit * std


class Dropout:
    """Inverted dropout's randomness for one training forward pass: each activation is zeroed with
    probability ``rate`` and the survivors scaled by ``1 / (1 - rate)`` (so its expectation is
    unchanged). Call sites draw independent masks through :meth:`at` (``fold_in`` of a site
    number), so a model's masks are a function of the step's key alone: the same key gives the
    same masks, scanned or not, and a resumed run draws the masks the uninterrupted one would.

    The mask is a keyed integer hash of each element's position (:func:`dropout_bits`), not
    ``jax.random.bernoulli``: the key gives two 32-bit words once per site, and each element costs
    one XOR and one multiply-xorshift hash, where threefry's twenty rounds per element made the
    masks about 12% of a CPU training step (a 4 x 192 byte LM at batch 16 x 256: 9 masks, 46 ms
    against 2.3 ms; benchmarks/dropout_masks.py). A rate is kept to within 2^-32."""

    def __init__(self, rate: float, key: jax.Array):
        self.rate = float(rate)
        self.key = key

    def at(self, site) -> Dropout:
        """The independent dropout of call site ``site`` (an int, or a traced int32 scalar)."""
        return Dropout(self.rate, jax.random.fold_in(self.key, site))

    def __call__(self, x: jax.Array) -> jax.Array:
        threshold = min(round(self.rate * 2**32), 2**32 - 1)  # drop where the 32 bits fall below it
        keep = dropout_bits(self.key, x.shape) >= jnp.uint32(threshold)
        return jnp.where(keep, x / jnp.asarray(1.0 - self.rate, x.dtype), jnp.zeros((), x.dtype))


def _mix32(x: jax.Array) -> jax.Array:
    """A bijective avalanche hash of uint32 words (two multiply-xorshift rounds; the constants of
    Chris Wellons' "lowbias32", found by his hash-prospector search)."""
    x = (x ^ (x >> 16)) * jnp.uint32(0x7FEB352D)
    x = (x ^ (x >> 15)) * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def dropout_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """32 pseudo-random bits per element of ``shape`` (uint32), a function of ``key`` and the
    element's position: ``mix(mix(row + k0) ^ mix(col + k1))``, where ``col`` is the index along
    the last axis, ``row`` the flat index over the others and ``k0, k1`` two words drawn from
    ``key``. The per-row and per-column hashes are vectors; each element costs one XOR and one
    hash, and the iotas partition with the array under sharding."""
    shape = tuple(int(d) for d in shape)
    cols = shape[-1] if shape else 1
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    if rows >= 2**32 or cols >= 2**32:
        raise ValueError(
            f"dropout on shape {shape}: at most 2^32 - 1 rows (the leading axes' product) and columns"
        )
    k = jax.random.bits(key, (2,), jnp.uint32)
    row_R = _mix32(jax.lax.iota(jnp.uint32, rows) + k[0])
    col_C = _mix32(jax.lax.iota(jnp.uint32, cols) + k[1])
    return _mix32(row_R[:, None] ^ col_C[None, :]).reshape(shape)


def make_dropout(rate: float, key: jax.Array | None) -> Dropout | None:
    """The dropout of a training pass (``key`` given and ``rate`` > 0), else None (no dropout)."""
    return Dropout(rate, key) if key is not None and rate > 0 else None


def drop_at(drop: Dropout | None, site) -> Dropout | None:
    """``drop.at(site)``, or None when there is no dropout."""
    return None if drop is None else drop.at(site)


def apply_dropout(x: jax.Array, drop: Dropout | None) -> jax.Array:
    return x if drop is None else drop(x)


class RMSNorm(nnx.Module):
    """Normalises the last axis to unit root mean square, then scales it (a learned gain of ones at
    init; ``axis``: the gain's logical axis)."""

    def __init__(self, dim: int, *, eps: float = 1e-6, axis: str = "embed"):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), logical_axes=(axis,))
        self.eps = eps

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        x32 = x_BxTxD.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        scale = self.scale[...].reshape((1,) * (x32.ndim - 1) + (-1,))
        return (normed * scale).astype(x_BxTxD.dtype)


def rotary_tables(
    positions_BxT: jax.Array | None, T: int, head_dim: int, base: float
) -> tuple[jax.Array, jax.Array]:
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


class Attention(nnx.Module):
    """Multi-head attention. Self-attention when ``kv_BxSxD`` is None, else cross-attention.

    Masks: ``causal`` (self-attention only), ``window`` > 0 for a sliding window of that many
    positions (the current one included), an explicit boolean ``mask_BxTxS`` (True = may
    attend), and ``segments_BxT`` (self-attention: document ids; a query sees only its document). Rotary
    positions apply to self-attention only, which may run over a :class:`~bytelm.models.cache.KVCache`
    (decoding: :meth:`__call__`'s ``cache``). ``implementation`` is a resolved attention kernel
    (:mod:`bytelm.models.kernels`). ``qk_norm``: each head's query and key are RMS-normalised (with a learned
    gain per head dimension, shared by the heads) before the rotary positions, which bounds the attention
    logits (QK-norm per head, the form Gemma 3 and Qwen 3 use; OLMo 2 normalises the whole projection before
    it is split into heads).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        rngs: nnx.Rngs,
        d_kv: int | None = None,
        rope_base: float = 10000.0,
        dtype: Dtype = jnp.float32,
        implementation: str = "xla",
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
    ):
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        d_kv = d_kv or d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.rope_base = rope_base
        self.dtype = dtype
        self.implementation = implementation
        hk = (n_heads, self.head_dim)
        self.wq = param(rngs, (d_model, *hk), ("embed", "heads", "kv"), fan_in=d_model)
        self.wk = param(rngs, (d_kv, *hk), ("embed", "heads", "kv"), fan_in=d_kv)
        self.wv = param(rngs, (d_kv, *hk), ("embed", "heads", "kv"), fan_in=d_kv)
        self.wo = param(rngs, (*hk, d_model), ("heads", "kv", "embed"), fan_in=d_model)
        self.q_norm = RMSNorm(self.head_dim, eps=norm_eps, axis="kv") if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps=norm_eps, axis="kv") if qk_norm else None

    def project(self, x: jax.Array, src: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Queries from ``x`` and keys and values from ``src`` (both already in the compute dtype),
        ``B x T x H x K``, before the rotary positions; QK-normalised with ``qk_norm``."""
        dt = self.dtype
        q_BxTxHxK = jnp.einsum("btd,dhk->bthk", x, gathered(self.wq).astype(dt))
        k_BxSxHxK = jnp.einsum("bsd,dhk->bshk", src, gathered(self.wk).astype(dt))
        v_BxSxHxK = jnp.einsum("bsd,dhk->bshk", src, gathered(self.wv).astype(dt))
        if self.q_norm is not None and self.k_norm is not None:
            q_BxTxHxK, k_BxSxHxK = self.q_norm(q_BxTxHxK), self.k_norm(k_BxSxHxK)
        return q_BxTxHxK, k_BxSxHxK, v_BxSxHxK

    @overload
    def __call__(
        self,
        x_BxTxD: jax.Array,
        *,
        kv_BxSxD: jax.Array | None = None,
        positions_BxT: jax.Array | None = None,
        causal: bool = True,
        window: int = 0,
        mask_BxTxS: jax.Array | None = None,
        segments_BxT: jax.Array | None = None,
        cache: None = None,
    ) -> jax.Array: ...

    @overload
    def __call__(
        self,
        x_BxTxD: jax.Array,
        *,
        kv_BxSxD: jax.Array | None = None,
        positions_BxT: jax.Array | None = None,
        causal: bool = True,
        window: int = 0,
        mask_BxTxS: jax.Array | None = None,
        segments_BxT: jax.Array | None = None,
        cache: KVCache,
    ) -> tuple[jax.Array, KVCache]: ...

    def __call__(
        self,
        x_BxTxD: jax.Array,
        *,
        kv_BxSxD: jax.Array | None = None,
        positions_BxT: jax.Array | None = None,
        causal: bool = True,
        window: int = 0,
        mask_BxTxS: jax.Array | None = None,
        segments_BxT: jax.Array | None = None,
        cache: KVCache | None = None,
    ) -> jax.Array | tuple[jax.Array, KVCache]:
        """The attention's output, ``B x T x D``; with a ``cache``, the output and the updated cache
        (:meth:`apply`)."""
        out_BxTxD, cache = self.apply(
            x_BxTxD,
            kv_BxSxD=kv_BxSxD,
            positions_BxT=positions_BxT,
            causal=causal,
            window=window,
            mask_BxTxS=mask_BxTxS,
            segments_BxT=segments_BxT,
            cache=cache,
        )
        return out_BxTxD if cache is None else (out_BxTxD, cache)

    def apply(
        self,
        x_BxTxD: jax.Array,
        *,
        kv_BxSxD: jax.Array | None = None,
        positions_BxT: jax.Array | None = None,
        causal: bool = True,
        window: int = 0,
        mask_BxTxS: jax.Array | None = None,
        segments_BxT: jax.Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """``(output, cache)``. Without a cache, attention over the inputs (or ``kv_BxSxD``) under
        the masks, and None. With a ``cache`` (self-attention only), the ``T`` inputs are new
        positions (``positions_BxT``, absolute; None: ``0 .. T-1``) after the cached ones: their keys
        and values are written into the cache and they attend over it, under the causal mask,
        ``window`` and, with ``segments_BxT``, their documents (``mask_BxTxS``, if given, is over the
        cache's slots); the cache returned holds them."""
        dt = self.dtype
        x = x_BxTxD.astype(dt)
        src = x if kv_BxSxD is None else kv_BxSxD.astype(dt)
        if kv_BxSxD is not None:
            causal = False
        if cache is not None:
            if kv_BxSxD is not None:
                raise ValueError(
                    "a key/value cache holds self-attention's keys and values, not a cross-attention's"
                )
            if positions_BxT is None:
                positions_BxT = offset_positions(0, *x.shape[:2])
        q_BxTxHxK, k_BxSxHxK, v_BxSxHxK = self.project(x, src)
        if kv_BxSxD is None:
            cos, sin = rotary_tables(positions_BxT, x.shape[1], self.head_dim, self.rope_base)
            cos, sin = cos[:, :, None], sin[:, :, None]  # B x T x 1 x K2
            q_BxTxHxK = apply_rotary(q_BxTxHxK, cos, sin)
            k_BxSxHxK = apply_rotary(k_BxSxHxK, cos, sin)
        if cache is not None:  # the keys and values: the cache's slots, the new positions written in
            assert positions_BxT is not None
            cache = cache.write(k_BxSxHxK, v_BxSxHxK, positions_BxT, segments_BxT)
            visible_BxTxS = cache.visible(positions_BxT, segments_BxT, window)
            mask_BxTxS = visible_BxTxS if mask_BxTxS is None else visible_BxTxS & mask_BxTxS
            k_BxSxHxK, v_BxSxHxK = cache.k_BxSxHxK, cache.v_BxSxHxK
            causal, window, segments_BxT = False, 0, None
        out_BxTxHxK = attend(
            q_BxTxHxK,
            k_BxSxHxK,
            v_BxSxHxK,
            causal=causal,
            window=window,
            mask_BxTxS=mask_BxTxS,
            segments_BxT=segments_BxT,
            implementation=self.implementation,
        )
        return jnp.einsum("bthk,hkd->btd", out_BxTxHxK, gathered(self.wo).astype(dt)), cache

    def init_cache(self, batch: int, slots: int) -> KVCache:
        """An empty cache of ``slots`` positions per row for this layer's keys and values."""
        return KVCache.empty(batch, slots, self.n_heads, self.head_dim, self.dtype)


class MLP(nnx.Module):
    """SwiGLU: ``down(silu(x W_gate) * (x W_up))``; ``backward`` is a resolved MLP kernel
    (:mod:`bytelm.models.kernels`): ``manual`` (:func:`swiglu_mlp`) or ``autodiff``."""

    def __init__(
        self,
        d_model: int,
        d_hidden: int,
        *,
        rngs: nnx.Rngs,
        dtype: Dtype = jnp.float32,
        backward: str = "autodiff",
    ):
        self.w_gate = param(rngs, (d_model, d_hidden), ("embed", "mlp"))
        self.w_up = param(rngs, (d_model, d_hidden), ("embed", "mlp"))
        self.w_down = param(rngs, (d_hidden, d_model), ("mlp", "embed"))
        self.dtype = dtype
        self.backward = backward

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        dt = self.dtype
        x_NxD = constrain(x_BxTxD.astype(dt).reshape(-1, x_BxTxD.shape[-1]), ("batch", "embed"))
        w = (
            gathered(self.w_gate).astype(dt),
            gathered(self.w_up).astype(dt),
            gathered(self.w_down).astype(dt),
        )
        out_NxD = swiglu_mlp(x_NxD, *w) if self.backward == "manual" else swiglu(x_NxD, *w)
        return constrain(out_NxD, ("batch", "embed")).reshape(x_BxTxD.shape)


def swiglu(x_NxD, w_gate_DxF, w_up_DxF, w_down_FxD):
    """``(silu(x W_gate) * (x W_up)) W_down``, the reference that :func:`swiglu_mlp` equals (the
    hidden activations placed rows x ``mlp``: :func:`bytelm.models.partitioning.constrain`)."""
    gate_NxF = constrain(x_NxD @ w_gate_DxF, ("batch", "mlp"))
    up_NxF = constrain(x_NxD @ w_up_DxF, ("batch", "mlp"))
    return (gate_NxF * jax.nn.sigmoid(gate_NxF) * up_NxF) @ w_down_FxD


@jax.custom_vjp
def swiglu_mlp(x_NxD, w_gate_DxF, w_up_DxF, w_down_FxD):
    """:func:`swiglu` with a hand-written backward (the ``manual`` MLP kernel, chosen on CPU).

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


class Embed(nnx.Module):
    """A lookup table (logical axes ``(vocab, embed)``: counted as embedding parameters). ``hashed``:
    a table of hashed n-grams (its rows are hash buckets, not ids), which reports count apart."""

    def __init__(
        self,
        n_rows: int,
        dim: int,
        *,
        rngs: nnx.Rngs,
        std: float = 1.0,
        truncated: bool = False,
        hashed: bool = False,
    ):
        self.table = param(rngs, (n_rows, dim), (EMBEDDING_AXIS, "embed"), std=std, truncated=truncated)
        if hashed:
            self.table.set_metadata(hashed_ngrams=True)

    def __call__(self, ids) -> jax.Array:
        """Rows for integer ``ids``; a floating ``ids`` array is read as one-hot weights over rows
        (``ids @ table``), which lets causality tests take gradients with respect to the inputs."""
        if jnp.issubdtype(ids.dtype, jnp.floating):
            return ids @ gathered(self.table)
        return jnp.take(gathered(self.table), ids, axis=0)


# A polynomial rolling hash of the ids of an n-gram in wrapping uint32 arithmetic, with the
# reference's first prime (1_000_000_007) as the multiplier; the reference computes the same kind
# of hash in int64 (``rolling_polynomial_hash``), which JAX keeps off by default.
_HASH_MULT = np.uint32(1_000_000_007)


def ngram_hashes(
    ids_BxT: jax.Array, n: int, table_size: int, reach_BxT: jax.Array | None = None
) -> jax.Array:
    """Row index of the n-gram ending at each position (ids before the start count as PAD): the
    input of the hashed n-gram embeddings of BLT's encoder and of :class:`NgramEmbed`. With
    ``reach_BxT``, the ids more than ``reach`` positions back count as PAD too (a document's
    first ids do not read the previous document's)."""
    padded = jnp.pad(ids_BxT.astype(jnp.uint32), ((0, 0), (n - 1, 0)), constant_values=PAD_ID)
    T = ids_BxT.shape[1]
    h = jnp.full(ids_BxT.shape, np.uint32(n), jnp.uint32)
    for m in range(n):  # oldest id first, n - 1 - m positions back
        ids = padded[:, m : m + T]
        if reach_BxT is not None and m < n - 1:
            ids = jnp.where(reach_BxT >= n - 1 - m, ids, np.uint32(PAD_ID))
        h = h * _HASH_MULT + ids + np.uint32(1)
    return (h % np.uint32(table_size)).astype(jnp.int32)


def document_spans(ids_BxT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(segments_BxT, reach_BxT)`` of a window of a training stream, in which a document starts
    at every BOS: each position's document id (the BOS seen so far) and how many positions back
    its document reaches (to its BOS; to the window's start before the first BOS)."""
    is_bos = ids_BxT == BOS_ID
    t_1xT = jnp.arange(ids_BxT.shape[1], dtype=jnp.int32)[None, :]
    start_BxT = jax.lax.cummax(jnp.where(is_bos, t_1xT, 0), axis=1)
    return jnp.cumsum(is_bos, axis=1, dtype=jnp.int32), t_1xT - start_BxT


class NgramEmbed(nnx.Module):
    """Hashed n-gram embeddings: for each ``n`` in ``sizes``, a table of ``rows`` rows indexed by
    :func:`ngram_hashes` of the ``n`` ids ending at each position; the call returns the sum of the
    rows (added to an id embedding by the caller). ``n_context`` ids before the first position are
    what a call over a continuation needs (:meth:`__call__`'s ``context_BxC``)."""

    def __init__(self, sizes: tuple[int, ...], rows: int, dim: int, *, rngs: nnx.Rngs, std: float = 1.0):
        self.sizes, self.rows = tuple(sizes), rows
        self.n_context = max(self.sizes) - 1
        self.tables = nnx.List([Embed(rows, dim, rngs=rngs, std=std, hashed=True) for _ in self.sizes])

    def __call__(
        self,
        ids_BxT: jax.Array,
        context_BxC: jax.Array | None = None,
        reach_BxT: jax.Array | None = None,
        drop: Dropout | None = None,
    ) -> jax.Array:
        """The summed rows of the n-grams ending at each of ``ids_BxT``'s positions. ``context_BxC``
        (the ``n_context`` ids just before them; PAD before a sequence's start) continues a sequence;
        without it the ids are a sequence's start. ``reach_BxT`` (without a context): how many ids
        back each position's document reaches (:func:`ngram_hashes`). ``drop`` (training,
        ``model.ngram_dropout``): table ``i`` drops each position's row through ``drop.at(i)``."""
        T = ids_BxT.shape[1]
        if context_BxC is not None:
            if reach_BxT is not None:
                raise ValueError("NgramEmbed takes a continuation's context or a window's reach, not both")
            ids_BxT = jnp.concatenate([context_BxC.astype(ids_BxT.dtype), ids_BxT], axis=1)
        rows = [
            drop_rows(table(ngram_hashes(ids_BxT, n, self.rows, reach_BxT)[:, -T:]), drop_at(drop, i))
            for i, (n, table) in enumerate(zip(self.sizes, self.tables))
        ]
        total = rows[0]
        for r in rows[1:]:
            total = total + r
        return total


def drop_rows(rows_BxTxD: jax.Array, drop: Dropout | None) -> jax.Array:
    """``model.ngram_dropout`` on one n-gram table's rows: one keep-or-drop per position, broadcast
    over the row (kept rows scaled by ``1 / (1 - rate)``); none without ``drop``."""
    if drop is None:
        return rows_BxTxD
    return rows_BxTxD * drop(jnp.ones((*rows_BxTxD.shape[:-1], 1), rows_BxTxD.dtype))


def head_param(rngs: nnx.Rngs, d_model: int, n_valid: int, multiple: int) -> nnx.Param:
    """The output head of every family: a ``d_model x V`` matrix, ``V = n_valid`` padded to
    ``multiple`` rows (a model keeps it as its ``head`` attribute; :func:`head_logits` applies it)."""
    return param(rngs, (d_model, pad_vocab(n_valid, multiple)), ("embed", "vocab"))


def head_logits(
    h_BxTxD: jax.Array, head_DxV: jax.Array, n_valid: int, dtype: Dtype, softcap: float = 0.0
) -> jax.Array:
    """Logits over the ``n_valid`` ids in float32; the padding rows' logits are masked (they can
    never be predicted). Shared by every family. ``softcap`` > 0 squashes each logit smoothly into
    ``(-softcap, softcap)`` with ``softcap * tanh(logit / softcap)`` (Gemma 2's final-logit
    soft-capping, Gemma Team 2024, section 2), before the padding rows are masked."""
    logits_BxTxV = (h_BxTxD.astype(dtype) @ head_DxV.astype(dtype)).astype(jnp.float32)
    if softcap:
        logits_BxTxV = softcap * jnp.tanh(logits_BxTxV / softcap)
    return mask_invalid_logits(logits_BxTxV, n_valid)


def mask_invalid_logits(logits_BxTxV: jax.Array, n_valid: int) -> jax.Array:
    """Padding rows of the vocabulary can never be predicted (finite, so no NaN downstream)."""
    if n_valid >= logits_BxTxV.shape[-1]:
        return logits_BxTxV
    valid_V = jnp.arange(logits_BxTxV.shape[-1]) < n_valid
    valid_V = valid_V.reshape((1,) * (logits_BxTxV.ndim - 1) + (-1,))
    return jnp.where(valid_V, logits_BxTxV, jnp.asarray(-1e9, logits_BxTxV.dtype))


def pad_vocab(n_valid: int, multiple: int) -> int:
    """Rows of the embedding/logit tables: ``n_valid`` rounded up to a multiple of ``multiple``."""
    return -(-n_valid // multiple) * multiple
