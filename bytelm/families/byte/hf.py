"""The byte LM as a Llama-style ``LlamaForCausalLM`` (export only: the same flat decoder over the
260 byte ids, in Llama's layout)."""

from __future__ import annotations

from collections.abc import Mapping

from bytelm.errors import UserError
from bytelm.models.configs import ModelConfig
from bytelm.models.hf_layout import HFExport, decoder_lm_entries, llama_config_json, not_in_llama


def hf_export(m: ModelConfig, artefacts: Mapping[str, ModelConfig], run_info: Mapping) -> HFExport:
    """The byte LM ``m`` as ``LlamaForCausalLM``; refuses what Llama has no equivalent of."""
    if unmatched := not_in_llama(m):
        raise UserError(
            "it cannot be written as LlamaForCausalLM: " + "; ".join(unmatched) + " (no Llama equivalent)"
        )
    return HFExport(
        arch="LlamaForCausalLM",
        config=llama_config_json(m),
        entries=decoder_lm_entries(m, "model.", "lm_head.weight", rope_perm=False),
    )
