"""How a bytelm model's parameters and config read as a Hugging Face checkpoint: the weight tables.

A weight table is a list of :class:`Entry` rows, one per parameter: bytelm's flat path, the
Hugging Face tensor name and the kind of mapping between them, so that conversion and export read
one table in two directions (:mod:`bytelm.interop.hf` does the reading and writing). The rows of
the shared blocks (a transformer block, a cross-attention, the flat decoder LM of
:mod:`bytelm.models.lm` in the Llama layout) are built here; a family whose model has a Hugging Face
counterpart builds its table from them in its own folder (``bytelm/families/<name>/hf.py``) and
returns it through its task's :meth:`~bytelm.families.Task.hf_export` and
:meth:`~bytelm.families.Task.hf_import` as :class:`HFExport` / :class:`HFImport`.

Conventions both sides already share: ids are bytes + 4 with PAD/BOE 0, BOS 1, EOS 2 (the BLT
tokenizer's offset), 260 ids; RMSNorm scales multiply the normalised vector; SwiGLU MLPs; no biases.
Rotary positions: the BLT reference rotates interleaved pairs ``(x[2i], x[2i+1])``, bytelm rotates
halves ``(x[i], x[i + K/2])`` with the same frequencies, so query and key projections are permuted
within each head (``heads_in_rope``: an exact reordering, the dot products are unchanged). Llama
rotates halves, as bytelm does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from bytelm.constants import NUM_BYTE_IDS
from bytelm.errors import UserError
from bytelm.models.configs import ModelConfig


@dataclasses.dataclass(frozen=True)
class Entry:
    """One parameter: bytelm's flat path, the Hugging Face tensor name, and the kind of mapping.

    Kinds: ``copy`` (same array), ``linear`` (HF ``out x in`` is bytelm ``in x out``), ``heads_in``
    / ``heads_in_rope`` (HF ``H*K x d`` is bytelm ``d x H x K``; ``_rope`` permutes each head from
    interleaved to half rotary order), ``heads_out`` (HF ``d x H*K`` is ``H x K x d``), ``rows``
    (HF ``n x d`` fills the first ``n`` of bytelm's padded rows), ``head`` (HF ``n x d`` is bytelm's
    ``d x V`` head, padded columns), ``rows_slice`` (rows ``lo:hi`` of one fused HF table),
    ``identity`` (no HF tensor: the reference has none there, bytelm holds the identity matrix)."""

    path: tuple
    hf: str
    kind: str
    rows: tuple[int, int] = (0, 0)


@dataclasses.dataclass(frozen=True)
class HFExport:
    """A run as a Hugging Face folder: the architecture's name, its ``config.json``, the weight table
    of the run's own model, and the tables of the artefact runs written into the same folder (by
    the model config field naming each run: a BLT's entropy model is its patcher)."""

    arch: str
    config: dict
    entries: list[Entry]
    artefact_entries: Mapping[str, list[Entry]] = dataclasses.field(default_factory=dict)


# (model config, artefact model configs by field) -> (the model's table, the artefacts' tables,
# name prefixes of tensors the folder holds that bytelm's models have no use for)
Tables = Callable[
    [ModelConfig, Mapping[str, ModelConfig]], tuple[list[Entry], Mapping[str, list[Entry]], tuple[str, ...]]
]


@dataclasses.dataclass(frozen=True)
class HFImport:
    """A Hugging Face folder as bytelm runs: the model config, and for each artefact the folder also
    holds (by model config field: a BLT's entropy model is its patcher) its model config;
    ``settings``: run config values every run takes (``train.seq_len`` ...); ``tables``: the weight
    tables, from the configs as finally set (a user's ``--set`` applied); ``source``: the format, for
    the runs' records."""

    model: ModelConfig
    artefacts: Mapping[str, ModelConfig]
    settings: Mapping[str, object]
    tables: Tables
    source: str


def block_entries(path: tuple, hf: str, rope_perm: bool) -> list[Entry]:
    q = "heads_in_rope" if rope_perm else "heads_in"
    return [
        Entry((*path, "attn_norm", "scale"), f"{hf}.input_layernorm.weight", "copy"),
        Entry((*path, "attn", "wq"), f"{hf}.self_attn.q_proj.weight", q),
        Entry((*path, "attn", "wk"), f"{hf}.self_attn.k_proj.weight", q),
        Entry((*path, "attn", "wv"), f"{hf}.self_attn.v_proj.weight", "heads_in"),
        Entry((*path, "attn", "wo"), f"{hf}.self_attn.o_proj.weight", "heads_out"),
        Entry((*path, "mlp_norm", "scale"), f"{hf}.post_attention_layernorm.weight", "copy"),
        Entry((*path, "mlp", "w_gate"), f"{hf}.mlp.gate_proj.weight", "linear"),
        Entry((*path, "mlp", "w_up"), f"{hf}.mlp.up_proj.weight", "linear"),
        Entry((*path, "mlp", "w_down"), f"{hf}.mlp.down_proj.weight", "linear"),
    ]


def cross_entries(path: tuple, hf: str) -> list[Entry]:
    return [
        Entry((*path, "norm_q", "scale"), f"{hf}.q_norm.weight", "copy"),
        Entry((*path, "norm_kv", "scale"), f"{hf}.k_norm.weight", "copy"),
        Entry((*path, "wq"), f"{hf}.q_proj.weight", "heads_in"),
        Entry((*path, "wk"), f"{hf}.k_proj.weight", "heads_in"),
        Entry((*path, "wv"), f"{hf}.v_proj.weight", "heads_in"),
        Entry((*path, "wo"), f"{hf}.o_proj.weight", "heads_out"),
    ]


def decoder_lm_entries(cfg, prefix: str, head: str, *, rope_perm: bool) -> list[Entry]:
    """A bytelm :class:`~bytelm.models.lm.DecoderLM` (``cfg`` a ``ByteLMConfig``) against a
    Llama-layout model under ``prefix`` with its output matrix ``head`` (Llama: ``model.`` and
    ``lm_head.weight``; BLT's patcher: ``model.patcher.`` and ``model.patcher.lm_head.weight``)."""
    out = [Entry(("embed", "table"), f"{prefix}embed_tokens.weight", "rows")]
    for i in range(cfg.n_layers):
        out += block_entries(("stack", "blocks", i), f"{prefix}layers.{i}", rope_perm)
    out += [Entry(("norm", "scale"), f"{prefix}norm.weight", "copy"), Entry(("head",), head, "head")]
    return out


def rope_order(k: int) -> np.ndarray:
    """bytelm's half-rotation position ``j`` of a head holds the reference's interleaved ``order[j]``."""
    return np.concatenate([np.arange(0, k, 2), np.arange(1, k, 2)])


def hf_shape(entry: Entry, target: tuple[int, ...]) -> tuple[int, ...]:
    """The Hugging Face tensor shape that fills a bytelm parameter of shape ``target``."""
    kind = entry.kind
    if kind == "copy":
        return target
    if kind == "linear":
        return (target[1], target[0])
    if kind in ("heads_in", "heads_in_rope"):
        return (target[1] * target[2], target[0])
    if kind == "heads_out":
        return (target[2], target[0] * target[1])
    if kind == "rows":
        return (NUM_BYTE_IDS, target[1])
    if kind == "head":
        return (NUM_BYTE_IDS, target[0])
    raise AssertionError(kind)


def to_bytelm(entry: Entry, hf: np.ndarray, target: tuple[int, ...]) -> np.ndarray:
    """The bytelm array (float32, shape ``target``) from the Hugging Face tensor."""
    a = np.asarray(hf, np.float32)
    kind = entry.kind
    if kind == "copy":
        return a.copy()
    if kind == "linear":
        return a.T.copy()
    if kind in ("heads_in", "heads_in_rope"):
        d, H, K = target
        w = a.T.reshape(d, H, K)
        return np.ascontiguousarray(w[:, :, rope_order(K)] if kind == "heads_in_rope" else w)
    if kind == "heads_out":
        return a.T.reshape(target).copy()
    if kind in ("rows", "rows_slice"):
        out = np.zeros(target, np.float32)
        out[: a.shape[0]] = a
        return out
    if kind == "head":
        out = np.zeros(target, np.float32)
        out[:, : a.shape[0]] = a.T
        return out
    raise AssertionError(kind)


def to_hf(entry: Entry, w: np.ndarray) -> np.ndarray:
    """The Hugging Face tensor (float32) from bytelm's array: :func:`to_bytelm` inverted."""
    w = np.asarray(w, np.float32)
    kind = entry.kind
    if kind == "copy":
        return w.copy()
    if kind == "linear":
        return np.ascontiguousarray(w.T)
    if kind in ("heads_in", "heads_in_rope"):
        d, H, K = w.shape
        if kind == "heads_in_rope":
            hf = np.empty_like(w)
            hf[:, :, rope_order(K)] = w
            w = hf
        return np.ascontiguousarray(w.reshape(d, H * K).T)
    if kind == "heads_out":
        H, K, d = w.shape
        return np.ascontiguousarray(w.reshape(H * K, d).T)
    if kind == "rows":
        return np.ascontiguousarray(w[:NUM_BYTE_IDS])
    if kind == "head":
        return np.ascontiguousarray(w[:, :NUM_BYTE_IDS].T)
    raise AssertionError(kind)


def rope_theta(sub: dict, where: str, default: float) -> float:
    rope = sub.get("rope_parameters") or sub.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise UserError(
            f"{where}: rope_type {kind!r} is not supported (bytelm's rotary positions are the default kind)"
        )
    return float(rope.get("rope_theta", sub.get("rope_theta", default)))


def llama_config_json(m) -> dict:
    """``config.json`` of a ``LlamaForCausalLM`` holding the flat decoder LM ``m`` (its model config)."""
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": NUM_BYTE_IDS,
        "hidden_size": m.d_model,
        "intermediate_size": m.mlp_dim,
        "num_hidden_layers": m.n_layers,
        "num_attention_heads": m.n_heads,
        "num_key_value_heads": m.n_heads,
        "head_dim": m.d_model // m.n_heads,
        "hidden_act": "silu",
        "rms_norm_eps": m.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(m.rope_base)},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "max_position_embeddings": 8192,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }


def not_in_llama(m, *, sliding_window: bool = False) -> list[str]:
    """What a byte LM's ``[model]`` table holds that a Llama-style decoder (``LlamaForCausalLM``; the
    BLT reference's patcher, which also has a ``sliding_window``) has no equivalent of, one phrase
    each; empty when it converts."""
    return [
        phrase
        for on, phrase in [
            (m.window and not sliding_window, f"model.window = {m.window} (sliding-window attention)"),
            (m.ngram_sizes, f"model.ngram_sizes = {list(m.ngram_sizes)} (hashed n-gram embeddings)"),
            (m.logit_softcap, f"model.logit_softcap = {m.logit_softcap:g} (soft-capped logits)"),
            (m.qk_norm, "model.qk_norm = true (normalised queries and keys)"),
        ]
        if on
    ]
