"""The compute ledger: own + auxiliary = total, the steps that spend a budget, and what a BLT's
entropy model costs it, against values computed by hand."""

import pytest
from flax import nnx

from bytelm.config import load_config
from bytelm.errors import UserError
from bytelm.families.blt import BLTTask
from bytelm.families.byte import ByteTask
from bytelm.families.byte.model import ByteLM
from bytelm.ledger import Ledger, run_total_flops


def test_ledger_arithmetic():
    ledger = Ledger(100.0, 10.0, {"entropy model training": 40.0, "calibration": 10.0})
    assert ledger.own(10) == 1000 and ledger.auxiliary(10) == 150 and ledger.total(10) == 1150
    assert ledger.steps_for(1150) == 10  # (1150 - 50) / (100 + 10)
    assert ledger.steps_for(1200) == 10 and ledger.steps_for(1220) == 11  # 10.45 and 10.64 steps, rounded
    assert ledger.steps_for(60) == 1  # at least one step
    with pytest.raises(UserError, match=r"costs 50 FLOPs \(entropy model training 40, calibration 10\)"):
        ledger.steps_for(50)
    assert Ledger.from_record(ledger.record()) == ledger
    summary = ledger.summary(10)
    assert summary["flops_total"] == 1150 and summary["auxiliary"]["auxiliary work per step"] == 100
    # a run.json from before ledgers: its own FLOPs alone; a converted checkpoint's: unknown
    assert Ledger.of_run({"train_flops_per_position": 3.0, "positions_per_step": 4}) == Ledger(12.0)
    assert Ledger.of_run({"family": "byte"}) is None
    assert run_total_flops({"ledger": ledger.record(), "step": 10}) == 1150
    assert run_total_flops({"ledger": Ledger(1.0, unknown=("x",)).record(), "step": 3}) is None


ENTROPY = [
    "model.family=byte",
    "model.d_model=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.mlp_dim=64",
    "model.window=16",
]
BLT = [
    "model.family=blt",
    "model.threshold=1.0",
    "model.local.d_model=32",
    "model.local.heads=2",
    "model.local.mlp_dim=64",
    "model.local.window=16",
    "model.local.encoder_layers=1",
    "model.local.decoder_layers=1",
    "model.global.d_model=48",
    "model.global.heads=2",
    "model.global.mlp_dim=96",
    "model.global.layers=1",
    "model.hash_table_size=512",
    "model.ngram_sizes=3,4,5",
    "train.seq_len=64",
    "train.batch_size=8",
]


def test_blt_pays_for_its_entropy_model_by_hand():
    """The entropy model (width 32, 1 layer, SwiGLU 64, window 16, 384 padded vocabulary rows) over a
    BLT window of 65 ids, per id: 2 (4 * 32^2 + 3 * 32 * 64) = 20480 for the projections and MLP,
    4 * 32 * (16 * 17 / 2 + 49 * 16) / 65 = 117760 / 65 for the windowed scores, 2 * 32 * 384 = 24576
    for the head: 3,046,400 per window."""
    per_window = 65 * (20480 + 24576) + 117760
    assert per_window == 3_046_400
    entropy = ByteLM(load_config(None, ENTROPY).model, rngs=nnx.Rngs(0))
    trained = {"ledger": Ledger(1.0e6).record(), "step": 7}  # the entropy run's record: 7 steps of 1e6 FLOPs
    cfg = load_config(None, BLT)
    task = BLTTask(cfg, None, None, modules={"entropy_run": entropy}, records={"entropy_run": trained})
    ledger = task.ledger()
    assert ledger.own_per_step == task.train_flops_per_position() * 8 * 64
    assert ledger.auxiliary_per_step == pytest.approx(8 * per_window)  # every id of every window of a step
    assert ledger.auxiliary_fixed == pytest.approx(
        {
            "entropy model training": 7.0e6,
            "entropy model forward over the calibration sample": 64 * per_window,
        }
    )
    budget = 7.0e6 + 64 * per_window + 10 * (ledger.own_per_step + 8 * per_window)
    assert ledger.steps_for(budget) == 10 and ledger.total(10) == pytest.approx(budget)
    # a converted entropy model (no training record): its training is unknown, and said to be
    unknown = BLTTask(
        cfg, None, None, modules={"entropy_run": entropy}, records={"entropy_run": {"step": 0}}
    ).ledger()
    assert (
        unknown.unknown == ("entropy model training",)
        and "entropy model training" not in unknown.auxiliary_fixed
    )
    # space patching needs no entropy model: nothing auxiliary; a byte LM neither
    space = BLTTask(load_config(None, [*BLT, "model.patching=space"]), None, None).ledger()
    assert space.auxiliary_per_step == 0 and not space.auxiliary_fixed
    # the same byte LM trained on its own (64 positions, 8 rows):
    # 3 x (20480 + 4 * 32 * (136 + 48 * 16) / 64 + 24576) per position
    byte = ByteTask(load_config(None, [*ENTROPY, "train.seq_len=64", "train.batch_size=8"]), None).ledger()
    assert byte == Ledger(3 * (20480 + 1808 + 24576) * 8 * 64)
