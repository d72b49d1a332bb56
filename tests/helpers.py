"""Helpers and constants that several test modules share (test modules never import each other).

Fixtures live in conftest.py, except ``corpus_dir``: five test modules define fixtures of that name
of their own, so the trainer's corpus stays a fixture that a module imports from here to use it.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import word_corpus
from flax import nnx

from bytelm.config import load_config, shipped_configs
from bytelm.constants import BOS_ID, BYTE_OFFSET
from bytelm.experiments.ablate import GRID_DIR
from bytelm.families.blt.model import BLT
from bytelm.families.bpe.model import TokenLM
from bytelm.families.byte.model import ByteLM
from bytelm.families.mambabyte.model import MambaByte
from bytelm.families.megabyte.model import MegaByte

# -- from test_training.py --------------------


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return word_corpus(tmp_path_factory.mktemp("train_corpus"))


def tiny_overrides(corpus_dir, **extra):
    base = {
        "data.source": f"files:{corpus_dir}",
        "data.segment_bytes": 64,
        "data.max_eval_bytes": 4096,
        "model.family": "byte",
        "model.d_model": 32,
        "model.n_layers": 2,
        "model.n_heads": 2,
        "model.mlp_dim": 64,
        "train.steps": 12,
        "train.batch_size": 8,
        "train.seq_len": 64,
        "train.learning_rate": 3e-3,
        "train.warmup_steps": 2,
        "train.log_every": 1,
        "train.checkpoint_every": 4,
        "train.peak_flops": 1e11,
        "eval.every": 6,
        "eval.eval_bytes": 512,
        "eval.batch_size": 8,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def metrics(run_dir, kind="train"):
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


# -- from test_bpe.py --------------------


def stdlib_sample(max_bytes: int, skip: int = 0) -> list[bytes]:
    """Top-level stdlib modules (sorted by name, valid UTF-8 only), up to ``max_bytes``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for p in sorted(root.glob("*.py"))[skip:]:
        data = p.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        out.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return out


# -- from test_bpe_parity.py --------------------

MULTILINGUAL = [
    "The quick brown fox jumps over the lazy dog; it's 12,345.67 km away, isn't it?",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "Le cœur déçu mais l'âme plutôt naïve, Louÿs rêva de crapaüter en canoë.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "דג סקרן שט בים מאוכזב ולפתע מצא חברה.",
    "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ومغلف بجلد أزرق.",
    "सभी मनुष्यों को गौरव और अधिकारों के मामले में जन्मजात स्वतन्त्रता प्राप्त है।",
    "いろはにほへと ちりぬるを わかよたれそ つねならむ。東京都は日本の首都です。",
    "我能吞下玻璃而不伤身体。中华人民共和国成立于1949年。",
    "다람쥐 헌 쳇바퀴에 타고파. 대한민국의 수도는 서울이다.",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
    "Tiếng Việt có dấu: Đây là một câu thử nghiệm.",
    "ሰማይ አይታረስ ንጉሥ አይከሰስ። ᚠᛇᚻ᛫ᛒᛦᚦ ⠊⠀⠉⠁⠝ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀𓁐",
]

ADVERSARIAL = [
    "1" * 1000,
    "12345678901234567890" * 50 + " 3.14159265358979",
    " " * 3000 + "x" + "\t" * 500 + "\n" * 500 + " \n \r\n\t " * 100,
    "    \n\n\n    def f():\n\t\t  \r\n",
    "👨‍👩‍👧‍👦👩🏽‍💻🏳️‍🌈🇯🇵🇺🇸" * 30,
    "e\u0301\u0302\u0303\u0304" * 200 + "Z\u0351\u0352\u0353\u0354\u0355" * 100,
    "''''s's 't 'RE 'Ve 'LL 'd 'ſ " * 20,
    "\u00a0\u2000\u3000\u200b\ufeff\x85\x0b\x0c\x1c\x1f" * 30,
    "a" * 100_000,
    " " * 100_000,
    "日" * 100_000,
    "!" * 100_000,
    "",
]


# -- from test_blt.py --------------------


def blt_cfg(**kw):
    base = {
        "model.family": "blt",
        "model.local.d_model": 32,
        "model.local.heads": 2,
        "model.local.mlp_dim": 64,
        "model.local.window": 8,
        "model.global.d_model": 48,
        "model.global.heads": 2,
        "model.global.mlp_dim": 96,
        "model.global.layers": 1,
        "model.hash_table_size": 101,
        "model.ngram_sizes": "3,4,5",
    }
    base.update({f"model.{k}": v for k, v in kw.items()})
    return load_config(None, [f"{k}={v}" for k, v in base.items()]).model


def random_lengths(rng, total, max_patches, max_len=6, first=1):
    """Patch lengths covering ``total`` positions, the first patch ``first`` positions (the BOS alone)."""
    lengths = [first]
    while sum(lengths) < total:
        lengths.append(int(min(rng.integers(1, max_len + 1), total - sum(lengths))))
    assert len(lengths) <= max_patches
    return lengths + [0] * (max_patches - len(lengths))


# -- from test_scan.py --------------------

LM = ["model.family=byte", "model.d_model=32", "model.n_heads=2", "model.mlp_dim=64"]
MEGABYTE = [
    "model.family=megabyte",
    "model.patch_size=4",
    "model.embed_dim=8",
    "model.global.d_model=32",
    "model.global.layers=3",
    "model.global.heads=2",
    "model.global.mlp_dim=64",
    "model.local.d_model=16",
    "model.local.layers=2",
    "model.local.heads=2",
    "model.local.mlp_dim=32",
]


def _byte_batch(B=2, T=24, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(BYTE_OFFSET, 260, size=(B, T + 1)).astype(np.int32)
    ids[:, 0] = BOS_ID
    return {"ids": jnp.asarray(ids)}


# -- from test_ablate.py --------------------

# a cell that cannot be built: the micro width (16) is not a multiple of the patch size
BROKEN = """
[[family]]
name = "broken"
config = "{tiny}/megabyte.toml"
lr_from = "megabyte"
grid = {{ "model.patch_size" = [3] }}
"""


def micro_grid(tmp_path, *, broken: bool = False, families: set[str] | None = None):
    """The shipped micro grid with absolute config paths, plus the broken cell, or only some families."""
    text = (GRID_DIR / "micro.toml").read_text().replace('"../tiny/', f'"{shipped_configs() / "tiny"}/')
    if families is not None:
        head, *tables = text.split("[[family]]")
        text = head + "".join(
            f"[[family]]{t}" for t in tables if t.split('name = "')[1].split('"')[0] in families
        )
    if broken:
        text += BROKEN.format(tiny=shipped_configs() / "tiny")
    path = tmp_path / "micro.toml"
    path.write_text(text)
    return path


# -- from test_dtypes.py --------------------

FAMILIES = {
    "byte": (ByteLM, dict(family="byte", d_model=64, n_layers=2, n_heads=2, mlp_dim=128)),
    "mambabyte": (
        MambaByte,
        dict(family="mambabyte", d_model=64, n_layers=2, d_state=16, head_dim=32, chunk=16),
    ),
    "bpe": (
        lambda cfg, rngs: TokenLM(cfg, 500, rngs=rngs),
        dict(family="bpe", d_model=64, n_layers=2, n_heads=2, mlp_dim=128),
    ),
    "megabyte": (
        MegaByte,
        dict(
            family="megabyte",
            patch_size=4,
            embed_dim=16,
            **{
                "global.d_model": 64,
                "global.layers": 2,
                "global.heads": 2,
                "global.mlp_dim": 128,
                "local.d_model": 32,
                "local.layers": 1,
                "local.heads": 2,
                "local.mlp_dim": 64,
            },
        ),
    ),
    "blt": (
        BLT,
        dict(
            family="blt",
            **{
                "local.d_model": 32,
                "local.heads": 2,
                "local.mlp_dim": 64,
                "local.window": 16,
                "global.d_model": 64,
                "global.heads": 2,
                "global.mlp_dim": 128,
                "global.layers": 1,
            },
            hash_table_size=64,
            ngram_sizes="3,4",
        ),
    ),
}


def batch_for(family):
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 500 if family == "bpe" else 260, size=(4, 65)).astype(np.int32)
    ids[:, 0] = 1
    batch = {"ids": jnp.asarray(ids)}
    if family == "bpe":
        batch["nbytes"] = jnp.asarray(rng.integers(1, 5, size=(4, 64)).astype(np.int32))
    if family == "blt":
        lengths = np.zeros((4, 40), np.int32)
        lengths[:, 0], lengths[:, 1:17] = 1, 4
        batch["patch_lengths"] = jnp.asarray(lengths)
    return batch


def loss_and_grads(model, batch):
    graphdef, state = nnx.split(model, nnx.Param)

    def loss(params):
        s = nnx.merge(graphdef, params).score(batch)
        return jnp.sum(s.nll_BxT) / jnp.sum(s.mask_BxT)

    value, grads = jax.jit(jax.value_and_grad(loss))(state)
    return float(value), jax.tree.leaves(grads)
