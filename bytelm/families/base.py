"""The family seam: what the trainer, the evaluator, the experiments and sampling ask of a family.

A *family* is a :class:`Task` subclass registered under its name (:mod:`bytelm.families`); a
*task* binds it to a resolved config and a prepared corpus. It builds the model, makes training
and evaluation batches (on the shared batch makers of :mod:`bytelm.data`), counts its FLOPs
(:meth:`Task.forward_flops_per_position`, and its compute ledger), sizes itself from a size rule
(:meth:`Task.sized`), names its cached decoder, and describes its run for reports. The layers
below it (data, models, patching, sampling's decoders) never name a family; the layers above
(training, evaluation, experiments, interop, the CLI) reach families only through the registry.

A family that needs artefacts besides its config (a tokenizer, an entropy model) names them in
:attr:`Task.artefacts`: config field -> artefact kind (:data:`ARTEFACT_KINDS`). Artefacts that are
run directories are restored by :func:`bytelm.training.restore.make_task` and handed to the task
as modules, with their ``run.json`` records (by config field); this module never loads another
run itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import ClassVar

import numpy as np
from flax import nnx

from bytelm.constants import BOS_ID, BYTE_OFFSET
from bytelm.data import Corpus, Stream, WindowBatches, segment_rows
from bytelm.errors import UserError
from bytelm.ledger import Ledger
from bytelm.models.configs import ModelConfig, StackConfig
from bytelm.models.hf_layout import HFExport, HFImport
from bytelm.sampling.decoders import Decoder, FlatDecoder, byte_of_unit, byte_units
from bytelm.sampling.recompute import RecomputeDecoder

STATS_KEY = "stats"  # a batch entry of host-side counts (not sent to the device): see Task.stats_record


@dataclasses.dataclass(frozen=True)
class ArtefactKind:
    """Something a family needs besides its config, named by a model config field."""

    noun: str  # "entropy model"
    made_by: str  # the command that makes one
    run_family: str | None = (
        None  # a run directory of this family, restored by the trainer; None: a plain directory
    )
    preset_role: str | None = None  # the role of a compare preset's [[model]] whose run is this artefact


ARTEFACT_KINDS = {
    "tokenizer": ArtefactKind("tokenizer", "bytelm tokenizer train --out DIR"),
    "entropy_model": ArtefactKind(
        "entropy model", "bytelm train configs/tiny/entropy.toml", run_family="byte", preset_role="entropy"
    ),
}


@dataclasses.dataclass(frozen=True)
class Trunk:
    """Transformer sizes from a size rule: the main stack, and the narrower stack of a family's local
    models (MegaByte's and BLT's byte-level stacks)."""

    main: StackConfig
    local: StackConfig


class Task:
    """Base class: a family's view of the data.

    A new family fills three members: :attr:`config_class` (its ``[model]`` dataclass, whose
    ``family`` field's default is the family's name), :meth:`build_model` and
    :meth:`forward_flops_per_position`. Everything else has a default for a model that reads bytes
    (``[BOS, byte + 4, ...]`` windows of the corpus's train stream, one position per byte, the
    flat decoder); a family that reads patches, chunks or tokens overrides what differs, or
    subclasses the task of a family that already reads them. The model built must score a batch
    (``model.score(batch, dropout_key=...)``, :class:`~bytelm.models.scoring.Scores`) and map ids
    to logits (``model(ids_BxT)``)."""

    config_class: ClassVar[type[ModelConfig]] = ModelConfig
    family: ClassVar[str] = ""  # the registry fills it from config_class's family default
    description: ClassVar[str] = ""  # "a byte LM": for messages and reports (default: "a <family> model")
    global_step: ClassVar[str] = "byte"  # what one position of the outermost stack is, for reports
    artefacts: ClassVar[Mapping[str, str]] = {}  # model config field -> artefact kind
    uses_nbytes: ClassVar[bool] = False  # batches carry each target's byte length ("nbytes")

    @classmethod
    def artefacts_of(cls, model_cfg) -> Mapping[str, str]:
        """The artefacts this model config needs (:attr:`artefacts`, unless its settings need fewer)."""
        return cls.artefacts

    @classmethod
    def sized(cls, model_cfg: ModelConfig, trunk: Trunk, changes: Mapping[str, object]) -> ModelConfig:
        """``model_cfg`` with ``changes`` (a grid cell's model fields, typed) given the ``trunk``: the
        size rule of ``bytelm ablate`` (its main stack; a local stack gets the trunk's local sizes),
        built and checked as one config (``dataclasses.replace``)."""
        raise UserError(f"the family {cls.family!r} has no size rule (Task.sized)")

    def __init__(
        self,
        cfg,
        corpus: Corpus | None,
        run_dir: Path | None = None,
        *,
        modules: Mapping[str, nnx.Module] | None = None,
        records: Mapping[str, dict] | None = None,
        record: Mapping | None = None,
    ):
        self.cfg = cfg
        self.corpus = corpus
        self.run_dir = run_dir
        self.record = dict(record or {})  # the run's own record when it exists (a resumed or restored run)
        self.modules = dict(modules or {})  # restored run artefacts, by config field
        self.records = dict(records or {})  # their run records (what making them cost), by config field

    @classmethod
    def for_shapes(cls, cfg, *, vocab_size: int | None = None) -> Task:
        """A task that builds the model and describes its batches without a corpus or artefacts
        (``bytelm compile``: programs compiled ahead of time from shapes alone). ``vocab_size``: a
        subword vocabulary's size where its tokenizer is not at hand."""
        return cls(cfg, None)

    def batch_shapes(self, rows: int) -> dict[str, tuple[tuple[int, ...], type]]:
        """The arrays of a batch of ``rows`` training windows, as :meth:`train_batches` and
        :meth:`decorate` make them: name -> (shape, dtype)."""
        return {"ids": ((rows, self.cfg.train.seq_len + 1), np.int32)}

    def require_corpus(self) -> Corpus:
        """The task's corpus; :class:`UserError` for a task built without one (restored to sample or
        export)."""
        if self.corpus is None:
            raise UserError(
                f"{self.description} needs its training corpus here, but it was restored without one"
            )
        return self.corpus

    # model
    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        raise NotImplementedError

    # training data
    def train_stream(self) -> Stream:
        """The stream training windows are cut from: the corpus's train bytes."""
        return self.require_corpus().train_stream

    def train_batches(
        self, start_step: int, process_index: int = 0, process_count: int = 1
    ) -> Iterator[dict]:
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
        """``(ids, nbytes)`` for one segment: ids start with BOS; ``nbytes`` per target or None (1
        each). Here ``[BOS, byte + 4, ...]``."""
        ids = np.empty(len(data) + 1, np.int32)
        ids[0] = BOS_ID
        ids[1:] = np.frombuffer(data, np.uint8).astype(np.int32) + BYTE_OFFSET
        return ids, None

    def check_context(self, segments: list[bytes]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """The encoded ``segments``; :class:`UserError` when one needs more positions than the model's
        context (``train.seq_len``): checked before training as well as at every evaluation."""
        encoded = [self.encode_segment(s) for s in segments]
        longest = max((len(ids) for ids, _ in encoded), default=2)
        if longest - 1 > self.cfg.train.seq_len:
            raise UserError(
                f"an evaluation segment needs {longest - 1} positions but the model trains on train.seq_len "
                f"= {self.cfg.train.seq_len}: set data.segment_bytes (now {self.cfg.data.segment_bytes}) so "
                "segments fit the training context (scores past it would measure length extrapolation, not "
                "the model)"
            )
        return encoded

    def eval_batches(self, segments: list[bytes], batch_size: int) -> Iterator[tuple[dict, int]]:
        encoded = self.check_context(segments)
        rows = segment_rows(
            encoded, width=self.cfg.train.seq_len + 1, batch_size=batch_size, with_nbytes=self.uses_nbytes
        )
        for batch, n_real in rows:
            yield self.decorate(batch), n_real

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
        """Training bytes per position of the outermost stack (1, P, the mean patch length, bytes per
        token)."""
        return self.bytes_per_position()

    def forward_flops_per_position(self) -> float:
        """The model's analytic forward FLOPs per position (by the convention of
        :mod:`bytelm.models.flops`)."""
        raise NotImplementedError

    def train_flops_per_position(self) -> float:
        return 3.0 * self.forward_flops_per_position()

    def train_flops_per_byte(self) -> float:
        return self.train_flops_per_position() / self.bytes_per_position()

    def inference_flops_per_byte(self) -> float:
        """Forward FLOPs per byte of the model itself."""
        return self.forward_flops_per_position() / self.bytes_per_position()

    def entropy_inference_flops_per_byte(self) -> float:
        """Forward FLOPs per byte of an entropy model run in the input pipeline (BLT), reported beside the
        model's own."""
        return 0.0

    def ledger(self) -> Ledger:
        """The compute ledger (:mod:`bytelm.ledger`): the model's own training FLOPs per step,
        and what it needs besides (here nothing; BLT: its entropy model's training and forward passes)."""
        return Ledger(self.train_flops_per_position() * self.positions_per_step())

    def measured_train_flops(self, stats: Mapping[str, float]) -> float | None:
        """The training FLOPs (own, forward + backward, as :meth:`train_flops_per_position`) that one
        step spent, from that step's model stats (``m["stats"]`` of the trainer's step, summed over
        the batch): for a model whose work depends on what it learns (H-Net's chunk rate). None: the
        planned figure (:meth:`ledger`) is exact, or this step's stats do not tell. A family that
        measures trains to ``train.flop_budget`` on its measured total (bytelm/training/flop_budget.py)."""
        return None

    @classmethod
    def measures_flops(cls) -> bool:
        """The family measures what its steps spend (it overrides :meth:`measured_train_flops`)."""
        return cls.measured_train_flops is not Task.measured_train_flops

    def stats_record(self, sums: Mapping[str, float]) -> dict:
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

    # Hugging Face (bytelm.interop.hf reads and writes the folders; the tables come from here)
    hf_model_type: ClassVar[str] = ""  # the Hugging Face model_type that hf_import converts ("": none)

    @classmethod
    def hf_export(cls, model_cfg, artefacts: Mapping[str, ModelConfig], run_info: Mapping) -> HFExport:
        """This family's run as a Hugging Face model (``artefacts``: the model configs of the runs its
        config names, by field; ``run_info``: its ``run.json``); :class:`UserError` saying why not."""
        raise UserError(f"the family {cls.family!r} has no Hugging Face format")

    @classmethod
    def hf_import(cls, config: dict, where: str, *, artefact_runs: Mapping[str, str], **options) -> HFImport:
        """A Hugging Face ``config.json`` of :attr:`hf_model_type` as this family's configs
        (``artefact_runs``: where each artefact's run will be, by config field; ``options``: the
        conversion's settings, e.g. ``seq_len``)."""
        raise UserError(f"the family {cls.family!r} converts no Hugging Face model")

    # generation
    def decoder(self, model: nnx.Module) -> Decoder:
        """The family's decoder for ``model`` (:mod:`bytelm.sampling`): here the flat byte decoder,
        with key/value caches when the model keeps them (``init_cache``), else by recomputing the
        whole prefix for every byte."""
        if hasattr(model, "init_cache"):
            return FlatDecoder(model, self.cfg.train.seq_len, byte_units, byte_of_unit)
        return RecomputeDecoder(model, self.cfg.train.seq_len, byte_units, byte_of_unit)

    @classmethod
    def add_commands(cls, subparsers) -> None:
        """A family may contribute commands of its own to the ``bytelm`` command line: add their
        parsers to ``subparsers`` (argparse's ``add_subparsers()``), each with its function
        (:func:`bytelm.console.command`). Default: none."""
