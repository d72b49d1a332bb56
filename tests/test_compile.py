"""`bytelm compile`: a config's steps compiled ahead of time for a TPU slice on this CPU machine (libtpu,
installed by the test extra, describes the slice; no TPU is used), and the pieces it reads: slice
names, the collectives of an HLO text, the optimizer state's placement."""

from __future__ import annotations

import importlib.util
import json

import pytest

from bytelm import cli
from bytelm.config import load_config
from bytelm.errors import UserError
from bytelm.training.aot import collectives
from bytelm.training.topology import parse_topology

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed (pip install -e '.[tpu]')"
)


@pytest.mark.parametrize(
    "name, libtpu, chips",
    [
        ("v5e-256", "v5e:16x16", 256),
        ("v6e-256", "v6e:16x16", 256),
        ("v5e-32", "v5e:4x8", 32),
        ("v5p-128", "v5p:4x4x4", 64),  # TensorCores: two per chip
        ("v4-64", "v4:2x4x4", 32),
        ("v5p-8", "v5p:2x2x1", 4),
        ("V5E:2x2", "v5e:2x2", 4),
    ],
)
def test_slice_names_give_cloud_tpus_shapes(name, libtpu, chips):
    topology = parse_topology(name)
    assert (topology.libtpu_name, topology.chips) == (libtpu, chips)


@pytest.mark.parametrize("name", ["v7-8", "v5e-3", "v5p-6", "v5e:0x4", "tpu", "v5e-"])
def test_a_bad_slice_name_says_what_is_accepted(name):
    with pytest.raises(UserError, match="--topology"):
        parse_topology(name)


def test_collectives_are_counted_with_their_result_bytes_and_slices():
    """A hand-written HLO excerpt in the forms XLA prints (tuples with layouts and index comments,
    async starts, listed and iota replica groups, a multi-slice transfer): counts and bytes computed
    by hand."""
    hlo = "\n".join(
        [
            "  %all-reduce.41 = (f32[384,256]{1,0:T(8,128)}, f32[]{:T(128)}, /*index=2*/bf16[8]{0}) "
            "all-reduce(%a, %b, %c), channel_id=3, replica_groups={{0,1,2,3}}, use_global_device_ids=true",
            "  %all-gather-start = (bf16[4,16]{1,0}, bf16[16,16]{1,0}) all-gather-start(bf16[4,16]{1,0} %p), "
            "replica_groups=[2,4]<=[8], dimensions={0}",
            "  %all-gather-done = bf16[16,16]{1,0} all-gather-done(%all-gather-start)",
            "  ROOT %reduce-scatter.2 = f32[2,8]{1,0} reduce-scatter(f32[8,8]{1,0} %g), "
            "replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}",
            "  %get-tuple-element.72 = f32[] get-tuple-element(%all-reduce.41), index=1",
            "  %send.3 = (f32[32,8,128]{2,1,0}, u32[], token[]) send(%x, %y), channel_id=8, "
            'is_host_transfer=true, frontend_attributes={_xla_megascale_target="{1,2}x{0:3}",'
            '_xla_megascale_transfer_type="ALL_REDUCE"}',
        ]
    )
    slice_of_device = [0, 0, 0, 0, 1, 1, 1, 1]
    got = collectives(hlo, slice_of_device)
    assert got["all-reduce"] == {"count": 1, "bytes": 384 * 256 * 4 + 4 + 8 * 2, "cross_slice": 0}
    # [2,4]<=[8]: groups {0,1,2,3}, {4,5,6,7}, each within a slice
    assert got["all-gather"] == {"count": 1, "bytes": 16 * 16 * 2, "cross_slice": 0}
    # [4,2]<=[2,4]T(1,0): groups {0,4}, {1,5}, ...: across the slices
    assert got["reduce-scatter"] == {"count": 1, "bytes": 2 * 8 * 4, "cross_slice": 1}
    assert got["dcn"] == {"count": 1, "bytes": 32 * 8 * 128 * 4, "cross_slice": 1, "kinds": {"all_reduce": 1}}
    assert got["all-to-all"]["count"] == got["collective-permute"]["count"] == 0


@needs_libtpu
@pytest.mark.parametrize("family", ["byte", "bpe", "megabyte", "blt", "entropy"])
@pytest.mark.slow
def test_every_tiny_preset_compiles_for_a_v5e_2x2_slice(family, capsys):
    """The train and eval steps of each family's tiny preset, on the 4 chips of a v5e:2x2: positive memory
    within a v5e's 16 GiB, and XLA's FLOPs within 25% of bytelm's analytic count (the tiny presets do not
    scan their layers, so XLA counts every layer; it also counts the optimizer and the norms; BLT's at
    its patch slots' capacity, which the compiled step runs whatever the patches)."""
    args = ["compile", f"tiny/{family}", "--topology", "v5e:2x2"]
    if family == "bpe":
        args += ["--vocab-size", "4096"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    headline = json.loads(out.strip().splitlines()[-1])
    assert headline["fits"] is True and headline["topology"] == "v5e:2x2"
    assert 0 < headline["train_bytes_per_chip"] < 16 << 30 and headline["eval_bytes_per_chip"] > 0
    analytic = headline["analytic_flops_per_chip"]
    if family == "blt":  # the compiled step runs every patch slot: BLT's formula at the slots' capacity
        from bytelm.families.blt.flops import forward_flops_per_byte

        m, seq = load_config("tiny/blt").model, load_config("tiny/blt").train.seq_len
        full = forward_flops_per_byte(m, seq, seq / m.patches_for(seq))
        analytic *= full / forward_flops_per_byte(m, seq, m.target_patch_len)
    assert 0.9 < headline["xla_flops_per_chip"] / analytic < 1.25, (headline, analytic)
    assert "train step:" in out and "eval step:" in out and "fits" in out


def _compiled(tmp_path, *args: str) -> dict:
    """The --json report of ``bytelm compile tiny/byte --topology v5e:2x2 ARGS`` (which must exit 0)."""
    assert (
        cli.main(["compile", "tiny/byte", "--topology", "v5e:2x2", *args, "--json", str(tmp_path / "r.json")])
        == 0
    )
    return json.loads((tmp_path / "r.json").read_text())


@needs_libtpu
@pytest.mark.slow
def test_two_slices_put_the_data_axis_across_the_data_centre_network(tmp_path):
    """With --slices 2 the mesh's data axis spans both slices, and the compiled step reduces the
    gradients over the data-centre network (libtpu's transfers between slices)."""
    report = _compiled(tmp_path, "--slices", "2")
    assert report["topology"]["chips"] == 8 and report["config"]["mesh"]["data"] == 8
    train = report["programs"][0]["collectives"]
    assert train["dcn"]["count"] > 0 and train["dcn"]["bytes"] > 0 and "all_reduce" in train["dcn"]["kinds"]
    assert report["programs"][1]["collectives"]["dcn"]["count"] == 0  # scoring reduces nothing across slices


@needs_libtpu
@pytest.mark.slow
def test_fsdp_shards_the_optimizer_state_with_the_weights(tmp_path):
    """On fsdp=4, each chip holds a quarter of the weights and of Adam's two moments: the train step's
    arguments are about 3 x 4 bytes x parameters / 4, not the 3 x 4 bytes x parameters a replicated
    optimizer state would nearly reach."""
    report = _compiled(tmp_path, "--set", "train.mesh_fsdp=4")
    params = report["config"]["params"]
    arguments = report["programs"][0]["memory"]["arguments"]
    assert arguments < 0.4 * 12 * params, (arguments, params)


@needs_libtpu
@pytest.mark.slow
def test_a_step_that_does_not_fit_exits_1_with_a_one_line_diagnosis(capsys):
    cfg = load_config("tiny/byte")
    huge = cfg.train.batch_size * 4096
    assert (
        cli.main(["compile", "tiny/byte", "--topology", "v5e:2x2", "--set", f"train.batch_size={huge}"]) == 1
    )
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1])["fits"] is False
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "does not fit" in err[0] and "GiB" in err[0] and "train.batch_size" in err[0], (
        err
    )


def test_the_persistent_cache_is_off_while_compiling_for_a_slice_and_on_again_after(tmp_path):
    """JAX decides once per process whether it uses its persistent cache: a process that compiled
    anything before `bytelm compile` would otherwise store the TPU programs, and fail (with a warning)
    to read them back at the next compile of the same step."""
    import uuid
    from pathlib import Path

    import jax
    import jax.numpy as jnp

    from bytelm.training.aot import _without_persistent_cache

    cache_dir = jax.config.jax_compilation_cache_dir
    if not cache_dir or jax.config.jax_persistent_cache_min_compile_time_secs > 0:
        pytest.skip("no persistent compilation cache that stores every program (tests/conftest.py sets one)")

    def compile_new(tag: str) -> str:
        def f(x):
            return x * 3 + 1

        f.__name__ = f"probe_{tag}_{uuid.uuid4().hex}"
        jax.jit(f)(jnp.ones(3)).block_until_ready()
        return f"jit_{f.__name__}-"

    compile_new("before")  # (JAX has decided to use the cache)
    with _without_persistent_cache():
        inside = compile_new("inside")
    after = compile_new("after")
    names = [p.name for p in Path(cache_dir).iterdir()]
    assert not any(n.startswith(inside) for n in names)
    assert any(n.startswith(after) for n in names)
