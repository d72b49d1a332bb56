"""SpaceByte (Slagle 2024): global blocks at word boundaries found by a fixed rule on the bytes
(:mod:`bytelm.families.spacebyte.model`). Batches are the byte LM's windows and segments; the model
finds its global positions itself, counts them (``Scores.stats``, ``Scores.steps_B``) and is charged
at the measured rate of every step (:meth:`SpaceByteTask.measured_train_flops`), planned at its
slots' rate."""

from __future__ import annotations

from collections.abc import Mapping

from flax import nnx

from bytelm.families.base import Task, Trunk
from bytelm.families.spacebyte.config import SpaceByteConfig
from bytelm.families.spacebyte.decoder import SpaceByteDecoder
from bytelm.families.spacebyte.flops import forward_flops_per_byte
from bytelm.families.spacebyte.model import SpaceByte
from bytelm.models.configs import with_stacks
from bytelm.sampling.decoders import Decoder


class SpaceByteTask(Task):
    """SpaceByte: the byte LM's windows and segments; the global positions are the model's."""

    description = "a SpaceByte model"
    global_step = "spacelike boundary"
    config_class = SpaceByteConfig

    @classmethod
    def sized(cls, model_cfg, trunk: Trunk, changes):
        """The global stack from the trunk's main stack, the local blocks at the trunk's local width,
        heads and MLP width (their depths and window stay)."""
        return with_stacks(model_cfg, {"global": trunk.main, "local": trunk.local}, **changes)

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        return SpaceByte(self.cfg.model, rngs=rngs)

    def decoder(self, model: nnx.Module) -> Decoder:
        return SpaceByteDecoder(model, self.cfg.train.seq_len)  # type: ignore[arg-type]

    def mean_bytes_per_global_step(self) -> float:
        return float(self.cfg.model.bytes_per_slot)

    def forward_flops_per_position(self) -> float:
        """Planned at the slots' rate (a global position per ``bytes_per_slot`` bytes: the most the
        program runs); charged at the measured rate (:meth:`measured_train_flops`)."""
        return forward_flops_per_byte(self.cfg.model, self.cfg.train.seq_len, self.cfg.model.bytes_per_slot)

    def measured_train_flops(self, stats: Mapping[str, float]) -> float | None:
        positions, globals_ = stats.get("positions", 0.0), stats.get("globals", 0.0)
        if not positions or not globals_:
            return None
        per_byte = forward_flops_per_byte(self.cfg.model, self.cfg.train.seq_len, positions / globals_)
        return 3.0 * per_byte * self.positions_per_step()

    def stats_record(self, sums: Mapping[str, float]) -> dict:
        """``bytes_per_global`` (real positions per kept global position), the overflow rates
        (windows with more global positions than slots; global positions dropped per position)."""
        positions, globals_ = sums.get("positions", 0.0), sums.get("globals", 0.0)
        if not positions or not globals_:
            return {}
        return {
            "bytes_per_global": positions / globals_,
            "overflow_windows": sums.get("overflow_windows", 0.0) / max(sums.get("windows", 1.0), 1.0),
            "dropped_globals": sums.get("dropped", 0.0) / positions,
        }

    @classmethod
    def report_note(cls, run_info: dict) -> str:
        rate = run_info.get("bytes_per_global")
        if not rate:
            return ""
        overflow = 100 * run_info.get("overflow_windows", 0.0)
        return f"train {rate:.2f} bytes per global position, overflow {overflow:.1f}% of windows"
