"""BLT as Meta's ``BltForCausalLM`` (transformers' BLT with its entropy patcher inside): the weight
table of bytelm's ``reference`` variant, its ``config.json`` both ways, and what the format cannot
hold. :mod:`bytelm.interop.hf` reads and writes the folders; the architectural differences between
bytelm's BLT and the reference, and why the ``reference`` variant exists, are in
``docs/interop.md``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from bytelm.constants import NUM_BYTE_IDS
from bytelm.errors import UserError
from bytelm.families.blt.config import BLTConfig
from bytelm.families.byte.config import ByteLMConfig
from bytelm.models.configs import EncoderDecoderConfig, ModelConfig, StackConfig, with_stacks
from bytelm.models.hf_layout import (
    Entry,
    HFExport,
    HFImport,
    block_entries,
    cross_entries,
    decoder_lm_entries,
    not_in_llama,
    rope_theta,
)

MODEL_TYPE = "blt"
PATCHER_HEAD = "model.patcher.lm_head.weight"
# Where the reference sets no maximum patch length, converted runs split patches longer than this
# (bytelm's BLT gathers every patch's bytes into a static P x max_patch_len block; at the window's
# length that block is quadratic in it). The reference keeps such a patch whole: the results then
# differ on windows holding one, which a larger --max-patch-len avoids at that cost.
DEFAULT_MAX_PATCH_LEN = 64


def patcher_entries(entropy_cfg) -> list[Entry]:
    """The entropy model (a byte LM) as the reference's patcher."""
    return decoder_lm_entries(entropy_cfg, "model.patcher.", PATCHER_HEAD, rope_perm=True)


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
    for i in range(cfg.local.encoder_layers):
        out += block_entries(("encoder", "stack", "blocks", i), f"{e}.layers.{i}", True)
    out.append(Entry(("encoder", "to_queries"), f"{e}.patch_embedding_projection.weight", "linear"))
    out += cross_entries(("encoder", "cross", 0), f"{e}.cross_attn_layers.0")
    if cfg.queries_per_patch * cfg.local.d_model != cfg.global_.d_model:
        out.append(
            Entry(
                ("encoder", "to_global"),
                "model.global_transformer.token_embedding_projection.weight",
                "linear",
            )
        )
    else:  # the reference has no projection at these widths (nn.Identity)
        out.append(Entry(("encoder", "to_global"), "", "identity"))
    for i in range(cfg.global_.layers):
        out += block_entries(("latent", "stack", "blocks", i), f"model.global_transformer.layers.{i}", True)
    out.append(Entry(("latent", "from_global"), f"{d}.patch_embedding_projection.weight", "linear"))
    for j in range(max(cfg.local.decoder_layers, 1) if cfg.decoder_cross_all_layers else 1):
        out += cross_entries(("decoder", "cross", j), f"{d}.cross_attn_layers.{j}")
    for i in range(cfg.local.decoder_layers):
        out += block_entries(("decoder", "stack", "blocks", i), f"{d}.layers.{i}", True)
    out += [
        Entry(("decoder", "norm", "scale"), f"{d}.norm.weight", "copy"),
        Entry(("decoder", "head"), "lm_head.weight", "head"),
    ]
    return out


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


def hf_import(
    config: dict,
    where: str,
    *,
    artefact_runs: Mapping[str, str],
    seq_len: int = 1024,
    max_patch_len: int | None = None,
    max_patches: int | None = None,
) -> HFImport:
    """The BLT and its entropy model (``artefact_runs["entropy_run"]``, where its run will be) from a
    ``BltForCausalLM`` ``config.json`` (typed: the family configs built from their stacks).
    ``max_patch_len`` defaults to the reference's ``max_patch_length``, else
    :data:`DEFAULT_MAX_PATCH_LEN`; ``max_patches`` to the window (``seq_len + 1``), so that no window
    runs out of patch slots. Refuses (naming the key) what bytelm cannot reproduce."""
    if config.get("model_type") not in (None, MODEL_TYPE):
        raise UserError(f"{where}: model_type {config.get('model_type')!r} is not {MODEL_TYPE!r}")
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
    top_theta = rope_theta(config, where, _THETA)
    thetas = {
        rope_theta(_sub(config, n, {}), f"{where} {n}", top_theta)
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
    try:
        blt = BLTConfig(
            variant="reference",
            patching="entropy",
            entropy_run=artefact_runs["entropy_run"],
            threshold=float(threshold),
            monotonic_threshold=0.0,
            max_patch_len=patch_len,
            max_patches=int(max_patches or seq_len + 1),
            local=EncoderDecoderConfig(
                enc["d"], enc["heads"], enc["mlp"], enc["layers"], dec["layers"], int(window or 0)
            ),
            global_=StackConfig(glo["d"], glo["layers"], glo["heads"], glo["mlp"]),
            ngram_sizes=tuple(int(n) for n in sizes),
            hash_table_size=vocab,
            hash_functions=int(config.get("encoder_hash_byte_group_nb_functions", 1)),
            queries_per_patch=k,
            cross_heads=enc["heads"],
            encoder_cross_all_layers=False,
            decoder_cross_all_layers=bool(dec_raw["cross_attn_all_layers"]),
            rope_base=thetas.pop(),
            norm_eps=eps.pop(),
        )
        entropy = with_stacks(
            ByteLMConfig(
                window=int(pat_raw.get("sliding_window") or 0),
                rope_base=rope_theta(pat_raw, f"{where} patcher_config", 10000.0),
                norm_eps=pat["eps"],
            ),
            {"": StackConfig(pat["d"], pat["layers"], pat["heads"], pat["mlp"])},
        )
    except ValueError as e:
        raise UserError(f"{where}: a configuration bytelm cannot build: {e}") from None
    cross_all = bool(enc_raw["cross_attn_all_layers"])

    def tables(model: ModelConfig, artefacts: Mapping[str, ModelConfig]):
        entries = blt_entries(model)
        ignored: tuple[str, ...] = ()
        if cross_all:  # the reference re-pools at every layer: only the last cross-attention counts
            last = f"model.local_encoder.cross_attn_layers.{getattr(model, 'local').encoder_layers - 1}."
            entries = [
                dataclasses.replace(e, hf=e.hf.replace("model.local_encoder.cross_attn_layers.0.", last))
                for e in entries
            ]
            ignored = ("model.local_encoder.cross_attn_layers.",)
        return entries, {"entropy_run": patcher_entries(artefacts["entropy_run"])}, ignored

    return HFImport(
        model=blt,
        artefacts={"entropy_run": entropy},
        # held-out segments fit the window
        settings={"train.seq_len": seq_len, "data.segment_bytes": seq_len},
        tables=tables,
        source="huggingface BltForCausalLM",
    )


def blt_config_json(cfg, entropy_cfg, threshold: float) -> dict:
    """``config.json`` of a ``BltForCausalLM`` holding bytelm's reference-variant BLT ``cfg`` and
    its entropy model ``entropy_cfg``."""
    m, e = cfg, entropy_cfg
    rope = {"rope_type": "default", "rope_theta": float(m.rope_base)}
    local = {
        "hidden_size": m.local.d_model,
        "num_attention_heads": m.local.heads,
        "num_key_value_heads": m.local.heads,
        "intermediate_size": m.local.mlp_dim,
        "rms_norm_eps": m.norm_eps,
        "hidden_act": "silu",
        "vocab_size": NUM_BYTE_IDS,
        "cross_attn_k": m.queries_per_patch,
        "hidden_size_global": m.global_.d_model,
        "rope_parameters": rope,
        "max_position_embeddings": 24576,
        "dropout": 0.0,
    }
    window = m.local.window or None
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
            "num_hidden_layers": m.local.encoder_layers,
            "cross_attn_all_layers": False,
            "sliding_window": window,
        },
        "decoder_config": {
            **local,
            "num_hidden_layers": m.local.decoder_layers,
            "cross_attn_all_layers": bool(m.decoder_cross_all_layers),
        },
        "global_config": {
            "hidden_size": m.global_.d_model,
            "num_attention_heads": m.global_.heads,
            "num_key_value_heads": m.global_.heads,
            "num_hidden_layers": m.global_.layers,
            "intermediate_size": m.global_.mlp_dim,
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


def hf_export(m: ModelConfig, artefacts: Mapping[str, ModelConfig], run_info: Mapping) -> HFExport:
    """A BLT run in the ``reference`` variant as ``BltForCausalLM``, its entropy model as the
    patcher; refuses (saying why) what the format cannot hold, from the configs alone."""
    assert isinstance(m, BLTConfig)
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
    if m.cross_heads != m.local.heads or not m.cross_attention or not m.global_path:
        problems.append(
            "the reference's cross-attentions have the local head count (model.cross_heads = "
            "model.local.heads) and are on"
        )
    if problems:
        raise UserError("it cannot be written as BltForCausalLM: " + "; ".join(problems))
    entropy_cfg = artefacts["entropy_run"]
    if unmatched := not_in_llama(entropy_cfg, sliding_window=True):
        raise UserError(
            f"it cannot be written as BltForCausalLM: its entropy model {m.entropy_run} has "
            + "; ".join(unmatched)
            + ", which the reference's patcher (a Llama-style byte LM) has not"
        )
    threshold = (run_info.get("patching") or {}).get("threshold") or m.threshold
    return HFExport(
        arch="BltForCausalLM",
        config=blt_config_json(m, entropy_cfg, float(threshold)),
        entries=blt_entries(m),
        artefact_entries={"entropy_run": patcher_entries(entropy_cfg)},
    )
