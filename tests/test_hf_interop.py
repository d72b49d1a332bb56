"""Hugging Face interop: Meta's BLT (``BltForCausalLM``) converted into bytelm with identical
patches, entropies and logits, and bytelm's models written back out and loaded by ``transformers``.

The reference models are built by ``transformers`` itself (small, random, CPU, fp32), saved with
``save_pretrained``, and compared number for number; nothing is downloaded.
"""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file
from transformers import BltConfig, BltForCausalLM, LlamaForCausalLM

from bytelm.cli import main
from bytelm.config import dump_config, load_config
from bytelm.constants import BOS_ID, BYTE_OFFSET
from bytelm.errors import UserError
from bytelm.evaluation.evaluator import evaluate_runs
from bytelm.families import task_class
from bytelm.families.blt.model import REFERENCE_PRIMES, reference_ngram_hashes
from bytelm.interop.hf import export_hf, write_run
from bytelm.interop.safetensors import SafetensorsFolder, write_safetensors
from bytelm.rundir import RunDir
from bytelm.training.loop import train
from bytelm.training.restore import restore_model, restore_scorer

TEXT = (
    "Byte-level models read raw bytes: naïve café, 東京, and numbers like 3.14159 need no tokenizer.".encode()
)


def _reference_hash(ids: np.ndarray, n: int, m: int, prime: int) -> np.ndarray:
    """The reference's hash in exact integers: sum of ids times prime powers (oldest id first, 0
    before the start) wrapped to int64, then Python's floor modulo."""
    out = np.zeros(ids.shape, np.int64)
    for b in range(ids.shape[0]):
        row = [0] * (n - 1) + [int(x) for x in ids[b]]
        for i in range(ids.shape[1]):
            h = sum(t * prime**j for j, t in enumerate(row[i : i + n])) % 2**64
            h = h - 2**64 if h >= 2**63 else h
            out[b, i] = h % m
    return out


@pytest.mark.parametrize(
    "n, m, prime",
    [(3, 500002, REFERENCE_PRIMES[0]), (8, 30000, REFERENCE_PRIMES[1]), (6, 97, REFERENCE_PRIMES[6])],
)
def test_reference_hash_is_the_int64_polynomial_exactly(n, m, prime):
    ids = np.random.default_rng(n).integers(0, 260, size=(3, 40))
    ids[0, :5] = 259  # large ids at the start (most of the window still padding)
    got = np.asarray(reference_ngram_hashes(jnp.asarray(ids, jnp.int32), n, m, prime))
    np.testing.assert_array_equal(got, _reference_hash(ids, n, m, prime))


def test_reference_variant_config_is_checked():
    base = ["model.family=blt", "model.entropy_run=unused"]
    assert (
        load_config(None, [*base, "model.variant=reference", "model.hash_functions=3"]).model.hash_functions
        == 3
    )
    for bad, match in [
        (["model.variant=meta"], 'model.variant = "meta" is not one of .bytelm., .reference.'),
        (["model.hash_functions=2"], "must be 1 for variant 'bytelm'"),
        (
            ["model.variant=reference", "model.encoder_cross_all_layers=true"],
            "only the last cross-attention counts",
        ),
        (
            ["model.variant=reference", "model.hash_table_size=16777216"],
            r"model.hash_table_size must be in \[1, 2\^24\)",
        ),
        (["model.norm_eps=0"], "model.norm_eps must be > 0"),
    ]:
        with pytest.raises(UserError, match=match):
            load_config(None, [*base, *bad])


def _hf_blt(tmp_path, name, *, window, enc_all, dec_all, k, d_global, functions, seed):
    """A random ``BltForCausalLM`` saved by ``save_pretrained``, its patching threshold placed in the
    middle of the widest gap of its patcher's entropies on the test inputs (so no boundary sits on
    the threshold, where float32 rounding on either side could flip it); returns its folder."""
    torch.manual_seed(seed)
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    local = dict(
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=48,
        hidden_size_global=d_global,
        cross_attn_k=k,
        rope_parameters=rope,
    )
    cfg = BltConfig(
        patching_threshold=1.0,
        local_attention_window_len=window,
        cross_attn_k=k,
        encoder_hash_byte_group_size=[3, 5],
        encoder_hash_byte_group_vocab=101,
        encoder_hash_byte_group_nb_functions=functions,
        rope_parameters=rope,
        encoder_config=dict(local, num_hidden_layers=2, cross_attn_all_layers=enc_all),
        decoder_config=dict(local, num_hidden_layers=2, cross_attn_all_layers=dec_all),
        global_config=dict(
            hidden_size=d_global,
            num_attention_heads=2,
            num_hidden_layers=2,
            intermediate_size=64,
            rope_parameters=rope,
        ),
        patcher_config=dict(
            hidden_size=32,
            num_attention_heads=2,
            num_hidden_layers=2,
            intermediate_size=48,
            sliding_window=window,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        ),
    )
    model = BltForCausalLM(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight") or "layernorm" in pname:
                p.add_(0.2 * torch.randn_like(p))  # norms away from 1, so a swapped norm shows
        model.model.patcher.lm_head.weight.mul_(12.0)  # spread the entropies, so patches vary in length
        ent = np.concatenate(
            [model.model.patcher(torch.tensor(x[None]))[0][0, 1:].numpy() for x in _inputs()]
        )
    ent = np.sort(ent[(ent > np.quantile(ent, 0.25)) & (ent < np.quantile(ent, 0.75))])
    gap = int(np.argmax(np.diff(ent)))
    model.config.patching_threshold = float((ent[gap] + ent[gap + 1]) / 2)
    model.save_pretrained(tmp_path / name)
    return tmp_path / name, model


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    rows = [np.concatenate([[BOS_ID], BYTE_OFFSET + rng.integers(0, 256, n)]) for n in (23, 56)]
    return [*rows, np.concatenate([[BOS_ID], BYTE_OFFSET + np.frombuffer(TEXT, np.uint8)])]


def _hf_outputs(model, ids):
    with torch.no_grad():
        t = torch.tensor(ids[None])
        ent, lengths, _ = model.model.patcher(t, patch_size=4, threshold=model.config.patching_threshold)
        logits = model(t, use_cache=False).logits[0].numpy()
    lengths = lengths[0].numpy()
    starts = np.cumsum(lengths)[:-1][lengths[1:] > 0]  # the reference's patch starts (0 included below)
    return ent[0].numpy(), np.concatenate([[0], starts]), logits


def _bytelm_outputs(trainer, model, rows):
    """bytelm's entropies, patch starts and logits of each row, all rows through one compiled
    forward pass: each row is extended with filler bytes to one width, which changes nothing
    before its end (the model is causal and the patcher prefix-stable), and its last target (the
    first filler byte) decides, as in the reference, whether a patch starts after the row."""
    task = trainer.task
    width = max(len(r) for r in rows) + 1
    window = np.stack([np.concatenate([r, BYTE_OFFSET + 10 + np.arange(width - len(r)) % 200]) for r in rows])
    lengths = task.patcher.lengths(window, task.max_patches)
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda st, x, n: nnx.merge(graphdef, st)(x, n))
    logits = np.asarray(forward(state, jnp.asarray(window[:, :-1], jnp.int32), jnp.asarray(lengths)))[
        ..., :260
    ]
    starts = task.patcher.starts(window)
    out = []
    for b, r in enumerate(rows):
        n = len(r)
        out.append((task.patcher.model.entropies(r), np.flatnonzero(starts[b, :n]), logits[b, :n]))
    return out


CASES = {
    "windowed": dict(window=8, enc_all=True, dec_all=True, k=2, d_global=48, functions=2, seed=0),
    "full_identity": dict(window=None, enc_all=False, dec_all=False, k=2, d_global=64, functions=1, seed=1),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.slow
def test_hf_blt_converts_with_identical_patches_entropies_and_logits(tmp_path, case):
    hf_dir, model = _hf_blt(tmp_path, "hf", **CASES[case])
    out = tmp_path / "run"
    assert main(["convert", "hf-blt", str(hf_dir), "--out", str(out), "--seq-len", "128"]) == 0
    trainer = restore_scorer(out, load_corpus=False)
    assert trainer.task.cfg.model.variant == "reference"
    with pytest.raises(UserError, match="converted checkpoint"):  # parameters only: nothing to resume
        train(trainer.cfg, out)
    blt = nnx.merge(trainer.graphdef, trainer.params)
    counts = []
    for ids, (ent, starts, logits) in zip(_inputs(), _bytelm_outputs(trainer, blt, _inputs())):
        ref_ent, ref_starts, ref_logits = _hf_outputs(model, ids)
        np.testing.assert_allclose(ent, ref_ent, atol=1e-4, rtol=0)
        np.testing.assert_array_equal(starts, ref_starts)
        np.testing.assert_allclose(logits, ref_logits, atol=1e-4, rtol=0)
        counts.append(len(ref_starts))
    assert all(
        2 < c < len(ids) for c, ids in zip(counts, _inputs())
    )  # real patches: neither all bytes nor one

    # the round trip: bytelm's export is the reference's folder, tensor for tensor, and loads in transformers
    back = tmp_path / "back"
    assert main(["export", "hf", str(out), "--out", str(back)]) == 0
    original, exported = SafetensorsFolder(hf_dir), SafetensorsFolder(back)
    # (a reference encoder that cross-attends after every layer keeps only the last one's output,
    # which bytelm keeps as its one cross-attention, exported as the first)
    cross = "model.local_encoder.cross_attn_layers."
    source = {
        n: n.replace(f"{cross}0.", f"{cross}1.") if CASES[case]["enc_all"] else n for n in exported.names()
    }
    assert sorted(source.values()) == [
        n for n in original.names() if not (CASES[case]["enc_all"] and n.startswith(f"{cross}0."))
    ]
    for name in exported.names():
        np.testing.assert_array_equal(exported.get(name), original.get(source[name]), err_msg=name)
    reloaded = BltForCausalLM.from_pretrained(back).eval()
    assert reloaded.config.patching_threshold == pytest.approx(model.config.patching_threshold)
    for ids in _inputs():
        np.testing.assert_allclose(
            _hf_outputs(reloaded, ids)[2], _hf_outputs(model, ids)[2], atol=1e-5, rtol=0
        )


def _random_model(cfg, seed: int, modules=None) -> nnx.Module:
    """The model ``cfg`` describes with random parameters drawn in numpy (no program compiled per
    shape): weights ~ N(0, 1/fan_in), norm scales ~ 1 + N(0, 0.2^2), so a swapped or dropped norm shows."""
    task = task_class(cfg.model.family)(cfg, None, None, modules=modules or {})
    model = nnx.eval_shape(lambda: task.build_model(nnx.Rngs(0)))
    rng = np.random.default_rng(seed)
    for _, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        shape = var.get_value().shape
        if len(shape) == 1:
            value = 1 + 0.2 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) * (np.prod(shape) / shape[-1]) ** -0.5
        var.set_value(jnp.asarray(value, jnp.float32))
    return model


@pytest.mark.slow
def test_bytelm_models_export_to_transformers_with_matching_logits(tmp_path):
    # a byte LM as Llama
    cfg = load_config(
        None,
        [
            "model.family=byte",
            "model.d_model=32",
            "model.n_layers=2",
            "model.n_heads=2",
            "model.mlp_dim=48",
            "model.norm_eps=1e-5",
            "model.rope_base=1000",
            "train.seq_len=64",
        ],
    )
    byte_lm = _random_model(cfg, 3)
    write_run(tmp_path / "byte", cfg, byte_lm, {})
    assert export_hf(tmp_path / "byte", tmp_path / "llama") == "LlamaForCausalLM"
    llama = LlamaForCausalLM.from_pretrained(tmp_path / "llama").eval()
    ids = _inputs()[2][None]
    with torch.no_grad():
        ref = llama(torch.tensor(ids), use_cache=False).logits[0].numpy()
    graphdef, state = nnx.split(restore_model(tmp_path / "byte"))
    ours = np.asarray(jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))(state, jnp.asarray(ids, jnp.int32)))[
        0, :, :260
    ]
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)

    # bytelm's own reference-variant BLT (its own random init, perturbed) with a windowed entropy model
    ent_cfg = load_config(
        None,
        [
            "model.family=byte",
            "model.d_model=32",
            "model.n_layers=1",
            "model.n_heads=2",
            "model.mlp_dim=48",
            "model.window=8",
            "model.norm_eps=1e-5",
            "train.seq_len=128",
        ],
    )
    ent_model = _random_model(ent_cfg, 4)
    ent_model.head.set_value(ent_model.head[...] * 12.0)
    write_run(tmp_path / "entropy", ent_cfg, ent_model, {})
    blt_cfg = load_config(
        None,
        [
            "model.family=blt",
            "model.variant=reference",
            f"model.entropy_run={tmp_path / 'entropy'}",
            "model.threshold=2.5",
            "model.max_patch_len=129",
            "model.max_patches=129",
            "model.local.d_model=32",
            "model.local.heads=2",
            "model.cross_heads=2",
            "model.local.mlp_dim=48",
            "model.local.window=8",
            "model.local.encoder_layers=1",
            "model.local.decoder_layers=2",
            "model.global.d_model=48",
            "model.global.heads=2",
            "model.global.layers=1",
            "model.global.mlp_dim=64",
            "model.ngram_sizes=3,4",
            "model.hash_table_size=61",
            "model.hash_functions=2",
            "model.norm_eps=1e-5",
            "train.seq_len=128",
        ],
    )
    modules = {"entropy_run": ent_model}
    blt = _random_model(blt_cfg, 5, modules)
    write_run(tmp_path / "blt", blt_cfg, blt, {}, modules=modules)
    assert export_hf(tmp_path / "blt", tmp_path / "hf_blt") == "BltForCausalLM"
    ref_model = BltForCausalLM.from_pretrained(tmp_path / "hf_blt").eval()
    trainer = restore_scorer(tmp_path / "blt", load_corpus=False)
    restored = nnx.merge(trainer.graphdef, trainer.params)
    for ids, (ent, starts, logits) in zip(_inputs(), _bytelm_outputs(trainer, restored, _inputs())):
        ref_ent, ref_starts, ref_logits = _hf_outputs(ref_model, ids)
        np.testing.assert_allclose(ent, ref_ent, atol=1e-4, rtol=0)
        np.testing.assert_array_equal(starts, ref_starts)
        np.testing.assert_allclose(logits, ref_logits, atol=1e-4, rtol=0)

    # what the format cannot hold is refused, naming it
    own = load_config(
        None,
        [
            *(
                f"model.{k}={v}"
                for k, v in {"family": "blt", "entropy_run": tmp_path / "entropy", "threshold": 2.5}.items()
            )
        ],
    )
    with pytest.raises(UserError, match="variant"):
        write_run(tmp_path / "own", own, _random_model(own, 0, modules), {}, modules=modules)
        export_hf(tmp_path / "own", tmp_path / "own_hf")
    with pytest.raises(UserError, match="window"):
        export_hf(tmp_path / "entropy", tmp_path / "llama2")


def test_bad_folders_are_refused_naming_the_tensor_or_key(tmp_path, capsys):
    hf_dir, _ = _hf_blt(tmp_path, "hf", **CASES["full_identity"])
    bad = tmp_path / "bad"
    bad.mkdir()
    tensors = {n: np.asarray(SafetensorsFolder(hf_dir).get(n)) for n in SafetensorsFolder(hf_dir).names()}
    name = "model.local_decoder.layers.1.mlp.up_proj.weight"
    tensors[name] = tensors[name][:, :-1]
    write_safetensors(bad / "model.safetensors", tensors)
    (bad / "config.json").write_text((hf_dir / "config.json").read_text())
    capsys.readouterr()
    assert main(["convert", "hf-blt", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert f"{name} has shape (48, 31); the config implies (48, 32)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written

    config = json.loads((hf_dir / "config.json").read_text())
    config["global_config"]["num_key_value_heads"] = 1
    (bad / "config.json").write_text(json.dumps(config))
    assert main(["convert", "hf-blt", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "global_config: num_key_value_heads 1 != num_attention_heads 2" in capsys.readouterr().err


@pytest.mark.parametrize(
    "option, phrase",
    [
        ("model.window=8", "model.window = 8"),
        ("model.ngram_sizes=2,3", "model.ngram_sizes = [2, 3]"),
        ("model.logit_softcap=30", "model.logit_softcap = 30"),
        ("model.qk_norm=true", "model.qk_norm = true"),
    ],
)
def test_byte_lm_options_llama_lacks_are_refused_before_anything_is_written(tmp_path, option, phrase):
    run = tmp_path / "run"
    RunDir(run).write_config(
        dump_config(load_config(None, ["model.family=byte", option]))
    )  # refused from its config, before any checkpoint is read
    with pytest.raises(UserError, match=f"cannot be written as LlamaForCausalLM: {re.escape(phrase)}"):
        export_hf(run, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    if option.startswith("model.window"):
        return  # the reference's patcher has a sliding window: a BLT's entropy model may keep one
    blt = tmp_path / "blt"  # the same byte LM as a reference BLT's entropy model (the patcher): refused too
    RunDir(blt).write_config(
        dump_config(
            load_config(None, ["model.family=blt", "model.variant=reference", f"model.entropy_run={run}"])
        )
    )
    with pytest.raises(
        UserError, match=f"cannot be written as BltForCausalLM: its entropy model .* has {re.escape(phrase)}"
    ):
        export_hf(blt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_converted_runs_are_evaluated_patched_and_sampled(tmp_path, capsys):
    hf_dir, _ = _hf_blt(tmp_path, "hf", **CASES["windowed"])
    out = tmp_path / "run"
    main(
        [
            "convert",
            "hf-blt",
            str(hf_dir),
            "--out",
            str(out),
            "--seq-len",
            "96",
            "--max-patch-len",
            "12",
            "--max-patches",
            "64",
            "--set",
            "eval.batch_size=4",
            "--set",
            "data.heldout_fraction=0.2",
            "--set",
            "data.max_eval_bytes=600",
        ]
    )
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"".join(b"%d: " % i + TEXT[i % 40 :] + b"\n" for i in range(60)))
    spec = f"files:{corpus}?split=line"
    report = evaluate_runs([str(out)], data_spec=spec, json_path=str(tmp_path / "report.json"))
    (row,) = report["models"]
    assert row["family"] == "blt" and 0 < row["bpb"] < 20
    capsys.readouterr()
    assert main(["patch", str(out), "--text", "naïve café"]) == 0
    assert "|" in capsys.readouterr().out
    assert main(["sample", str(out), "--prompt", "Byte", "--max-bytes", "8", "--seed", "0"]) == 0


def test_safetensors_files_and_shards_read_as_the_reference_library_writes_them(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "a.weight": rng.standard_normal((3, 5)).astype(np.float32),
        "b.bias": rng.standard_normal(7).astype(np.float16),
        "c.ids": rng.integers(-5, 5, (2, 2, 2)).astype(np.int64),
        "d.empty": np.zeros((0, 4), np.float32),
    }
    save_file(dict(tensors), tmp_path / "ref.safetensors")  # the reference writer
    ours = SafetensorsFolder(tmp_path / "ref.safetensors")
    assert ours.names() == sorted(tensors)
    for name, a in tensors.items():
        np.testing.assert_array_equal(ours.get(name), a)
        assert ours.get(name).dtype == a.dtype and ours.shape(name) == a.shape
    write_safetensors(tmp_path / "ours.safetensors", tensors, {"format": "pt"})
    back = load_file(tmp_path / "ours.safetensors")  # the reference reader
    assert sorted(back) == sorted(tensors)
    for name, a in tensors.items():
        np.testing.assert_array_equal(back[name], a)

    # bfloat16 and a sharded folder, as save_pretrained writes large models
    bf = rng.standard_normal((4, 3)).astype(ml_dtypes.bfloat16)
    folder = tmp_path / "sharded"
    folder.mkdir()
    write_safetensors(folder / "model-00001-of-00002.safetensors", {"x": bf})
    write_safetensors(folder / "model-00002-of-00002.safetensors", {"y": tensors["a.weight"]})
    index = {
        "metadata": {},
        "weight_map": {"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"},
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    shards = SafetensorsFolder(folder)
    assert shards.names() == ["x", "y"]
    np.testing.assert_array_equal(np.asarray(shards.get("x"), np.float32), bf.astype(np.float32))
    np.testing.assert_array_equal(shards.get("y"), tensors["a.weight"])
    with pytest.raises(UserError, match="no tensor 'z'"):
        shards.get("z")
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(UserError, match="not a safetensors file"):
        SafetensorsFolder(tmp_path / "junk.safetensors")
