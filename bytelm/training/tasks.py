"""How each model family meets the data: model construction, train batches, eval batches, FLOPs.

A *task* binds a resolved config and a prepared corpus to one family. The trainer and the
evaluator only talk to tasks, so adding a family means adding a task here (and its model in
``bytelm/models``), not touching the training loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from flax import nnx

from bytelm.constants import BOS_ID, BYTE_OFFSET, EOS_ID, NUM_BYTE_IDS, PAD_ID
from bytelm.data import Corpus, WindowBatches
from bytelm.errors import UserError
from bytelm.training import flops


class Task:
    """Base class: a family's view of the data. Subclasses fill in the model-specific parts."""

    family: str = ""

    def __init__(self, cfg, corpus: Corpus, run_dir: Path | None = None):
        self.cfg = cfg
        self.corpus = corpus
        self.run_dir = run_dir

    # model
    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        raise NotImplementedError

    # training data
    def train_stream(self) -> np.ndarray:
        raise NotImplementedError

    def train_batches(self, start_step: int, process_index: int = 0, process_count: int = 1) -> Iterator[dict]:
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

    uses_nbytes = False

    # accounting
    def positions_per_step(self) -> int:
        return self.cfg.train.batch_size * self.cfg.train.seq_len

    def bytes_per_position(self) -> float:
        return 1.0

    def train_flops_per_position(self) -> float:
        raise NotImplementedError

    def train_flops_per_byte(self) -> float:
        return self.train_flops_per_position() / self.bytes_per_position()

    def run_info(self) -> dict:
        """Extra facts recorded in the run (e.g. the tokenizer fingerprint)."""
        return {"mean_bytes_per_global_step": self.bytes_per_position()}


class ByteTask(Task):
    """ByT5-style byte LM: the corpus's train stream as is; segments as ``[BOS, b+4, ...]``."""

    family = "byte"

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        from bytelm.models.byte_lm import ByteLM  # noqa: PLC0415

        return ByteLM(self.cfg.model, rngs=rngs)

    def train_stream(self) -> np.ndarray:
        return self.corpus.train_stream

    def encode_segment(self, data: bytes):
        ids = np.empty(len(data) + 1, np.int32)
        ids[0] = BOS_ID
        ids[1:] = np.frombuffer(data, np.uint8).astype(np.int32) + BYTE_OFFSET
        return ids, None

    def train_flops_per_position(self) -> float:
        return 3.0 * flops.decoder_lm_forward_flops_per_position(self.cfg.model, NUM_BYTE_IDS, self.cfg.train.seq_len)


class MegaByteTask(ByteTask):
    """MegaByte: the same byte windows and segments as the byte LM (its pads replace the BOS input)."""

    family = "megabyte"

    def __init__(self, cfg, corpus, run_dir=None):
        super().__init__(cfg, corpus, run_dir)
        P = cfg.model.patch_size
        if cfg.train.seq_len % P and not cfg.model.pad_to_patch:
            raise UserError(
                f"train.seq_len {cfg.train.seq_len} is not a multiple of model.patch_size {P} and "
                "model.pad_to_patch is false: change one of them or set model.pad_to_patch = true"
            )

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        from bytelm.models.megabyte import MegaByte  # noqa: PLC0415

        return MegaByte(self.cfg.model, rngs=rngs)

    def train_flops_per_position(self) -> float:
        return flops.megabyte_train_flops_per_byte(self.cfg.model, self.cfg.train.seq_len)

    def run_info(self) -> dict:
        return {"mean_bytes_per_global_step": float(self.cfg.model.patch_size)}


class TokenTask(Task):
    """The BPE-token LM: the corpus encoded once into a cached token stream; segments encoded
    each on its own (tokens never cross a segment boundary), with every token's byte length."""

    family = "bpe"
    uses_nbytes = True

    def __init__(self, cfg, corpus, run_dir=None):
        super().__init__(cfg, corpus, run_dir)
        from bytelm.baselines.bpe import load_tokenizer  # noqa: PLC0415

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
        from bytelm.models.token_lm import TokenLM  # noqa: PLC0415

        return TokenLM(self.cfg.model, self.tokenizer.n_vocab, rngs=rngs)

    def _load_stream(self) -> None:
        from bytelm.atomic import atomic_directory  # noqa: PLC0415

        corpus = self.corpus
        path = corpus.path.parent.parent / "tokens" / f"{corpus.path.name}-{self.tokenizer.fingerprint[:24]}"
        if not (path / "manifest.json").is_file():
            with atomic_directory(path) as tmp:
                # one process: forking a process that already runs JAX threads risks deadlocks; cached once
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

    def train_flops_per_position(self) -> float:
        n_valid = self.tokenizer.n_vocab + BYTE_OFFSET
        return 3.0 * flops.decoder_lm_forward_flops_per_position(self.cfg.model, n_valid, self.cfg.train.seq_len)

    def run_info(self) -> dict:
        return {
            "tokenizer": str(Path(self.cfg.model.tokenizer).absolute()),
            "tokenizer_fingerprint": self.tokenizer.fingerprint,
            "tokenizer_n_vocab": self.tokenizer.n_vocab,
            "mean_bytes_per_global_step": self.bytes_per_position(),
        }


class BLTTask(ByteTask):
    """BLT: byte windows and segments as for the byte LM, plus patch lengths from the entropy model
    (computed in the input pipeline, no gradient through it) with a calibrated threshold."""

    family = "blt"
    calibration_rows = 64

    def __init__(self, cfg, corpus, run_dir=None):
        super().__init__(cfg, corpus, run_dir)
        from bytelm.patching import EntropyModel, EntropyPatcher  # noqa: PLC0415

        m = cfg.model
        if not m.entropy_run:
            raise UserError("model.entropy_run is empty: train an entropy model (bytelm train configs/tiny/entropy.toml) and point to its run directory")
        entropy_dir = Path(m.entropy_run)
        run_json = entropy_dir / "run.json"
        if not run_json.is_file():
            raise UserError(f"model.entropy_run {entropy_dir} is not a finished run directory (no run.json); train the entropy model first")
        family = json.loads(run_json.read_text()).get("family")
        if family != "byte":
            raise UserError(f"model.entropy_run {entropy_dir} is a {family!r} run; the entropy model must be a byte LM (family 'byte')")
        from bytelm.training.trainer import restore_trainer  # noqa: PLC0415  (cycle: trainer imports tasks)

        entropy_trainer = restore_trainer(entropy_dir)
        # one fixed row width (the training window) for training and evaluation rows alike, so a
        # segment's entropies, and hence its patches, never depend on its batch
        self.entropy_model = EntropyModel(nnx.merge(entropy_trainer.graphdef, entropy_trainer.params), width=cfg.train.seq_len + 1)
        self.max_patches = m.patches_for(cfg.train.seq_len)
        mono = m.monotonic_threshold or None
        recorded = {}
        if run_dir is not None and (Path(run_dir) / "run.json").is_file():
            recorded = json.loads((Path(run_dir) / "run.json").read_text()).get("patching") or {}
        if recorded.get("threshold") is not None:  # a run keeps the threshold it was trained with
            self.patcher = EntropyPatcher.from_settings(self.entropy_model, recorded)
            self.achieved = recorded.get("achieved_mean_patch_len")
        elif m.threshold > 0:
            self.patcher = EntropyPatcher(self.entropy_model, m.threshold, mono, m.max_patch_len)
            self.achieved = None
        else:
            sample = WindowBatches(
                self.corpus.train_stream, batch_size=self.calibration_rows, window=cfg.train.seq_len + 1,
                seed=cfg.train.seed + 7919, process_index=0, process_count=1,
            ).batch(0)
            self.patcher, self.achieved = EntropyPatcher.calibrated(
                self.entropy_model, sample, m.target_patch_len, monotonic_threshold=mono, max_patch_len=m.max_patch_len
            )

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        from bytelm.models.blt import BLT  # noqa: PLC0415

        return BLT(self.cfg.model, rngs=rngs)

    def decorate(self, batch: dict) -> dict:
        batch["patch_lengths"] = self.patcher.lengths(batch["ids"], self.max_patches)
        return batch

    def mean_patch_len(self) -> float:
        return self.achieved or self.cfg.model.target_patch_len

    def train_flops_per_position(self) -> float:
        return flops.blt_train_flops_per_byte(self.cfg.model, self.cfg.train.seq_len, self.mean_patch_len())

    def run_info(self) -> dict:
        return {
            "mean_bytes_per_global_step": self.mean_patch_len(),
            "entropy_run": str(Path(self.cfg.model.entropy_run).absolute()),
            "entropy_fingerprint": self.entropy_model.fingerprint,
            "patching": {
                **self.patcher.record(),
                "target_mean_patch_len": self.cfg.model.target_patch_len,
                "achieved_mean_patch_len": self.achieved,
                "calibration_rows": self.calibration_rows if self.achieved is not None else 0,
                "max_patches": self.max_patches,
            },
        }


_TASKS: dict[str, type[Task]] = {"byte": ByteTask, "megabyte": MegaByteTask, "bpe": TokenTask, "blt": BLTTask}


def register_task(family: str, cls: type[Task]) -> None:
    _TASKS[family] = cls


def make_task(cfg, corpus: Corpus, run_dir: Path | None = None) -> Task:
    if cfg.model is None:
        raise UserError("the config has no [model] section: set model.family (e.g. --set model.family=byte)")
    family = cfg.model.family
    if family not in _TASKS:
        raise UserError(f"model.family {family!r} has no trainer task; known: {', '.join(sorted(_TASKS))}")
    return _TASKS[family](cfg, corpus, run_dir)
