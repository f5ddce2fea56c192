"""Adaptive settings against the best static setting per cell (analysis/adaptive_check.py), on seeded rounds."""

from __future__ import annotations

import numpy as np
import pandas as pd

from workflow_scripts.analysis.adaptive_check import BETTER, WORSE, adaptive_lines, adaptive_table
from workflow_scripts.analysis.decisions import RaceRule
from workflow_scripts.analysis.improvement import variance_priors
from workflow_scripts.analysis.paired import EQUIVALENT
from workflow_scripts.analysis.study_config import StudyConfig

SPEC = {"speculative_algorithm": "STANDALONE", "speculative_eagle_topk": 1}
CFG = StudyConfig.from_dict({
    "settings": {"base": {}, "steps2": {**SPEC, "speculative_num_steps": 2, "speculative_num_draft_tokens": 3},
                 "cal": {**SPEC, "speculative_num_steps": 2, "speculative_num_draft_tokens": 3, "simulate_acc_len": 3},
                 "sched": {**SPEC, "speculative_num_steps": 3, "speculative_num_draft_tokens": 4,
                           "speculative_adaptive": True}},
    "workloads": {"w": {"kind": "synthetic"}}, "analysis": {"baseline": "base"}, "benchmark": {"aa_control": False}})


def values(factors: dict[int, dict[str, float]], rounds: int = 6, seed: int = 0) -> pd.DataFrame:
    """One row per setting x round x concurrency: true factor x a drift the round shares x 0.5% own noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for c, by_setting in factors.items():
        for r in range(rounds):
            drift = rng.lognormal(0, 0.1)
            for setting, f in by_setting.items():
                v = 100 * f * drift * rng.lognormal(0, 0.005)
                rows.append({"source": "measured", "setting": setting, "workload": "w", "concurrency": c,
                             "cohort": "k", "repeat": r, "aggregate_tok_s": v, "per_request_tok_s": v / 4})
    return pd.DataFrame(rows)


def test_each_cell_judges_the_adaptive_setting_against_its_best_static_one():
    data = values({1: {"base": 1.0, "steps2": 0.8, "cal": 1.5, "sched": 1.0},     # ties the control, the best static
                   16: {"base": 1.0, "steps2": 1.3, "cal": 2.0, "sched": 1.45},   # beats steps2 (cal never counts)
                   64: {"base": 1.0, "steps2": 1.2, "cal": 2.0, "sched": 1.05}})  # behind steps2
    table = adaptive_table(data, CFG, RaceRule(4.0, floor_pct=2.0), variance_priors(data, "base"))
    by = {(r.concurrency, r.metric): r for r in table.itertuples()}
    for metric in ("aggregate_tok_s", "per_request_tok_s"):
        assert (by[1, metric].best_static, by[1, metric].verdict) == ("base", EQUIVALENT)
        assert (by[16, metric].best_static, by[16, metric].verdict) == ("steps2", BETTER)
        assert (by[64, metric].best_static, by[64, metric].verdict) == ("steps2", WORSE)
        assert by[64, metric].ci_high_pct < 0 and by[16, metric].ci_low_pct > 0
    lines = adaptive_lines(table)
    assert any("`sched`" in line and "**2 of 3**" in line and "worse in 1" in line for line in lines)


def test_a_study_without_adaptive_settings_has_an_empty_table_and_no_summary_lines():
    data = values({1: {"base": 1.0, "steps2": 1.1}})
    cfg = StudyConfig.from_dict({**{"settings": {"base": {}, "steps2": {**SPEC, "speculative_num_steps": 2}}},
                                 "workloads": {"w": {"kind": "synthetic"}}, "analysis": {"baseline": "base"}})
    table = adaptive_table(data, cfg, RaceRule(4.0))
    assert table.empty and adaptive_lines(table) == []
