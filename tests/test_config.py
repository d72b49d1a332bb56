import dataclasses

import pytest

from bytelm.config import Config, dump_config, load_config
from bytelm.errors import UserError


def write(path, text):
    path.write_text(text)
    return path


def test_defaults_without_file():
    cfg = load_config()
    assert cfg == Config()
    assert cfg.data.source == "stdlib"


def test_include_merge_order(tmp_path):
    write(tmp_path / "base.toml", "[train]\nsteps = 10\nbatch_size = 8\n[data]\nsegment_bytes = 256\n")
    write(tmp_path / "mid.toml", 'include = "base.toml"\n[train]\nsteps = 20\n')
    write(tmp_path / "other.toml", "[train]\nbatch_size = 4\nseed = 7\n")
    top = write(
        tmp_path / "top.toml",
        'include = ["mid.toml", "other.toml"]\n[train]\nseed = 9\n[model]\nfamily = "byte"\nd_model = 64\n',
    )
    cfg = load_config(top, ["train.steps=30"])
    assert cfg.train.steps == 30  # override beats every file
    assert cfg.train.batch_size == 4  # later include beats earlier include
    assert cfg.train.seed == 9  # the including file beats its includes
    assert cfg.data.segment_bytes == 256  # inherited through two levels
    assert cfg.model.d_model == 64 and cfg.model.n_heads == 4
    # tables merge key by key: base's other train keys survive
    assert cfg.train.learning_rate == dataclasses.fields(type(cfg.train))[4].default


def test_override_type_conversion():
    cfg = load_config(
        None,
        [
            "model.family=byte",
            "model.d_model=128",
            "model.rope_base=500",
            "train.learning_rate=1e-3",
            "data.source=files:/x?split=line",
            "train.peak_flops=2e12",
        ],
    )
    assert cfg.model.d_model == 128 and isinstance(cfg.model.d_model, int)
    assert cfg.model.rope_base == 500.0 and isinstance(cfg.model.rope_base, float)
    assert cfg.train.learning_rate == 1e-3
    assert cfg.data.source == "files:/x?split=line"  # '=' after the first belongs to the value


def test_unknown_key_suggests_closest():
    with pytest.raises(UserError, match=r"unknown key 'model.d_modle'; did you mean 'model.d_model'\?"):
        load_config(None, ["model.family=byte", "model.d_modle=3"])
    with pytest.raises(UserError, match=r"unknown key 'trian'; did you mean 'train'\?"):
        load_config(None, ["trian.steps=3"])


def test_unknown_key_in_file_names_it(tmp_path):
    p = write(tmp_path / "c.toml", "[train]\nlerning_rate = 0.1\n")
    with pytest.raises(UserError, match=r"train.lerning_rate.*train.learning_rate"):
        load_config(p)


def test_wrong_type_names_key_value_and_type(tmp_path):
    with pytest.raises(UserError, match=r"train.steps = abc is not a valid int"):
        load_config(None, ["train.steps=abc"])
    p = write(tmp_path / "c.toml", '[train]\nsteps = "ten"\n')
    with pytest.raises(UserError, match=r'train.steps = "ten" is not a valid int'):
        load_config(p)
    with pytest.raises(UserError, match=r"train.learning_rate = true is not a valid float"):
        load_config(write(tmp_path / "d.toml", "[train]\nlearning_rate = true\n"))


def test_invariant_violation_is_user_error():
    with pytest.raises(UserError, match="d_model 250 is not divisible by n_heads 4"):
        load_config(None, ["model.family=byte", "model.d_model=250"])
    with pytest.raises(UserError, match="not a known family"):
        load_config(None, ["model.family=bogus"])


def test_include_cycle_and_missing_file(tmp_path):
    write(tmp_path / "a.toml", 'include = "b.toml"\n')
    write(tmp_path / "b.toml", 'include = "a.toml"\n')
    with pytest.raises(UserError, match="include cycle"):
        load_config(tmp_path / "a.toml")
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(UserError, match="cannot parse config file"):
        load_config(write(tmp_path / "bad.toml", "[train\n"))


def test_bad_override_syntax():
    with pytest.raises(UserError, match="section.key=value"):
        load_config(None, ["train.steps"])


def test_dump_round_trip(tmp_path):
    cfg = load_config(
        None, ["model.family=byte", "model.window=64", 'data.source=files:/a "b"/c', "train.steps=3"]
    )
    path = tmp_path / "config.toml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg


def test_repo_configs_load():
    from pathlib import Path

    root = Path(__file__).parent.parent / "configs"
    # compare presets and ablation grids have schemas of their own (tests/test_compare.py,
    # tests/test_ablate.py)
    paths = sorted(
        p for p in root.rglob("*.toml") if not {"compare", "ablations"} & set(p.relative_to(root).parts)
    )
    # the small and base presets' shared [model] settings (dtype, kernels) are fragments, not presets
    paths = [p for p in paths if p.relative_to(root).as_posix() not in ("small/base.toml", "base/base.toml")]
    assert len(paths) >= 8
    for path in paths:
        load_config(path)


def test_the_loader_reads_model_tables_through_the_family_registry():
    """A [model] table is read into the config class its family registered, for every built-in
    family; an unknown family names the known ones and the closest."""
    from bytelm.families import FAMILIES

    assert set(FAMILIES) >= {"byte", "bpe", "megabyte", "blt"}
    for name, task in FAMILIES.items():
        assert type(load_config(None, [f"model.family={name}"]).model) is task.config_class
    with pytest.raises(
        UserError, match=r"model.family = 'megabite' is not a known family .*did you mean 'megabyte'"
    ):
        load_config(None, ["model.family=megabite"])


def test_cpu_recipes_cover_every_family_and_score_inside_their_context():
    """configs/cpu: a recipe per family (and BLT's entropy model, and the ten-minute recipes),
    loadable by its short name; the recipes are run with a time budget, so their step count is only
    a ceiling that a budget of minutes never reaches, and every held-out segment lies inside the
    training context."""
    from bytelm.families import FAMILIES

    built_in = [
        name for name, task in FAMILIES.items() if task.__module__.startswith("bytelm.")
    ]  # (a test may register its own)
    for name in [*built_in, "entropy", "byte_10min", "bpe_10min", "blt_10min"]:
        cfg = load_config(f"cpu/{name}")
        assert cfg.model.family == ("byte" if name == "entropy" else name.removesuffix("_10min"))
        assert cfg.train.seq_len >= cfg.data.segment_bytes, name
        if name != "entropy":  # the entropy model trains a fixed number of steps, before BLT
            assert cfg.train.steps >= 10_000 and cfg.train.time_budget_s == 0, name


@pytest.mark.slow
def test_small_and_base_presets_have_the_sizes_they_promise():
    """configs/small: about 100M-parameter models of every family (one GPU); configs/base: about 1B
    (the global model of MegaByte and BLT, the main network of H-Net; several hosts, FSDP, one
    preset with tensor parallelism). Counted on the abstract models (no weights are allocated).
    Embedding tables (BLT's hashed n-grams, the subword vocabulary) are lookups and are not counted."""
    from flax import nnx

    from bytelm.families.blt.model import BLT
    from bytelm.families.bpe.model import TokenLM
    from bytelm.families.byte.model import ByteLM
    from bytelm.families.hnet.model import HNet
    from bytelm.families.mambabyte.model import MambaByte
    from bytelm.families.megabyte.model import MegaByte
    from bytelm.families.spacebyte.model import SpaceByte
    from bytelm.training.scorer import count_params

    builders = {
        "byte": ByteLM,
        "megabyte": MegaByte,
        "blt": BLT,
        "hnet": HNet,
        "mambabyte": MambaByte,
        "spacebyte": SpaceByte,
        "bpe": lambda m, rngs: TokenLM(m, 32768, rngs=rngs),
    }
    expected = {"small": (80e6, 130e6), "base": (0.95e9, 1.2e9)}
    for size, (lo, hi) in expected.items():
        for family in ("byte", "bpe", "megabyte", "blt", "hnet", "mambabyte", "spacebyte"):
            cfg = load_config(f"{size}/{family}")
            model = nnx.eval_shape(lambda: builders[cfg.model.family](cfg.model, rngs=nnx.Rngs(0)))
            counts = count_params(nnx.state(model, nnx.Param))
            trunk = counts["non_embedding"]
            if family in ("megabyte", "blt", "hnet", "spacebyte"):  # the global (main) model alone
                stack = {
                    "megabyte": lambda: model.global_stack,
                    "blt": lambda: model.latent.stack,
                    "hnet": lambda: model.main_network().stack,
                    "spacebyte": lambda: model.global_stack,
                }[family]()
                trunk = count_params(nnx.state(stack, nnx.Param))["non_embedding"]
            assert lo <= trunk <= hi, (size, family, trunk)
            assert cfg.model.dtype == "bfloat16" and cfg.train.seq_len >= cfg.data.segment_bytes
            t = cfg.train
            assert (
                t.batch_size % (t.mesh_fsdp * t.mesh_tensor) == 0
                and cfg.eval.batch_size % (t.mesh_fsdp * t.mesh_tensor) == 0
            )
        assert load_config(f"{size}/entropy").model.window == 512
    tp = load_config("base/byte_tp").train
    assert (tp.mesh_fsdp, tp.mesh_tensor) == (4, 2)


def test_configs_are_never_written_into():
    """Frozen configs stay frozen: the library builds changed configs with dataclasses.replace
    (bytelm.config.with_values, the families' sized), never object.__setattr__."""
    import pathlib

    import bytelm

    root = pathlib.Path(bytelm.__file__).parent
    assert [str(p) for p in root.rglob("*.py") if "object.__setattr__" in p.read_text()] == []


def test_typed_changes_are_checked_like_a_file():
    from bytelm.config import with_overrides, with_values

    cfg = load_config(None, ["model.family=byte"])
    changed = with_values(
        cfg, {"model.d_model": 64, "model.n_heads": 2, "train.steps": "7", "model.ngram_sizes": (3, 4)}
    )
    assert (changed.model.d_model, changed.train.steps, changed.model.ngram_sizes) == (64, 7, (3, 4))
    assert (
        load_config(
            None,
            [
                "model.family=byte",
                "model.d_model=64",
                "model.n_heads=2",
                "train.steps=7",
                "model.ngram_sizes=3,4",
            ],
        )
        == changed
    )
    with pytest.raises(UserError, match=r"unknown key 'model.d_modle'; did you mean 'model.d_model'"):
        with_values(cfg, {"model.d_modle": 64})
    with pytest.raises(UserError, match="d_model 250 is not divisible by n_heads 4"):
        with_values(cfg, {"model.d_model": 250})
    with pytest.raises(UserError, match="train.steps = x is not a valid int"):
        with_values(cfg, {"train.steps": "x"})
    assert (
        with_overrides(changed, ["train.steps=9"]).train.steps == 9 and with_overrides(changed, []) is changed
    )


def test_closed_sets_are_literal_types_checked_at_load(tmp_path):
    """A field whose values form a closed set is typed as one (``Literal``): a value outside it is
    refused at load, from a file or a --set string alike, naming the key, the value and every choice."""
    import typing

    from bytelm.models.configs import ModelConfig

    hints = typing.get_type_hints(ModelConfig)
    for field in ("dtype", "attention", "mlp", "remat"):
        assert typing.get_origin(hints[field]) is typing.Literal, field
    with pytest.raises(UserError, match=r"model.remat = \"all\" is not one of 'none', 'block', 'dots'"):
        load_config(None, ["model.family=byte", "model.remat=all"])
    path = tmp_path / "c.toml"
    path.write_text('[model]\nfamily = "byte"\ndtype = "bf16"\n')
    with pytest.raises(UserError, match=r"model.dtype = \"bf16\" is not one of 'float32', 'bfloat16'"):
        load_config(path)
    path.write_text('[model]\nfamily = "byte"\ndtype = 16\n')
    with pytest.raises(UserError, match=r"model.dtype = 16 is not one of"):
        load_config(path)
    assert load_config(None, ["model.family=byte", "model.dtype=bfloat16"]).model.dtype == "bfloat16"


def test_stacks_are_nested_tables_and_old_flat_keys_name_their_new_place(tmp_path):
    """A family's stacks are ``[model.<stack>]`` tables typed by their own dataclasses: a table's keys
    go over the family's defaults (a partial table keeps the rest), ``--set`` reaches in by a dotted
    key, the dump writes them back as tables, and the flat keys they replaced fail naming the new key."""
    from bytelm.config import section_overrides, with_values
    from bytelm.families.hnet.config import HNetStageConfig
    from bytelm.models.configs import StackConfig

    path = tmp_path / "h.toml"
    path.write_text(
        '[model]\nfamily = "hnet"\nstages = 2\n\n[model.global]\nd_model = 256\n\n'
        '[model.middle]\nwindow = 8\nencoder = "T3"\n'
    )
    cfg = load_config(path, ["model.local.heads=4"])
    m = cfg.model
    assert m.global_ == StackConfig(d_model=256, layers=3, heads=2, mlp_dim=512)  # the rest: defaults
    assert m.middle == HNetStageConfig(128, 2, 352, "T3", "m2T1", 8)
    assert (m.local.heads, m.local.d_model) == (4, 128)
    assert [(s.d_model, s.heads, s.window) for s in m.stage_specs()] == [(128, 4, 64), (128, 2, 8)]
    text = dump_config(cfg)
    assert "[model.global]\nd_model = 256\n" in text and "global_" not in text
    (tmp_path / "dumped.toml").write_text(text)
    assert load_config(tmp_path / "dumped.toml") == cfg
    base = load_config(None, ["model.family=hnet"])
    assert set(section_overrides("model", m, base.model)) == {
        "model.stages=2",
        "model.global.d_model=256",
        "model.middle.window=8",
        "model.middle.encoder=T3",
        "model.local.heads=4",
    }
    for old, new in [
        ("model.global_d_model=64", "model.global.d_model"),
        ("model.local_window=8", "model.local.window"),
        ("model.middle_encoder=m1", "model.middle.encoder"),
        ("model.encoder_layers=1", "model.local.encoder"),
        ("model.local.encoder_layers=1", "model.local.encoder"),  # (depths became layer patterns)
    ]:
        with pytest.raises(UserError, match=f"is now {new.replace('.', '[.]')}: write"):
            load_config(None, ["model.family=hnet", old])
    path.write_text('[model]\nfamily = "megabyte"\nlocal_layers = 3\n')
    with pytest.raises(UserError, match=r"model.local_layers is now model.local.layers.*\[model.local\]"):
        load_config(path)
    with pytest.raises(UserError, match=r"model.global is a table: set its keys"):
        with_values(load_config(None, ["model.family=megabyte"]), {"model.global": 3})
    with pytest.raises(
        UserError, match=r"unknown key 'model.global.layer'; did you mean 'model.global.layers'"
    ):
        load_config(None, ["model.family=megabyte", "model.global.layer=2"])
    with pytest.raises(UserError, match=r"invalid \[model.global\] config: .*divisible"):
        load_config(None, ["model.family=megabyte", "model.global.heads=3"])
