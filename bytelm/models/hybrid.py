"""A stack of mixed layers, Mamba-2 and attention, written in H-Net's layout notation
(Hwang, Wang & Gu 2025, arXiv 2507.07955; its released configs' ``arch_layout``).

A **pattern** is a string of runs ``<kind><count>``: ``m`` a Mamba-2 layer without an MLP, ``M`` a
Mamba-2 layer followed by a SwiGLU MLP, ``t`` an attention layer without an MLP, ``T`` an attention
layer and a SwiGLU MLP (the transformer block). ``"m4"`` is four Mamba-2 layers, ``"T1m4"`` one
transformer block then four Mamba-2 layers. Every mixer and MLP is pre-norm with its own residual
(``x + f(RMSNorm(x))``), as the transformer stack's blocks are; attention uses the stack's sliding
``window`` (0 = full causal attention) and rotary positions, the Mamba-2 layers
(:class:`~bytelm.models.ssd.Mamba2`) their own recurrence.

One forward path serves training and decoding: with ``cache`` (one per layer: a
:class:`~bytelm.models.cache.KVCache` for attention, an :class:`~bytelm.models.ssd.SSMCache` for
Mamba-2, :meth:`HybridStack.init_cache`) a call runs new positions after the cached ones. A row
that is not ``active`` in a cached call keeps its Mamba-2 state (its attention cache slot is
written, at its current position, and overwritten by its next real step before it is read).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from flax import nnx

from bytelm.models.core import MLP, Attention, Dropout, Dtype, RMSNorm, apply_dropout, drop_at
from bytelm.models.kernels import REMAT_POLICIES, Kernels
from bytelm.models.ssd import Mamba2, SSMCache, SSMConfig

KINDS = {"m": ("ssm", False), "M": ("ssm", True), "t": ("attention", False), "T": ("attention", True)}
_RUN = re.compile(r"([mMtT])(\d+)")


def parse_pattern(pattern: str) -> list[tuple[str, bool]]:
    """``[(mixer, has_mlp), ...]`` per layer of ``pattern`` (the module docstring); ``ValueError``
    naming the pattern when it is not runs of ``m``, ``M``, ``t``, ``T`` with counts."""
    runs = _RUN.findall(pattern)
    if "".join(k + n for k, n in runs) != pattern:
        raise ValueError(
            f"layer pattern {pattern!r} is not runs of <kind><count> with kinds m (Mamba-2), M (Mamba-2 + "
            "MLP), t (attention), T (attention + MLP), e.g. 'm4' or 'T1m4'"
        )
    return [KINDS[k] for k, n in runs for _ in range(int(n))]


class HybridLayer(nnx.Module):
    """One layer: ``x + mixer(norm(x))``, then (with an MLP) ``x + mlp(norm(x))``. Dropout sites 0
    (the mixer's output) and 1 (the MLP's)."""

    def __init__(
        self,
        d_model: int,
        mixer: str,
        has_mlp: bool,
        *,
        heads: int,
        mlp_dim: int,
        ssm: SSMConfig,
        n_layers: int,
        rngs: nnx.Rngs,
        kernels: Kernels,
        rope_base: float,
        dtype: Dtype,
        norm_eps: float,
    ):
        self.kind = mixer
        self.mixer_norm = RMSNorm(d_model, eps=norm_eps)
        self.mixer: Attention | Mamba2
        if mixer == "attention":
            self.mixer = Attention(
                d_model, heads, rngs=rngs, rope_base=rope_base, dtype=dtype, implementation=kernels.attention
            )
        else:
            self.mixer = Mamba2(d_model, ssm, n_layers=n_layers, rngs=rngs, dtype=dtype)
        self.mlp_norm = RMSNorm(d_model, eps=norm_eps) if has_mlp else None
        self.mlp = MLP(d_model, mlp_dim, rngs=rngs, dtype=dtype, backward=kernels.mlp) if has_mlp else None

    def init_cache(self, batch: int, slots: int):
        if isinstance(self.mixer, Attention):
            return self.mixer.init_cache(batch, slots)
        return self.mixer.init_cache(batch)

    def __call__(self, x_BxTxD, *, positions_BxT, window, segments_BxT, drop, cache, active_B):
        h = self.mixer_norm(x_BxTxD)
        if isinstance(self.mixer, Attention):
            y, cache = self.mixer.apply(
                h, positions_BxT=positions_BxT, window=window, segments_BxT=segments_BxT, cache=cache
            )
        else:
            y, new = self.mixer(h, cache=cache)
            if cache is not None and new is not None and active_B is not None:  # idle rows keep their state
                new = SSMCache(
                    *(jnp.where(active_B.reshape(-1, *(1,) * (a.ndim - 1)), a, b) for a, b in zip(new, cache))
                )
            cache = new
        x_BxTxD = x_BxTxD + apply_dropout(y, drop_at(drop, 0)).astype(x_BxTxD.dtype)
        if self.mlp is not None and self.mlp_norm is not None:
            x_BxTxD = x_BxTxD + apply_dropout(self.mlp(self.mlp_norm(x_BxTxD)), drop_at(drop, 1)).astype(
                x_BxTxD.dtype
            )
        return x_BxTxD, cache


class HybridStack(nnx.Module):
    """The layers of ``pattern`` (the module docstring) at width ``d_model``."""

    def __init__(
        self,
        d_model: int,
        pattern: str,
        *,
        heads: int,
        mlp_dim: int,
        ssm: SSMConfig,
        rngs: nnx.Rngs,
        kernels: Kernels,
        window: int = 0,
        rope_base: float = 10000.0,
        dtype: Dtype = jnp.float32,
        norm_eps: float = 1e-6,
    ):
        kinds = parse_pattern(pattern)
        self.pattern, self.window, self.remat = pattern, window, kernels.remat
        self.layers = nnx.List(
            [
                HybridLayer(
                    d_model,
                    mixer,
                    has_mlp,
                    heads=heads,
                    mlp_dim=mlp_dim,
                    ssm=ssm,
                    n_layers=len(kinds),
                    rngs=rngs,
                    kernels=kernels,
                    rope_base=rope_base,
                    dtype=dtype,
                    norm_eps=norm_eps,
                )
                for mixer, has_mlp in kinds
            ]
        )

    def init_cache(self, batch: int, slots: int) -> list:
        """One empty cache per layer (``slots`` positions for an attention layer's keys and values)."""
        return [layer.init_cache(batch, slots) for layer in self.layers]

    def __call__(
        self,
        x_BxTxD: jax.Array,
        *,
        positions_BxT=None,
        segments_BxT=None,
        drop: Dropout | None = None,
        cache: list | None = None,
        active_B: jax.Array | None = None,
    ):
        """The output; with ``cache``, the output and the new caches (``active_B``: the rows that
        step, None = all)."""
        kw = dict(positions_BxT=positions_BxT, window=self.window, segments_BxT=segments_BxT)
        if cache is not None:
            if len(cache) != len(self.layers):
                raise ValueError(f"{len(cache)} caches for a stack of {len(self.layers)} layers")
            new = []
            for i, (layer, layer_cache) in enumerate(zip(self.layers, cache)):
                x_BxTxD, layer_cache = layer(
                    x_BxTxD, **kw, drop=drop_at(drop, i), cache=layer_cache, active_B=active_B
                )
                new.append(layer_cache)
            return x_BxTxD, new
        for i, layer in enumerate(self.layers):
            if self.remat == "none":
                x_BxTxD = layer(x_BxTxD, **kw, drop=drop_at(drop, i), cache=None, active_B=None)[0]
                continue
            site = drop_at(drop, i)
            rate, key = (0.0, None) if site is None else (site.rate, site.key)

            def forward(layer, x, positions, segments, key):  # (the rate and window stay static)
                d = None if key is None else Dropout(rate, key)
                return layer(
                    x,
                    positions_BxT=positions,
                    window=self.window,
                    segments_BxT=segments,
                    drop=d,
                    cache=None,
                    active_B=None,
                )[0]

            x_BxTxD = nnx.remat(forward, policy=REMAT_POLICIES[self.remat])(
                layer, x_BxTxD, positions_BxT, segments_BxT, key
            )
        return x_BxTxD
