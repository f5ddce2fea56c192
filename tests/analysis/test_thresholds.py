"""A schedule on both sides of its breakpoints (analysis/thresholds.py), on seeded rounds."""

from __future__ import annotations

import json

from workflow_scripts.analysis.decisions import RaceRule
from workflow_scripts.analysis.improvement import variance_priors
from workflow_scripts.analysis.paired import EQUIVALENT
from workflow_scripts.analysis.study_config import StudyConfig
from workflow_scripts.analysis.thresholds import (THRESHOLD_COLUMNS, schedule_tiers, steps_at, threshold_lines,
                                                  threshold_table)

from tests.analysis.test_adaptive_check import SPEC, values

SCHEDULE = {"1": {"candidate_steps": [0]}, "2": {"candidate_steps": [3]}, "23": {"candidate_steps": [2]}}


def config(tmp_path) -> StudyConfig:
    (tmp_path / "schedule.json").write_text(json.dumps(SCHEDULE))
    (tmp_path / "tiers.json").write_text(json.dumps({"1": {"candidate_steps": [1, 3]}}))
    adaptive = {**SPEC, "speculative_num_steps": 3, "speculative_num_draft_tokens": 4, "speculative_adaptive": True}
    return StudyConfig.from_dict({
        "settings": {"base": {}, **{f"steps{k}": {**SPEC, "speculative_num_steps": k,
                                                  "speculative_num_draft_tokens": k + 1} for k in (2, 3)},
                     "sched": {**adaptive, "speculative_adaptive_config": str(tmp_path / "schedule.json")},
                     "tiered": {**adaptive, "speculative_adaptive_config": str(tmp_path / "tiers.json")},
                     "default_tiers": adaptive},
        "workloads": {"w": {"kind": "synthetic"}}, "analysis": {"baseline": "base"},
        "benchmark": {"aa_control": False}})


def test_a_schedule_routes_each_batch_to_one_tier_and_tiered_configs_have_none(tmp_path):
    cfg = config(tmp_path)
    tiers = schedule_tiers(cfg.settings["sched"])
    assert tiers == {1: 0, 2: 3, 23: 2}
    assert [steps_at(tiers, b) for b in (1, 2, 22, 23, 64)] == [0, 3, 3, 2, 2]
    assert schedule_tiers(cfg.settings["tiered"]) is None and schedule_tiers(cfg.settings["default_tiers"]) is None


def test_each_side_of_each_breakpoint_judges_the_schedule_against_the_static_setting_it_runs(tmp_path):
    """At C = 2 the schedule switches between 0 and 3 steps as requests end: 15% behind steps3 there shows as worse
    on that side only; C = 4 is not the nearest cell above batch 2 and gets no row."""
    cfg = config(tmp_path)
    fair = {"base": 1.0, "steps2": 1.1, "steps3": 1.2, "tiered": 1.0, "default_tiers": 1.0}
    data = values({1: {**fair, "sched": 1.0}, 2: {**fair, "sched": 1.2 * 0.85}, 4: {**fair, "sched": 0.5},
                   22: {**fair, "sched": 1.2}, 23: {**fair, "sched": 1.1}})
    table = threshold_table(data, cfg, RaceRule(4.0, floor_pct=2.0), variance_priors(data, "base"))
    assert list(table.columns) == THRESHOLD_COLUMNS and set(table.setting) == {"sched"}
    sides = {(r.breakpoint, r.side, r.metric): (r.concurrency, r.steps, r.static, r.verdict)
             for r in table.itertuples()}
    assert len(sides) == len(table) == 8
    for metric in ("aggregate_tok_s", "per_request_tok_s"):
        assert sides[2, "below", metric] == (1, 0, "base", EQUIVALENT)
        assert sides[2, "above", metric] == (2, 3, "steps3", "worse")
        assert sides[23, "below", metric] == (22, 3, "steps3", EQUIVALENT)
        assert sides[23, "above", metric] == (23, 2, "steps2", EQUIVALENT)
    assert -17 < table[table.concurrency == 2].diff_pct.max() < -13
    lines = threshold_lines(table)
    assert any("**3 of 4** sides, worse on 1 (w C = 2 (above batch 2)" in line and "against steps3" in line
               for line in lines)


def test_tiered_adaptive_settings_get_no_threshold_rows(tmp_path):
    cfg = config(tmp_path)  # the schedule is configured but was not measured; the tiered settings were
    data = values({1: {"base": 1.0, "steps2": 1.1, "tiered": 1.0, "default_tiers": 1.0},
                   4: {"base": 1.0, "steps2": 1.1, "tiered": 1.0, "default_tiers": 1.0}})
    table = threshold_table(data, cfg, RaceRule(4.0))
    assert table.empty and threshold_lines(table) == []
