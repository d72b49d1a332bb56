"""The BLT entropy model (a small :class:`~bytelm.models.byte_lm.ByteLM`) and the entropy patcher.

``H[i]`` is the entropy in nats of the model's distribution over the id *after* position ``i``:
``-sum_v p(v | ids[:i+1]) log p(v | ids[:i+1])``, computed in float32 from the logits at
position ``i``. The model is causal, so ``H[i]`` depends on ``ids[:i+1]`` only.
"""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bytelm.patching.calibrate import calibrate_threshold
from bytelm.patching.lengths import starts_to_lengths
from bytelm.patching.patchers import entropy_starts, real_lengths, valid_mask


def params_fingerprint(params: nnx.State) -> str:
    """sha256 (hex) over every parameter's path, dtype, shape and bytes, in path order."""
    h = hashlib.sha256()
    leaves, _ = jax.tree_util.tree_flatten_with_path(params)
    for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
        a = np.ascontiguousarray(np.asarray(jax.device_get(leaf)))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape}\n".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _entropy_fn(graphdef):
    def fn(params, rest, ids_BxL):
        logits_BxLxV = nnx.merge(graphdef, params, rest)(ids_BxL).astype(jnp.float32)
        logp_BxLxV = jax.nn.log_softmax(logits_BxLxV, axis=-1)
        p_BxLxV = jnp.exp(logp_BxLxV)
        return -jnp.sum(jnp.where(p_BxLxV > 0, p_BxLxV * logp_BxLxV, 0.0), axis=-1)

    return jax.jit(fn)


class EntropyModel:
    """Next-id entropies from a ByteLM, batched and jitted (one compilation per input shape).

    The model's state is copied at construction: the entropies and :attr:`fingerprint` stay those
    of the parameters it was built with.

    ``batch_size`` (optional) splits large batches into chunks of that many rows, the last one
    padded with PAD rows, so any batch compiles at most one program per row width.
    """

    def __init__(self, model: nnx.Module, *, batch_size: int | None = None):
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 (or None), got {batch_size}")
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        # A snapshot: nnx.split shares Variable objects with the module, so later changes to the
        # module (an optimizer step, nnx.jit) would otherwise change these entropies silently.
        self.graphdef = graphdef
        self.params, self.rest = jax.tree.map(lambda x: x, (params, rest))
        self.batch_size = batch_size
        self.window = int(getattr(getattr(model, "cfg", None), "window", 0) or 0)
        self.fingerprint = params_fingerprint(self.params)
        self._fn = _entropy_fn(self.graphdef)

    def entropies(self, ids) -> np.ndarray:
        """``float32[B, L]`` (or ``[L]`` for one row) entropies in nats; 0 on the padding tail."""
        ids = np.asarray(ids)
        squeeze = ids.ndim == 1
        ids_BxL = np.atleast_2d(ids).astype(np.int32)
        if ids_BxL.ndim != 2:
            raise ValueError(f"expected ids of shape (L,) or (B, L), got {ids.shape}")
        B, L = ids_BxL.shape
        if B == 0 or L == 0:
            return np.zeros(ids.shape, np.float32)
        chunk = self.batch_size or B
        out = []
        for s in range(0, B, chunk):
            part = ids_BxL[s : s + chunk]
            if part.shape[0] < chunk:
                part = np.concatenate([part, np.zeros((chunk - part.shape[0], L), np.int32)])
            h = np.asarray(jax.device_get(self._fn(self.params, self.rest, part)), dtype=np.float32)
            out.append(h[: min(chunk, B - s)])
        h_BxL = np.where(valid_mask(ids_BxL), np.concatenate(out), np.float32(0))
        return h_BxL[0] if squeeze else h_BxL


@dataclasses.dataclass
class EntropyPatcher:
    """Entropy patching with a fixed entropy model and thresholds (what a BLT run records).

    :meth:`settings` is the ``"patching"`` record of a BLT run's ``run.json``
    (``threshold``, ``monotonic_threshold``, ``max_patch_len``).
    """

    model: EntropyModel
    threshold: float | None = None
    monotonic_threshold: float | None = None
    max_patch_len: int | None = None

    def __post_init__(self) -> None:
        if self.threshold is None and self.monotonic_threshold is None:
            raise ValueError("an entropy patcher needs threshold, monotonic_threshold, or both")

    @classmethod
    def calibrated(
        cls,
        model: EntropyModel,
        ids_rows,
        target_mean_patch_len: float,
        *,
        monotonic_threshold: float | None = None,
        max_patch_len: int | None = None,
        tol: float = 0.02,
    ) -> tuple[EntropyPatcher, float]:
        """Calibrate the global threshold on ``ids_rows`` (a ``(B, L)`` sample); returns the patcher
        and the achieved mean patch length."""
        ids_BxL = np.atleast_2d(np.asarray(ids_rows))
        theta, achieved = calibrate_threshold(
            model.entropies(ids_BxL),
            ids_BxL,
            target_mean_patch_len,
            max_patch_len=max_patch_len,
            monotonic_threshold=monotonic_threshold,
            tol=tol,
        )
        return cls(model, theta, monotonic_threshold, max_patch_len), achieved

    @classmethod
    def from_settings(cls, model: EntropyModel, settings: dict) -> EntropyPatcher:
        return cls(model, settings.get("threshold"), settings.get("monotonic_threshold"), settings.get("max_patch_len"))

    def settings(self) -> dict:
        return {"threshold": self.threshold, "monotonic_threshold": self.monotonic_threshold, "max_patch_len": self.max_patch_len}

    def record(self) -> dict:
        """:meth:`settings` plus the entropy model's fingerprint."""
        return {**self.settings(), "entropy_fingerprint": self.model.fingerprint}

    def starts_from_entropies(self, ids, entropies) -> np.ndarray:
        return entropy_starts(
            ids,
            entropies,
            threshold=self.threshold,
            monotonic_threshold=self.monotonic_threshold,
            max_patch_len=self.max_patch_len,
        )

    def starts(self, ids) -> np.ndarray:
        return self.starts_from_entropies(ids, self.model.entropies(ids))

    def lengths(self, ids_BxL, max_patches: int) -> np.ndarray:
        """``int32[B, max_patches]`` patch lengths (see :func:`starts_to_lengths`)."""
        ids_BxL = np.atleast_2d(np.asarray(ids_BxL))
        return starts_to_lengths(self.starts(ids_BxL), real_lengths(ids_BxL), max_patches)
