"""The measurement design's bookkeeping (client/rounds.py): orders, complete rounds, the precision target, budget."""

from __future__ import annotations

import logging
import math
import time

import numpy as np

import pytest

from workflow_scripts.analysis.decisions import WINNER
from workflow_scripts.client.rounds import (Ledger, Planner, RoundPolicy, block_order, launch_index, launch_order,
                                           seeded_order)


def test_orders_are_seeded_and_blocks_alternate():
    members = ["a", "b", "c", "d"]
    assert seeded_order(members, "cohort", "cell", 0) == seeded_order(members, "cohort", "cell", 0)
    orders = {tuple(seeded_order(members, "cohort", "cell", r)) for r in range(20)}
    assert len(orders) > 5  # the order changes from round to round
    assert block_order(["a", "b", "c"], 0) == ["a", "b", "c"] and block_order(["a", "b", "c"], 1) == ["c", "b", "a"]


def _ledger(ratios_by_round: list[float]) -> Ledger:
    ledger = Ledger("ctrl", {"k": ["ctrl", "cand"]})
    for r, ratio in enumerate(ratios_by_round):
        ledger.add("k", "ctrl", r, {"aggregate_tok_s": 100.0, "per_request_tok_s": 50.0})
        ledger.add("k", "cand", r, {"aggregate_tok_s": 100.0 * ratio, "per_request_tok_s": 50.0 * ratio})
    return ledger


def test_a_round_counts_once_every_member_has_it():
    ledger = _ledger([1.0, 1.1])
    ledger.add("k", "ctrl", 2, {"aggregate_tok_s": 1.0, "per_request_tok_s": 1.0})
    assert ledger.complete_rounds("k") == [0, 1]
    assert ledger.done("k", "ctrl", 2) and not ledger.done("k", "cand", 2)


def test_rounds_repeat_until_the_precision_target_or_the_limit():
    policy = RoundPolicy(repeats=3, max_repeats=6, precision_pct=3.0)
    steady = Planner(policy, _ledger([1.10, 1.105, 1.10]))
    assert steady.needs_round("k", 2)  # the minimum
    assert not steady.needs_round("k", 3)  # +10% +-0.5%: precise enough after 3 rounds
    noisy = Planner(policy, _ledger([1.0, 1.3, 0.8, 1.2, 0.9, 1.1]))
    assert noisy.needs_round("k", 3) and noisy.needs_round("k", 5)
    assert not noisy.needs_round("k", 6)  # max_repeats
    assert noisy.ledger.half_width_pct("k") > 3.0
    assert noisy.active(4, ["k"]) == ["k"] and steady.active(4, ["k"]) == []


def test_the_budget_stops_new_rounds_but_never_the_minimum():
    planner = Planner(RoundPolicy(2, 4, 3.0, time_budget_s=0.01), _ledger([]))
    time.sleep(0.02)
    assert not planner.over_budget(0) and not planner.over_budget(1) and not planner.budget_hit
    assert planner.over_budget(2) and planner.budget_hit


@pytest.mark.parametrize("missing", ["ctrl", "cand"])
def test_precision_is_unknown_until_both_sides_have_rounds(missing):
    ledger = Ledger("ctrl", {"k": ["ctrl", "cand"]})
    other = "cand" if missing == "ctrl" else "ctrl"
    for r in range(3):
        ledger.add("k", other, r, {"aggregate_tok_s": 1.0, "per_request_tok_s": 1.0})
    assert ledger.half_width_pct("k") == float("inf")


def test_launch_order_follows_the_seed_reverses_on_odd_launches_and_reshuffles_per_pair():
    members = ["baseline", "baseline_aa", "steps1", "steps2", "steps3", "ngram"]
    orders = {seed: launch_order(members, seed, "cohort-1") for seed in range(8)}
    assert orders[0] == launch_order(members, 0, "cohort-1")  # reproducible
    assert len(set(map(tuple, orders.values()))) > 4  # two cohorts with different seeds record different orders
    firsts = {order[0] for order in orders.values()}
    assert len(firsts) > 2  # the control is not always the first to start
    # counterbalanced: every odd launch reverses the order, so a pair of launches puts each member mid-way
    assert launch_order(members, 0, "cohort-1", 1) == orders[0][::-1]
    pairs = [launch_order(members, 0, "cohort-1", 2 * p) for p in range(8)]
    assert all(launch_order(members, 0, "cohort-1", 2 * p + 1) == pairs[p][::-1] for p in range(8))
    # restart_each_round: each pair of launches a fresh order, so the twin's place (and what reversal leaves of a
    # curved position effect) is drawn again per pair
    assert len(set(map(tuple, pairs))) > 4
    assert len({order.index("baseline_aa") for order in pairs}) > 2


def test_servers_launch_again_after_the_first_round_when_counterbalanced():
    assert [launch_index(r, False, True) for r in range(4)] == [0, 1, 1, 1]
    assert [launch_index(r, False, False) for r in range(4)] == [0, 0, 0, 0]
    assert [launch_index(r, True, True) for r in range(4)] == [0, 1, 2, 3]  # restart_each_round: a launch per round


def test_racing_stops_measuring_a_setting_beaten_on_both_metrics_but_never_the_control():
    members = ["cal", "ctrl", "ctrl_aa", "fast", "slow"]
    # a fixed-acceptance calibration member, slower than `slow`, is measured every round and never races
    ledger = Ledger("ctrl", {"k": members}, bystanders=frozenset({"cal"}))
    factors = {"cal": 0.5, "ctrl": 1.0, "ctrl_aa": 1.0, "fast": 1.3, "slow": 0.7}
    for r, drift in enumerate([1.0, 0.9, 1.1]):
        for m, f in factors.items():
            jitter = 1 + 0.003 * ((r + len(m)) % 3 - 1)
            ledger.add("k", m, r, {"aggregate_tok_s": 100 * f * drift * jitter, "per_request_tok_s": 10 * f * drift})
    planner = Planner(RoundPolicy(2, 6, 3.0, allocation="racing", equivalence_pct=4.0), ledger)
    assert planner.needs_round("k", 2) or ledger.eliminated["k"]
    assert ledger.eliminated["k"] == {"slow": 2}
    assert ledger.due("k", 1) == members and ledger.due("k", 2) == ["cal", "ctrl", "ctrl_aa", "fast"]
    assert ledger.complete_rounds("k") == [0, 1, 2]  # round 2 did not need `slow`
    assert not planner.needs_round("k", 3)  # `fast` leads the control by 30% on both metrics: decided


def test_racing_keeps_measuring_a_challenger_until_its_verdict_is_decided(caplog):
    """A schedule (a challenger) 1% off the best static on rounds 6% apart: the static race is decided after 3
    rounds, but the schedule's verdict is not, so the cell goes on while 8 rounds could decide it; at 4 it could
    not, and the log names the challenge. Never eliminated: every round measures it."""
    members = ["ctrl", "fast", "sched"]
    ledger = Ledger("ctrl", {"k": members}, challengers=frozenset({"sched"}))
    for r, ratio in enumerate([1.07, 0.94, 0.99]):
        for m, f in {"ctrl": 1.0, "fast": 1.3, "sched": 1.3 * ratio}.items():
            ledger.add("k", m, r, {"aggregate_tok_s": 100 * f, "per_request_tok_s": 10 * f})
    racing = Planner(RoundPolicy(2, 60, 3.0, allocation="racing", equivalence_pct=4.0), ledger)
    assert racing.needs_round("k", 3) and ledger.due("k", 3) == members
    assert racing.race("k", 3).verdicts["aggregate_tok_s"].decision == WINNER
    short = Planner(RoundPolicy(2, 4, 3.0, allocation="racing", equivalence_pct=4.0), ledger)
    with caplog.at_level(logging.INFO, logger="workflow_scripts.client.rounds"):
        assert not short.needs_round("k", 3) and short.out_of_reach == {"k": 3}
    assert "sched against fast" in caplog.text


def test_racing_measures_the_undecided_cell_nearest_a_decision_first():
    """A budget that ends mid-round then cuts the cell a round more cannot decide, not the one it can."""
    ledger = Ledger("ctrl", {"tight": ["ctrl", "cand"], "loose": ["ctrl", "cand"]})
    for r, (tight, loose) in enumerate([(1.02, 1.05), (1.03, 1.25)]):
        for cell, ratio in (("tight", tight), ("loose", loose)):
            ledger.add(cell, "ctrl", r, {"aggregate_tok_s": 100.0, "per_request_tok_s": 50.0})
            ledger.add(cell, "cand", r, {"aggregate_tok_s": 100.0 * ratio, "per_request_tok_s": 50.0 * ratio})
    planner = Planner(RoundPolicy(2, 6, 3.0, allocation="racing", equivalence_pct=4.0), ledger)
    assert ledger.half_width_pct("tight", 2) < ledger.half_width_pct("loose", 2)
    assert planner.active(2, ["loose", "tight"]) == ["tight", "loose"]
    assert planner.cell_order(2, planner.active(2, ["loose", "tight"]), "cohort") == ["tight", "loose"]


def test_racing_gives_no_more_rounds_to_a_cell_out_of_reach_and_says_so():
    """A 1% lead with rounds 6% apart cannot be decided by 6 rounds: the cell stops after 3, recorded, while a
    5% lead on rounds 3% apart in another cell, undecided on 3, goes on."""
    ledger = Ledger("ctrl", {"flat": ["ctrl", "cand"], "open": ["ctrl", "cand"]})
    for r, (flat, open_) in enumerate([(1.07, 1.08), (0.95, 1.01), (1.01, 1.05)]):
        for cell, ratio in (("flat", flat), ("open", open_)):
            ledger.add(cell, "ctrl", r, {"aggregate_tok_s": 100.0, "per_request_tok_s": 50.0})
            ledger.add(cell, "cand", r, {"aggregate_tok_s": 100.0 * ratio, "per_request_tok_s": 50.0 * ratio})
    planner = Planner(RoundPolicy(2, 6, 3.0, allocation="racing", equivalence_pct=4.0), ledger)
    assert planner.active(3, ["flat", "open"]) == ["open"]
    assert planner.out_of_reach == {"flat": 3}
    # rounds measured later (a rerun keeps them) can bring it back within reach: then it is not reported out of reach
    for r in (3, 4):
        ledger.add("flat", "ctrl", r, {"aggregate_tok_s": 100.0, "per_request_tok_s": 50.0})
        ledger.add("flat", "cand", r, {"aggregate_tok_s": 99.0, "per_request_tok_s": 49.5})
    assert planner.needs_round("flat", 5) and "flat" not in planner.out_of_reach


def test_racing_pools_the_spread_of_every_cell_so_two_rounds_can_decide():
    """With 2 rounds a comparison's own CI rests on 1 degree of freedom; the spread pooled over the cohort's cells
    (Ledger.priors, fitted on the rounds before the boundary only) lets a 12% lead over a 1.4% spread decide."""
    rng = np.random.default_rng(1)
    cells = [f"c{i}" for i in range(12)]
    ledger = Ledger("ctrl", {cell: ["ctrl", "cand"] for cell in cells})
    for cell in cells:
        lead = 1.12 if cell == "c0" else 1.0
        for r in range(3):
            for member, f in (("ctrl", 1.0), ("cand", lead)):
                value = 100 * f * rng.lognormal(0, 0.01)
                ledger.add(cell, member, r, {"aggregate_tok_s": value, "per_request_tok_s": value / 10})
    priors = ledger.priors(2)
    assert all(p is not None and 0.007 < math.sqrt(p.var) < 0.03 for p in priors.values())
    assert ledger.priors(2) != ledger.priors()  # round 2's values are not known at its own boundary
    planner = Planner(RoundPolicy(2, 6, 3.0, allocation="racing", equivalence_pct=4.0), ledger)
    assert not planner.needs_round("c0", 2)  # decided on 2 rounds
    assert ledger.half_width_pct("c0", 2, priors) < ledger.half_width_pct("c0", 2) / 3


def test_the_race_judges_values_freed_of_the_start_position():
    """A 3%-per-place start-position effect swings a setting's rounds by 12% between counterbalanced launches; the
    race fits it on the rounds before its boundary and judges what is left, as the tables do."""
    rng = np.random.default_rng(2)
    effects = {"ctrl": 1.0, "ctrl_aa": 1.0, "fast": 1.15, "m1": 1.0, "m2": 0.98}
    order = ["fast", "m1", "ctrl", "m2", "ctrl_aa"]
    cells = [f"c{i}" for i in range(6)]

    def ledger(with_launches: bool) -> Ledger:
        out = Ledger("ctrl", {cell: list(effects) for cell in cells})
        if with_launches:
            out.launches.update({0: order, 1: order[::-1]})
        for cell in cells:
            for r, launch in enumerate((order, order[::-1])):
                for member, f in effects.items():
                    value = 100 * f * math.exp(0.03 * (launch.index(member) - 2)) * rng.lognormal(0, 0.01)
                    out.add(cell, member, r, {"aggregate_tok_s": value, "per_request_tok_s": value / 10})
        return out

    freed, raw = ledger(True), ledger(False)
    for planned in (freed, raw):
        assert planned.series("c0", "aggregate_tok_s", 2)["fast"].keys() == {0, 1}
    fast = [freed.series("c0", "aggregate_tok_s", 2)["fast"][r] / freed.series("c0", "aggregate_tok_s", 2)["ctrl"][r]
            for r in (0, 1)]
    assert abs(fast[0] / fast[1] - 1) < 0.05  # raw, the two rounds differ by exp(0.03 * 8) - 1 = 27%
    policy = RoundPolicy(2, 6, 3.0, allocation="racing", equivalence_pct=5.0)
    assert Planner(policy, freed).race("c0", 2).decided
    assert not Planner(policy, raw).race("c0", 2).decided
