"""Hugging Face checkpoints <-> bytelm run directories: Meta's BLT (``BltForCausalLM`` with its
entropy patcher) both ways, and bytelm's byte LM out as a Llama-style model.

The formats are read and written here without ``transformers`` or ``torch``: a folder is a
``config.json`` and safetensors (:mod:`bytelm.interop.safetensors`). What each side computes is
pinned by the parity tests (``tests/test_hf_interop.py``), which build models with ``transformers``
itself; the architectural differences between bytelm's BLT and the reference, and why the
``reference`` variant exists, are in ``docs/interop.md``.

Weights move by one table per model (:func:`blt_entries`, :func:`decoder_lm_entries`): each row
names a bytelm parameter, the Hugging Face tensor and how one becomes the other, so conversion and
export are the same table read in the two directions, and every tensor's shape is checked against
the config before anything is written (an error names the tensor).

Conventions both sides already share: ids are bytes + 4 with PAD/BOE 0, BOS 1, EOS 2 (the BLT
tokenizer's offset), 260 ids; RMSNorm scales multiply the normalised vector; SwiGLU MLPs; no biases.
Rotary positions: the reference rotates interleaved pairs ``(x[2i], x[2i+1])``, bytelm rotates
halves ``(x[i], x[i + K/2])`` with the same frequencies, so query and key projections are permuted
within each head (an exact reordering: the dot products are unchanged). Llama rotates halves, as
bytelm does.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from bytelm.atomic import atomic_write_text
from bytelm.config import Config, dump_config, load_run_config, with_overrides, with_values
from bytelm.constants import NUM_BYTE_IDS
from bytelm.errors import UserError
from bytelm.families import task_class
from bytelm.families.blt.config import BLTConfig
from bytelm.families.byte.config import ByteLMConfig
from bytelm.interop.safetensors import SafetensorsFolder, write_safetensors
from bytelm.models.configs import StackConfig, with_stacks
from bytelm.rundir import RunDir, is_url, run_path
from bytelm.training.checkpoint import Checkpointer
from bytelm.training.restore import restore_model
from bytelm.training.trainer import count_params

CONFIG_FILE = "config.json"
PATCHER_HEAD = "model.patcher.lm_head.weight"
# Where the reference sets no maximum patch length, converted runs split patches longer than this
# (bytelm's BLT gathers every patch's bytes into a static P x max_patch_len block; at the window's
# length that block is quadratic in it). The reference keeps such a patch whole: the results then
# differ on windows holding one, which a larger --max-patch-len avoids at that cost.
DEFAULT_MAX_PATCH_LEN = 64


# -- the weight tables --------------------------------------------------------------------------
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


def _block_entries(path: tuple, hf: str, rope_perm: bool) -> list[Entry]:
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


def _cross_entries(path: tuple, hf: str) -> list[Entry]:
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
        out += _block_entries(("stack", "blocks", i), f"{prefix}layers.{i}", rope_perm)
    out += [Entry(("norm", "scale"), f"{prefix}norm.weight", "copy"), Entry(("head",), head, "head")]
    return out


def blt_entries(cfg) -> list[Entry]:
    """A bytelm BLT in the ``reference`` variant (``cfg`` a ``BLTConfig``) against ``BltForCausalLM``."""
    e, d = "model.local_encoder", "model.local_decoder"
    out = [Entry(("encoder", "byte_embed", "table"), f"{e}.embed_tokens.weight", "rows")]
    n = cfg.hash_table_size
    for t in range(
        len(cfg.ngram_sizes) * cfg.hash_functions
    ):  # the reference fuses the tables, function-major
        out.append(
            Entry(
                ("encoder", "ngram_embeds", t, "table"),
                "model.encoder_hash_tok_embedding.weight",
                "rows_slice",
                rows=(t * n, (t + 1) * n),
            )
        )
    for i in range(cfg.encoder_layers):
        out += _block_entries(("encoder", "stack", "blocks", i), f"{e}.layers.{i}", True)
    out.append(Entry(("encoder", "to_queries"), f"{e}.patch_embedding_projection.weight", "linear"))
    out += _cross_entries(("encoder", "cross", 0), f"{e}.cross_attn_layers.0")
    if cfg.queries_per_patch * cfg.local_d_model != cfg.global_d_model:
        out.append(
            Entry(
                ("encoder", "to_global"),
                "model.global_transformer.token_embedding_projection.weight",
                "linear",
            )
        )
    else:  # the reference has no projection at these widths (nn.Identity)
        out.append(Entry(("encoder", "to_global"), "", "identity"))
    for i in range(cfg.global_layers):
        out += _block_entries(("latent", "stack", "blocks", i), f"model.global_transformer.layers.{i}", True)
    out.append(Entry(("latent", "from_global"), f"{d}.patch_embedding_projection.weight", "linear"))
    for j in range(max(cfg.decoder_layers, 1) if cfg.decoder_cross_all_layers else 1):
        out += _cross_entries(("decoder", "cross", j), f"{d}.cross_attn_layers.{j}")
    for i in range(cfg.decoder_layers):
        out += _block_entries(("decoder", "stack", "blocks", i), f"{d}.layers.{i}", True)
    out += [
        Entry(("decoder", "norm", "scale"), f"{d}.norm.weight", "copy"),
        Entry(("decoder", "head"), "lm_head.weight", "head"),
    ]
    return out


def _rope_order(k: int) -> np.ndarray:
    """bytelm's half-rotation position ``j`` of a head holds the reference's interleaved ``order[j]``."""
    return np.concatenate([np.arange(0, k, 2), np.arange(1, k, 2)])


def _hf_shape(entry: Entry, target: tuple[int, ...]) -> tuple[int, ...]:
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
        return np.ascontiguousarray(w[:, :, _rope_order(K)] if kind == "heads_in_rope" else w)
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
            hf[:, :, _rope_order(K)] = w
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


# -- bytelm parameters by flat path ---------------------------------------------------------
_STACKS = ("stack", "global_stack", "local_stack")  # Transformer attributes that may hold a scanned stack


def _flat_params(model: nnx.Module) -> dict[tuple, tuple[nnx.Variable, int | None]]:
    """The model's parameters by flat path, as ``(variable, layer)``: a scanned stack's layers
    appear under ``blocks, i`` paths with their index into the stacked array."""
    out: dict[tuple, tuple[nnx.Variable, int | None]] = {}
    for key, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        path = tuple(key)
        i = path.index("layers") if "layers" in path else -1
        if i > 0 and path[i - 1] in _STACKS:
            for layer in range(var.get_value().shape[0]):
                out[(*path[:i], "blocks", layer, *path[i + 1 :])] = (var, layer)
        else:
            out[path] = (var, None)
    return out


def _shape(flat, path) -> tuple[int, ...]:
    var, layer = flat[path]
    shape = tuple(var.get_value().shape)
    return shape if layer is None else shape[1:]


def _read(flat, path) -> np.ndarray:
    var, layer = flat[path]
    a = np.asarray(jax.device_get(var.get_value()))
    return a if layer is None else a[layer]


def load_entries(
    model: nnx.Module,
    entries: list[Entry],
    tensors: SafetensorsFolder,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Set every parameter of ``model`` (concrete, or abstract from ``nnx.eval_shape``) from
    ``tensors`` by ``entries``. All shapes are checked before any parameter is set, and a parameter
    that no entry fills is an error."""
    flat = _flat_params(model)
    unfilled = sorted(set(flat) - {e.path for e in entries}, key=str)
    if unfilled or any(e.path not in flat for e in entries):
        raise AssertionError(f"the weight table and the model disagree: unfilled {unfilled[:3]}")
    problems = []
    for e in entries:
        if e.kind == "identity":
            if len(set(_shape(flat, e.path))) != 1:
                problems.append(
                    f"{'.'.join(map(str, e.path))} of shape {_shape(flat, e.path)} cannot be the identity"
                )
            continue
        if e.hf not in tensors:
            problems.append(f"{e.hf} is missing")
            continue
        target, have = _shape(flat, e.path), tensors.shape(e.hf)
        if e.kind == "rows_slice":
            if len(have) != 2 or have[1] != target[1] or have[0] < e.rows[1]:
                problems.append(
                    f"{e.hf} has shape {have}; the config implies at least ({e.rows[1]}, {target[1]})"
                )
        elif have != _hf_shape(e, target):
            problems.append(f"{e.hf} has shape {have}; the config implies {_hf_shape(e, target)}")
    if problems:
        raise UserError(f"{tensors.path}: the tensors do not match config.json: " + "; ".join(problems[:6]))
    buffers: dict[int, tuple[nnx.Variable, np.ndarray]] = {}  # whole arrays, filled layer by layer
    for i, e in enumerate(entries):
        if progress:
            progress(i, len(entries))
        var, layer = flat[e.path]
        target = _shape(flat, e.path)
        if e.kind == "identity":
            value = np.eye(target[0], dtype=np.float32)
        else:
            hf = tensors.get(e.hf)
            value = to_bytelm(e, hf[e.rows[0] : e.rows[1]] if e.kind == "rows_slice" else hf, target)
        if id(var) not in buffers:
            buffers[id(var)] = (var, np.zeros(var.get_value().shape, np.float32))
        buf = buffers[id(var)][1]
        if layer is None:
            buf[...] = value
        else:
            buf[layer] = value
    for var, buf in buffers.values():
        var.set_value(jax.numpy.asarray(buf, var.get_value().dtype))
    if progress:
        progress(len(entries), len(entries))


def export_entries(
    model: nnx.Module, entries: list[Entry], progress: Callable[[int, int], None] | None = None
) -> dict[str, np.ndarray]:
    """The Hugging Face tensors of ``model`` by ``entries`` (fused tables put back together)."""
    flat = _flat_params(model)
    out: dict[str, np.ndarray] = {}
    fused: dict[str, list[tuple[tuple[int, int], np.ndarray]]] = {}
    for i, e in enumerate(entries):
        if progress:
            progress(i + 1, len(entries))
        w = _read(flat, e.path)
        if e.kind == "identity":
            if not np.array_equal(w, np.eye(w.shape[0], dtype=w.dtype)):
                raise UserError(
                    f"{'.'.join(map(str, e.path))} is not the identity, but the reference has no such "
                    "projection at these widths (queries_per_patch x local_d_model = global_d_model): the "
                    "model cannot be written in its format"
                )
        elif e.kind == "rows_slice":
            fused.setdefault(e.hf, []).append((e.rows, w))
        else:
            out[e.hf] = to_hf(e, w)
    for name, parts in fused.items():
        parts.sort(key=lambda p: p[0][0])
        out[name] = np.concatenate([w for _, w in parts]).astype(np.float32)
    return out


# -- config.json ------------------------------------------------------------------------------
def read_config_json(hf_dir: str | os.PathLike) -> dict:
    path = Path(hf_dir) / CONFIG_FILE
    if not path.is_file():
        raise UserError(
            f"{hf_dir} has no {CONFIG_FILE}: point at a folder written by save_pretrained (or downloaded "
            "whole)"
        )
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise UserError(f"{path} is not JSON ({e})") from None


def _rope_theta(sub: dict, where: str, default: float) -> float:
    rope = sub.get("rope_parameters") or sub.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise UserError(
            f"{where}: rope_type {kind!r} is not supported (bytelm's rotary positions are the default kind)"
        )
    return float(rope.get("rope_theta", sub.get("rope_theta", default)))


def _sub(config: dict, name: str, defaults: dict) -> dict:
    sub = dict(defaults)
    sub.update(config.get(name) or {})
    return sub


# The reference configuration classes' defaults (transformers' configuration_blt.py), for
# config.json files that leave a field out.
_ENCODER = {
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": None,
    "num_hidden_layers": 1,
    "rms_norm_eps": 1e-5,
    "intermediate_size": None,
    "cross_attn_all_layers": False,
    "hidden_act": "silu",
}
_DECODER = {
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": None,
    "num_hidden_layers": 9,
    "rms_norm_eps": 1e-5,
    "intermediate_size": 2816,
    "cross_attn_all_layers": True,
    "hidden_act": "silu",
}
_GLOBAL = {
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": None,
    "num_hidden_layers": 25,
    "rms_norm_eps": 1e-5,
    "intermediate_size": 5632,
    "hidden_act": "silu",
}
_PATCHER = {
    "hidden_size": 768,
    "num_attention_heads": 12,
    "num_key_value_heads": None,
    "num_hidden_layers": 14,
    "rms_norm_eps": 1e-5,
    "intermediate_size": 2048,
    "sliding_window": 512,
    "vocab_size": NUM_BYTE_IDS,
}
_THETA = 500000.0  # the reference's default_theta


def _stack(sub: dict, where: str) -> dict:
    """Width, heads, layers, MLP width and epsilon of one reference stack, checked."""
    heads = int(sub["num_attention_heads"])
    if sub.get("num_key_value_heads") not in (None, heads):
        raise UserError(
            f"{where}: num_key_value_heads {sub['num_key_value_heads']} != num_attention_heads {heads} "
            "(grouped-query attention) is not supported by bytelm's attention"
        )
    if sub.get("hidden_act", "silu") != "silu":
        raise UserError(
            f"{where}: hidden_act {sub['hidden_act']!r} is not supported (bytelm's MLP is SwiGLU with silu)"
        )
    width = int(sub["hidden_size"])
    mlp = sub.get("intermediate_size") or int(8 * width / 3)
    return {
        "d": width,
        "heads": heads,
        "layers": int(sub["num_hidden_layers"]),
        "mlp": int(mlp),
        "eps": float(sub["rms_norm_eps"]),
    }


def blt_configs_from_hf(
    config: dict,
    where: str,
    *,
    entropy_run: str,
    seq_len: int,
    max_patch_len: int | None,
    max_patches: int | None,
) -> tuple[Config, Config, dict]:
    """The configs of the BLT run and of its entropy-model run from a BLT ``config.json`` (typed: the
    family configs built from their stacks), and a note of what was read. Refuses (naming the key)
    what bytelm cannot reproduce."""
    if config.get("model_type") not in (None, "blt"):
        raise UserError(f"{where}: model_type {config.get('model_type')!r} is not 'blt'")
    if int(config.get("vocab_size", NUM_BYTE_IDS)) != NUM_BYTE_IDS:
        raise UserError(
            f"{where}: vocab_size {config['vocab_size']} is not {NUM_BYTE_IDS} (bytes + 4 control ids)"
        )
    if config.get("patching_mode", "entropy") != "entropy" or config.get("patch_in_forward", True) is False:
        raise UserError(
            f"{where}: patching_mode {config.get('patching_mode')!r} / patch_in_forward "
            f"{config.get('patch_in_forward')!r}: only entropy patching with the patcher's weights is "
            "converted"
        )
    if config.get("monotonicity"):
        raise UserError(
            f"{where}: monotonicity patching is not what the reference's forward pass applies; not converted"
        )
    enc_raw, dec_raw = _sub(config, "encoder_config", _ENCODER), _sub(config, "decoder_config", _DECODER)
    enc = _stack(enc_raw, f"{where} encoder_config")
    dec = _stack(dec_raw, f"{where} decoder_config")
    glo = _stack(_sub(config, "global_config", _GLOBAL), f"{where} global_config")
    pat_raw = _sub(config, "patcher_config", _PATCHER)
    pat = _stack(pat_raw, f"{where} patcher_config")
    for key in ("d", "heads", "mlp"):
        if enc[key] != dec[key]:
            raise UserError(
                f"{where}: the local encoder and decoder differ in {key} ({enc[key]} vs {dec[key]}); "
                "bytelm's BLT gives both one local width, head count and MLP width"
            )
    eps = {enc["eps"], dec["eps"], glo["eps"]}
    if len(eps) > 1:
        raise UserError(
            f"{where}: rms_norm_eps differs between the encoder, decoder and global stacks ({sorted(eps)})"
        )
    top_theta = _rope_theta(config, where, _THETA)
    thetas = {
        _rope_theta(_sub(config, n, {}), f"{where} {n}", top_theta)
        for n in ("encoder_config", "decoder_config", "global_config")
    }
    if len(thetas) > 1:
        raise UserError(
            f"{where}: the rotary theta differs between the encoder, decoder and global stacks "
            f"({sorted(thetas)})"
        )
    window = config.get("local_attention_window_len", 512)
    sizes = config.get("encoder_hash_byte_group_size") or [3, 4, 5, 6, 7, 8]
    vocab = int(config.get("encoder_hash_byte_group_vocab", 500002))
    k = int(config.get("cross_attn_k", 2))
    threshold = config.get("patching_threshold", 1.335442066192627)
    if threshold is None or not float(threshold) > 0:
        raise UserError(f"{where}: patching_threshold {threshold!r} must be a positive entropy (nats)")
    ref_max = config.get("max_patch_length")
    patch_len = int(max_patch_len or ref_max or min(DEFAULT_MAX_PATCH_LEN, seq_len + 1))
    if ref_max and patch_len > int(ref_max):
        raise UserError(
            f"--max-patch-len {patch_len} is longer than the reference's max_patch_length {ref_max}"
        )
    if int(pat_raw.get("vocab_size", NUM_BYTE_IDS)) != NUM_BYTE_IDS:
        raise UserError(f"{where}: patcher_config.vocab_size {pat_raw['vocab_size']} is not {NUM_BYTE_IDS}")
    window_fields = {
        "train.seq_len": seq_len,
        "data.segment_bytes": seq_len,
    }  # held-out segments fit the window
    try:
        blt = with_stacks(
            BLTConfig(
                variant="reference",
                patching="entropy",
                entropy_run=entropy_run,
                threshold=float(threshold),
                monotonic_threshold=0.0,
                max_patch_len=patch_len,
                max_patches=int(max_patches or seq_len + 1),
                encoder_layers=enc["layers"],
                decoder_layers=dec["layers"],
                local_window=int(window or 0),
                ngram_sizes=tuple(int(n) for n in sizes),
                hash_table_size=vocab,
                hash_functions=int(config.get("encoder_hash_byte_group_nb_functions", 1)),
                queries_per_patch=k,
                cross_heads=enc["heads"],
                encoder_cross_all_layers=False,
                decoder_cross_all_layers=bool(dec_raw["cross_attn_all_layers"]),
                rope_base=thetas.pop(),
                norm_eps=eps.pop(),
            ),
            {
                "local_": StackConfig(enc["d"], enc["layers"], enc["heads"], enc["mlp"]),
                "global_": StackConfig(glo["d"], glo["layers"], glo["heads"], glo["mlp"]),
            },
        )
        entropy = with_stacks(
            ByteLMConfig(
                window=int(pat_raw.get("sliding_window") or 0),
                rope_base=_rope_theta(pat_raw, f"{where} patcher_config", 10000.0),
                norm_eps=pat["eps"],
            ),
            {"": StackConfig(pat["d"], pat["layers"], pat["heads"], pat["mlp"])},
        )
    except ValueError as e:
        raise UserError(f"{where}: a configuration bytelm cannot build: {e}") from None
    return (
        with_values(Config(model=blt), window_fields),
        with_values(Config(model=entropy), window_fields),
        {"encoder_cross_all_layers": bool(enc_raw["cross_attn_all_layers"])},
    )


# -- run directories ----------------------------------------------------------------------------
def _stage(progress: Callable[..., None] | None, name: str) -> Callable[[int, int], None] | None:
    """``progress(stage, done, total)`` as a ``(done, total)`` callback for one stage."""
    return None if progress is None else (lambda done, total: progress(name, done, total))


def write_run(
    out: str | os.PathLike, cfg: Config, model: nnx.Module, info: dict, *, modules: dict | None = None
) -> Path:
    """A run directory holding ``cfg``, ``model``'s parameters as its one checkpoint (step 0, the
    parameters alone: no optimizer state) and a ``run.json`` (``info`` added), which every
    command that restores runs for scoring or sampling reads like a trained one (training does
    not resume from it). ``modules`` are the artefacts the family needs, in memory (a BLT's
    entropy model), instead of restored from their run directories. Refuses a directory that
    already holds a run."""
    out = Path(out).absolute()
    files = RunDir(out)
    if files.started():
        raise UserError(f"{out} already holds a run: choose a new --out (conversion never overwrites a run)")
    task = task_class(cfg.require_model().family)(cfg, None, None, modules=modules or {})
    params = nnx.state(model, nnx.Param)
    out.mkdir(parents=True, exist_ok=True)
    files.write_config(dump_config(cfg))
    ckpt = Checkpointer(files.checkpoints_path, keep=cfg.train.keep_checkpoints)
    try:
        meta = {
            "step": 0,
            "wall_s": 0.0,
            "train_s": 0.0,
            "data": {"step": 0, "seed": cfg.train.seed},
            "parameters_only": True,
        }
        ckpt.save(0, {"params": params}, meta)
    finally:
        ckpt.close()
    record = {
        "family": task.family,
        "status": "finished",
        "step": 0,
        "params": count_params(params),
        "train_flops_per_position": task.train_flops_per_position(),
        "bytes_per_position": task.bytes_per_position(),
        "positions_per_step": task.positions_per_step(),
        **task.run_info(),
        **info,
    }
    files.write_info(record)
    return out


def _abstract_model(cfg: Config, modules: dict | None = None) -> nnx.Module:
    """The model ``cfg`` describes with shapes only (no random initialisation, no compile)."""
    task = task_class(cfg.require_model().family)(cfg, None, None, modules=modules or {})
    return nnx.eval_shape(lambda: task.build_model(nnx.Rngs(0)))


def convert_hf_blt(
    hf_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    entropy_out: str | os.PathLike | None = None,
    seq_len: int = 1024,
    max_patch_len: int | None = None,
    max_patches: int | None = None,
    overrides: tuple[str, ...] = (),
    progress: Callable[..., None] | None = None,
) -> tuple[Path, Path]:
    """A Hugging Face BLT folder (``BltForCausalLM``: ``config.json`` + safetensors, the patcher's
    weights inside) as two bytelm run directories: the entropy model (``entropy_out``, default
    ``out/entropy``) and the BLT in the ``reference`` variant pointing at it. ``max_patch_len``
    defaults to the reference's ``max_patch_length``, else :data:`DEFAULT_MAX_PATCH_LEN`;
    ``max_patches`` to the window (``seq_len + 1``), so that no window runs out of patch slots.
    ``overrides`` (``--set`` strings) apply to both runs' configs (e.g. ``eval.batch_size=4``).
    Every tensor is checked before anything is written.
    ``progress(stage, done, total)`` hears of the tensors read. Returns ``(blt_run, entropy_run)``."""
    hf_dir, out = Path(hf_dir), Path(out).absolute()
    entropy_out = Path(entropy_out).absolute() if entropy_out else out / "entropy"
    for d in (out, entropy_out):
        if RunDir(d).started():
            raise UserError(
                f"{d} already holds a run: choose a new --out (conversion never overwrites a run)"
            )
    config = read_config_json(hf_dir)
    if config.get("model_type") not in (None, "blt"):  # (said before the weights are looked for)
        raise UserError(
            f"{hf_dir / CONFIG_FILE}: model_type {config.get('model_type')!r} is not 'blt': 'convert hf-blt' "
            "takes a BltForCausalLM folder (a Llama-style byte LM is exported, not converted, by bytelm)"
        )
    tensors = SafetensorsFolder(hf_dir)
    blt_cfg, entropy_cfg, note = blt_configs_from_hf(
        config,
        str(hf_dir / CONFIG_FILE),
        entropy_run=str(entropy_out),
        seq_len=seq_len,
        max_patch_len=max_patch_len,
        max_patches=max_patches,
    )
    entropy_cfg, blt_cfg = with_overrides(entropy_cfg, overrides), with_overrides(blt_cfg, overrides)
    entropy_entries = decoder_lm_entries(entropy_cfg.model, "model.patcher.", PATCHER_HEAD, rope_perm=True)
    entries = blt_entries(blt_cfg.model)
    dead: tuple[str, ...] = ()
    # the reference re-pools at every layer: only the last cross-attention counts
    if note["encoder_cross_all_layers"] and isinstance(blt_cfg.model, BLTConfig):
        last = f"model.local_encoder.cross_attn_layers.{blt_cfg.model.encoder_layers - 1}."
        entries = [
            dataclasses.replace(e, hf=e.hf.replace("model.local_encoder.cross_attn_layers.0.", last))
            for e in entries
        ]
        dead = ("model.local_encoder.cross_attn_layers.",)
    known = {e.hf for e in entropy_entries + entries}
    unknown = [
        n for n in tensors.names() if n not in known and not n.startswith(dead) and not n.endswith("inv_freq")
    ]
    if unknown:
        raise UserError(
            f"{hf_dir}: tensors that this config has no place for (a different architecture?): {unknown[:5]}"
        )
    entropy_model = _abstract_model(entropy_cfg)
    load_entries(entropy_model, entropy_entries, tensors, _stage(progress, "read the entropy model"))
    modules = {"entropy_run": entropy_model}
    blt_model = _abstract_model(blt_cfg, modules)
    load_entries(blt_model, entries, tensors, _stage(progress, "read the BLT"))
    source = {"converted_from": str(hf_dir.absolute()), "source_format": "huggingface BltForCausalLM"}
    write_run(entropy_out, entropy_cfg, entropy_model, source)
    write_run(out, blt_cfg, blt_model, source, modules=modules)
    return out, entropy_out


def _blt_config_json(cfg, entropy_cfg, threshold: float) -> dict:
    """``config.json`` of a ``BltForCausalLM`` holding bytelm's reference-variant BLT ``cfg`` and
    its entropy model ``entropy_cfg``."""
    m, e = cfg, entropy_cfg
    rope = {"rope_type": "default", "rope_theta": float(m.rope_base)}
    local = {
        "hidden_size": m.local_d_model,
        "num_attention_heads": m.local_heads,
        "num_key_value_heads": m.local_heads,
        "intermediate_size": m.local_mlp_dim,
        "rms_norm_eps": m.norm_eps,
        "hidden_act": "silu",
        "vocab_size": NUM_BYTE_IDS,
        "cross_attn_k": m.queries_per_patch,
        "hidden_size_global": m.global_d_model,
        "rope_parameters": rope,
        "max_position_embeddings": 24576,
        "dropout": 0.0,
    }
    window = m.local_window or None
    return {
        "model_type": "blt",
        "architectures": ["BltForCausalLM"],
        "vocab_size": NUM_BYTE_IDS,
        "patch_in_forward": True,
        "patching_mode": "entropy",
        "patch_size": 4,
        "patching_threshold": float(threshold),
        # None, not model.max_patch_len: with a limit set, the reference also drops an empty last patch
        # (its process_patch_lengths), so its last position would read one patch earlier than bytelm's
        "patching_batch_size": 1,
        "max_patch_length": None,
        "local_attention_window_len": window,
        "cross_attn_k": m.queries_per_patch,
        "encoder_hash_byte_group_size": list(m.ngram_sizes),
        "encoder_hash_byte_group_vocab": m.hash_table_size,
        "encoder_hash_byte_group_nb_functions": m.hash_functions,
        "tie_word_embeddings": False,
        "rope_parameters": rope,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "max_position_embeddings": 4096,
        "encoder_config": {
            **local,
            "num_hidden_layers": m.encoder_layers,
            "cross_attn_all_layers": False,
            "sliding_window": window,
        },
        "decoder_config": {
            **local,
            "num_hidden_layers": m.decoder_layers,
            "cross_attn_all_layers": bool(m.decoder_cross_all_layers),
        },
        "global_config": {
            "hidden_size": m.global_d_model,
            "num_attention_heads": m.global_heads,
            "num_key_value_heads": m.global_heads,
            "num_hidden_layers": m.global_layers,
            "intermediate_size": m.global_mlp_dim,
            "rms_norm_eps": m.norm_eps,
            "hidden_act": "silu",
            "rope_parameters": rope,
            "max_position_embeddings": 4096,
            "dropout": 0.0,
        },
        "patcher_config": {
            "hidden_size": e.d_model,
            "num_attention_heads": e.n_heads,
            "num_key_value_heads": e.n_heads,
            "num_hidden_layers": e.n_layers,
            "intermediate_size": e.mlp_dim,
            "rms_norm_eps": e.norm_eps,
            "vocab_size": NUM_BYTE_IDS,
            "sliding_window": e.window or None,
            "max_position_embeddings": 8192,
            "rope_parameters": {"rope_type": "default", "rope_theta": float(e.rope_base)},
            "dropout": 0.0,
        },
    }


def _llama_config_json(m) -> dict:
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


def _not_in_llama(m, *, sliding_window: bool = False) -> list[str]:
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


def export_hf(
    run_dir: str | os.PathLike, out: str | os.PathLike, progress: Callable[..., None] | None = None
) -> str:
    """Write a bytelm run as a Hugging Face folder (``config.json`` + ``model.safetensors``): a BLT
    in the ``reference`` variant as ``BltForCausalLM`` (its entropy model as the patcher), a byte LM
    as ``LlamaForCausalLM``. Returns the architecture written; refuses what the format cannot hold.
    ``progress(stage, done, total)`` hears of the tensors gathered."""
    run_dir, out = run_path(run_dir), Path(out)
    if (out / CONFIG_FILE).exists():
        raise UserError(f"{out} already holds a {CONFIG_FILE}: choose a new --out")
    cfg = load_run_config(run_dir)
    if cfg.model is None:
        raise UserError(f"{run_dir} is not a run directory (its config has no [model] table)")
    m = cfg.model
    meta = {"format": "pt", "bytelm_run": str(run_dir) if is_url(run_dir) else str(run_dir.absolute())}
    if m.family == "byte" and isinstance(m, ByteLMConfig):
        if unmatched := _not_in_llama(m):
            raise UserError(
                f"{run_dir} cannot be written as LlamaForCausalLM: "
                + "; ".join(unmatched)
                + " (no Llama equivalent)"
            )
        tensors = export_entries(
            restore_model(run_dir),
            decoder_lm_entries(m, "model.", "lm_head.weight", rope_perm=False),
            _stage(progress, "gather"),
        )
        config, arch = _llama_config_json(m), "LlamaForCausalLM"
    elif isinstance(m, BLTConfig):
        problems = []
        if m.variant != "reference":
            problems.append(
                f"model.variant is {m.variant!r}, not 'reference' (bytelm's own BLT differs from the "
                "reference: docs/interop.md)"
            )
        if m.patching != "entropy" or m.monotonic_threshold:
            problems.append(
                "the reference patches by a global entropy threshold only (model.patching = 'entropy', no "
                "monotonic_threshold)"
            )
        if m.cross_heads != m.local_heads or not m.cross_attention or not m.global_path:
            problems.append(
                "the reference's cross-attentions have the local head count (model.cross_heads = "
                "model.local_heads) and are on"
            )
        if problems:
            raise UserError(f"{run_dir} cannot be written as BltForCausalLM: " + "; ".join(problems))
        entropy_dir = Path(m.entropy_run)
        entropy_cfg = load_run_config(entropy_dir).model
        if unmatched := _not_in_llama(
            entropy_cfg, sliding_window=True
        ):  # (from the configs, before any checkpoint is read)
            raise UserError(
                f"{run_dir} cannot be written as BltForCausalLM: its entropy model {entropy_dir} has "
                + "; ".join(unmatched)
                + ", which the reference's patcher (a Llama-style byte LM) has not"
            )
        model = restore_model(run_dir)
        info = RunDir(run_dir).info(what="a finished run directory")
        threshold = (info.get("patching") or {}).get("threshold") or m.threshold
        tensors = export_entries(model, blt_entries(m), _stage(progress, "gather the BLT"))
        patcher = decoder_lm_entries(entropy_cfg, "model.patcher.", PATCHER_HEAD, rope_perm=True)
        tensors.update(
            export_entries(restore_model(entropy_dir), patcher, _stage(progress, "gather the entropy model"))
        )
        config, arch = _blt_config_json(m, entropy_cfg, float(threshold)), "BltForCausalLM"
    else:
        raise UserError(
            f"{run_dir} is a {m.family!r} run; bytelm exports BLT (reference variant) and byte LM runs"
        )
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "model.safetensors", tensors, meta)
    atomic_write_text(out / CONFIG_FILE, json.dumps(config, indent=1))
    return arch
