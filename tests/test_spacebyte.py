"""SpaceByte (bytelm/families/spacebyte): the spacelike rule against a plain transcription of the
paper's definition, causality with overflowing windows, batch invariance, the FLOP count's measured
rate, and a run end to end (train, evaluate, sample)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bytelm.constants import BOS_ID, BYTE_OFFSET, NUM_BYTE_IDS, PAD_ID
from bytelm.families.spacebyte.config import SpaceByteConfig
from bytelm.families.spacebyte.model import SpaceByte, global_starts
from bytelm.models.configs import replace_fields

# texts in several scripts (written here: tests do not read the shared corpora)
TEXTS = [
    "All human beings are born free and equal in dignity and rights.",
    "Alle Menschen sind frei und gleich an Würde und Rechten geboren.",
    "Все люди рождаются свободными и равными в своем достоинстве и правах.",
    "Όλοι οι άνθρωποι γεννιούνται ελεύθεροι και ίσοι στην αξιοπρέπεια.",
    "人人生而自由，在尊严和权利上一律平等。",
    "すべての人間は、生まれながらにして自由であり、かつ、尊厳と権利とについて平等である。",
    "มนุษย์ทั้งหลายเกิดมามีอิสระและเสมอภาคกันในเกียรติศักด์และสิทธิ",
    "يولد جميع الناس أحرارًا متساوين في الكرامة والحقوق.",
    "def f(x_1, y2):\n    return x_1 * 3.5e-2 + y2  # 42%\n",
]


def paper_spacelike(b: int) -> bool:
    """The paper's (and its code's) definition, as written there."""
    return b < 0x30 or 0x39 < b < 0x41 or 0x5A < b < 0x61 or 0x7A < b < 0x80 or b >= 0xC0


def paper_globals(data: bytes) -> list[bool]:
    """``[BOS, bytes...]``: BOS is global; a byte is global when it is spacelike and the one before it
    is not (BOS counts as spacelike)."""
    out, prev = [True], True
    for b in data:
        s = paper_spacelike(b)
        out.append(s and not prev)
        prev = s
    return out


def ids_of(data: bytes) -> np.ndarray:
    return np.array([BOS_ID, *(b + BYTE_OFFSET for b in data)], np.int32)


@pytest.mark.parametrize("text", TEXTS)
def test_global_positions_follow_the_paper_s_rule_in_every_script(text):
    data = text.encode()
    got = np.asarray(global_starts(jnp.asarray(ids_of(data)[None])))[0]
    assert got.tolist() == paper_globals(data)


def test_global_positions_on_random_bytes_pads_and_documents():
    rng = np.random.default_rng(0)
    for n in (1, 2, 17, 300):
        data = rng.integers(0, 256, n).astype(np.uint8).tobytes()
        got = np.asarray(global_starts(jnp.asarray(ids_of(data)[None])))[0]
        assert got.tolist() == paper_globals(data)
        assert [paper_spacelike(b) for b in range(256)].count(True) == 256 - 10 - 52 - 64
    ids = np.concatenate([ids_of(b"ab cd"), ids_of(b"ef"), np.full(3, PAD_ID, np.int32)])[None]
    got = np.asarray(global_starts(jnp.asarray(ids)))[0].astype(int).tolist()
    assert got == [1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0]  # every BOS global, a PAD never


def tiny(**kw):
    base = {
        "local.d_model": 32,
        "local.heads": 2,
        "local.mlp_dim": 64,
        "local.encoder_layers": 1,
        "local.decoder_layers": 1,
        "local.window": 8,
        "global.d_model": 48,
        "global.layers": 1,
        "global.heads": 2,
        "global.mlp_dim": 64,
        "bytes_per_slot": 8.0,  # few slots: windows of words overflow
    }
    return replace_fields(SpaceByteConfig(), {**base, **kw})


def word_ids(B: int, T: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(B):
        words = [bytes(rng.integers(97, 123, rng.integers(1, 5)).astype(np.uint8)) for _ in range(T)]
        rows.append(ids_of(b" ".join(words))[:T])
    return np.stack(rows)


@pytest.mark.slow
def test_bytes_after_t_change_no_log_probability_up_to_t_even_when_windows_overflow():
    m = SpaceByte(tiny(), rngs=nnx.Rngs(0))
    B, T = 2, 48
    ids = word_ids(B, T, 1)
    s = m.score({"ids": jnp.asarray(np.concatenate([ids, ids[:, :1]], axis=1))})
    assert float(s.stats["overflow_windows"]) == B  # short words: more boundaries than the 6 slots
    full = np.asarray(m(jnp.asarray(ids)))
    for t in (4, 17, 33):
        changed = ids.copy()
        changed[:, t + 1 :] = np.random.default_rng(t).integers(4, NUM_BYTE_IDS, (B, T - t - 1))
        got = np.asarray(m(jnp.asarray(changed)))
        np.testing.assert_allclose(got[:, : t + 1], full[:, : t + 1], atol=1e-5)
        assert np.abs(got[:, t + 1 :] - full[:, t + 1 :]).max() > 1e-3


def test_a_row_s_scores_do_not_depend_on_the_rows_beside_it():
    m = SpaceByte(tiny(), rngs=nnx.Rngs(1))
    ids = word_ids(3, 40, 2)
    ids[1, 25:] = PAD_ID
    together = np.asarray(m(jnp.asarray(ids)))
    for r in range(3):
        alone = np.asarray(m(jnp.asarray(ids[r : r + 1])))[0]
        np.testing.assert_allclose(alone, together[r], atol=1e-5)


def test_measured_flops_follow_the_global_rate():
    from bytelm.config import load_config
    from bytelm.families import task_class

    cfg = load_config(None, ["model.family=spacebyte", "train.seq_len=256", "train.batch_size=4"])
    task = task_class("spacebyte")(cfg, None)
    positions = 4 * 256.0
    at_slots = task.measured_train_flops({"positions": positions, "globals": positions / 6.0})
    assert at_slots == pytest.approx(task.train_flops_per_position() * task.positions_per_step())
    fewer = task.measured_train_flops({"positions": positions, "globals": positions / 12.0})
    g = cfg.model.global_
    per_global = 2.0 * (4 * g.d_model**2 + 3 * g.d_model * g.mlp_dim) * g.layers  # (+ attention)
    assert at_slots - fewer > 3.0 * per_global * (positions / 6 - positions / 12)
    assert task.measured_train_flops({"positions": positions, "globals": 0.0}) is None


@pytest.fixture(scope="module")
def spacebyte_run(tmp_path_factory):
    from conftest import word_corpus

    from bytelm.config import load_config
    from bytelm.training.loop import train

    root = tmp_path_factory.mktemp("spacebyte")
    corpus = word_corpus(root / "corpus", n_docs=40, words_per_doc=120, two_dirs=True)
    overrides = {
        "data.source": f"files:{corpus}",
        "model.family": "spacebyte",
        **{f"model.{k}": v for k, v in tiny().__dict__.items() if k == "bytes_per_slot"},
        "model.local.d_model": 32,
        "model.local.heads": 2,
        "model.local.mlp_dim": 64,
        "model.local.window": 16,
        "model.global.d_model": 48,
        "model.global.layers": 1,
        "model.global.heads": 2,
        "model.global.mlp_dim": 64,
        "data.segment_bytes": 48,
        "data.max_eval_bytes": 2400,
        "data.heldout_fraction": 0.2,
        "train.batch_size": 4,
        "train.seq_len": 64,
        "train.steps": 3,
        "train.warmup_steps": 1,
        "train.log_every": 1,
        "train.checkpoint_every": 100,
        "train.peak_flops": 1e11,
        "eval.every": 0,
        "eval.batch_size": 4,
    }
    train(load_config(None, [f"{k}={v}" for k, v in overrides.items()]), root / "run")
    return root / "run"


@pytest.mark.slow
def test_a_run_trains_evaluates_and_samples(spacebyte_run, tmp_path, capsys):
    from bytelm import cli

    info = json.loads((spacebyte_run / "run.json").read_text())
    assert 1.0 < info["bytes_per_global"] < 64 and 0 <= info["overflow_windows"] <= 1
    assert info["flops_measured"] > 0 and info["flops_planned"] > 0
    assert cli.main(["eval", str(spacebyte_run), "--json", str(tmp_path / "r.json")]) == 0
    (model,) = json.loads((tmp_path / "r.json").read_text())["models"]
    assert model["family"] == "spacebyte" and model["note"].startswith("train ")
    for group in model["dirs"].values():  # per directory: bytes per global position, counted by the model
        assert group["global_steps"] >= group["segments"]
        assert group["mean_bytes_per_global_step"] == pytest.approx(group["bytes"] / group["global_steps"])
    assert (
        cli.main(["sample", str(spacebyte_run), "--prompt", "the ", "--max-bytes", "8", "--seed", "0"]) == 0
    )


@pytest.mark.slow
def test_the_batched_cache_equals_the_full_pass_at_every_step():
    """Rows with prompts of different lengths (a second document in one), fed byte by byte after the
    prefill: every step's logits equal the full pass over the same prefix (1e-4), in windows whose
    global positions overflow their slots, and the global stack ran once per kept global position."""
    import jax

    from bytelm.families.spacebyte.decoder import SpaceByteSampler

    m = SpaceByte(tiny(), rngs=nnx.Rngs(2))
    T = 40
    ids = word_ids(3, T, 5)
    ids[2, 9] = BOS_ID
    lengths = [1, 5, 12]
    sampler = SpaceByteSampler(m, T)
    forward = jax.jit(lambda x: m(x))

    def reference(row, n):
        x = np.full((1, T), PAD_ID, np.int32)
        x[0, :n] = ids[row, :n]
        return np.asarray(forward(x))[0, n - 1]

    logits = sampler.prefill([ids[i, :n].tolist() for i, n in enumerate(lengths)])
    worst = 0.0
    for step in range(T - max(lengths)):
        for i, n in enumerate(lengths):
            worst = max(worst, float(np.abs(logits[i] - reference(i, n + step)).max()))
        logits = sampler.step([int(ids[i, n + step]) for i, n in enumerate(lengths)])
    assert worst < 1e-4
    fed = [n + T - max(lengths) for n in lengths]  # each row's bytes through the sampler
    prefixes = np.full((3, T), PAD_ID, np.int32)
    for i, n in enumerate(fed):
        prefixes[i, :n] = ids[i, :n]
    kept = np.asarray(m.forward(jnp.asarray(prefixes))[1]).sum(axis=1)  # the full pass's kept positions
    np.testing.assert_array_equal(sampler.globals_so_far(), kept)
    assert kept.max() == m.cfg.slots_for(T)  # the slot rule was at work
