"""The family seam: a family written here, outside the package, joins through the public registry
and trains, is scored, takes part in ``bytelm compare`` and in an ablation grid, and samples,
without any bytelm file naming it."""

import ast
import dataclasses
import importlib
import json
import pathlib
import sys
import tempfile

import jax
import numpy as np
import pytest
from conftest import word_corpus
from helpers import micro_grid

import bytelm
from bytelm import cli
from bytelm.errors import UserError
from bytelm.experiments.ablate import ablate, load_grid
from bytelm.experiments.compare import compare, load_preset
from bytelm.experiments.spec import Member
from bytelm.families import Task, register, task_class
from bytelm.generate import generate, load_decoder

jax.config.update("jax_numpy_rank_promotion", "raise")  # as the other model tests: no silent broadcasting

NAME = "conv_test"

# The family as a user writes it: a folder of its own (written to a temporary directory by the
# fixture below, imported from there), filling the three members of the seam and nothing else.
TOY_FAMILY = {
    "config.py": f'''
import dataclasses

from bytelm.models.configs import ModelConfig


@dataclasses.dataclass(frozen=True)
class ConvConfig(ModelConfig):
    """A causal depthwise convolution over byte embeddings, then a mixing layer and the head."""

    family: str = "{NAME}"
    d_model: int = 32
    kernel: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.d_model < 1 or self.kernel < 1:
            raise ValueError(f"model.d_model ({{self.d_model}}), model.kernel ({{self.kernel}}) must be >= 1")
''',
    "model.py": """
import jax.numpy as jnp
from flax import nnx

from bytelm.constants import NUM_BYTE_IDS
from bytelm.models.core import Embed, head_logits, head_param, pad_vocab, param
from bytelm.models.scoring import next_id_scores


class ConvLM(nnx.Module):
    n_valid = NUM_BYTE_IDS

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = Embed(pad_vocab(NUM_BYTE_IDS, cfg.vocab_multiple), cfg.d_model, rngs=rngs)
        self.taps = param(rngs, (cfg.kernel, cfg.d_model), (None, "embed"), std=0.5)
        self.mix = param(rngs, (cfg.d_model, cfg.d_model), ("embed", "mlp"))
        self.head = head_param(rngs, cfg.d_model, NUM_BYTE_IDS, cfg.vocab_multiple)

    def __call__(self, ids_BxT):
        x_BxTxD = self.embed(ids_BxT)
        T, K = ids_BxT.shape[1], self.cfg.kernel
        padded = jnp.pad(x_BxTxD, ((0, 0), (K - 1, 0), (0, 0)))
        h_BxTxD = sum(
            padded[:, k : k + T] * self.taps[...][K - 1 - k][None, None, :] for k in range(K)
        )  # t reads t-K+1 .. t
        return head_logits(jnp.tanh(h_BxTxD @ self.mix[...]), self.head[...], NUM_BYTE_IDS, jnp.float32)

    def score(self, batch, *, dropout_key=None):
        ids = batch["ids"]
        return next_id_scores(self(ids[:, :-1]), ids[:, 1:])
""",
    "__init__.py": """
from bytelm.constants import NUM_BYTE_IDS
from bytelm.families import Task, register
from bytelm.models.core import pad_vocab

from .config import ConvConfig
from .model import ConvLM


class ConvTask(Task):
    config_class = ConvConfig

    def build_model(self, rngs):
        return ConvLM(self.cfg.model, rngs=rngs)

    def forward_flops_per_position(self):
        m = self.cfg.model
        return 2.0 * m.kernel * m.d_model + 2.0 * m.d_model * m.d_model + 2.0 * m.d_model * pad_vocab(
            NUM_BYTE_IDS, m.vocab_multiple
        )


register(ConvTask)
""",
}


def import_toy_family(root: pathlib.Path):
    """Write the toy family's folder under ``root`` and import it (which registers it)."""
    folder = root / "toy_conv_family"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in TOY_FAMILY.items():
        (folder / name).write_text(text.lstrip())
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module("toy_conv_family")
    finally:
        sys.path.remove(str(root))


_toy = import_toy_family(pathlib.Path(tempfile.mkdtemp(prefix="bytelm-toy-family-")))
ConvTask, ConvConfig = _toy.ConvTask, _toy.ConvConfig


def test_the_toy_family_fills_three_members():
    (body,) = [n for n in ast.parse(TOY_FAMILY["__init__.py"]).body if isinstance(n, ast.ClassDef)]
    own = {t.id for n in body.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    own |= {n.name for n in body.body if isinstance(n, ast.FunctionDef)}
    assert own == {"config_class", "build_model", "forward_flops_per_position"}
    # what the registry filled in
    assert ConvTask.family == NAME and ConvTask.description == f"a {NAME} model"


@dataclasses.dataclass(frozen=True)
class SizedConvConfig(ConvConfig):
    family: str = NAME + "_sized"


class SizedConvTask(ConvTask):
    """The toy family with a size rule (what ``bytelm ablate`` needs besides the three)."""

    config_class = SizedConvConfig

    @classmethod
    def sized(cls, model_cfg, trunk, changes):
        return dataclasses.replace(model_cfg, **{"d_model": trunk.main.d_model, **changes})


register(SizedConvTask)


def test_no_bytelm_file_names_the_family():
    root = pathlib.Path(bytelm.__file__).parent
    assert not [
        p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".toml") and NAME in p.read_text()
    ]
    assert task_class(NAME) is ConvTask
    register(ConvTask)  # again: nothing changes
    with pytest.raises(ValueError, match="is taken"):
        register(type("Other", (ConvTask,), {}))


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return word_corpus(tmp_path_factory.mktemp("plugin_corpus"), words_per_doc=200, two_dirs=True)


def conv_config(path: pathlib.Path, family: str = NAME) -> pathlib.Path:
    """A config file of the family (as a user writes one): the tiny presets' settings, its own model."""
    path.write_text(
        f'include = "{bytelm.config.shipped_configs() / "tiny" / "base.toml"}"\n\n'
        f'[model]\nfamily = "{family}"\nd_model = 32\nkernel = 4\n'
    )
    return path


@pytest.mark.slow
def test_it_trains_is_scored_and_samples(corpus_dir, tmp_path, capsys):
    run = tmp_path / "run"
    sets = [
        "--set",
        f"data.source=files:{corpus_dir}",
        "--set",
        "train.steps=6",
        "--set",
        "train.batch_size=4",
        "--set",
        "train.seq_len=64",
        "--set",
        "data.segment_bytes=64",
        "--set",
        "eval.every=0",
        "--set",
        "train.peak_flops=1e11",
    ]
    assert cli.main(["train", str(conv_config(tmp_path / "conv.toml")), "--out", str(run), *sets]) == 0
    info = json.loads((run / "run.json").read_text())
    assert info["family"] == NAME and info["status"] == "finished" and info["step"] == 6
    assert info["ledger"]["own_per_step"] == pytest.approx(
        3
        * ConvTask(bytelm.config.load_config(run / "config.toml"), None).forward_flops_per_position()
        * 4
        * 64
    )
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--json", str(tmp_path / "report.json")]) == 0
    row = json.loads((tmp_path / "report.json").read_text())["models"][0]
    assert row["family"] == NAME and 0 < row["bpb"] < 9 and row["mean_bytes_per_global_step"] == 1.0
    out = generate(run, b"the ", max_bytes=8)
    assert isinstance(out, bytes) and 0 < len(out) <= 8
    dec = load_decoder(run)
    np.testing.assert_allclose(dec.start(b"ab"), dec.recompute(b"ab", []), rtol=1e-6)


@pytest.mark.slow
def test_it_takes_part_in_compare_and_in_an_ablation_grid(corpus_dir, tmp_path):
    config = conv_config(tmp_path / "conv.toml")
    preset = load_preset("test")
    preset = dataclasses.replace(
        preset, members=(*[m for m in preset.members if m.name == "byte"], Member("conv", config))
    )
    report = compare(preset, tmp_path / "cmp", data_spec=f"files:{corpus_dir}").report
    rows = {m["name"]: m for m in report["models"]}
    assert rows["conv"]["family"] == NAME and 0 < rows["conv"]["bpb"] < 9
    assert (
        abs(rows["conv"]["flops_total"] - preset.budgets[0])
        <= report["compare"]["models"]["conv"]["flops_per_step"] / 2
    )
    assert "| conv" in (tmp_path / "cmp" / "report.md").read_text()

    sized = conv_config(tmp_path / "conv_sized.toml", SizedConvTask.family)
    grid_file = micro_grid(tmp_path, families={"byte"})
    grid_file.write_text(
        grid_file.read_text()
        + f'\n[[family]]\nname = "conv"\nconfig = "{sized}"\ngrid = {{ "model.kernel" = [2, 6] }}\n'
    )
    grid = load_grid(str(grid_file))
    result = ablate(grid, tmp_path / "grid", data_spec=f"files:{corpus_dir}")
    cells = [r for r in result.report["runs"] if r["family"] == "conv" and r["in_grid"] and r["seed"] == 0]
    assert (
        result.stage == "done" and {r["cell"] for r in cells} == {"kernel=2", "kernel=6"} and len(cells) == 4
    )
    assert all(r["status"] == "done" and 0 < r["bpb"] < 9 for r in cells)
    # sized by the rule: at the micro budgets, width 16
    assert {
        json.loads((pathlib.Path(r["run_dir"]) / "run.json").read_text())["params"]["non_embedding"]
        for r in cells
        if r["cell"] == "kernel=2"
    }
    cfg = bytelm.config.load_config(pathlib.Path(cells[0]["run_dir"]) / "config.toml")
    assert cfg.model.d_model == 16 and cfg.model.family == SizedConvTask.family


def test_a_bad_family_is_refused_at_registration():
    with pytest.raises(ValueError, match="config_class"):
        register(type("NoConfig", (Task,), {"family": "x1", "config_class": int}))
    with pytest.raises(ValueError, match="has family = 'conv_test'; make them equal"):
        register(type("Mismatch", (ConvTask,), {"family": "x2"}))
    with pytest.raises(UserError, match="not a known family"):
        task_class("nope_family")
