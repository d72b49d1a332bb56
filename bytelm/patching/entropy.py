"""The BLT entropy model (a small :class:`~bytelm.families.byte.model.ByteLM`) and the entropy patcher.

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
from jax.experimental import multihost_utils

from bytelm.patching.calibrate import calibrate_threshold
from bytelm.patching.lengths import cap_starts, starts_to_lengths
from bytelm.patching.patchers import apply_max_len, entropy_starts, real_lengths, space_starts, valid_mask


def params_fingerprint(params: nnx.State) -> str:
    """sha256 (hex) over every parameter's path, dtype, shape and bytes, in path order."""
    h = hashlib.sha256()
    leaves, _ = jax.tree_util.tree_flatten_with_path(params)
    for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
        a = np.ascontiguousarray(np.asarray(jax.device_get(leaf)))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape}\n".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def entropy_of_logits(logits_BxLxV: jax.Array) -> jax.Array:
    """Entropy in nats of each next-id distribution, in float32 (``H`` above)."""
    logp_BxLxV = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
    p_BxLxV = jnp.exp(logp_BxLxV)
    return -jnp.sum(jnp.where(p_BxLxV > 0, p_BxLxV * logp_BxLxV, 0.0), axis=-1)


def _entropy_fn(graphdef):
    def fn(params, rest, ids_1xW):
        return entropy_of_logits(nnx.merge(graphdef, params, rest)(ids_1xW))

    return jax.jit(fn)


def _host_copy(x):
    """A weight that spans other processes' devices (restored on several hosts) as one host array."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return x


class EntropyModel:
    """Next-id entropies from a ByteLM, **one row at a time through one compiled program**.

    Batch invariance by construction: every row is padded with PAD to ``width`` positions and run
    on its own through the same jitted single-row function, so its entropies are bitwise the same
    whatever other rows it comes with, however many, in whichever order (a patch boundary whose
    entropy sits at the threshold cannot move with the evaluation batch size). Rows go to the local
    devices in turn (the same executable on each), and dispatch is asynchronous, so the device
    queue stays full. ``width`` (default: the width of each call's input) should be fixed by the
    caller for results that must not depend on the call: the BLT task uses its window,
    ``train.seq_len + 1``. Rows are causal, so the padding after a row never changes its values.

    The model's state is copied at construction: the entropies and :attr:`fingerprint` stay those
    of the parameters it was built with.
    """

    def __init__(self, model: nnx.Module, *, width: int | None = None):
        if width is not None and width < 1:
            raise ValueError(f"width must be >= 1 (or None: the input's width), got {width}")
        graphdef, params, *others = nnx.split(model, nnx.Param, ...)
        (rest,) = others
        self.graphdef = graphdef
        # A snapshot on every local device: nnx.split shares Variable objects with the module, so
        # later changes to the module (an optimizer step, nnx.jit) would otherwise change these
        # entropies silently; one copy per device lets rows run on all of them.
        self.devices = jax.local_devices()
        # (on several hosts the restored weights span every process's devices: this host's copy first)
        params, rest = jax.tree.map(_host_copy, (params, rest))
        self._state = [jax.device_put((params, rest), d) for d in self.devices]
        self.params, self.rest = self._state[0]
        self.width = width
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
        W = self.width or L
        if L > W:
            raise ValueError(f"rows of {L} ids are wider than this entropy model's fixed width {W}")
        rows_BxW = np.zeros((B, W), np.int32)
        rows_BxW[:, :L] = ids_BxL
        n = len(self.devices)
        pending = []
        for b in range(B):  # all dispatched before the first result is read back
            params, rest = self._state[b % n]
            pending.append(self._fn(params, rest, jax.device_put(rows_BxW[b : b + 1], self.devices[b % n])))
        h_BxL = np.concatenate([np.asarray(jax.device_get(h), np.float32) for h in pending])[:, :L]
        h_BxL = np.where(valid_mask(ids_BxL), h_BxL, np.float32(0))
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
        return cls(
            model,
            settings.get("threshold"),
            settings.get("monotonic_threshold"),
            settings.get("max_patch_len"),
        )

    def settings(self) -> dict:
        return {
            "threshold": self.threshold,
            "monotonic_threshold": self.monotonic_threshold,
            "max_patch_len": self.max_patch_len,
        }

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

    def layout(self, ids_BxL, max_patches: int) -> PatchLayout:
        """The patches of ``ids_BxL`` in ``max_patches`` slots: boundaries from the entropies, then
        the causal slot rule (:func:`cap_starts`), then ``int32[B, max_patches]`` lengths."""
        ids_BxL = np.atleast_2d(np.asarray(ids_BxL))
        n_B = real_lengths(ids_BxL)
        starts_BxL, overflow_B = cap_starts(self.starts(ids_BxL), n_B, max_patches)
        return PatchLayout(starts_to_lengths(starts_BxL, n_B, max_patches), overflow_B, n_B)

    def lengths(self, ids_BxL, max_patches: int) -> np.ndarray:
        """``int32[B, max_patches]`` patch lengths (:meth:`layout`)."""
        return self.layout(ids_BxL, max_patches).lengths_BxP


@dataclasses.dataclass(frozen=True)
class PatchLayout:
    """Patch lengths of a batch and what the slot rule cost: ``overflow_B`` real positions of each
    row fell into its last patch because the slots ran out (0 for rows that fit)."""

    lengths_BxP: np.ndarray
    overflow_B: np.ndarray
    n_real_B: np.ndarray

    def stats(self) -> dict[str, int]:
        """Counts over the non-empty rows: rows, rows that overflowed, positions, overflowed positions."""
        rows = self.n_real_B > 0
        return {
            "windows": int(rows.sum()),
            "overflow_windows": int((self.overflow_B[rows] > 0).sum()),
            "positions": int(self.n_real_B.sum()),
            "overflow_positions": int(self.overflow_B.sum()),
        }


@dataclasses.dataclass
class SpacePatcher:
    """Space patching (SpaceByte, Slagle 2024; BLT's space baseline): a patch starts after every
    space-like byte (:func:`~bytelm.patching.patchers.space_starts`), long patches are split at
    ``max_patch_len``; no model. The same :meth:`layout` as :class:`EntropyPatcher`."""

    max_patch_len: int | None = None

    def settings(self) -> dict:
        return {"rule": "space", "max_patch_len": self.max_patch_len}

    def record(self) -> dict:
        return self.settings()

    def starts(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        return apply_max_len(space_starts(ids), self.max_patch_len, valid=valid_mask(ids))

    def layout(self, ids_BxL, max_patches: int) -> PatchLayout:
        ids_BxL = np.atleast_2d(np.asarray(ids_BxL))
        n_B = real_lengths(ids_BxL)
        starts_BxL, overflow_B = cap_starts(self.starts(ids_BxL), n_B, max_patches)
        return PatchLayout(starts_to_lengths(starts_BxL, n_B, max_patches), overflow_B, n_B)
