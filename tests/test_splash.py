"""Splash attention (the TPU kernel, run here in Pallas's interpreter) against the XLA path, for every
mask the models use: causal, a sliding window, documents (segment ids) and both; forward and
gradients; float32 and bfloat16; and per shard under a mesh."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import subprocess_env

from bytelm.models.attention import attend
from bytelm.models.kernels import resolve_kernels, target_backend

B, T, H, K = 2, 256, 2, 64
MASKS = {
    "causal": {},
    "window": {"window": 64},
    "documents": {"segments": True},
    "window and documents": {"window": 48, "segments": True},
}


def _inputs(dtype, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal((B, T, H, K)), dtype) for _ in range(3))
    # documents of random lengths, several per row (a packed window)
    cuts = [np.sort(rng.choice(np.arange(1, T), size=3, replace=False)) for _ in range(B)]
    seg = np.stack([np.searchsorted(c, np.arange(T), side="right") for c in cuts]).astype(np.int32)
    return q, k, v, jnp.asarray(seg)


def _kwargs(mask: str, seg):
    spec = MASKS[mask]
    return {
        "causal": True,
        "window": spec.get("window", 0),
        "segments_BxT": seg if spec.get("segments") else None,
    }


def _loss(impl, kw):
    # a loss whose gradient reaches every output unevenly (sin), so that a wrong dq/dk/dv shows
    return lambda q, k, v: jnp.sum(jnp.sin(attend(q, k, v, implementation=impl, **kw).astype(jnp.float32)))


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.slow
def test_splash_equals_the_xla_path_in_float32(mask):
    q, k, v, seg = _inputs(jnp.float32)
    kw = _kwargs(mask, seg)
    splash = attend(q, k, v, implementation="splash", **kw)
    xla = attend(q, k, v, implementation="xla", **kw)
    assert float(jnp.max(jnp.abs(splash - xla))) < 1e-5
    g_splash = jax.grad(_loss("splash", kw), argnums=(0, 1, 2))(q, k, v)
    g_xla = jax.grad(_loss("xla", kw), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", g_splash, g_xla):
        assert float(jnp.max(jnp.abs(a - b))) < 1e-5 * max(1.0, float(jnp.max(jnp.abs(b)))), name


@pytest.mark.parametrize("mask", ["causal", "window and documents"])
def test_splash_in_bfloat16_is_as_close_to_float32_as_the_xla_path(mask):
    """bf16 inputs (8 bits of mantissa: a relative rounding of 2^-9 per input) give outputs a few 1e-3
    off the float32 result whatever the kernel; splash accumulates in float32, so its error is no larger
    than XLA's bf16 path's (within 25%), and both stay under 3e-2."""
    q32, k32, v32, seg = _inputs(jnp.float32, seed=1)
    kw = _kwargs(mask, seg)
    exact = attend(q32, k32, v32, implementation="xla", **kw)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q32, k32, v32))
    errors = {}
    for impl in ("splash", "xla"):
        out = attend(q, k, v, implementation=impl, **kw)
        assert out.dtype == jnp.bfloat16
        errors[impl] = float(jnp.mean(jnp.abs(out.astype(jnp.float32) - exact)))
        assert float(jnp.max(jnp.abs(out.astype(jnp.float32) - exact))) < 3e-2, impl
    assert errors["splash"] <= 1.25 * errors["xla"], errors
    grads = {impl: jax.grad(_loss(impl, kw), argnums=(0, 1, 2))(q, k, v) for impl in ("splash", "xla")}
    exact_grads = jax.grad(_loss("xla", kw), argnums=(0, 1, 2))(q32, k32, v32)
    for i, name in enumerate("qkv"):
        err = {
            impl: float(jnp.mean(jnp.abs(g[i].astype(jnp.float32) - exact_grads[i])))
            for impl, g in grads.items()
        }
        assert err["splash"] <= 1.25 * err["xla"] + 1e-4, (name, err)


def test_auto_takes_splash_on_a_tpu_and_keeps_the_other_backends_choices():
    with target_backend("tpu"):
        assert resolve_kernels("auto", dtype="bfloat16").attention == "splash"
        assert resolve_kernels("auto").mlp == "autodiff"
    assert resolve_kernels("auto", backend="cpu").attention == "halving"
    assert (
        resolve_kernels("splash", backend="cpu").attention == "xla"
    )  # (a warning: kernels change speed only)


@pytest.mark.slow
def test_splash_under_a_mesh_runs_per_shard_and_equals_one_device():
    """On 4 CPU devices as data 2 x tensor 2, inside jit under the mesh: rows and heads per shard
    (shard_map), the same outputs and gradients as without a mesh."""
    code = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh
        from bytelm.models.attention import attend
        rng = np.random.default_rng(0)
        q, k, v = (jnp.asarray(rng.standard_normal((4, 256, 4, 64)), jnp.float32) for _ in range(3))
        seg = jnp.asarray(np.repeat(np.arange(4)[None], 64, axis=1).reshape(1, -1).repeat(4, 0), jnp.int32)
        kw = dict(causal=True, window=96, segments_BxT=seg)
        f = lambda q, k, v: jnp.sum(jnp.sin(attend(q, k, v, implementation="splash", **kw)))
        one = (attend(q, k, v, implementation="splash", **kw), jax.grad(f, argnums=(0, 1, 2))(q, k, v))
        mesh = Mesh(np.asarray(jax.devices()).reshape(2, 1, 2), ("data", "fsdp", "tensor"))
        with jax.set_mesh(mesh):
            run = jax.jit(lambda q, k, v: attend(q, k, v, implementation="splash", **kw))
            out = run(q, k, v)
            grads = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)
            text = run.lower(q, k, v).as_text()
        assert "shard_map" in text or "sdy.manual_computation" in text, "not run per shard"
        assert float(jnp.max(jnp.abs(out - one[0]))) < 1e-5
        for a, b in zip(grads, one[1]):
            assert float(jnp.max(jnp.abs(a - b))) < 1e-5
        print("OK")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], env=subprocess_env(4), capture_output=True, text=True)
    assert "OK" in r.stdout, r.stderr[-4000:]
