"""Exhaustive and halving search on known cost tables: winners, evaluation counts, bad input."""

from __future__ import annotations

import pytest

from workflow_scripts.moe.search import exhaustive, run_search, successive_halving

COSTS = [5.0, 3.0, 9.0, 1.0, 4.0, 7.0, 2.0, 8.0, 6.0, 1.5, 11.0, 10.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0]


def counted(costs):
    calls = []

    def measure(i):
        calls.append(i)
        return costs[i]

    return measure, calls


def test_exhaustive_measures_everything_repeats_times():
    measure, calls = counted(COSTS)
    result = exhaustive(len(COSTS), measure, repeats=10)
    assert result.best == 3 and result.best_s == 1.0
    assert result.evaluations == len(calls) == 180
    assert calls[:18] == list(range(18))  # round-robin, not one config at a time


def test_halving_finds_the_best_with_under_a_fifth_of_the_evaluations():
    measure, calls = counted(COSTS)
    result = successive_halving(len(COSTS), measure)
    assert result.best == 3
    # 18 once, the best 6 up to 2 samples, the final 2 up to 7: 18 + 6 + 10
    assert result.evaluations == len(calls) == 34
    assert result.evaluations / 180 <= 0.2


def test_a_candidate_is_scored_by_its_fastest_sample():
    """One preempted (slow) sample does not sink a config that is fastest on its others."""
    samples = {0: iter([9.0, 1.0]), 1: iter([2.0, 2.0]), 2: iter([3.0, 3.0])}
    result = exhaustive(3, lambda i: next(samples[i]), repeats=2)
    assert (result.best, result.best_s) == (0, 1.0)
    assert result.scores() == {0: 1.0, 1: 2.0, 2: 3.0}


def test_single_candidate_and_bad_input():
    assert successive_halving(1, lambda i: 1.0).evaluations == 1
    with pytest.raises(ValueError, match="moe.search: unknown search 'random'"):
        run_search("random", 3, lambda i: 1.0, 2)
    with pytest.raises(ValueError, match="repeats >= 1"):
        exhaustive(3, lambda i: 1.0, 0)
