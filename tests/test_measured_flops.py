"""A family charged what its steps measured (H-Net's chunk rate): ``Task.measured_train_flops``,
``train.flop_budget`` (bytelm/training/flop_budget.py) and the records and reports that carry the
measured figure."""

from __future__ import annotations

import json
import math

import pytest
from conftest import TINY_FAMILIES, word_corpus
from helpers import corpus_dir, metrics, tiny_overrides  # noqa: F401  (corpus_dir: a fixture)

from bytelm.config import load_config, shipped_configs
from bytelm.families import task_class
from bytelm.families.base import Task
from bytelm.families.hnet.flops import forward_flops_per_byte
from bytelm.training.loop import train


def hnet_cfg(**extra):
    return load_config(None, [f"{k}={v}" for k, v in {**TINY_FAMILIES["hnet"], **extra}.items()])


# -- the hook ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("stages", [1, 2])
def test_hnet_measured_flops_are_the_planned_ones_at_the_targets_and_follow_the_formula_elsewhere(stages):
    extra = {}
    if stages == 2:
        extra = {"model.stages": 2, "model.middle.d_model": 40, "model.middle.heads": 2}
        extra |= {"model.middle.mlp_dim": 64, "model.inner_target_chunk_len": 2.0}
    cfg = hnet_cfg(**extra, **{"train.batch_size": 8, "train.seq_len": 64})
    task = task_class("hnet")(cfg, None)
    assert task.measures_flops() and not task_class("byte").measures_flops()
    planned = task.train_flops_per_position() * task.positions_per_step()
    targets = cfg.model.targets()
    assert len(targets) == stages

    def stats(lengths, positions=500.0):  # a step's counts: each stage's positions and chunks
        out = {}
        for s, n in enumerate(lengths, 1):
            out[f"s{s}_positions"], out[f"s{s}_chunks"] = positions, positions / n
            positions /= n
        return out

    assert task.measured_train_flops(stats(targets)) == pytest.approx(planned, rel=1e-12)
    shorter = [n * 0.72 for n in targets]  # (the default compare's 4.32 bytes per chunk against N = 6)
    measured = task.measured_train_flops(stats(shorter))
    expected = 3 * forward_flops_per_byte(cfg.model, 64, shorter) * 8 * 64
    assert measured == pytest.approx(expected, rel=1e-12) and measured > planned
    # more chunks cost more: the main network's FLOPs grow with the innermost chunks
    assert task.measured_train_flops(stats([n * 0.5 for n in targets])) > measured
    assert task.measured_train_flops({**stats(targets), "s1_chunks": 0.0}) is None  # (no chunks: none)
    assert task.measured_train_flops({}) is None


# -- the loop -------------------------------------------------------------------------------------
def _stop_step(costs, budget):
    """The stop rule (bytelm/training/flop_budget.py): the first step whose measured total reaches the
    budget less half the mean cost of its steps."""
    total = 0.0
    for k, c in enumerate(costs, 1):
        total += c
        if total + total / k / 2 >= budget:
            return k, total
    raise AssertionError("the budget is not reached")


def test_a_flop_budget_stops_where_the_varying_measured_total_reaches_it(corpus_dir, tmp_path, monkeypatch):  # noqa: F811
    """A byte LM made to measure steps of three costs in turn (1, 1.5 and 2 times its planned FLOPs):
    it trains past its planned 12 steps to the step the rule names, its records carry the measured
    figures, and the horizon was re-planned towards that step."""
    byte = task_class("byte")
    calls: list[int] = []

    def measured(self, stats):
        calls.append(1)
        return self.ledger().own_per_step * (1.0 + 0.5 * ((len(calls) - 1) % 3))

    monkeypatch.setattr(byte, "measured_train_flops", measured)
    cfg = load_config(None, tiny_overrides(corpus_dir, **{"train.steps": 12, "eval.every": 0}))
    planned = byte(cfg, None).ledger().own_per_step
    budget = 20.0 * planned
    cfg = load_config(
        None, tiny_overrides(corpus_dir, **{"train.steps": 12, "eval.every": 0, "train.flop_budget": budget})
    )
    result = train(cfg, tmp_path / "run")
    costs = [planned * (1.0 + 0.5 * (i % 3)) for i in range(40)]
    step, total = _stop_step(costs, budget)
    assert result.step == step == len(calls) and step > 12  # (measured above plan: more than 12 steps)
    assert abs(total - budget) <= max(costs) / 2 + 1e-9 * budget
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "finished" and info["step"] == step
    assert info["flops_measured"] == pytest.approx(total) and info["flops_planned"] == pytest.approx(
        planned * step
    )
    assert info["flop_budget"] == budget
    rows = metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, step + 1))
    for r in rows:  # every record: the measured figures, with the planned one beside
        assert r["flops"] == pytest.approx(sum(costs[: r["step"]])) == pytest.approx(r["flops_total"])
        assert r["flops_planned"] == pytest.approx(planned * r["step"])
    # the horizon follows the measured FLOPs (planned at 12 steps on the planned ones): the schedule
    # ends within a step or two of the stop
    plans = [r for r in metrics(tmp_path / "run", kind="plan")]
    assert plans and abs(info["planned_steps"] - step) <= 2 and info["planned_steps"] != 12


def test_a_run_without_a_measurement_trains_its_steps_whatever_the_budget(corpus_dir, tmp_path):  # noqa: F811
    cfg = load_config(
        None, tiny_overrides(corpus_dir, **{"train.steps": 5, "eval.every": 0, "train.flop_budget": 1e3})
    )
    assert train(cfg, tmp_path / "run").step == 5
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert "flops_measured" not in info and "flops_planned" not in metrics(tmp_path / "run")[0]


HNET_RUN = {
    **TINY_FAMILIES["hnet"],
    "model.target_chunk_len": 4.0,
    "data.segment_bytes": 48,
    "data.max_eval_bytes": 2400,
    "data.heldout_fraction": 0.2,
    "train.batch_size": 4,
    "train.seq_len": 64,
    "train.steps": 8,
    "train.warmup_steps": 2,
    "train.log_every": 1,
    "train.checkpoint_every": 3,
    "train.peak_flops": 1e11,
    "eval.every": 0,
    "eval.batch_size": 4,
}


@pytest.mark.slow
def test_an_interrupted_hnet_run_stops_where_the_uninterrupted_one_does(tmp_path):
    corpus = word_corpus(tmp_path / "corpus", n_docs=40, words_per_doc=120, two_dirs=True)
    base = {"data.source": f"files:{corpus}", **HNET_RUN}
    planned = task_class("hnet")(load_config(None, [f"{k}={v}" for k, v in base.items()]), None).ledger()
    budget = 8.0 * planned.own_per_step
    cfg = load_config(None, [f"{k}={v}" for k, v in {**base, "train.flop_budget": budget}.items()])
    whole = train(cfg, tmp_path / "whole")
    first = train(cfg, tmp_path / "resumed", stop_after=4)  # (its last checkpoint: step 3)
    assert first.step == 4
    resumed = train(cfg, tmp_path / "resumed")
    a, b = (json.loads((tmp_path / d / "run.json").read_text()) for d in ("whole", "resumed"))
    assert resumed.step == whole.step == a["step"] == b["step"] and a["status"] == b["status"] == "finished"
    assert b["flops_measured"] == a["flops_measured"] and b["planned_steps"] == a["planned_steps"]
    assert abs(a["flops_measured"] - budget) <= a["flops_measured"] / a["step"]  # (within about half a step)
    # the router's rate is not the target: the measured figure is not the planned one
    assert a["flops_measured"] != pytest.approx(a["flops_planned"], rel=1e-6)
    rows = {r["step"]: r for r in metrics(tmp_path / "whole")}
    for r in metrics(tmp_path / "resumed"):
        assert r["loss"] == rows[r["step"]]["loss"] and r["flops"] == rows[r["step"]]["flops"]


# -- compare ----------------------------------------------------------------------------------------
PRESET = """
[compare]
flop_budget = 1.0e10
eval_points = 1
set = [
    "data.segment_bytes=64", "data.max_eval_bytes=2048",
    "train.batch_size=8", "train.seq_len=64", "train.log_every=5", "train.checkpoint_every=1000",
    "train.peak_flops=1e11", "eval.eval_bytes=512", "eval.batch_size=8",
]

[[model]]
name = "hnet"
config = "{config}"
set = [{sets}]
"""


@pytest.mark.slow
def test_compare_charges_an_hnet_the_budget_it_measured(tmp_path):
    from bytelm.experiments import compare as cmp  # noqa: PLC0415

    corpus = word_corpus(tmp_path / "corpus", words_per_doc=200, two_dirs=True)
    hnet = {**TINY_FAMILIES["hnet"], "model.chunk_slots": 2.0}
    sets = ", ".join(f'"{k}={v}"' for k, v in hnet.items() if k != "model.family")
    preset = tmp_path / "hnet.toml"
    preset.write_text(PRESET.format(config=shipped_configs() / "tiny" / "hnet.toml", sets=sets))
    result = cmp.compare(str(preset), tmp_path / "cmp", data_spec=f"files:{corpus}")
    plan = result.report["compare"]["models"]["hnet"]
    row = next(m for m in result.report["models"] if m["name"] == "hnet")
    assert 0.99 <= plan["charged_over_measured"] <= 1.01  # (about 70 steps: half a step is under 1%)
    assert row["flops"] == plan["flops_measured"] == pytest.approx(1.0e10 / plan["charged_over_measured"])
    assert (
        row["flops_planned"] == plan["flops_planned"] == pytest.approx(plan["flops_per_step"] * row["step"])
    )
    assert row["flops_total"] == row["flops"] and math.isfinite(row["bpb"])
    assert "measured (charged)" in row["note"]  # (report.json's note for the model)
    # the router's rate is not the target (slots for twice the target's chunks): the planned figure
    # is not what it spent
    assert row["flops_planned"] != pytest.approx(row["flops"], rel=1e-6)
    cfg = (tmp_path / "cmp" / "runs" / "hnet" / "config.toml").read_text()
    assert "flop_budget = 10000000000.0" in cfg


def test_the_base_task_measures_nothing():
    assert Task.measured_train_flops(Task(None, None), {"s1_positions": 1.0}) is None
    assert not Task.measures_flops()
