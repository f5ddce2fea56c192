"""The race rule (analysis/decisions.py) on seeded synthetic rounds: a round drift every setting shares, and a
per-setting noise of sd 1% on top, as paired rounds on a shared machine look."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from workflow_scripts.analysis.decisions import (BETTER, DECISION_COLUMNS, EQUIVALENT, ROUNDS_CAP, UNDECIDED,
                                                 WINNER, WORSE, Challenge, RaceRule, challenge, decision_table, judge,
                                                 race, rerun_lines, round_seconds, rounds_needed)
from workflow_scripts.analysis.decisions import pair as paired_lead
from workflow_scripts.analysis.paired import TOST_CI

METRICS = ("aggregate_tok_s", "per_request_tok_s")


def rounds(factors: dict[str, float], n: int, seed: int, noise: float = 0.01) -> dict[str, dict]:
    """metric -> member -> round -> value: each member's true factor x a shared drift x its own noise."""
    rng = np.random.default_rng(seed)
    out = {}
    for metric in METRICS:
        drift = rng.lognormal(0, 0.10, n)
        out[metric] = {m: {r: 100 * f * drift[r] * rng.lognormal(0, noise) for r in range(n)}
                       for m, f in factors.items()}
    return out


@pytest.mark.parametrize("seed", range(5))
def test_a_setting_20pct_behind_is_eliminated_by_round_3_or_4(seed):
    data = rounds({"ctrl": 1.0, "ctrl_aa": 1.0, "fast": 1.05, "slow": 0.80}, 8, seed)
    result = race(data, "ctrl", "ctrl_aa", RaceRule(4.0, floor_pct=2.0), start=2, upto=8)
    assert result.eliminated.get("slow") in (2, 3, 4)
    assert "fast" not in result.eliminated


@pytest.mark.parametrize("seed", range(5))
def test_settings_half_a_percent_apart_become_equivalent_under_a_3pct_margin(seed):
    data = rounds({"ctrl": 1.0, "a": 1.20, "b": 1.195}, 6, seed, noise=0.005)
    verdict = judge(data["aggregate_tok_s"], "ctrl", ["ctrl", "a", "b"], RaceRule(3.0, floor_pct=2.0))
    assert verdict.decision == EQUIVALENT and {verdict.best, verdict.runner_up} == {"a", "b"}
    assert "ctrl" in verdict.beaten  # 20% behind: beaten, still a survivor


@pytest.mark.parametrize("seed", range(5))
def test_a_4pct_lead_over_a_2pct_floor_is_a_winner(seed):
    data = rounds({"ctrl": 1.0, "ctrl_aa": 1.0, "lead": 1.04}, 6, seed, noise=0.005)
    result = race(data, "ctrl", "ctrl_aa", RaceRule(4.0, floor_pct=2.0), start=2, upto=6)
    for verdict in result.verdicts.values():
        assert verdict.decision == WINNER and verdict.best == "lead" and verdict.runner_up == "ctrl"
        assert 2.0 < verdict.lead.diff_pct < 6.0 and verdict.lead.ci_low_pct > 0
    assert result.decided


def test_a_lead_no_round_can_show_is_out_of_reach_and_settles_the_cell():
    """A 1% lead with rounds 6% apart: 6 rounds could show neither a real lead nor a tie within 4%, so the cell takes
    no more rounds (undecided, not a winner); with room for 60 rounds it could, and stays open."""
    series = {"ctrl": {0: 100.0, 1: 100.0, 2: 100.0}, "cand": {0: 107.0, 1: 95.0, 2: 101.0}}
    rule = RaceRule(4.0, floor_pct=2.0)
    near = race({"aggregate_tok_s": series}, "ctrl", None, rule, start=2, upto=3, max_rounds=6)
    assert near.verdicts["aggregate_tok_s"].decision == UNDECIDED and near.verdicts["aggregate_tok_s"].out_of_reach
    assert near.settled and not near.decided
    far = race({"aggregate_tok_s": series}, "ctrl", None, rule, start=2, upto=3, max_rounds=60)
    assert not far.verdicts["aggregate_tok_s"].out_of_reach and not far.settled
    assert not race({"aggregate_tok_s": series}, "ctrl", None, rule, start=2, upto=3).settled  # no limit given


def test_a_lead_more_rounds_can_show_stays_within_reach():
    """A 5% lead on two rounds 2% apart: one degree of freedom leaves it undecided, 6 rounds would show it."""
    series = {"ctrl": {0: 100.0, 1: 100.0}, "cand": {0: 106.0, 1: 104.0}}
    result = race({"aggregate_tok_s": series}, "ctrl", None, RaceRule(4.0, floor_pct=2.0), start=2, upto=2,
                  max_rounds=6)
    verdict = result.verdicts["aggregate_tok_s"]
    assert verdict.decision == UNDECIDED and not verdict.out_of_reach and not result.settled


def test_the_same_lead_inside_the_floor_is_not_a_winner():
    data = rounds({"ctrl": 1.0, "lead": 1.04}, 6, 0, noise=0.005)
    verdict = judge(data["aggregate_tok_s"], "ctrl", ["ctrl", "lead"], RaceRule(3.0, floor_pct=5.0))
    assert verdict.decision == UNDECIDED and verdict.best == "lead"


@pytest.mark.parametrize("seed", range(5))
def test_the_control_and_its_twin_are_never_eliminated(seed):
    data = rounds({"ctrl": 0.5, "ctrl_aa": 0.5, "a": 1.0, "b": 1.3}, 8, seed)
    result = race(data, "ctrl", "ctrl_aa", RaceRule(4.0, floor_pct=2.0), start=2, upto=8)
    assert "a" in result.eliminated
    assert "ctrl" not in result.eliminated and "ctrl_aa" not in result.eliminated
    assert all(v.best == "b" and v.decision == WINNER for v in result.verdicts.values())
    assert result.eliminated_text(8) == f"a@{result.eliminated['a']}"


@pytest.mark.parametrize("seed", range(3))
def test_a_calibration_bystander_neither_wins_nor_is_eliminated(seed):
    # a fixed-acceptance setting runs far faster or slower than any real one; it is measured, never raced
    data = rounds({"ctrl": 1.0, "ctrl_aa": 1.0, "a": 1.10, "cal_fast": 1.5, "cal_slow": 0.5}, 6, seed)
    result = race(data, "ctrl", "ctrl_aa", RaceRule(4.0, floor_pct=2.0), start=2, upto=6,
                  bystanders={"cal_fast", "cal_slow"})
    assert all(v.best == "a" and v.decision == WINNER for v in result.verdicts.values())
    assert not {"cal_fast", "cal_slow"} & set(result.eliminated)
    raced = race(data, "ctrl", "ctrl_aa", RaceRule(4.0, floor_pct=2.0), start=2, upto=6)  # as a contender
    assert all(v.best == "cal_fast" for v in raced.verdicts.values()) and "cal_slow" in raced.eliminated


@pytest.mark.parametrize("seed", range(3))
def test_a_challenger_never_races_and_is_judged_against_the_best(seed):
    """An adaptive setting 30% ahead would win the race as a contender; as a challenger it is measured every round,
    never eliminated, and each metric says how it stands against the race's best."""
    data = rounds({"ctrl": 1.0, "ctrl_aa": 1.0, "a": 1.10, "slow": 0.6, "sched_fast": 1.43, "sched_tie": 1.10,
                   "sched_slow": 0.7}, 6, seed, noise=0.005)
    challengers = {"sched_fast", "sched_tie", "sched_slow"}
    result = race(data, "ctrl", "ctrl_aa", RaceRule(4.0, floor_pct=2.0), start=2, upto=6, challengers=challengers)
    assert all(v.best == "a" and v.decision == WINNER for v in result.verdicts.values())
    assert "slow" in result.eliminated and not challengers & set(result.eliminated)
    for by_name in result.challenges.values():
        assert {n: c.verdict for n, c in by_name.items()} == {"sched_fast": BETTER, "sched_tie": EQUIVALENT,
                                                              "sched_slow": WORSE}
        assert 25 < by_name["sched_fast"].lead.diff_pct < 35 and -38 < by_name["sched_slow"].lead.diff_pct < -34
    assert result.decided and result.settled
    raced = race(data, "ctrl", "ctrl_aa", RaceRule(4.0, floor_pct=2.0), start=2, upto=6)  # as a contender
    assert all(v.best == "sched_fast" for v in raced.verdicts.values()) and not any(raced.challenges.values())


def test_an_open_challenge_keeps_a_decided_cell_going_until_out_of_reach():
    """The static race is decided, but a challenger 1% behind on rounds 6% apart is neither shown tied nor behind:
    the cell is not decided. 6 rounds could not decide it (settled: no more rounds), 60 could (not settled)."""
    series = {"ctrl": {0: 100.0, 1: 100.0, 2: 100.0}, "fast": {0: 130.0, 1: 130.0, 2: 130.0},
              "sched": {0: 137.0, 1: 122.0, 2: 128.5}}
    rule = RaceRule(4.0, floor_pct=2.0)
    near = race({"aggregate_tok_s": series}, "ctrl", None, rule, start=2, upto=3, max_rounds=6, challengers={"sched"})
    assert near.verdicts["aggregate_tok_s"].decision == WINNER
    sched = near.challenges["aggregate_tok_s"]["sched"]
    assert sched.verdict == UNDECIDED and sched.out_of_reach and near.settled and not near.decided
    far = race({"aggregate_tok_s": series}, "ctrl", None, rule, start=2, upto=3, max_rounds=60, challengers={"sched"})
    assert not far.challenges["aggregate_tok_s"]["sched"].out_of_reach and not far.settled
    # the table's verdict is the same test: challenge() on all the rounds, without a round limit
    assert challenge(series, "fast", "sched", rule) == Challenge(UNDECIDED, sched.lead)


def test_nothing_is_judged_from_one_round_and_the_margin_must_be_positive():
    data = rounds({"ctrl": 1.0, "fast": 2.0}, 1, 0)
    assert not race(data, "ctrl", None, RaceRule(4.0), start=1, upto=1).decided
    assert race(data, "ctrl", None, RaceRule(4.0), start=1, upto=1).verdicts["aggregate_tok_s"].best == "fast"
    with pytest.raises(ValueError, match="benchmark.equivalence_pct"):
        RaceRule(0.0)


def test_the_decision_table_replays_the_race_on_the_rounds_of_each_cell():
    data = rounds({"ctrl": 1.0, "ctrl_aa": 1.0, "fast": 1.3, "slow": 0.6}, 6, 0)
    rows = [{"setting": m, "workload": "w", "concurrency": 4, "cohort": "c", "repeat": r,
             **{metric: data[metric][m][r] for metric in METRICS}}
            for m in data["aggregate_tok_s"] for r in range(6) if not (m == "slow" and r >= 3)]  # racing dropped it
    table = decision_table(pd.DataFrame(rows), "ctrl", "ctrl_aa", RaceRule(4.0, floor_pct=2.0), start=2)
    assert list(table.columns) == DECISION_COLUMNS and len(table) == 2
    assert (table.decision == WINNER).all() and (table.best == "fast").all() and (table.runner_up == "ctrl").all()
    assert (table.rounds == 6).all() and table.eliminated.iloc[0] in ("slow@2", "slow@3")
    assert (table.ci_low_pct > 2.0).all()


def test_rounds_needed_is_the_first_round_count_whose_projected_ci_decides():
    """A 1% lead on rounds 6% apart (the out-of-reach case above): the count rounds_needed names decides when
    projected, the one before it does not; beyond the cap it is inf, and one round tells nothing."""
    series = {"ctrl": {0: 100.0, 1: 100.0, 2: 100.0}, "cand": {0: 107.0, 1: 95.0, 2: 101.0}}
    rule = RaceRule(4.0, floor_pct=2.0)
    lead, tost = paired_lead(series, "ctrl", "cand"), paired_lead(series, "ctrl", "cand", ci=TOST_CI)

    def decides(n: int) -> bool:
        return rule.beaten(lead.projected(n)) or rule.equivalent(tost.projected(n))

    n = rounds_needed(lead, tost, rule)
    assert 6 < n <= 60 and decides(int(n)) and not decides(int(n) - 1)
    assert rounds_needed(lead, tost, rule, cap=int(n) - 1) == math.inf
    one = paired_lead({"ctrl": {0: 100.0}, "cand": {0: 101.0}}, "ctrl", "cand")
    assert math.isnan(rounds_needed(one, one, rule))
    verdict = race({"aggregate_tok_s": series}, "ctrl", None, rule, start=2, upto=3, max_rounds=8)
    assert verdict.verdicts["aggregate_tok_s"].rounds_needed == n


def test_a_lead_on_the_margin_needs_more_rounds_than_any_cap():
    """A steady 4.5% lead, between a 4% equivalence margin and a 5% floor: never real, never a tie."""
    series = {"ctrl": {r: 100.0 for r in range(4)}, "cand": {0: 104.0, 1: 105.0, 2: 104.5, 3: 104.5}}
    verdict = race({"aggregate_tok_s": series}, "ctrl", None, RaceRule(4.0, floor_pct=5.0), start=2, upto=4,
                   max_rounds=8).verdicts["aggregate_tok_s"]
    assert verdict.decision == UNDECIDED and verdict.out_of_reach and verdict.rounds_needed == math.inf


def test_round_seconds_spans_the_last_round_of_each_cell():
    """Sliced members share one span (the longest cell); members one after another add up; older rounds and
    cohorts sorting first do not count."""
    rows = [("w", 4, "c", 0, "a", 0.0, 99.0), ("w", 4, "c", 1, "a", 100.0, 30.0), ("w", 4, "c", 1, "b", 100.0, 40.0),
            ("w", 16, "c", 1, "a", 200.0, 30.0), ("w", 16, "c", 1, "b", 230.0, 20.0)]
    requests = pd.DataFrame(rows, columns=["workload", "concurrency", "cohort", "repeat", "setting", "cell_start_ts",
                                           "cell_wall_s"])
    assert round_seconds(requests) == {("w", 4): 40.0, ("w", 16): 50.0}
    assert round_seconds(requests.drop(columns="cell_wall_s")) == {}


def test_rerun_lines_count_the_rounds_and_minutes_each_undecided_metric_needs():
    base = {"workload": "w", "best": "a", "runner_up": "b", "lead_pct": 1.0, "ci_low_pct": -3.0, "ci_high_pct": 5.0,
            "rounds": 2, "eliminated": ""}
    rows = [{**base, "concurrency": 4, "metric": "aggregate_tok_s", "decision": UNDECIDED, "rounds_needed": 5.0,
             "round_s": 60.0},
            {**base, "concurrency": 4, "metric": "per_request_tok_s", "decision": UNDECIDED, "rounds_needed": 4.0,
             "round_s": 60.0},
            {**base, "concurrency": 16, "metric": "aggregate_tok_s", "decision": UNDECIDED, "rounds_needed": 20.0,
             "round_s": 30.0},
            {**base, "concurrency": 16, "metric": "per_request_tok_s", "decision": UNDECIDED,
             "rounds_needed": math.inf, "round_s": 30.0},
            {**base, "concurrency": 64, "metric": "aggregate_tok_s", "decision": WINNER, "rounds_needed": math.nan,
             "round_s": 90.0}]
    [line] = rerun_lines(pd.DataFrame(rows, columns=DECISION_COLUMNS), max_rounds=8)
    # C=4: 3 more rounds of 60 s; C=16: 18 more of 30 s
    assert "2 of the 4 undecided cells × metrics would be decided within `benchmark.max_repeats` (8 rounds)" in line
    assert "about 3 min more" in line and "1 by 20 rounds (12 min for all 3)" in line
    assert f"1 by no number up to {ROUNDS_CAP}" in line
    assert rerun_lines(pd.DataFrame([rows[-1]], columns=DECISION_COLUMNS), max_rounds=8) == []
