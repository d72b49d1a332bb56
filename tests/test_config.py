import dataclasses

import pytest

from bytelm.config import Config, dump_config, load_config, save_config
from bytelm.errors import UserError


def write(path, text):
    path.write_text(text)
    return path


def test_defaults_without_file():
    cfg = load_config()
    assert cfg == Config()
    assert cfg.data.source == "stdlib"


def test_include_merge_order(tmp_path):
    write(tmp_path / "base.toml", '[train]\nsteps = 10\nbatch_size = 8\n[data]\nsegment_bytes = 256\n')
    write(tmp_path / "mid.toml", 'include = "base.toml"\n[train]\nsteps = 20\n')
    write(tmp_path / "other.toml", '[train]\nbatch_size = 4\nseed = 7\n')
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
    cfg = load_config(None, ["model.family=byte", "model.window=64", 'data.source=files:/a "b"/c', "train.steps=3"])
    path = save_config(cfg, tmp_path / "run")
    assert path.read_text() == dump_config(cfg)
    assert load_config(path) == cfg


def test_repo_configs_load():
    from pathlib import Path

    root = Path(__file__).parent.parent / "configs"
    # compare presets and ablation grids have schemas of their own (tests/test_compare.py, tests/test_ablate.py)
    paths = sorted(p for p in root.rglob("*.toml") if not {"compare", "ablations"} & set(p.relative_to(root).parts))
    assert len(paths) >= 8
    for path in paths:
        load_config(path)


def test_config_classes_agree_with_the_family_registry():
    """The loader reads [model] tables into the ModelConfig subclasses of bytelm/models/configs.py;
    the task registry names the same class for every family, and no family is missing on either side."""
    from bytelm.models.configs import config_classes
    from bytelm.training.tasks import FAMILIES

    assert {name: task.config_class for name, task in FAMILIES.items()} == config_classes()
