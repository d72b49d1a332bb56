"""The ten-minute sweep's rule for choosing a group's winner at one or two paces (benchmarks/cpu_sweep.py)."""

import importlib.util
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(
    0, str(Path(__file__).parents[1] / "benchmarks")
)  # (as when the script runs: its helpers beside it)
_spec = importlib.util.spec_from_file_location(
    "cpu_sweep", Path(__file__).parents[1] / "benchmarks" / "cpu_sweep.py"
)
cpu_sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpu_sweep)
pick = cpu_sweep.pick


def test_one_pace_picks_the_lowest():
    rng = np.random.default_rng(0)
    for _ in range(200):
        scores = rng.uniform(1.2, 1.6, size=int(rng.integers(1, 8)))
        assert pick([(float(b),) for b in scores]) == int(np.argmin(scores))


def test_a_candidate_that_loses_at_either_pace_does_not_replace_the_best_so_far():
    # the thirteenth round's shape: better at 600 s, worse at 1,400 steps, and the reverse
    assert pick([(1.3452, 1.3255), (1.3380, 1.3300)]) == 0
    assert pick([(1.3452, 1.3255), (1.3500, 1.3102)]) == 0
    assert pick([(1.3452, 1.3255), (1.3380, 1.3102)]) == 1
    assert pick([(1.3452, 1.3255), (1.3452, 1.3102)]) == 0  # a tie is not a win


def test_of_several_better_candidates_the_largest_combined_gain_wins():
    # 1: -2% and -0.1%; 2: -1% and -1.5% (product of ratios 0.979 vs 0.975)
    assert pick([(1.0, 2.0), (0.98, 1.998), (0.99, 1.97)]) == 2


@pytest.mark.parametrize("paces", [2, 3])
def test_random_groups(paces):
    rng = np.random.default_rng(paces)
    for _ in range(300):
        scores = [
            tuple(float(x) for x in row)
            for row in rng.uniform(1.2, 1.6, size=(int(rng.integers(1, 6)), paces))
        ]
        w = pick(scores)
        dominating = [i for i in range(1, len(scores)) if all(b < f for b, f in zip(scores[i], scores[0]))]
        if not dominating:
            assert w == 0
        else:
            gain = {i: sum(math.log(b / f) for b, f in zip(scores[i], scores[0])) for i in dominating}
            assert w in dominating and gain[w] == min(gain.values())


def test_seeds_train_one_run_each_and_average_reusing_seed_0(tmp_path, monkeypatch):
    # training and scoring replaced: each run's score is 1 + seed / 10, read from its --set flags
    trained: dict[str, int] = {}

    def fake_bytelm(*args):
        seed = max([int(a.rsplit("=", 1)[1]) for a in args if a.startswith("--set=train.seed=")], default=0)
        out = args[args.index("--out") + 1]
        Path(out).mkdir(parents=True)  # a second training of one run would fail here
        trained[out] = seed

    def fake_evaluate(run_dir, eval_set):
        return types.SimpleNamespace(
            bpb=1.0 + trained[str(run_dir)] / 10, step=50 + trained[str(run_dir)], params={"total": 7}
        )

    monkeypatch.setattr(cpu_sweep, "bytelm", fake_bytelm)
    monkeypatch.setattr(cpu_sweep, "evaluate_run", fake_evaluate)
    one = cpu_sweep.Sweep(tmp_path, "files:x", 5.0, {})
    one.validation = types.SimpleNamespace(fingerprint="f")
    single = one.score("p", "byte", ("a=1",), (), steps=10)
    assert single["validation_bpb"] == 1.0 and len(trained) == 1

    three = cpu_sweep.Sweep(tmp_path, "files:x", 5.0, {}, seeds=3)
    three.validation = one.validation
    row = three.score("p", "byte", ("a=1",), (), steps=10)
    assert len(trained) == 3  # seed 0's run was reused, seeds 1 and 2 trained
    assert sorted(trained.values()) == [0, 1, 2]
    assert row["validation_bpb"] == pytest.approx(1.1)
    assert [s["validation_bpb"] for s in row["seeds"]] == pytest.approx([1.0, 1.1, 1.2])
    assert [s["steps"] for s in row["seeds"]] == [50, 51, 52]
    assert three.score("p", "byte", ("a=1",), (), steps=10) == row and len(trained) == 3  # all cached now
