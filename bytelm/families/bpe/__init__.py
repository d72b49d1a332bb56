"""The subword-token LM (family ``bpe``, for historical reasons: any subword tokenizer, BPE,
Unigram or WordPiece, trained here or imported, with its encoder rule): the byte LM's transformer
over ``token id + 4``. The corpus is encoded once into a cached token stream; segments are encoded
each on its own (tokens never cross a segment boundary), with the bytes each token stands for, so
its BPB is measured against real byte counts.

An unknown token (WordPiece's ``[UNK]``, character level) stands for different bytes at each
occurrence: an evaluation segment charges each ``[UNK]`` with the bytes of the word it replaced
(:meth:`~bytelm.baselines.subword.SubwordTokenizer.encode_ordinary_with_bytes`), so BPB stays
honest on the identical held-out bytes, and the report says which share of them went to ``[UNK]``
(``pipeline_stats["bytes_in_unk"]``). Training batches use the token's spelling's length for it (a
logged rate only; ``bytes_per_position`` comes from the real byte count of the train split)."""

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
from bytelm.families.base import STATS_KEY, Task, Trunk
from bytelm.families.bpe.config import TokenLMConfig
from bytelm.families.bpe.model import TokenLM
from bytelm.families.byte import ByteTask
from bytelm.models.flops import decoder_lm_forward_flops_per_position
from bytelm.sampling.decoders import Decoder, FlatDecoder


class TokenTask(Task):
    """The subword-token LM (the module docstring): the corpus encoded once into a cached token
    stream; segments encoded each on its own, with the bytes each token stands for."""

    family = "bpe"
    description = "a subword LM on BPE, Unigram or WordPiece tokens"
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
        lossy = getattr(self.tokenizer, "lossy", None)
        if lossy:
            raise UserError(
                f"model.tokenizer {cfg.model.tokenizer}: {lossy}: BPB would not be a likelihood of the "
                "held-out bytes; give a byte-exact tokenizer (one bytelm trains, a tiktoken import, or an HF "
                "ByteLevel BPE with add_prefix_space=false)"
            )
        n = self.n_vocab = self.tokenizer.n_vocab
        lengths = [len(self.tokenizer.token_bytes(i)) for i in range(n)]
        self.id_bytes: np.ndarray | None = np.asarray([0] * BYTE_OFFSET + lengths, np.int32)  # per model id
        unk = getattr(self.tokenizer, "unk_id", None)
        self.unk_model_id = None if unk is None else unk + BYTE_OFFSET  # its bytes vary: see encode_segment
        self._stream: np.ndarray | None = None
        self._bytes_per_token: float | None = None

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
        task.id_bytes = task.unk_model_id = None
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
        assert self._stream is not None
        return self._stream

    def decorate(self, batch: dict) -> dict:
        if "nbytes" not in batch:
            assert self.id_bytes is not None, "a task built for shapes alone makes no batches"
            batch["nbytes"] = self.id_bytes[batch["ids"][:, 1:]]
        elif self.unk_model_id is not None:  # an evaluation batch: its bytes are per occurrence
            nbytes = np.asarray(batch["nbytes"])
            unk = np.asarray(batch["ids"])[:, 1:] == self.unk_model_id
            batch[STATS_KEY] = {"unk_bytes": int(nbytes[unk].sum()), "bytes": int(nbytes.sum())}
        return batch

    def encode_segment(self, data: bytes):
        tokens, nbytes = self.tokenizer.encode_ordinary_with_bytes(data)
        ids = np.concatenate([[BOS_ID], np.asarray(tokens, np.int64) + BYTE_OFFSET]).astype(np.int32)
        return ids, np.asarray(nbytes, np.int32)

    def stats_record(self, sums) -> dict:
        if not sums.get("bytes"):
            return {}
        return {"bytes_in_unk": sums["unk_bytes"] / sums["bytes"]}

    def bytes_per_position(self) -> float:
        if self._bytes_per_token is None:
            self._load_stream()
        assert self._bytes_per_token is not None
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
