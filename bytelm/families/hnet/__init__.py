"""H-Net (Hwang, Wang & Gu 2025): chunk boundaries learned end to end by a router in the model
(:mod:`bytelm.families.hnet.model`), one or two stages, the main network over the innermost chunks.
Batches are the byte LM's windows and segments: nothing is computed in the input pipeline and
nothing is trained beside the model (its compute ledger is its own training alone). The chunk
rates the router learns are logged (``s1_mean_chunk_len``, ...) and each evaluation segment's
innermost chunks are counted by the model itself (its global steps)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from flax import nnx

from bytelm.families.base import Task, Trunk
from bytelm.families.hnet.config import HNetConfig
from bytelm.families.hnet.decoder import HNetDecoder
from bytelm.families.hnet.flops import forward_flops_per_byte
from bytelm.families.hnet.model import HNet
from bytelm.models.configs import with_stacks
from bytelm.sampling.decoders import Decoder


class HNetTask(Task):
    """H-Net: the byte LM's windows and segments; the model decides its own chunks."""

    family = "hnet"
    description = "an H-Net"
    global_step = "innermost learned chunk"
    config_class = HNetConfig

    @classmethod
    def sized(cls, model_cfg, trunk: Trunk, changes):
        """The main network from the trunk's main stack; stage 1 (and stage 2) at the trunk's local
        width, heads and MLP width; the encoder and decoder depths stay."""
        stacks = {"global": trunk.main, "local": trunk.local, "middle": trunk.local}
        return with_stacks(model_cfg, stacks, **changes)

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        return HNet(self.cfg.model, rngs=rngs)

    def decoder(self, model: nnx.Module) -> Decoder:
        return HNetDecoder(model, self.cfg.train.seq_len)  # type: ignore[arg-type]

    def chunk_lens(self) -> tuple[float, ...]:
        """Each stage's mean chunk length for the FLOP count: the targets N (what the ratio loss
        trains towards, known before training, so a run's budget plans on them)."""
        return self.cfg.model.targets()

    def global_steps(self, batch: dict, n_real: int) -> np.ndarray:
        # (the model counts its chunks itself, Scores.steps_B; this estimate is never reported)
        return super().global_steps(batch, n_real) / float(math.prod(self.chunk_lens()))

    def mean_bytes_per_global_step(self) -> float:
        return float(math.prod(self.chunk_lens()))

    def forward_flops_per_position(self) -> float:
        return forward_flops_per_byte(self.cfg.model, self.cfg.train.seq_len, self.chunk_lens())

    def measured_train_flops(self, stats: Mapping[str, float]) -> float | None:
        """The step's training FLOPs at the chunk lengths its router produced (each stage's positions
        per chunk, summed over the batch): the planned figure's formula at the measured lengths; None
        for a step without a stage's counts (or without chunks)."""
        measured = []
        for s in range(1, self.cfg.model.stages + 1):
            positions, chunks = stats.get(f"s{s}_positions", 0.0), stats.get(f"s{s}_chunks", 0.0)
            if not positions or not chunks:
                return None
            measured.append(positions / chunks)
        per_position = forward_flops_per_byte(self.cfg.model, self.cfg.train.seq_len, measured)
        return 3.0 * per_position * self.positions_per_step()

    def stats_record(self, sums: Mapping[str, float]) -> dict:
        """Per stage ``s``: ``s{s}_mean_chunk_len`` (its positions per kept chunk), the overflow rates
        (windows that wanted more chunks than slots; boundaries dropped), the mean ratio loss and mean
        ``p``; and ``flops_at_measured_rate``, the forward FLOPs per byte at the measured chunk lengths
        over those planned at the targets."""
        out: dict = {}
        measured = []
        for s in range(1, self.cfg.model.stages + 1):
            k = f"s{s}_"
            positions, chunks = sums.get(k + "positions", 0.0), sums.get(k + "chunks", 0.0)
            if not positions or not chunks:
                return {}
            measured.append(positions / chunks)
            out[k + "mean_chunk_len"] = positions / chunks
            out[k + "overflow_windows"] = sums.get(k + "overflow_windows", 0.0) / max(
                sums.get(k + "windows", 1.0), 1.0
            )
            out[k + "dropped_boundaries"] = sums.get(k + "dropped", 0.0) / positions
            out[k + "ratio_loss"] = sums.get(k + "ratio_loss", 0.0) / max(sums.get(k + "windows", 1.0), 1.0)
            out[k + "p_mean"] = sums.get(k + "p_sum", 0.0) / positions
        out["flops_at_measured_rate"] = (
            forward_flops_per_byte(self.cfg.model, self.cfg.train.seq_len, measured)
            / self.forward_flops_per_position()
        )
        return out

    @classmethod
    def report_note(cls, run_info: dict) -> str:
        lengths = [run_info.get(f"s{s}_mean_chunk_len") for s in (1, 2)]
        lengths = [x for x in lengths if x]
        if not lengths:
            return ""
        overflow = max(run_info.get(f"s{s}_overflow_windows", 0.0) for s in range(1, len(lengths) + 1))
        chunks = " x ".join(f"{x:.2f}" for x in lengths)
        note = f"train chunks {chunks} (per stage), overflow {100 * overflow:.1f}% of windows"
        ratio = run_info.get("flops_at_measured_rate")
        # (FLOPs are planned at the targets N; at the rates the router learned they would be this)
        note += f", FLOPs at the learned rates {ratio:.2f}x planned" if ratio else ""
        measured, planned = run_info.get("flops_measured"), run_info.get("flops_planned")
        if measured and planned:  # (charged what every step measured: bytelm/training/flop_budget.py)
            note += f"; own FLOPs {measured:.3g} measured (charged), {planned:.3g} planned at the targets"
        return note

    @classmethod
    def add_commands(cls, subparsers) -> None:
        from bytelm.families.hnet.cli import add_chunks  # noqa: PLC0415 (when the command line is built)

        add_chunks(subparsers)  # bytelm chunks
