"""How each model family meets the data: the Task seam, and the one registry of families.

A *task* binds a resolved config and a prepared corpus to one family: it builds the model, makes
train and eval batches, counts FLOPs, bytes per position and global steps, and describes the run
for reports. The trainer, the evaluator and the compare pipeline only talk to tasks, so adding a
family means a model file, its config dataclass, its task here (with its :data:`FAMILIES` entry)
and a preset (docs/architecture.md lists the files).

A family that needs artefacts besides its config (a tokenizer, an entropy model) names them in
:attr:`Task.artefacts`: config field -> artefact kind (:data:`ARTEFACT_KINDS`). Artefacts that are
run directories are restored by :func:`bytelm.training.trainer.make_task` and handed to the task
as modules (by config field); this module never loads another run itself.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import ClassVar

import numpy as np
from flax import nnx

from bytelm.atomic import atomic_directory
from bytelm.baselines import load_tokenizer
from bytelm.constants import BOS_ID, BYTE_OFFSET, EOS_ID, NUM_BYTE_IDS, PAD_ID
from bytelm.data import Corpus, WindowBatches
from bytelm.errors import UserError
from bytelm.models.blt import BLT
from bytelm.models.byte_lm import ByteLM
from bytelm.models.configs import BLTConfig, ByteLMConfig, MegaByteConfig, ModelConfig, TokenLMConfig
from bytelm.models.megabyte import MegaByte
from bytelm.models.token_lm import TokenLM
from bytelm.patching import EntropyModel, EntropyPatcher, SpacePatcher, mean_patch_length, real_lengths
from bytelm.sampling.decoders import BLTDecoder, Decoder, MegaByteDecoder, byte_decoder, token_decoder
from bytelm.training import flops
from bytelm.training.ledger import Ledger, run_total_flops

STATS_KEY = "stats"  # a batch entry of host-side counts (not sent to the device): see Task.stats_record


@dataclasses.dataclass(frozen=True)
class ArtefactKind:
    """Something a family needs besides its config, named by a model config field."""

    noun: str  # "entropy model"
    made_by: str  # the command that makes one
    run_family: str | None = None  # a run directory of this family, restored by the trainer; None: a plain directory
    preset_role: str | None = None  # the role of a compare preset's [[model]] whose run is this artefact


ARTEFACT_KINDS = {
    "tokenizer": ArtefactKind("tokenizer", "bytelm tokenizer train --out DIR"),
    "entropy_model": ArtefactKind("entropy model", "bytelm train configs/tiny/entropy.toml", run_family="byte", preset_role="entropy"),
}


@dataclasses.dataclass(frozen=True)
class Trunk:
    """Transformer sizes from a size rule: the main stack and the half-width local stacks."""

    d_model: int
    layers: int
    heads: int
    mlp_dim: int
    local_d_model: int
    local_layers: int
    local_heads: int
    local_mlp_dim: int

    def stack(self, prefix: str, *, local: bool = False) -> list[str]:
        """``model.<prefix>d_model`` / ``layers`` / ``heads`` / ``mlp_dim`` overrides."""
        d, L, h, m = (self.local_d_model, self.local_layers, self.local_heads, self.local_mlp_dim) if local else (
            self.d_model, self.layers, self.heads, self.mlp_dim)
        return [f"model.{prefix}d_model={d}", f"model.{prefix}layers={L}", f"model.{prefix}heads={h}", f"model.{prefix}mlp_dim={m}"]


class Task:
    """Base class: a family's view of the data. Subclasses fill in the model-specific parts."""

    family: ClassVar[str] = ""
    description: ClassVar[str] = ""  # "a byte LM": for messages and reports
    global_step: ClassVar[str] = "byte"  # what one position of the outermost stack is, for reports
    config_class: ClassVar[type[ModelConfig]] = ModelConfig
    artefacts: ClassVar[Mapping[str, str]] = {}  # model config field -> artefact kind
    uses_nbytes: ClassVar[bool] = False  # batches carry each target's byte length ("nbytes")

    @classmethod
    def artefacts_of(cls, model_cfg) -> Mapping[str, str]:
        """The artefacts this model config needs (:attr:`artefacts`, unless its settings need fewer)."""
        return cls.artefacts

    @classmethod
    def sized(cls, model_cfg, trunk: Trunk) -> list[str]:
        """``--set`` overrides giving this family's model the ``trunk`` (the size rule of
        ``bytelm ablate``: its main stack; a local stack gets the trunk's local sizes)."""
        raise UserError(f"the family {cls.family!r} has no size rule (Task.sized)")

    def __init__(
        self, cfg, corpus: Corpus | None, run_dir: Path | None = None, *, modules: Mapping[str, nnx.Module] | None = None,
        records: Mapping[str, dict] | None = None,
    ):
        self.cfg = cfg
        self.corpus = corpus
        self.run_dir = run_dir
        self.modules = dict(modules or {})  # restored run artefacts, by config field
        self.records = dict(records or {})  # their run.json records (what making them cost), by config field

    # model
    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        raise NotImplementedError

    # training data
    def train_stream(self) -> np.ndarray:
        raise NotImplementedError

    def train_batches(self, start_step: int, process_index: int = 0, process_count: int = 1) -> Iterator[dict]:
        """Training batches from step ``start_step`` on: this host's rows (``process_index`` of
        ``process_count``, the trainer passes JAX's) of each global batch, with family arrays."""
        t = self.cfg.train
        it = WindowBatches(
            self.train_stream(),
            batch_size=t.batch_size,
            window=t.seq_len + 1,
            seed=t.seed,
            step=start_step,
            process_index=process_index,
            process_count=process_count,
        )
        for ids in it:
            yield self.decorate({"ids": ids})

    def decorate(self, batch: dict) -> dict:
        """Add family-specific arrays (token byte lengths, patch lengths) to a batch of ids."""
        return batch

    # evaluation data
    def encode_segment(self, data: bytes) -> tuple[np.ndarray, np.ndarray | None]:
        """``(ids, nbytes)`` for one segment: ids start with BOS; ``nbytes`` per target or None (1 each)."""
        raise NotImplementedError

    def eval_batches(self, segments: list[bytes], batch_size: int) -> Iterator[tuple[dict, int]]:
        encoded = [self.encode_segment(s) for s in segments]
        longest = max((len(ids) for ids, _ in encoded), default=2)
        if longest - 1 > self.cfg.train.seq_len:
            raise UserError(
                f"an evaluation segment needs {longest - 1} positions but the model trains on train.seq_len = "
                f"{self.cfg.train.seq_len}: set data.segment_bytes so segments fit the training context "
                "(scores past it would measure length extrapolation, not the model)"
            )
        # One row width for every batch (the training window), not the longest segment of this call:
        # a segment's program, and so its score, must not depend on the segments it is scored with.
        width = self.cfg.train.seq_len + 1
        for lo in range(0, len(encoded), batch_size):
            chunk = encoded[lo : lo + batch_size]
            ids = np.full((batch_size, width), PAD_ID, np.int32)
            nbytes = np.zeros((batch_size, width - 1), np.int32)
            for r, (row_ids, row_nbytes) in enumerate(chunk):
                ids[r, : len(row_ids)] = row_ids
                nbytes[r, : len(row_ids) - 1] = 1 if row_nbytes is None else row_nbytes
            batch = {"ids": ids}
            if self.uses_nbytes:
                batch["nbytes"] = nbytes
            yield self.decorate(batch), len(chunk)

    def global_steps(self, batch: dict, n_real: int) -> np.ndarray:
        """Positions of the model's outermost (most expensive) stack for each of the first ``n_real``
        rows of an eval batch: here the scored positions (bytes, or tokens)."""
        return (np.asarray(batch["ids"])[:n_real, 1:] >= BYTE_OFFSET).sum(axis=1).astype(np.float64)

    # accounting
    def positions_per_step(self) -> int:
        return self.cfg.train.batch_size * self.cfg.train.seq_len

    def bytes_per_position(self) -> float:
        return 1.0

    def mean_bytes_per_global_step(self) -> float:
        """Training bytes per position of the outermost stack (1, P, the mean patch length, bytes per token)."""
        return self.bytes_per_position()

    def forward_flops_per_position(self) -> float:
        """The model's analytic forward FLOPs per position (:mod:`bytelm.training.flops`)."""
        raise NotImplementedError

    def train_flops_per_position(self) -> float:
        return 3.0 * self.forward_flops_per_position()

    def train_flops_per_byte(self) -> float:
        return self.train_flops_per_position() / self.bytes_per_position()

    def inference_flops_per_byte(self) -> float:
        """Forward FLOPs per byte of the model itself."""
        return self.forward_flops_per_position() / self.bytes_per_position()

    def entropy_inference_flops_per_byte(self) -> float:
        """Forward FLOPs per byte of an entropy model run in the input pipeline (BLT), reported beside the model's own."""
        return 0.0

    def ledger(self) -> Ledger:
        """The compute ledger (:mod:`bytelm.training.ledger`): the model's own training FLOPs per step,
        and what it needs besides (here nothing; BLT: its entropy model's training and forward passes)."""
        return Ledger(self.train_flops_per_position() * self.positions_per_step())

    def stats_record(self, sums: Mapping[str, int]) -> dict:
        """Rates for logs and reports from the summed ``batch["stats"]`` counts of :meth:`decorate`
        (``{}`` for families whose pipeline keeps none)."""
        return {}

    def fingerprints(self) -> dict[str, tuple[str, str]]:
        """The artefacts the task depends on: ``name -> (fingerprint, where it is)``, recorded in
        ``run.json`` as ``<name>_fingerprint`` (a restored run must find the same ones)."""
        return {}

    def run_info(self) -> dict:
        """Extra facts recorded in the run (e.g. the tokenizer fingerprint)."""
        return {
            **{f"{name}_fingerprint": fingerprint for name, (fingerprint, _) in self.fingerprints().items()},
            "mean_bytes_per_global_step": self.mean_bytes_per_global_step(),
            "inference_flops_per_byte": self.inference_flops_per_byte(),
            "entropy_inference_flops_per_byte": self.entropy_inference_flops_per_byte(),
            "ledger": self.ledger().record(),
        }

    @classmethod
    def report_note(cls, run_info: dict) -> str:
        """A short note for a report row, from the run's ``run.json`` ("" for none)."""
        return ""

    # generation
    def decoder(self, model: nnx.Module) -> Decoder:
        """The family's cached decoder for ``model`` (:mod:`bytelm.sampling`)."""
        raise NotImplementedError


class ByteTask(Task):
    """ByT5-style byte LM: the corpus's train stream as is; segments as ``[BOS, b+4, ...]``."""

    family = "byte"
    description = "a byte LM"
    config_class = ByteLMConfig

    @classmethod
    def sized(cls, model_cfg, trunk: Trunk) -> list[str]:
        return [f"model.d_model={trunk.d_model}", f"model.n_layers={trunk.layers}", f"model.n_heads={trunk.heads}",
                f"model.mlp_dim={trunk.mlp_dim}"]

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        return ByteLM(self.cfg.model, rngs=rngs)

    def train_stream(self) -> np.ndarray:
        return self.corpus.train_stream

    def decoder(self, model: nnx.Module) -> Decoder:
        return byte_decoder(model, self.cfg.train.seq_len)

    def encode_segment(self, data: bytes):
        ids = np.empty(len(data) + 1, np.int32)
        ids[0] = BOS_ID
        ids[1:] = np.frombuffer(data, np.uint8).astype(np.int32) + BYTE_OFFSET
        return ids, None

    def forward_flops_per_position(self) -> float:
        return flops.decoder_lm_forward_flops_per_position(self.cfg.model, NUM_BYTE_IDS, self.cfg.train.seq_len)


class MegaByteTask(ByteTask):
    """MegaByte: the same byte windows and segments as the byte LM, the BOS in its first patch."""

    family = "megabyte"
    description = "a MegaByte model"
    global_step = "patch of P bytes"
    config_class = MegaByteConfig

    @classmethod
    def sized(cls, model_cfg, trunk: Trunk) -> list[str]:
        P = model_cfg.patch_size
        if trunk.d_model % P:
            raise UserError(f"the size rule's width {trunk.d_model} is not divisible by model.patch_size {P} (embed_dim = width / P)")
        return [*trunk.stack("global_"), f"model.embed_dim={trunk.d_model // P}", *trunk.stack("local_", local=True)]

    def __init__(self, cfg, corpus, run_dir=None, *, modules=None, records=None):
        super().__init__(cfg, corpus, run_dir, modules=modules, records=records)
        cfg.model.padded_length(cfg.train.seq_len + 1, what="a window (the BOS and train.seq_len bytes) of")

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        return MegaByte(self.cfg.model, rngs=rngs)

    def decoder(self, model: nnx.Module) -> Decoder:
        return MegaByteDecoder(model, self.cfg.train.seq_len)

    def global_steps(self, batch: dict, n_real: int) -> np.ndarray:
        return super().global_steps(batch, n_real) / float(self.cfg.model.patch_size)

    def forward_flops_per_position(self) -> float:
        return flops.megabyte_forward_flops_per_byte(self.cfg.model, self.cfg.train.seq_len)

    def mean_bytes_per_global_step(self) -> float:
        return float(self.cfg.model.patch_size)


class TokenTask(Task):
    """The subword-token LM (family ``bpe``, for historical reasons: any subword tokenizer, BPE or
    Unigram, with its encoder rule): the corpus encoded once into a cached token stream; segments
    encoded each on its own (tokens never cross a segment boundary), with every token's byte length."""

    family = "bpe"
    description = "a subword LM on BPE or Unigram tokens"
    global_step = "token"
    config_class = TokenLMConfig
    artefacts = {"tokenizer": "tokenizer"}

    @classmethod
    def sized(cls, model_cfg, trunk: Trunk) -> list[str]:
        return ByteTask.sized(model_cfg, trunk)  # the byte LM's transformer over token ids
    uses_nbytes = True

    def __init__(self, cfg, corpus, run_dir=None, *, modules=None, records=None):
        super().__init__(cfg, corpus, run_dir, modules=modules, records=records)
        if not cfg.model.tokenizer:
            raise UserError(
                "model.tokenizer is empty: point it at a tokenizer directory (bytelm tokenizer train --out DIR)"
            )
        self.tokenizer = load_tokenizer(cfg.model.tokenizer)
        n = self.tokenizer.n_vocab
        lengths = [len(self.tokenizer.token_bytes(i)) for i in range(n)]
        self.id_bytes = np.asarray([0] * BYTE_OFFSET + lengths, np.int32)  # bytes per model id
        self._stream = None
        self._bytes_per_token = None

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        return TokenLM(self.cfg.model, self.tokenizer.n_vocab, rngs=rngs)

    def decoder(self, model: nnx.Module) -> Decoder:
        return token_decoder(model, self.tokenizer, self.cfg.train.seq_len)

    def _load_stream(self) -> None:
        corpus = self.corpus
        alpha = self.cfg.model.sample_alpha
        sampled = f"-a{alpha:g}-s{self.cfg.train.seed}" if alpha > 0 else ""
        if alpha > 0 and self.tokenizer.kind != "unigram":
            raise UserError(f"model.sample_alpha = {alpha} draws Unigram segmentations, but {self.cfg.model.tokenizer} holds a "
                            f"{self.tokenizer.kind} tokenizer; set model.sample_alpha = 0 or train one with --kind unigram")
        path = corpus.path.parent.parent / "tokens" / f"{corpus.path.name}-{self.tokenizer.fingerprint[:24]}{sampled}"
        if not (path / "manifest.json").is_file():
            with atomic_directory(path) as tmp:
                # one process: forking a process that already runs JAX threads risks deadlocks; cached once
                if alpha > 0:
                    parts = [
                        self.tokenizer.encode_sampled(doc, alpha=alpha, rng=np.random.default_rng([self.cfg.train.seed, j]))
                        for j, doc in enumerate(corpus.documents("train"))
                    ]
                    counts = np.array([len(p) for p in parts], np.int64)
                    ids = np.fromiter((i for p in parts for i in p), dtype=np.int64, count=int(counts.sum()))
                else:
                    ids, counts = self.tokenizer.encode_documents(corpus.documents("train"), dtype=np.int64, num_workers=1)
                n_docs = len(counts)
                stream = np.empty(len(ids) + 2 * n_docs, np.uint32)
                starts = np.concatenate([[0], np.cumsum(counts + 2)])[:-1]
                stream[starts] = BOS_ID
                stream[starts + counts + 1] = EOS_ID
                body = np.ones(len(stream), bool)
                body[starts] = False
                body[starts + counts + 1] = False
                stream[body] = ids + BYTE_OFFSET
                stream.tofile(tmp / "train.u32")
                (tmp / "manifest.json").write_text(
                    json.dumps({"tokens": int(len(ids)), "bytes": corpus.split_bytes("train"), "length": int(len(stream))})
                )
        manifest = json.loads((path / "manifest.json").read_text())
        self._stream = np.memmap(path / "train.u32", dtype=np.uint32, mode="r", shape=(manifest["length"],))
        self._bytes_per_token = manifest["bytes"] / max(manifest["tokens"], 1)

    def train_stream(self) -> np.ndarray:
        if self._stream is None:
            self._load_stream()
        return self._stream

    def decorate(self, batch: dict) -> dict:
        if "nbytes" not in batch:
            batch["nbytes"] = self.id_bytes[batch["ids"][:, 1:]]
        return batch

    def encode_segment(self, data: bytes):
        tokens = np.asarray(self.tokenizer.encode_ordinary(data), np.int64)
        ids = np.concatenate([[BOS_ID], tokens + BYTE_OFFSET]).astype(np.int32)
        return ids, self.id_bytes[ids[1:]]

    def bytes_per_position(self) -> float:
        if self._bytes_per_token is None:
            self._load_stream()
        return self._bytes_per_token

    def forward_flops_per_position(self) -> float:
        n_valid = self.tokenizer.n_vocab + BYTE_OFFSET
        return flops.decoder_lm_forward_flops_per_position(self.cfg.model, n_valid, self.cfg.train.seq_len)

    def fingerprints(self) -> dict[str, tuple[str, str]]:
        return {"tokenizer": (self.tokenizer.fingerprint, str(Path(self.cfg.model.tokenizer).absolute()))}

    def run_info(self) -> dict:
        return {
            **super().run_info(),
            "tokenizer": str(Path(self.cfg.model.tokenizer).absolute()),
            "tokenizer_n_vocab": self.tokenizer.n_vocab,
            "tokenizer_kind": self.tokenizer.kind,
            "tokenizer_encoder": self.tokenizer.encoder,
            "sample_alpha": self.cfg.model.sample_alpha,
        }

    @classmethod
    def report_note(cls, run_info: dict) -> str:
        kind = run_info.get("tokenizer_kind")
        return f"{kind} tokenizer, {run_info.get('tokenizer_n_vocab')} ids, encoder {run_info.get('tokenizer_encoder')}" if kind else ""


class BLTTask(ByteTask):
    """BLT: byte windows and segments as for the byte LM, plus patch lengths from the entropy model
    (computed in the input pipeline, no gradient through it) with a calibrated threshold."""

    family = "blt"
    description = "a BLT model"
    global_step = "entropy patch (the BOS patch excluded)"
    config_class = BLTConfig
    artefacts = {"entropy_run": "entropy_model"}
    calibration_rows = 64

    @classmethod
    def sized(cls, model_cfg, trunk: Trunk) -> list[str]:
        return [*trunk.stack("global_"), f"model.local_d_model={trunk.local_d_model}", f"model.local_heads={trunk.local_heads}",
                f"model.local_mlp_dim={trunk.local_mlp_dim}"]

    @classmethod
    def artefacts_of(cls, model_cfg) -> Mapping[str, str]:
        return {} if model_cfg.patching == "space" else cls.artefacts

    def __init__(self, cfg, corpus, run_dir=None, *, modules=None, records=None):
        super().__init__(cfg, corpus, run_dir, modules=modules, records=records)
        self.max_patches = cfg.model.patches_for(cfg.train.seq_len)
        self.space = cfg.model.patching == "space"
        if self.space:
            self.entropy_model = None
            return
        if "entropy_run" not in self.modules:
            raise UserError(
                "a BLT task needs its entropy model: build it with bytelm.training.trainer.make_task, which "
                "restores the run that model.entropy_run names"
            )
        # one fixed row width (the training window) for training and evaluation rows alike, so a
        # segment's entropies, and hence its patches, never depend on its batch
        self.entropy_model = EntropyModel(self.modules["entropy_run"], width=cfg.train.seq_len + 1)

    def _calibration_sample(self) -> np.ndarray:
        return WindowBatches(
            self.corpus.train_stream, batch_size=self.calibration_rows, window=self.cfg.train.seq_len + 1,
            seed=self.cfg.train.seed + 7919, process_index=0, process_count=1,
        ).batch(0)

    @functools.cached_property
    def _patching(self) -> tuple[EntropyPatcher | SpacePatcher, float | None]:
        """The patcher and the mean patch length calibration achieved (None when not calibrated):
        a run keeps the threshold it was trained with; else the configured threshold; else a
        threshold calibrated on training windows (computed on first use, not at construction).
        Space patching has no threshold; its mean length is measured on the same training windows."""
        m = self.cfg.model
        mono = m.monotonic_threshold or None
        recorded = {}
        if self.run_dir is not None and (Path(self.run_dir) / "run.json").is_file():
            recorded = json.loads((Path(self.run_dir) / "run.json").read_text()).get("patching") or {}
        if self.space:
            patcher = SpacePatcher(m.max_patch_len)
            if recorded.get("achieved_mean_patch_len") or self.corpus is None:
                return patcher, recorded.get("achieved_mean_patch_len")
            sample = self._calibration_sample()
            return patcher, mean_patch_length(patcher.starts(sample), real_lengths(sample))
        if recorded.get("threshold") is not None:
            patcher, achieved = EntropyPatcher.from_settings(self.entropy_model, recorded), recorded.get("achieved_mean_patch_len")
        elif m.threshold > 0:
            patcher, achieved = EntropyPatcher(self.entropy_model, m.threshold, mono, m.max_patch_len), None
        elif self.corpus is None:
            raise UserError(
                f"the BLT run {self.run_dir} records no patching threshold (run.json 'patching') and model.threshold is 0, "
                "so the threshold would be calibrated on the training corpus, which was not loaded: set model.threshold "
                "or restore the run with its corpus"
            )
        else:
            return EntropyPatcher.calibrated(
                self.entropy_model, self._calibration_sample(), m.target_patch_len, monotonic_threshold=mono, max_patch_len=m.max_patch_len
            )
        if achieved is None and self.corpus is not None:  # a fixed threshold: its mean length measured as calibration would
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
            raise UserError("sampling from a space-patched BLT (model.patching = 'space') is not supported; sample an entropy-patched run")
        return BLTDecoder(model, self.modules["entropy_run"], self.patcher.settings(), self.cfg.train.seq_len, self.max_patches)

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
        return flops.blt_forward_flops_per_byte(self.cfg.model, self.cfg.train.seq_len, self.mean_bytes_per_global_step())

    def entropy_inference_flops_per_byte(self) -> float:
        if self.space:
            return 0.0
        return flops.entropy_inference_flops_per_byte(self.modules["entropy_run"].cfg, self.cfg.train.seq_len)

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
            own.own_per_step, per_window * self.cfg.train.batch_size, fixed, () if trained is not None else ("entropy model training",),
            per_step_name="entropy model forward over the training bytes",
        )

    def stats_record(self, sums: Mapping[str, int]) -> dict:
        if not sums.get("windows"):
            return {}
        return {
            "patch_overflow_windows": sums["overflow_windows"] / sums["windows"],
            "patch_overflow_bytes": sums["overflow_positions"] / max(sums["positions"], 1),
        }

    def fingerprints(self) -> dict[str, tuple[str, str]]:
        if self.space:
            return {}
        return {"entropy": (self.entropy_model.fingerprint, str(Path(self.cfg.model.entropy_run).absolute()))}

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


# The one registry: family name -> its task (and through it, its config dataclass).
FAMILIES: dict[str, type[Task]] = {cls.family: cls for cls in (ByteTask, TokenTask, MegaByteTask, BLTTask)}


def task_class(family: str) -> type[Task]:
    """The task of ``family``; :class:`UserError` naming the known families otherwise."""
    if family not in FAMILIES:
        raise UserError(f"model.family {family!r} is not a known family; known: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[family]
