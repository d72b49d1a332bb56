"""The one place where kernels are chosen: ``model.attention`` and ``model.mlp`` -> implementations.

Layers never look at the backend themselves; a model resolves its config's choices here once,
when it is built, and hands the result to its layers.

``attention`` (:func:`bytelm.models.attention.attend`):

- ``xla``: ``jax.nn.dot_product_attention``'s XLA path (dense scores under a mask).
- ``cudnn``: the same call with ``implementation="cudnn"`` (fused flash attention; GPU only, for
  bfloat16 or float16 compute; calls with an explicit mask, such as BLT's cross-attention, and
  head dimensions cuDNN does not take, not a multiple of 8 or over 128, keep the XLA path).
- ``halving``: causal self-attention that skips the masked half of the score matrix by recursive
  halving (or query blocks, under a sliding window) when the sequence is long; XLA otherwise.
- ``splash``: Pallas splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``, TPU):
  block-sparse flash attention that skips the blocks a causal, sliding-window or document mask
  removes and never builds the score matrix; bf16 inputs with float32 accumulation. Under a mesh
  it runs per shard (``shard_map``: the batch over ``data x fsdp``, heads over ``tensor``). Calls
  with an explicit mask (BLT's cross-attention) and lengths not a multiple of 128 keep the XLA
  path; off a TPU it runs in Pallas's interpreter (the tests).
- ``auto``: ``cudnn`` on GPU in bfloat16/float16 (``xla`` in float32), ``splash`` on TPU (``xla``
  before, whose dense float32 scores of a ``base`` preset took about 4 GiB per layer), ``halving``
  on CPU, where XLA evaluates the full masked score matrix (``benchmarks/RESULTS.md`` at 3372114).

:func:`target_backend` makes the choice for another backend than the one this process runs
(``bytelm compile`` builds TPU programs on a CPU machine).

``mlp`` (:func:`bytelm.models.core.swiglu`):

- ``autodiff``: the SwiGLU MLP differentiated by JAX.
- ``manual``: the hand-written backward of :func:`bytelm.models.core.swiglu_mlp`, which keeps
  XLA CPU from recomputing the sigmoid in several fusions and from transposing the wide
  gradients inside strided loops.
- ``auto``: ``manual`` on CPU (the only backend it was measured on), ``autodiff`` elsewhere.

``remat`` (rematerialisation of each transformer block in the backward pass, ``jax.checkpoint``):

- ``none``: keep every activation the backward pass needs (the fastest step, the most memory).
- ``block``: keep only each block's input; recompute the block in the backward pass.
- ``dots``: keep the outputs of the matmuls without batch dimensions (the projections), recompute
  the rest (norms, activations, attention scores).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
from collections.abc import Iterator

import jax

log = logging.getLogger(__name__)

ATTENTION_BLOCK = 128  # the halving/blocked paths' leaf size, and their minimum of 2 blocks


REMAT_POLICIES = {
    "block": None,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}  # (None: save nothing)


_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("bytelm_target_backend", default=None)


@contextlib.contextmanager
def target_backend(backend: str) -> Iterator[None]:
    """Resolve kernels for ``backend`` ("tpu", "gpu", "cpu") inside the block, not for the backend this
    process runs: models built inside are the ones that backend would train."""
    token = _TARGET.set(backend)
    try:
        yield
    finally:
        _TARGET.reset(token)


@dataclasses.dataclass(frozen=True)
class Kernels:
    attention: str  # "xla" | "cudnn" | "halving"
    mlp: str  # "autodiff" | "manual"
    remat: str = "none"  # "none" | "block" | "dots"


def resolve_kernels(
    attention: str = "auto",
    mlp: str = "auto",
    *,
    dtype: str = "float32",
    backend: str | None = None,
    remat: str = "none",
) -> Kernels:
    """The implementations for a model's ``attention`` and ``mlp`` choices in compute ``dtype`` on
    ``backend`` (default: JAX's default backend). Raises ``ValueError`` for a kernel the backend
    or dtype cannot run (an explicit ``cudnn`` where cuDNN cannot run falls back to ``xla`` with a
    warning: kernels change speed, not results, so a run stays usable on another backend)."""
    backend = backend or _TARGET.get() or jax.default_backend()
    half = dtype in ("bfloat16", "float16")
    if attention == "auto":
        attention = {"gpu": "cudnn" if half else "xla", "cpu": "halving", "tpu": "splash"}.get(backend, "xla")
    if attention == "splash" and backend != "tpu":
        log.warning("model.attention = 'splash' needs a TPU (backend %s): using 'xla'", backend)
        attention = "xla"
    if attention == "cudnn" and (backend != "gpu" or not half):
        # kernels change speed, not results: a run trained with cuDNN stays usable on a CPU
        log.warning(
            "model.attention = 'cudnn' needs a GPU and bfloat16/float16 (backend %s, dtype %s): using 'xla'",
            backend,
            dtype,
        )
        attention = "xla"
    if attention not in ("xla", "cudnn", "halving", "splash"):
        raise ValueError(f"unknown attention kernel {attention!r}: use auto, xla, cudnn, halving or splash")
    if mlp == "auto":
        mlp = "manual" if backend == "cpu" else "autodiff"
    if mlp not in ("autodiff", "manual"):
        raise ValueError(f"unknown mlp kernel {mlp!r}: use auto, autodiff or manual")
    if remat not in ("none", *REMAT_POLICIES):
        raise ValueError(f"unknown remat policy {remat!r}: use none, block or dots")
    return Kernels(attention, mlp, remat)
