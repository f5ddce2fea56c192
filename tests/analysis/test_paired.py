"""Paired statistics (analysis/paired.py): known values, the verdict rules, and why pairing matters under drift."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workflow_scripts.analysis.paired import (NO_DATA, REAL, WITHIN_NOISE, Paired, VariancePrior, noise_floor_pct,
                                              paired_ratio, verdict)


def test_geometric_mean_of_round_ratios_with_a_t_interval_on_logs():
    control = np.array([100.0, 200.0, 50.0])
    candidate = control * np.array([1.10, 1.20, 1.15])
    p = paired_ratio(control, candidate)
    logs = np.log([1.10, 1.20, 1.15])
    assert p.diff_pct == pytest.approx((math.exp(logs.mean()) - 1) * 100)
    half = 4.302652729911275 * logs.std(ddof=1) / math.sqrt(3)  # t(0.975, 2)
    assert p.ci_low_pct == pytest.approx((math.exp(logs.mean() - half) - 1) * 100)
    assert p.ci_high_pct == pytest.approx((math.exp(logs.mean() + half) - 1) * 100)
    assert p.rounds == 3 and p.half_width_pct == pytest.approx((p.ci_high_pct - p.ci_low_pct) / 2)


def test_a_projection_keeps_the_mean_and_spread_and_narrows_by_rounds_and_degrees_of_freedom():
    """What 8 rounds would show were the mean and spread of these 3 what they are: t(0.975, 7) × s ÷ √8."""
    control = np.array([100.0, 200.0, 50.0])
    p = paired_ratio(control, control * np.array([1.10, 1.20, 1.15]))
    assert p.projected(3) == p
    logs = np.log([1.10, 1.20, 1.15])
    later = p.projected(8)
    half = 2.364624251592785 * logs.std(ddof=1) / math.sqrt(8)  # t(0.975, 7)
    assert later.diff_pct == pytest.approx(p.diff_pct) and later.rounds == 8
    assert later.ci_low_pct == pytest.approx((math.exp(logs.mean() - half) - 1) * 100)
    assert math.isnan(paired_ratio(control[:1], control[:1] * 1.1).projected(8).ci_low_pct)  # no spread yet


def test_a_round_without_a_control_value_gives_no_ratio_never_zero():
    p = paired_ratio(np.array([np.nan, 100.0, 0.0]), np.array([120.0, 110.0, 130.0]))
    assert p.rounds == 1 and p.diff_pct == pytest.approx(10.0) and math.isnan(p.ci_low_pct)
    assert verdict(p, 1.0) == WITHIN_NOISE  # one round: no CI, nothing is real
    empty = paired_ratio(np.array([np.nan, np.nan]), np.array([1.0, 2.0]))
    assert empty.rounds == 0 and verdict(empty, 1.0) == NO_DATA
    with pytest.raises(ValueError, match="align by round"):
        paired_ratio(np.array([1.0]), np.array([1.0, 2.0]))


def test_verdict_needs_a_ci_excluding_zero_and_an_effect_beyond_the_floor():
    assert verdict(Paired(8.0, 5.0, 11.0, 4), floor_pct=3.0) == REAL
    assert verdict(Paired(-8.0, -11.0, -5.0, 4), floor_pct=3.0) == REAL  # a real slowdown
    assert verdict(Paired(4.0, 1.0, 7.0, 4), floor_pct=5.0) == WITHIN_NOISE  # CI excludes 0, but inside the floor
    assert verdict(Paired(8.0, -1.0, 17.0, 4), floor_pct=3.0) == WITHIN_NOISE  # CI spans 0
    assert verdict(Paired(8.0, 5.0, 11.0, 4), floor_pct=math.nan) == REAL  # no twin measured: the CI decides


def test_noise_floor_is_the_95th_percentile_of_absolute_aa_differences():
    diffs = np.array([1.0, -2.0, 0.5, -0.2, 3.0, np.nan])
    assert noise_floor_pct(diffs) == pytest.approx(np.percentile([1.0, 2.0, 0.5, 0.2, 3.0], 95))
    assert math.isnan(noise_floor_pct(np.array([np.nan])))


def _machine_in_load_phases(rng: np.random.Generator, n_slots: int, phase_slots: int) -> np.ndarray:
    """Speed factor of the machine per measurement slot: load phases (another tenant) that last about one server
    session and move the speed by ~15%, plus 2% noise per cell: what the study saw between settings measured one
    after another (up to 61% apart) while repeats inside one session agreed to ~10%."""
    levels = rng.normal(0, 0.15, n_slots // phase_slots + 1)
    return np.exp(levels[np.arange(n_slots) // phase_slots] + rng.normal(0, 0.02, n_slots))


@pytest.mark.parametrize("rounds", [3, 6])
def test_interleaving_removes_the_spurious_effect_that_sequential_scheduling_shows(rounds):
    """An A/A pair (identical true speed) on a drifting machine, 400 seeded studies per design: measured one
    setting after the other, the paired CI calls the drift an effect; interleaved by round in a random order, it
    rarely does."""
    false_real = {"sequential": 0, "interleaved": 0}
    for seed in range(400):
        rng = np.random.default_rng(seed)
        machine = 100 * _machine_in_load_phases(rng, 2 * rounds, phase_slots=rounds)
        sequential = paired_ratio(machine[:rounds], machine[rounds:])  # all of A's rounds, then all of B's
        swap = rng.random(rounds) < 0.5  # each round measures A and B side by side, in a random order
        a, b = np.where(swap, machine[1::2], machine[0::2]), np.where(swap, machine[0::2], machine[1::2])
        false_real["sequential"] += verdict(sequential, math.nan) == REAL
        false_real["interleaved"] += verdict(paired_ratio(a, b), math.nan) == REAL
    assert false_real["interleaved"] / 400 <= 0.10  # ~ the 5% a 95% CI allows, plus a phase change inside a round
    assert false_real["sequential"] / 400 >= 0.6


def _comparisons(rng: np.random.Generator, sds: np.ndarray, rounds: int) -> list[np.ndarray]:
    """Per comparison, `rounds` log ratios drawn around 0 with its own round-to-round sd."""
    return [rng.normal(0.0, sd, rounds) for sd in sds]


def test_a_prior_from_alike_spreads_recovers_their_variance_and_pools_fully():
    rng = np.random.default_rng(7)
    prior = VariancePrior.fit(_comparisons(rng, np.full(400, 0.03), 3))
    # spreads that differ by chance only: the prior weighs several times a comparison's own 2 degrees of freedom
    assert prior.df > 5
    assert math.sqrt(prior.var) == pytest.approx(0.03, rel=0.1)


def test_spreads_that_differ_beyond_chance_keep_their_own():
    rng = np.random.default_rng(7)
    prior = VariancePrior.fit(_comparisons(rng, rng.choice([0.005, 0.08], 400), 3))
    assert prior.df < 3  # little pooling: a noisy comparison keeps most of its own spread
    assert VariancePrior.fit([np.array([0.1, 0.2]), np.array([0.0, 0.3])]) is None  # too few to say


def test_pooled_cis_keep_their_coverage_and_narrow_at_two_rounds():
    """The point of pooling: at 2 rounds a t interval on 1 degree of freedom is ~6x wider than needed. Pooled over
    30 comparisons of one spread, the 95% CIs of true ties still cover 0 about 95% of the time, and are narrower."""
    rng = np.random.default_rng(11)
    covered, plain_half, pooled_half = [], [], []
    for _ in range(200):
        logs = _comparisons(rng, np.full(30, 0.03), 2)
        prior = VariancePrior.fit(logs)
        for x in logs:
            control = np.full(2, 100.0)
            pooled = paired_ratio(control, control * np.exp(x), prior=prior)
            covered.append(pooled.ci_low_pct <= 0 <= pooled.ci_high_pct)
            pooled_half.append(pooled.half_width_pct)
            plain_half.append(paired_ratio(control, control * np.exp(x)).half_width_pct)
    assert 0.93 <= np.mean(covered) <= 0.97
    assert np.median(pooled_half) < np.median(plain_half) / 3
