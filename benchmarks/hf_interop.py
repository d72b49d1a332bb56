"""Meta's BLT in bytelm against ``transformers``' ``BltForCausalLM``, in the same run on the same bytes.

    python benchmarks/hf_interop.py [--layers 2] [--width 64] [--text-bytes 2000] [--seed 0]
        [--max-patch-len N]

1. A random ``BltForCausalLM`` (with its entropy patcher) built by ``transformers`` at the given
   size (local sliding windows of 64, two hash functions, decoder cross-attention before every
   layer; its patcher's head scaled up so that patch lengths vary), saved with
   ``save_pretrained``; its patching threshold is the median of its patcher's entropies on the text.
2. ``bytelm convert hf-blt`` of that folder (timed), and ``transformers``' ``from_pretrained`` of
   it (timed, the peer).
3. On the first ``--text-bytes`` bytes of this file's own source (after BOS), one sequence: the
   largest absolute differences of the patcher's entropies and of the logits at every position,
   and whether the patch boundaries agree.
4. The forward pass of each on that sequence (bytelm's compiled, timed after one warm-up run;
   torch's eager, fp32, best of three).

The last line printed is one JSON object with the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from results import record as record_result
from transformers import BltConfig, BltForCausalLM

from bytelm.constants import BOS_ID, BYTE_OFFSET
from bytelm.interop.hf import convert_hf
from bytelm.training.restore import restore_scorer


def build_reference(folder: Path, ids: np.ndarray, layers: int, width: int, seed: int) -> BltForCausalLM:
    torch.manual_seed(seed)
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    heads = max(width // 32, 1)
    local = dict(
        hidden_size=width,
        num_attention_heads=heads,
        intermediate_size=2 * width,
        hidden_size_global=2 * width,
        cross_attn_k=2,
        rope_parameters=rope,
        num_hidden_layers=layers,
    )
    cfg = BltConfig(
        local_attention_window_len=64,
        cross_attn_k=2,
        encoder_hash_byte_group_size=[3, 4, 5, 6, 7, 8],
        encoder_hash_byte_group_vocab=5003,
        encoder_hash_byte_group_nb_functions=2,
        rope_parameters=rope,
        encoder_config=dict(local, cross_attn_all_layers=False),
        decoder_config=dict(local, cross_attn_all_layers=True),
        global_config=dict(
            hidden_size=2 * width,
            num_attention_heads=heads,
            num_hidden_layers=layers,
            intermediate_size=4 * width,
            rope_parameters=rope,
        ),
        patcher_config=dict(
            hidden_size=width,
            num_attention_heads=heads,
            num_hidden_layers=layers,
            intermediate_size=2 * width,
            sliding_window=64,
            rope_parameters=rope,
        ),
    )
    model = BltForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.add_(0.2 * torch.randn_like(p))
        model.model.patcher.lm_head.weight.mul_(12.0)
        ent = model.model.patcher(torch.tensor(ids[None]))[0][0, 1:].numpy()
    model.config.patching_threshold = float(np.median(ent))
    model.save_pretrained(folder)
    return model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2, help="layers of every stack (default: 2)")
    p.add_argument(
        "--width", type=int, default=64, help="local width; the global width is twice it (default: 64)"
    )
    p.add_argument("--text-bytes", type=int, default=2000, help="bytes of text compared (default: 2000)")
    p.add_argument(
        "--seed", type=int, default=0, help="torch seed of the reference's initialisation (default: 0)"
    )
    p.add_argument(
        "--max-patch-len",
        type=int,
        default=None,
        help="bytelm's patch-length limit (default: the converter's)",
    )
    args = p.parse_args(argv)
    text = Path(__file__).read_bytes()[: args.text_bytes]
    ids = np.concatenate([[BOS_ID], BYTE_OFFSET + np.frombuffer(text, np.uint8)]).astype(np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ref = build_reference(tmp / "hf", ids, args.layers, args.width, args.seed)
        t = time.perf_counter()
        out, _ = convert_hf(
            tmp / "hf", tmp / "run", model_type="blt", seq_len=len(ids) + 1, max_patch_len=args.max_patch_len
        )
        convert_s = time.perf_counter() - t
        t = time.perf_counter()
        BltForCausalLM.from_pretrained(tmp / "hf")
        hf_load_s = time.perf_counter() - t

        with torch.no_grad():
            x = torch.tensor(ids[None])
            ref_ent, ref_lengths, _ = ref.model.patcher(
                x, patch_size=4, threshold=ref.config.patching_threshold
            )
            times = []
            for _ in range(3):
                t = time.perf_counter()
                ref_logits = ref(x, use_cache=False).logits[0].numpy()
                times.append(time.perf_counter() - t)
        hf_forward_s = min(times)
        lengths = ref_lengths[0].numpy()
        ref_starts = np.concatenate([[0], np.cumsum(lengths)[:-1][lengths[1:] > 0]])

        trainer = restore_scorer(out, load_corpus=False)
        task = trainer.task
        window = np.concatenate([ids, [BYTE_OFFSET]])[None]
        starts = np.flatnonzero(task.patcher.starts(window)[0, : len(ids)])
        ent = task.patcher.model.entropies(ids)
        patch_lengths = jnp.asarray(task.patcher.lengths(window, task.max_patches))
        graphdef, state = nnx.split(nnx.merge(trainer.graphdef, trainer.params))
        forward = jax.jit(lambda st, x, n: nnx.merge(graphdef, st)(x, n))
        inputs = jnp.asarray(ids[None], jnp.int32)
        forward(state, inputs, patch_lengths).block_until_ready()
        t = time.perf_counter()
        logits = np.asarray(forward(state, inputs, patch_lengths).block_until_ready())[0, :, :260]
        bytelm_forward_s = time.perf_counter() - t

    record = {
        "positions": int(len(ids)),
        "longest_patch": int(np.max(np.diff(np.append(ref_starts, len(ids))))),
        "max_patch_len": int(task.cfg.model.max_patch_len),
        "patches": int(len(ref_starts)),
        "boundaries_identical": bool(np.array_equal(starts, ref_starts)),
        "max_abs_entropy_diff": float(np.max(np.abs(ent - ref_ent[0].numpy()))),
        "max_abs_logit_diff": float(np.max(np.abs(logits - ref_logits))),
        "max_abs_logit": float(np.max(np.abs(ref_logits))),
        "convert_s": round(convert_s, 3),
        "hf_from_pretrained_s": round(hf_load_s, 3),
        "bytelm_forward_s": round(bytelm_forward_s, 4),
        "hf_forward_s": round(hf_forward_s, 4),
        "forward_speedup": round(hf_forward_s / bytelm_forward_s, 2),
    }
    print(
        f"patches {record['patches']} over {record['positions']} positions; boundaries identical: "
        f"{record['boundaries_identical']}"
    )
    print(
        f"max |entropy diff| {record['max_abs_entropy_diff']:.2e} nats; max |logit diff| "
        f"{record['max_abs_logit_diff']:.2e}"
    )
    print(json.dumps(record))
    record_result("hf_interop", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
