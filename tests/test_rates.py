"""The learning-rate selection of compare and ablate: the grid first, then up to two rates past the
end where the best sits, each the grid's own ratio away; failed rates lose."""

import math

import pytest

from bytelm.errors import UserError
from bytelm.experiments.rates import RateSearch

GRID = (3e-3, 1e-2, 3e-2)  # ratios: 10/3 down, 3 up


def run_search(objective, grid=GRID, **kw):
    """Drive a search on ``objective(lr)`` (None: the run failed); returns the choice and the rounds."""
    search, scores, rounds = RateSearch(grid, **kw), {}, []
    while rates := search.next_rates(scores):
        rounds.append(rates)
        for lr in rates:
            assert lr not in scores, f"{lr} asked for twice"
            scores[lr] = objective(lr)
    return search.choose(scores), rounds


def bowl(center):
    """A convex objective in log(lr) with its minimum at ``center``."""
    return lambda lr: (math.log(lr) - math.log(center)) ** 2


def test_an_interior_best_needs_no_extension():
    choice, rounds = run_search(bowl(1e-2))
    assert rounds == [list(GRID)]
    assert choice.chosen == 1e-2 and choice.extensions == 0 and not choice.at_edge


def test_best_at_the_upper_end_extends_up_by_the_grids_ratio_until_bracketed():
    choice, rounds = run_search(
        bowl(0.1)
    )  # 0.03 best of the grid -> 0.09 (x3) is better -> 0.27 is worse: bracketed
    assert rounds == [list(GRID), [0.09], [0.27]]
    assert choice.chosen == 0.09 and choice.extensions == 2 and not choice.at_edge
    assert set(choice.scores) == {*GRID, 0.09, 0.27}


def test_best_at_the_lower_end_extends_down_by_the_grids_ratio():
    choice, rounds = run_search(bowl(2e-3))  # 0.003 best -> 0.0009 (/ (10/3)) is worse: bracketed after one
    assert rounds == [list(GRID), [0.0009]]
    assert choice.chosen == 3e-3 and choice.extensions == 1 and not choice.at_edge


def test_two_extensions_at_most_then_the_edge_is_flagged():
    choice, rounds = run_search(lambda lr: -lr)  # always better higher: never bracketed
    assert rounds == [list(GRID), [0.09], [0.27]]
    assert choice.chosen == 0.27 and choice.extensions == 2 and choice.at_edge
    record = choice.record()
    assert record["at_edge"] and list(record["validation_bpb"]) == ["0.003", "0.01", "0.03", "0.09", "0.27"]
    choice, rounds = run_search(lambda lr: lr, max_extensions=1)
    assert rounds == [list(GRID), [0.0009]] and choice.at_edge and choice.chosen == 0.0009


def test_a_failed_rate_loses_and_brackets_the_search():
    # 0.03 is best of the grid; 0.09 diverges (None), so 0.03 is bracketed and chosen
    choice, rounds = run_search(lambda lr: None if lr > 0.05 else -lr)
    assert rounds == [list(GRID), [0.09]] and choice.chosen == 3e-2 and not choice.at_edge
    assert choice.scores[0.09] is None and choice.record()["validation_bpb"]["0.09"] is None
    nan_choice, _ = run_search(lambda lr: math.nan if lr > 0.05 else -lr)
    assert nan_choice.chosen == 3e-2
    everything_fails, _ = run_search(lambda lr: None)
    assert everything_fails.chosen is None and not everything_fails.at_edge


def test_ties_pick_the_lower_rate_and_a_single_rate_is_not_extended():
    choice, rounds = run_search(
        lambda lr: 2.0 if lr < 5e-3 else 1.0
    )  # 0.01 and 0.03 tie: the lower, an interior rate
    assert choice.chosen == 1e-2 and rounds == [list(GRID)]
    single, rounds = run_search(lambda lr: 1.0, grid=(1e-3,))
    assert rounds == [[1e-3]] and single.chosen == 1e-3 and not single.at_edge


@pytest.mark.parametrize("grid", [(), (1e-3, 1e-3), (-1e-3, 1e-2), (0.0, 1.0)])
def test_bad_grids_are_refused(grid):
    with pytest.raises(UserError, match="distinct positive"):
        RateSearch(grid)
