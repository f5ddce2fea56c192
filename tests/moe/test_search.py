"""Exhaustive and halving search: winners, evaluation counts, bad input, halving against a shared machine's noise."""

from __future__ import annotations

import random

import pytest

from workflow_scripts.moe.search import distinct, exhaustive, run_search, successive_halving

COSTS = [5.0, 3.0, 9.0, 1.0, 4.0, 7.0, 2.0, 8.0, 6.0, 1.5, 11.0, 10.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0]
# The CPU tuner's space, strategy-major: loop, sorted, gather_bmm x block_m 8..256.
SPACE = [(s, b) for s in ("loop", "sorted", "gather_bmm") for b in (8, 16, 32, 64, 128, 256)]


def counted(costs):
    calls = []

    def measure(i):
        calls.append(i)
        return costs[i]

    return measure, calls


def same_work(M):
    """The tuner's key: every block_m >= M runs the same single chunk."""
    return lambda i: (SPACE[i][0], min(SPACE[i][1], M))


def table(M, one_chunk, chunked=None):
    """Costs per config at M tokens: one_chunk[strategy] when block_m >= M, else chunked[(strategy, block_m)]."""
    return [one_chunk[s] if b >= M else chunked[(s, b)] for s, b in SPACE]


def shared_machine(costs, seed):
    """A seeded stand-in for a shared 2-core machine: load phases that hold for 5-40 samples (up to 1.8x),
    bursts over 3-10 consecutive samples (1.2-2.2x), rare spikes (1.5-3x) and 2% jitter. Noise only adds time."""
    rng = random.Random(seed)
    state = {"phase": 0, "level": 1.0, "burst": 0, "factor": 1.0}

    def measure(i):
        if state["phase"] == 0:
            state["phase"], state["level"] = rng.randint(5, 40), rng.uniform(1.0, 1.8)
        state["phase"] -= 1
        if state["burst"] == 0 and rng.random() < 0.01:
            state["burst"], state["factor"] = rng.randint(3, 10), rng.uniform(1.2, 2.2)
        burst = state["factor"] if state["burst"] else 1.0
        state["burst"] = max(0, state["burst"] - 1)
        spike = rng.uniform(1.5, 3.0) if rng.random() < 0.01 else 1.0
        return costs[i] * state["level"] * burst * spike * (1 + abs(rng.gauss(0, 0.02)))

    return measure


def test_exhaustive_measures_everything_repeats_times():
    measure, calls = counted(COSTS)
    result = exhaustive(len(COSTS), measure, repeats=10)
    assert result.best == 3 and result.best_s == 1.0
    assert result.evaluations == len(calls) == 180
    assert calls[:18] == list(range(18))  # round-robin, not one config at a time


def test_a_candidate_is_scored_by_its_fastest_sample():
    """One preempted (slow) sample does not sink a config that is fastest on its others."""
    samples = {0: iter([9.0, 1.0]), 1: iter([2.0, 2.0]), 2: iter([3.0, 3.0])}
    result = exhaustive(3, lambda i: next(samples[i]), repeats=2)
    assert (result.best, result.best_s) == (0, 1.0)
    assert result.scores() == {0: 1.0, 1: 2.0, 2: 3.0}


def test_halving_finds_the_best_with_a_fifth_of_the_evaluations():
    measure, calls = counted(COSTS)
    result = successive_halving(len(COSTS), measure)
    assert result.best == 3 and result.best_s == 1.0
    # 18 once, the best 6 once more, the final 2 the remaining 12 samples: 2 per config of the space
    assert result.evaluations == len(calls) == 36 == 180 // 5
    assert sorted(len(s) for s in result.samples.values())[-2:] == [8, 8]


def test_equivalent_candidates_are_measured_as_one_and_the_budget_goes_to_the_finalists():
    costs = table(4, {"loop": 1.25, "sorted": 1.0, "gather_bmm": 4.3}, {("loop", 8): 1.25, ("sorted", 8): 1.0})
    measure, calls = counted(costs)
    result = successive_halving(len(SPACE), measure, key=same_work(4))
    assert set(calls) == {5, 11, 17}  # one per strategy: the last config, block_m 256
    assert SPACE[result.best] == ("sorted", 256)
    assert result.evaluations == 36 and all(calls.count(i) == 12 for i in (5, 11, 17))


def test_distinct_keeps_the_last_of_each_key_in_order():
    assert distinct(4, None) == [0, 1, 2, 3]
    assert distinct(6, lambda i: i // 3) == [2, 5]
    assert [SPACE[i] for i in distinct(len(SPACE), same_work(24))][:3] == [("loop", 8), ("loop", 16), ("loop", 256)]


@pytest.mark.parametrize("n", range(1, 41))
@pytest.mark.parametrize("classes", [None, 1, 3, 6, 12])
def test_halving_stays_within_its_budget_and_its_cost_is_fixed(n, classes):
    key = None if classes is None else (lambda i: i % classes)
    runs = []
    for seed in (1, 2):
        measure, calls = counted([random.Random(seed * 100 + i).uniform(1, 2) for i in range(n)])
        result = successive_halving(n, measure, key=key)
        assert result.evaluations == len(calls) <= max(1, 2 * n)
        runs.append(result.evaluations)
    assert runs[0] == runs[1]  # the cost depends on n and the keys, not on the timings


def test_a_load_phase_over_one_strategy_in_the_first_pass_does_not_decide():
    """A miss at M=4 seen live, replayed: the first pass visited the space in order and heavier load fell on the
    sorted block (samples 6-11), then the whole machine slowed. Loop's fastest samples, from the lighter start,
    beat every sorted sample, and the old halving kept only loop configs after its first round."""
    costs = table(4, {"loop": 1.25, "sorted": 1.0, "gather_bmm": 4.3}, {("loop", 8): 1.25, ("sorted", 8): 1.0})
    for key in (None, same_work(4)):
        taken = []

        def measure(i):
            k = len(taken)
            taken.append(i)
            return costs[i] * (1.5 if 6 <= k < 12 else 1.3 if k >= 18 else 1.0)

        result = successive_halving(len(SPACE), measure, key=key)
        assert SPACE[result.best][0] == "sorted"


@pytest.mark.parametrize("M, costs", [
    (2, table(2, {"loop": 1.24, "sorted": 1.0, "gather_bmm": 4.3})),
    (64, table(64, {"loop": 1.05, "sorted": 1.0, "gather_bmm": 30.0},
               {**{("loop", b): c for b, c in ((8, 5.2), (16, 2.85), (32, 1.77))},
                **{("sorted", b): c for b, c in ((8, 4.4), (16, 2.65), (32, 1.55))},
                **{("gather_bmm", b): 30.0 for b in (8, 16, 32)}})),
    (256, table(256, {"loop": 1.01, "sorted": 1.0, "gather_bmm": 40.0},
                {**{("loop", b): c for b, c in ((8, 6.0), (16, 3.6), (32, 2.4), (64, 1.6), (128, 1.22))},
                 **{("sorted", b): c for b, c in ((8, 5.0), (16, 3.1), (32, 2.2), (64, 1.54), (128, 1.19))},
                 **{("gather_bmm", b): 40.0 for b in (8, 16, 32, 64, 128)}})),
])
def test_halving_is_within_2_percent_of_the_best_under_shared_machine_noise(M, costs):
    """Cost tables shaped like the default target's (E16 top-4); 300 seeded runs each, every one within 2%.

    (Over 5000 seeds of this noise, harsher than the machine's, the old schedule missed in 1-8% of the runs,
    this one in at most 0.2%, at the M=64 table, whose runner-up is 5% off.)
    """
    best = min(costs)
    regrets = [costs[successive_halving(len(SPACE), shared_machine(costs, seed), key=same_work(M)).best] / best - 1
               for seed in range(300)]
    assert max(regrets) <= 0.02


def test_single_candidate_and_bad_input():
    assert successive_halving(1, lambda i: 1.0).evaluations == 1
    assert successive_halving(18, lambda i: 1.0, key=lambda i: "same").evaluations == 1
    with pytest.raises(ValueError, match="moe.search: unknown search 'random'"):
        run_search("random", 3, lambda i: 1.0, 2)
    with pytest.raises(ValueError, match="repeats >= 1"):
        exhaustive(3, lambda i: 1.0, 0)
    with pytest.raises(ValueError, match="budget 20 is below the 26 samples that 18 distinct candidates need"):
        successive_halving(18, lambda i: 1.0, budget=20)
