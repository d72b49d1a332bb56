"""The pre-norm transformer stack every family runs on: :class:`Block` (attention and SwiGLU, each
with its residual) and :class:`Transformer` (``n_layers`` blocks, unrolled or under
``jax.lax.scan``), built of the layers of :mod:`bytelm.models.core`.

One forward path serves training, scoring and decoding: without a cache a call runs a whole
sequence; with one (a :class:`~bytelm.models.cache.KVCache` per layer, :meth:`Transformer.init_cache`)
it runs new positions after the cached ones and returns the updated caches.
"""

from __future__ import annotations

from typing import overload

import jax
import jax.numpy as jnp
from flax import nnx

from bytelm.models.cache import KVCache
from bytelm.models.core import (
    LAYER_AXIS,
    MLP,
    Attention,
    Dropout,
    Dtype,
    RMSNorm,
    apply_dropout,
    drop_at,
)
from bytelm.models.kernels import REMAT_POLICIES, Kernels


class Block(nnx.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``. With a :class:`Dropout`
    (training), each branch's output is dropped before its residual add (sites 0 and 1)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_hidden: int,
        *,
        rngs: nnx.Rngs,
        kernels: Kernels,
        rope_base: float = 10000.0,
        dtype: Dtype = jnp.float32,
        norm_eps: float = 1e-6,
        qk_norm: bool = False,
    ):
        self.attn_norm = RMSNorm(d_model, eps=norm_eps)
        self.attn = Attention(
            d_model,
            n_heads,
            rngs=rngs,
            rope_base=rope_base,
            dtype=dtype,
            implementation=kernels.attention,
            qk_norm=qk_norm,
            norm_eps=norm_eps,
        )
        self.mlp_norm = RMSNorm(d_model, eps=norm_eps)
        self.mlp = MLP(d_model, d_hidden, rngs=rngs, dtype=dtype, backward=kernels.mlp)
        self.remat = kernels.remat

    @overload
    def __call__(
        self,
        x_BxTxD: jax.Array,
        *,
        positions_BxT=None,
        window: int = 0,
        causal: bool = True,
        mask_BxTxS=None,
        segments_BxT=None,
        drop: Dropout | None = None,
        cache: None = None,
    ) -> jax.Array: ...

    @overload
    def __call__(
        self,
        x_BxTxD: jax.Array,
        *,
        positions_BxT=None,
        window: int = 0,
        causal: bool = True,
        mask_BxTxS=None,
        segments_BxT=None,
        drop: Dropout | None = None,
        cache: KVCache,
    ) -> tuple[jax.Array, KVCache]: ...

    def __call__(
        self,
        x_BxTxD: jax.Array,
        *,
        positions_BxT=None,
        window: int = 0,
        causal: bool = True,
        mask_BxTxS=None,
        segments_BxT=None,
        drop: Dropout | None = None,
        cache: KVCache | None = None,
    ) -> jax.Array | tuple[jax.Array, KVCache]:
        """The block's output; with a ``cache``, the output and the updated cache (:meth:`apply`)."""
        x_BxTxD, cache = self.apply(
            x_BxTxD,
            positions_BxT=positions_BxT,
            window=window,
            causal=causal,
            mask_BxTxS=mask_BxTxS,
            segments_BxT=segments_BxT,
            drop=drop,
            cache=cache,
        )
        return x_BxTxD if cache is None else (x_BxTxD, cache)

    def apply(
        self,
        x_BxTxD: jax.Array,
        *,
        positions_BxT=None,
        window: int = 0,
        causal: bool = True,
        mask_BxTxS=None,
        segments_BxT=None,
        drop: Dropout | None = None,
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """``(output, cache)``: the cache (None without one) as :meth:`Attention.apply` leaves it.
        Without a cache the block runs under ``model.remat``'s policy (a cached call is decoding:
        nothing to recompute)."""
        if cache is not None or self.remat == "none":
            return self._forward(
                x_BxTxD,
                positions_BxT,
                mask_BxTxS,
                segments_BxT,
                drop,
                window=window,
                causal=causal,
                cache=cache,
            )
        rate = 0.0 if drop is None else drop.rate

        def forward(
            block, x, positions, mask, segments, key
        ):  # window, causal and the rate stay Python values (static)
            return block._forward(
                x,
                positions,
                mask,
                segments,
                None if key is None else Dropout(rate, key),
                window=window,
                causal=causal,
            )[0]

        key = None if drop is None else drop.key
        return nnx.remat(forward, policy=REMAT_POLICIES[self.remat])(
            self, x_BxTxD, positions_BxT, mask_BxTxS, segments_BxT, key
        ), None

    def _forward(
        self,
        x_BxTxD,
        positions_BxT,
        mask_BxTxS,
        segments_BxT,
        drop,
        *,
        window: int,
        causal: bool,
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        attn_out, cache = self.attn.apply(
            self.attn_norm(x_BxTxD),
            positions_BxT=positions_BxT,
            window=window,
            causal=causal,
            mask_BxTxS=mask_BxTxS,
            segments_BxT=segments_BxT,
            cache=cache,
        )
        h = x_BxTxD + apply_dropout(attn_out, drop_at(drop, 0)).astype(x_BxTxD.dtype)
        return h + apply_dropout(self.mlp(self.mlp_norm(h)), drop_at(drop, 1)).astype(h.dtype), cache


class Transformer(nnx.Module):
    """A stack of ``n_layers`` causal blocks (with an optional sliding window).

    ``scan=True`` holds the layers as one block whose every weight has a leading layer axis
    (logical axis ``layers``, never sharded) and runs them under ``jax.lax.scan``: the program
    holds the block once, so compile time and program size stay flat in depth. The layers are
    initialised exactly as without scan (the same random draws, in the same order), so a scanned
    stack's weights are the unscanned stack's, stacked. A cached call steps through the layers
    one by one (:meth:`layer_blocks`, either way), each with its own cache.
    """

    def __init__(
        self,
        d_model: int,
        n_layers: int,
        n_heads: int,
        d_hidden: int,
        *,
        rngs: nnx.Rngs,
        kernels: Kernels,
        window: int = 0,
        rope_base: float = 10000.0,
        dtype: Dtype = jnp.float32,
        scan: bool = False,
        norm_eps: float = 1e-6,
        qk_norm: bool = False,
    ):
        blocks = [
            Block(
                d_model,
                n_heads,
                d_hidden,
                rngs=rngs,
                kernels=kernels,
                rope_base=rope_base,
                dtype=dtype,
                norm_eps=norm_eps,
                qk_norm=qk_norm,
            )
            for _ in range(n_layers)
        ]
        self.window = window
        self.n_layers = n_layers
        self.scan = bool(scan) and n_layers > 0
        if self.scan:
            self.layers = _stack_blocks(blocks)
        else:
            self.blocks = nnx.List(blocks)

    def layer_blocks(self) -> list[Block]:
        """The stack's blocks, one per layer (for a scanned stack: views of its stacked weights)."""
        if not self.scan:
            return list(self.blocks)
        graphdef, params, *others = nnx.split(self.layers, nnx.Param, ...)
        (rest,) = others
        return [
            nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], params), rest) for i in range(self.n_layers)
        ]

    def init_cache(self, batch: int, slots: int) -> list[KVCache]:
        """Empty caches for a cached call: one per layer, ``slots`` positions per row."""
        return [block.attn.init_cache(batch, slots) for block in self.layer_blocks()]

    @overload
    def __call__(
        self,
        x_BxTxD: jax.Array,
        *,
        positions_BxT=None,
        mask_BxTxS=None,
        segments_BxT=None,
        drop: Dropout | None = None,
        cache: None = None,
    ) -> jax.Array: ...

    @overload
    def __call__(
        self,
        x_BxTxD: jax.Array,
        *,
        positions_BxT=None,
        mask_BxTxS=None,
        segments_BxT=None,
        drop: Dropout | None = None,
        cache: list[KVCache],
    ) -> tuple[jax.Array, list[KVCache]]: ...

    def __call__(
        self,
        x_BxTxD: jax.Array,
        *,
        positions_BxT=None,
        mask_BxTxS=None,
        segments_BxT=None,
        drop: Dropout | None = None,
        cache: list[KVCache] | None = None,
    ) -> jax.Array | tuple[jax.Array, list[KVCache]]:
        """The stack's output; with a ``cache``, the output and the updated caches (:meth:`apply`)."""
        x_BxTxD, cache = self.apply(
            x_BxTxD,
            positions_BxT=positions_BxT,
            mask_BxTxS=mask_BxTxS,
            segments_BxT=segments_BxT,
            drop=drop,
            cache=cache,
        )
        return x_BxTxD if cache is None else (x_BxTxD, cache)

    def apply(
        self,
        x_BxTxD: jax.Array,
        *,
        positions_BxT=None,
        mask_BxTxS=None,
        segments_BxT=None,
        drop: Dropout | None = None,
        cache: list[KVCache] | None = None,
    ) -> tuple[jax.Array, list[KVCache] | None]:
        """``(output, caches)``. ``drop``: training dropout; layer ``i`` draws from ``drop.at(i)``,
        scanned or not. ``segments_BxT``: document ids (each position attends within its document
        only).

        ``cache`` (decoding): one :class:`~bytelm.models.cache.KVCache` per layer; the inputs are new
        positions (``positions_BxT``, absolute; None: ``0 .. T-1``) after the cached ones, and the
        caches returned hold them (None without a cache)."""
        kw = dict(
            positions_BxT=positions_BxT, window=self.window, mask_BxTxS=mask_BxTxS, segments_BxT=segments_BxT
        )
        if cache is not None:
            if len(cache) != self.n_layers:
                raise ValueError(f"{len(cache)} caches for a stack of {self.n_layers} layers")
            new = []
            for i, (block, layer_cache) in enumerate(zip(self.layer_blocks(), cache)):
                x_BxTxD, layer_cache = block(x_BxTxD, **kw, drop=drop_at(drop, i), cache=layer_cache)
                new.append(layer_cache)
            return x_BxTxD, new
        if not self.scan:
            for i, block in enumerate(self.blocks):
                x_BxTxD = block(x_BxTxD, **kw, drop=drop_at(drop, i))
            return x_BxTxD, None
        graphdef, params, *others = nnx.split(self.layers, nnx.Param, ...)
        (rest,) = others

        def layer(h_BxTxD, xs):
            layer_params, i = xs
            block = nnx.merge(graphdef, layer_params, rest)
            return block(h_BxTxD, **kw, drop=drop_at(drop, i)), None

        x_BxTxD, _ = jax.lax.scan(layer, x_BxTxD, (params, jnp.arange(self.n_layers, dtype=jnp.int32)))
        return x_BxTxD, None


def _stack_blocks(blocks: list[Block]) -> Block:
    """``blocks[0]`` with every weight replaced by the weights of all ``blocks`` stacked on a new
    leading :data:`~bytelm.models.core.LAYER_AXIS` (the other blocks' modules are dropped)."""
    flats = [dict(nnx.to_flat_state(nnx.state(b, nnx.Param))) for b in blocks]
    template = blocks[0]
    for path, var in flats[0].items():
        var.set_value(jnp.stack([flat[path].get_value() for flat in flats]))
        var.set_metadata(logical_axes=(LAYER_AXIS, *var.get_metadata()["logical_axes"]))
    return template
