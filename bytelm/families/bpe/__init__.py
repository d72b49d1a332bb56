"""The subword-token LM (family ``bpe``, for historical reasons: any subword tokenizer, BPE or
Unigram, with its encoder rule): the byte LM's transformer over ``token id + 4``. The corpus is
encoded once into a cached token stream; segments are encoded each on its own (tokens never cross a
segment boundary), with every token's byte length, so its BPB is measured against real byte counts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from flax import nnx

from bytelm.atomic import atomic_directory
from bytelm.baselines import load_tokenizer
from bytelm.baselines.token_stream import encode_train_split
from bytelm.constants import BOS_ID, BYTE_OFFSET
from bytelm.data import Stream
from bytelm.errors import UserError
from bytelm.families.base import Task, Trunk
from bytelm.families.bpe.config import TokenLMConfig
from bytelm.families.bpe.model import TokenLM
from bytelm.families.byte import ByteTask
from bytelm.models.flops import decoder_lm_forward_flops_per_position
from bytelm.sampling.decoders import Decoder, FlatDecoder


class TokenTask(Task):
    """The subword-token LM (family ``bpe``, for historical reasons: any subword tokenizer, BPE or
    Unigram, with its encoder rule): the corpus encoded once into a cached token stream; segments
    encoded each on its own (tokens never cross a segment boundary), with every token's byte length."""

    family = "bpe"
    description = "a subword LM on BPE or Unigram tokens"
    global_step = "token"
    config_class = TokenLMConfig
    artefacts = {"tokenizer": "tokenizer"}

    uses_nbytes = True

    @classmethod
    def sized(cls, model_cfg, trunk: Trunk, changes):
        return ByteTask.sized(model_cfg, trunk, changes)  # the byte LM's transformer over token ids

    def __init__(self, cfg, corpus, run_dir=None, *, modules=None, records=None, record=None):
        super().__init__(cfg, corpus, run_dir, modules=modules, records=records, record=record)
        if not cfg.model.tokenizer:
            raise UserError(
                "model.tokenizer is empty: point it at a tokenizer directory (bytelm tokenizer train --out "
                "DIR)"
            )
        self.tokenizer = load_tokenizer(cfg.model.tokenizer)
        n = self.n_vocab = self.tokenizer.n_vocab
        lengths = [len(self.tokenizer.token_bytes(i)) for i in range(n)]
        self.id_bytes = np.asarray([0] * BYTE_OFFSET + lengths, np.int32)  # bytes per model id
        self._stream = None
        self._bytes_per_token = None

    @classmethod
    def for_shapes(cls, cfg, *, vocab_size=None):
        """The tokenizer's size from its directory, else ``vocab_size``; nothing else of it is needed."""
        if vocab_size is None:
            try:
                return cls(cfg, None)
            except UserError as e:
                raise UserError(
                    f"{e}; or give the vocabulary's size (bytelm compile ... --vocab-size N) to compile "
                    "without it"
                ) from None
        task = cls.__new__(cls)
        Task.__init__(task, cfg, None)
        task.tokenizer = None
        task.n_vocab = int(vocab_size)
        task.id_bytes = None
        task._stream = task._bytes_per_token = None
        return task

    def batch_shapes(self, rows):
        return {**super().batch_shapes(rows), "nbytes": ((rows, self.cfg.train.seq_len), np.int32)}

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
        return TokenLM(self.cfg.model, self.n_vocab, rngs=rngs)

    def decoder(self, model: nnx.Module) -> Decoder:
        return token_decoder(model, self.tokenizer, self.cfg.train.seq_len)

    def _load_stream(self) -> None:
        corpus = self.require_corpus()
        alpha = self.cfg.model.sample_alpha
        sampled = f"-a{alpha:g}-s{self.cfg.train.seed}" if alpha > 0 else ""
        if alpha > 0 and self.tokenizer.kind != "unigram":
            raise UserError(
                f"model.sample_alpha = {alpha} draws Unigram segmentations, but {self.cfg.model.tokenizer} "
                f"holds a {self.tokenizer.kind} tokenizer; set model.sample_alpha = 0 or train one with "
                "--kind unigram"
            )
        path = (
            corpus.path.parent.parent
            / "tokens"
            / f"{corpus.path.name}-{self.tokenizer.fingerprint[:24]}{sampled}"
        )
        if not (path / "manifest.json").is_file():
            with atomic_directory(path) as tmp:  # sharded and parallel (spawned workers), cached once
                encode_train_split(
                    corpus,
                    self.cfg.model.tokenizer,
                    tmp,
                    workers=self.cfg.data.workers,
                    alpha=alpha,
                    seed=self.cfg.train.seed,
                )
        manifest = json.loads((path / "manifest.json").read_text())
        self._stream = np.memmap(path / "train.u32", dtype=np.uint32, mode="r", shape=(manifest["length"],))
        self._bytes_per_token = manifest["bytes"] / max(manifest["tokens"], 1)

    def train_stream(self) -> Stream:
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
        n_valid = self.n_vocab + BYTE_OFFSET
        return decoder_lm_forward_flops_per_position(self.cfg.model, n_valid, self.cfg.train.seq_len)

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
        return (
            f"{kind} tokenizer, {run_info.get('tokenizer_n_vocab')} ids, encoder "
            f"{run_info.get('tokenizer_encoder')}"
            if kind
            else ""
        )


def token_decoder(model, tokenizer, context: int) -> FlatDecoder:
    """The subword LM's decoder: units are ``token + 4``; the prompt is encoded with every special
    token's spelling disallowed (untrusted text cannot inject control tokens), and special tokens
    are never generated."""

    def encode(prompt: bytes) -> list[int]:
        try:
            return [t + BYTE_OFFSET for t in tokenizer.encode(prompt)]
        except ValueError:
            found = [t for t in tokenizer.special_tokens if t.encode() in prompt]
            raise UserError(
                f"the prompt contains the special token {found[0]!r} spelled out; a prompt cannot hold "
                "control tokens: remove it from the prompt"
            ) from None

    dec = FlatDecoder(model, context, encode, lambda u: tokenizer.token_bytes(u - BYTE_OFFSET))
    dec.allowed_V[[i + BYTE_OFFSET for i in tokenizer.special_tokens.values()]] = False
    return dec
