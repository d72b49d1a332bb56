"""Orbax checkpoints of the train state: params, optimizer state, step, data-iterator state.

Saves are finalised atomically by orbax (a checkpoint killed mid-write is never listed), the
manager keeps the last ``keep`` steps, and restore targets carry the live shardings so a
checkpoint restores directly onto the mesh.
"""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from bytelm.errors import UserError

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, directory: Path, *, keep: int):
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: dict, meta: dict) -> None:
        """Save ``state`` (a pytree of arrays) and ``meta`` (JSON) as checkpoint ``step``."""
        self.manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=True,
        )

    def restore(self, step: int, target: dict) -> tuple[dict, dict]:
        """Restore checkpoint ``step`` onto the structure, shapes and shardings of ``target``."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        out = self._restore(step, ocp.args.StandardRestore(abstract))
        return out["state"], out["meta"]

    def restore_params(self, step: int, params: dict, key: str = "params") -> tuple[dict, dict]:
        """Only the parameters of checkpoint ``step`` (or another tree of their structure saved
        beside them, ``key``: the weight average, "ema"), onto the shapes, dtypes and shardings of
        ``params`` (abstract arrays are enough); an optimizer state in the checkpoint is neither
        read nor allocated (a third of a full restore's memory under Adam), and a checkpoint may
        hold none (``bytelm convert`` writes parameters only)."""
        restore_args = jax.tree.map(
            lambda x: ocp.ArrayRestoreArgs(
                sharding=x.sharding, global_shape=x.shape, dtype=x.dtype, strict=True
            ),
            params,
        )
        out = self._restore(
            step,
            ocp.args.PyTreeRestore({key: params}, restore_args={key: restore_args}, partial_restore=True),
        )
        return out["state"][key], out["meta"]

    def _restore(self, step: int, state_args) -> dict:
        try:
            return self.manager.restore(
                step, args=ocp.args.Composite(state=state_args, meta=ocp.args.JsonRestore())
            )
        except (ValueError, KeyError, TypeError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(
                f"checkpoint {step} in {self.directory} does not match the model built from the run's config "
                f"({first[:300]}); the config.toml next to it was changed or belongs to another run"
            ) from None

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
