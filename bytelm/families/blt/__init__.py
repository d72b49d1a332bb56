"""BLT (Pagnoni et al. 2024): entropy patches from a byte LM run (its entropy model, an artefact),
a local encoder with hashed n-grams and cross-attention pooling, a latent global transformer over
patches, a local decoder (:mod:`bytelm.families.blt.model`). Batches are the byte LM's windows and
segments, plus patch lengths computed in the input pipeline (no gradient through the patcher) with
a calibrated threshold; its compute ledger carries its entropy model."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from flax import nnx

from bytelm.data import WindowBatches
from bytelm.errors import UserError
from bytelm.families.base import STATS_KEY, Task, Trunk
from bytelm.families.blt import hf
from bytelm.families.blt.config import BLTConfig
from bytelm.families.blt.decoder import BLTDecoder
from bytelm.families.blt.flops import entropy_forward_flops_per_id, forward_flops_per_byte
from bytelm.families.blt.model import BLT
from bytelm.ledger import Ledger, run_total_flops
from bytelm.models.configs import with_stacks
from bytelm.patching import EntropyModel, EntropyPatcher, SpacePatcher, mean_patch_length, real_lengths
from bytelm.sampling.decoders import Decoder


class BLTTask(Task):
    """BLT: byte windows and segments as for the byte LM, plus patch lengths from the entropy model
    (computed in the input pipeline, no gradient through it) with a calibrated threshold."""

    family = "blt"
    description = "a BLT model"
    global_step = "entropy patch (the BOS patch excluded)"
    config_class = BLTConfig
    artefacts = {"entropy_run": "entropy_model"}
    calibration_rows = 64

    @classmethod
    def sized(cls, model_cfg, trunk: Trunk, changes):
        # the local stacks' widths and heads from the trunk; their depths and window stay
        return with_stacks(model_cfg, {"global": trunk.main, "local": trunk.local}, **changes)

    hf_model_type = hf.MODEL_TYPE

    @classmethod
    def hf_export(cls, model_cfg, artefacts, run_info):
        return hf.hf_export(model_cfg, artefacts, run_info)

    @classmethod
    def hf_import(cls, config, where, *, artefact_runs, **options):
        return hf.hf_import(config, where, artefact_runs=artefact_runs, **options)

    @classmethod
    def artefacts_of(cls, model_cfg) -> Mapping[str, str]:
        return {} if model_cfg.patching == "space" else cls.artefacts

    def __init__(self, cfg, corpus, run_dir=None, *, modules=None, records=None, record=None):
        super().__init__(cfg, corpus, run_dir, modules=modules, records=records, record=record)
        self.max_patches = cfg.model.patches_for(cfg.train.seq_len)
        self.space = cfg.model.patching == "space"
        if self.space:
            self.entropy_model: EntropyModel | None = None
            return
        if "entropy_run" not in self.modules:
            raise UserError(
                "a BLT task needs its entropy model: build it with bytelm.training.restore.make_task, which "
                "restores the run that model.entropy_run names"
            )
        # one fixed row width (the training window) for training and evaluation rows alike, so a
        # segment's entropies, and hence its patches, never depend on its batch
        self.entropy_model = EntropyModel(self.modules["entropy_run"], width=cfg.train.seq_len + 1)

    @classmethod
    def for_shapes(cls, cfg, *, vocab_size=None):
        """Without the entropy model (it patches on the host, outside the compiled step); its FLOPs
        counted at the target patch length."""
        task = cls.__new__(cls)
        Task.__init__(task, cfg, None)
        task.max_patches = cfg.model.patches_for(cfg.train.seq_len)
        task.space = cfg.model.patching == "space"
        task.entropy_model = None
        task.__dict__["_patching"] = (None, None)  # (no patcher; FLOPs at the target patch length)
        return task

    def batch_shapes(self, rows):
        return {**super().batch_shapes(rows), "patch_lengths": ((rows, self.max_patches), np.int32)}

    def _calibration_sample(self) -> np.ndarray:
        return WindowBatches(
            self.require_corpus().train_stream,
            batch_size=self.calibration_rows,
            window=self.cfg.train.seq_len + 1,
            seed=self.cfg.train.seed + 7919,
            process_index=0,
            process_count=1,
        ).batch(0)

    @functools.cached_property
    def _patching(self) -> tuple[EntropyPatcher | SpacePatcher, float | None]:
        """The patcher and the mean patch length calibration achieved (None when not calibrated):
        a run keeps the threshold it was trained with; else the configured threshold; else a
        threshold calibrated on training windows (computed on first use, not at construction).
        Space patching has no threshold; its mean length is measured on the same training windows."""
        m = self.cfg.model
        mono = m.monotonic_threshold or None
        recorded = self.record.get("patching") or {}
        patcher: EntropyPatcher | SpacePatcher
        if self.space:
            patcher = SpacePatcher(m.max_patch_len)
            if recorded.get("achieved_mean_patch_len") or self.corpus is None:
                return patcher, recorded.get("achieved_mean_patch_len")
            sample = self._calibration_sample()
            return patcher, mean_patch_length(patcher.starts(sample), real_lengths(sample))
        if recorded.get("threshold") is not None:
            patcher, achieved = (
                EntropyPatcher.from_settings(self._entropy(), recorded),
                recorded.get("achieved_mean_patch_len"),
            )
        elif m.threshold > 0:
            patcher, achieved = EntropyPatcher(self._entropy(), m.threshold, mono, m.max_patch_len), None
        elif self.corpus is None:
            raise UserError(
                f"the BLT run {self.run_dir} records no patching threshold (its run record's 'patching') and "
                "model.threshold is 0, so the threshold would be calibrated on the training corpus, which "
                "was not loaded: set model.threshold or restore the run with its corpus"
            )
        else:
            return EntropyPatcher.calibrated(
                self._entropy(),
                self._calibration_sample(),
                m.target_patch_len,
                monotonic_threshold=mono,
                max_patch_len=m.max_patch_len,
            )
        if (
            achieved is None and self.corpus is not None
        ):  # a fixed threshold: its mean length measured as calibration would
            sample = self._calibration_sample()
            achieved = mean_patch_length(patcher.starts(sample), real_lengths(sample))
        return patcher, achieved

    @property
    def patcher(self) -> EntropyPatcher | SpacePatcher:
        return self._patching[0]

    @property
    def achieved(self) -> float | None:
        return self._patching[1]

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        return BLT(self.cfg.model, rngs=rngs)

    def decoder(self, model: nnx.Module) -> Decoder:
        if self.space:
            raise UserError(
                "sampling from a space-patched BLT (model.patching = 'space') is not supported; sample an "
                "entropy-patched run"
            )
        return BLTDecoder(
            model,
            self.modules["entropy_run"],
            self.patcher.settings(),
            self.cfg.train.seq_len,
            self.max_patches,
        )

    def decorate(self, batch: dict) -> dict:
        layout = self.patcher.layout(batch["ids"], self.max_patches)
        batch["patch_lengths"] = layout.lengths_BxP
        batch[STATS_KEY] = layout.stats()
        return batch

    def global_steps(self, batch: dict, n_real: int) -> np.ndarray:
        lengths = np.asarray(batch["patch_lengths"])[:n_real]
        # the first patch holds the BOS alone; the others cover the segment's bytes
        return ((lengths > 0).sum(axis=1) - 1).astype(np.float64)

    def mean_bytes_per_global_step(self) -> float:
        return self.achieved or self.cfg.model.target_patch_len

    def forward_flops_per_position(self) -> float:
        return forward_flops_per_byte(
            self.cfg.model, self.cfg.train.seq_len, self.mean_bytes_per_global_step()
        )

    def entropy_inference_flops_per_byte(self) -> float:
        if self.space:
            return 0.0
        entropy_cfg = getattr(self.modules["entropy_run"], "cfg")  # (a byte LM's model keeps its config)
        return entropy_forward_flops_per_id(entropy_cfg, self.cfg.train.seq_len)

    def ledger(self) -> Ledger:
        """Its own training, plus its entropy model's: the training of that model (its run's total), its
        forward over every id of every training window, and over the calibration sample."""
        own = super().ledger()
        if self.space:
            return own
        per_window = self.entropy_inference_flops_per_byte() * (self.cfg.train.seq_len + 1)
        fixed = {"entropy model forward over the calibration sample": per_window * self.calibration_rows}
        trained = run_total_flops(self.records.get("entropy_run") or {})
        if trained is not None:
            fixed = {"entropy model training": trained, **fixed}
        return Ledger(
            own.own_per_step,
            per_window * self.cfg.train.batch_size,
            fixed,
            () if trained is not None else ("entropy model training",),
            per_step_name="entropy model forward over the training bytes",
        )

    def stats_record(self, sums: Mapping[str, float]) -> dict:
        if not sums.get("windows"):
            return {}
        return {
            "patch_overflow_windows": sums["overflow_windows"] / sums["windows"],
            "patch_overflow_bytes": sums["overflow_positions"] / max(sums["positions"], 1),
        }

    def _entropy(self) -> EntropyModel:
        """The entropy model (a task patching by spaces has none)."""
        assert self.entropy_model is not None
        return self.entropy_model

    def fingerprints(self) -> dict[str, tuple[str, str]]:
        if self.space:
            return {}
        return {"entropy": (self._entropy().fingerprint, str(Path(self.cfg.model.entropy_run).absolute()))}

    def run_info(self) -> dict:
        return {
            **super().run_info(),
            "entropy_run": None if self.space else str(Path(self.cfg.model.entropy_run).absolute()),
            "patching": {
                **self.patcher.record(),
                "target_mean_patch_len": self.cfg.model.target_patch_len,
                "achieved_mean_patch_len": self.achieved,
                "calibration_rows": self.calibration_rows if self.achieved is not None else 0,
                "max_patches": self.max_patches,
            },
        }

    @classmethod
    def report_note(cls, run_info: dict) -> str:
        achieved = (run_info.get("patching") or {}).get("achieved_mean_patch_len")
        return f"train mean patch {achieved:.2f} (BOS patches counted)" if achieved else ""

    @classmethod
    def add_commands(cls, subparsers) -> None:
        from bytelm.families.blt.cli import add_patch  # noqa: PLC0415 (when the command line is built)

        add_patch(subparsers)  # bytelm patch
