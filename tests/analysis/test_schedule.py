"""The step schedule: noise-aware steps per band, and deployment files that run exactly that schedule."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from workflow_scripts.analysis.recommend import RECOMMENDATION_COLUMNS
from workflow_scripts.analysis.schedule import (band_ranges, band_start, bands_problem, main, model_choice,
                                                step_schedule)
from workflow_scripts.analysis.schedule_plot import scheduled_points
from workflow_scripts.analysis.study_config import StudyConfig
from workflow_scripts.engine.adaptive import AdaptiveSpeculativeParams, load_adaptive_config
from workflow_scripts.launcher.command import ServerSpec, build_command, check_setting


def standalone(steps: int) -> dict:
    return {"speculative_algorithm": "STANDALONE", "speculative_num_steps": steps, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": steps + 1, "moe_config": "tuned"}


CONFIG = {
    "settings": {"baseline": {"moe_config": "tuned"}, **{f"steps{k}": standalone(k) for k in (1, 2, 3)},
                 "ngram": {**standalone(2), "speculative_algorithm": "NGRAM"}},
    "workloads": {"synthetic": {}, "realistic": {}},
    "analysis": {"bands": {"low": [1, 4], "mid": [16], "high": [32, 64]}},
}
MAX_BATCH = 64


def rec(workload: str, band: str, pick: str, verdict: str, tied: str = "") -> dict:
    return {**dict.fromkeys(RECOMMENDATION_COLUMNS, ""), "band": band, "workload": workload, "metric": "aggregate_tok_s",
            "recommended": pick, "verdict": verdict, "tied_with": tied}


RECOMMENDATION = pd.DataFrame([
    rec("synthetic", "low", "steps2", "real"),
    rec("synthetic", "mid", "steps3", "within noise"),
    rec("synthetic", "high", "baseline", "within noise"),
    rec("synthetic", "low", "steps3", "real") | {"metric": "per_request_tok_s"},  # another metric: not scheduled
    rec("realistic", "low", "steps1", "real", tied="steps2"),
    rec("realistic", "mid", "ngram", "real"),
    rec("realistic", "high", "", ""),
])


IMPROVEMENT_COLUMNS = ["source", "kind", "baseline", "candidate", "workload", "concurrency", "metric",
                       "improvement_pct", "verdict"]
PREDICTION_COLUMNS = ["source", "workload", "concurrency", "steps", "setting", "measured", "predicted_aggregate_tok_s"]
NO_IMPROVEMENT, NO_PREDICTIONS = pd.DataFrame(columns=IMPROVEMENT_COLUMNS), pd.DataFrame(columns=PREDICTION_COLUMNS)


def comparison(baseline: str, candidate: str, concurrency: int, pct: float, verdict: str) -> dict:
    return {"source": "measured", "kind": "pairwise", "baseline": baseline, "candidate": candidate,
            "workload": "synthetic", "concurrency": concurrency, "metric": "aggregate_tok_s", "improvement_pct": pct,
            "verdict": verdict}


def predicted(per_setting: dict[str, float]) -> pd.DataFrame:
    """The cost model's predictions at C = 32 and 64: the given aggregate tok/s per setting, the same at both."""
    return pd.DataFrame([{"source": "measured", "workload": "synthetic", "concurrency": c, "steps": int(name[-1]),
                          "setting": name, "measured": True, "predicted_aggregate_tok_s": value}
                         for name, value in per_setting.items() for c in (32, 64)], columns=PREDICTION_COLUMNS)


# steps1 and steps2 beat the baseline for real at both concurrencies of the high band; steps3 does at 32 only
VS_BASELINE = [comparison("baseline", name, c, 12.0, "real") for name in ("steps1", "steps2") for c in (32, 64)] + [
    comparison("baseline", "steps3", 32, 10.0, "real"), comparison("baseline", "steps3", 64, 2.0, "within noise")]


@pytest.mark.parametrize("pick_vs_model, predictions, expected, why", [
    # the pick not shown ahead of the model's best at C=64: the model's best
    ([("steps1", "steps2", 32, -3.0, "real"), ("steps1", "steps2", 64, 1.3, "equivalent")],
     {"steps1": 740.0, "steps2": 757.0}, "steps2", "C=32 steps2 vs steps1 -3.0% (real); C=64 steps2 vs steps1 +1.3%"),
    # never compared with the pick: not shown ahead either
    ([], {"steps1": 740.0, "steps2": 757.0}, "steps2", "at every concurrency of the band (not compared)"),
    # the pick's lead real at every concurrency of the band: the pick stands, whatever the model says
    ([("steps1", "steps2", 32, -3.0, "real"), ("steps2", "steps1", 64, 4.0, "real")],
     {"steps1": 740.0, "steps2": 757.0}, None, ""),
    # the model's best, steps3, does not beat the baseline beyond noise at C = 64: the pick stands
    ([], {"steps1": 740.0, "steps3": 760.0, "steps2": 700.0}, None, ""),
    # the model agrees with the pick
    ([("steps1", "steps2", 32, 1.0, "within noise")], {"steps1": 760.0, "steps2": 757.0}, None, ""),
    # equal predictions: the fewer steps, which is the pick
    ([("steps1", "steps2", 32, 1.0, "within noise")], {"steps1": 757.0, "steps2": 757.0}, None, ""),
])
def test_the_cost_model_chooses_where_the_study_did_not_tell_the_pick_from_another_step_count(
        pick_vs_model, predictions, expected, why):
    cfg = StudyConfig.from_dict(CONFIG)
    improvement = pd.DataFrame([comparison(*row) for row in pick_vs_model] + VS_BASELINE, columns=IMPROVEMENT_COLUMNS)
    chosen = model_choice("steps1", predicted(predictions), improvement, cfg, "synthetic", [32, 64], "STANDALONE")
    assert (chosen[0] if chosen else None) == expected
    if chosen:
        assert "steps1 (1 steps) scores best but is not shown ahead of steps2 (2 steps)" in chosen[1]
        assert why in chosen[1] and "the cost model predicts steps2 +2.3% over it here" in chosen[1]


def test_a_schedule_band_takes_the_model_choice_and_says_why():
    cfg = StudyConfig.from_dict(CONFIG)
    improvement = pd.DataFrame([comparison("steps1", "steps2", 64, 1.3, "equivalent")] + VS_BASELINE,
                               columns=IMPROVEMENT_COLUMNS)
    recommendation = pd.DataFrame([rec("synthetic", "high", "steps1", "real")])
    schedule = step_schedule(recommendation, cfg, MAX_BATCH, improvement,
                             predicted({"steps1": 740.0, "steps2": 757.0})).set_index(["workload", "band"])
    row = schedule.loc[("synthetic", "high")]
    assert (row["steps"], row["recommended"]) == (2, "steps1")
    assert "the cost model predicts steps2 +2.3% over it here, and steps2 beats baseline beyond noise" in row["reason"]


def test_the_plot_circles_the_setting_whose_steps_a_band_runs():
    """A band the cost model moved to 2 steps circles steps2, not its recommendation steps1 (nor ngram, 2 steps too);
    a band at its recommendation's steps circles that setting; a 0-step band, the baseline."""
    cfg = StudyConfig.from_dict(CONFIG)
    measured = pd.DataFrame([{"setting": s, "workload": "synthetic", "concurrency": c, "aggregate_tok_s_median": 1.0}
                             for s in CONFIG["settings"] for c in (1, 4, 16, 32, 64)])
    schedule = pd.DataFrame([
        {"workload": "synthetic", "band": "low", "concurrencies": "1 4", "steps": 0, "recommended": "steps1"},
        {"workload": "synthetic", "band": "mid", "concurrencies": "16", "steps": 3, "recommended": "steps3"},
        {"workload": "synthetic", "band": "high", "concurrencies": "32 64", "steps": 2, "recommended": "steps1"},
    ]).assign(reason="")
    points = scheduled_points(measured, schedule, cfg)
    assert sorted(zip(points["band"], points["setting"], points["concurrency"])) == [
        ("high", "steps2", 32), ("high", "steps2", 64), ("low", "baseline", 1), ("low", "baseline", 4),
        ("mid", "steps3", 16)]


def test_steps_per_band_are_noise_aware():
    schedule = step_schedule(RECOMMENDATION, StudyConfig.from_dict(CONFIG), MAX_BATCH, NO_IMPROVEMENT,
                             NO_PREDICTIONS).set_index(["workload", "band"])
    expected = {("synthetic", "low"): (1, 7, 2, "beats baseline beyond noise"),
                ("synthetic", "mid"): (8, 22, 0, "not decided against baseline"),
                ("synthetic", "high"): (23, 64, 0, "baseline (no speculation) scores best"),
                ("realistic", "low"): (1, 7, 1, "tied within tolerance with steps2, fewer steps kept"),
                ("realistic", "mid"): (8, 22, 0, "ngram is not a STANDALONE setting"),
                ("realistic", "high"): (23, 64, 0, "no eligible setting")}
    for key, (lo, hi, steps, why) in expected.items():
        row = schedule.loc[key]
        assert (row["batch_from"], row["batch_to"], row["steps"]) == (lo, hi, steps)
        assert why in row["reason"]


def test_emitted_schedule_round_trips(tmp_path):
    """Read back from settings.yaml, the schedule validates as a setting and builds the argv of the setting the study
    emitted; the SGLang config it names routes every batch size to the band's steps, as the vLLM form does."""
    rec_csv, deploy = tmp_path / "recommendation.csv", tmp_path / "deploy"
    RECOMMENDATION.to_csv(rec_csv, index=False)
    NO_IMPROVEMENT.to_csv(tmp_path / "improvement.csv", index=False)
    NO_PREDICTIONS.to_csv(tmp_path / "predictions.csv", index=False)
    summary = pd.DataFrame([{"source": "measured", "setting": s, "workload": w, "concurrency": c,
                             "aggregate_tok_s_median": 100.0 * c ** 0.5 * (1 + 0.1 * i)}
                            for i, s in enumerate(CONFIG["settings"]) for w in CONFIG["workloads"] for c in (1, 4, 16, 32, 64)])
    summary.to_csv(tmp_path / "summary.csv", index=False)
    assert main(["--recommendation", str(rec_csv), "--improvement", str(tmp_path / "improvement.csv"),
                 "--predictions", str(tmp_path / "predictions.csv"), "--config-json", json.dumps(CONFIG),
                 "--max-batch", str(MAX_BATCH),
                 "--out-csv", str(tmp_path / "step_schedule.csv"), "--deploy-dir", str(deploy),
                 "--summary", str(tmp_path / "summary.csv"), "--plot-dir", str(tmp_path)]) == 0
    svg = (tmp_path / "step_schedule.svg").read_text()
    assert "2 steps" in svg and "realistic" in svg  # the scheduled steps labelled, a panel per workload
    schedule = pd.read_csv(tmp_path / "step_schedule.csv")
    spec = ServerSpec("embedded", "/m/target", "/m/draft", "127.0.0.1", MAX_BATCH, 0)
    for workload in CONFIG["workloads"]:
        bands = schedule[schedule["workload"] == workload]
        settings = yaml.safe_load((deploy / workload / "settings.yaml").read_text())["settings"]
        (name, setting), = settings.items()
        check_setting(name, setting)
        argv = build_command(spec, setting, port=30000)
        config_path = argv[argv.index("--speculative-adaptive-config") + 1]
        assert argv[argv.index("--speculative-num-steps") + 1] == str(bands["steps"].iloc[0] or 1)
        rule = AdaptiveSpeculativeParams(setting["speculative_num_steps"], load_adaptive_config(config_path))
        vllm = json.loads((deploy / workload / "vllm_speculative_config.json").read_text())
        for r in bands.itertuples():
            for batch in range(r.batch_from, r.batch_to + 1):
                assert rule.steps_for_batch(batch) == r.steps
                assert [k for lo, hi, k in vllm["num_speculative_tokens_per_batch_size"] if lo <= batch <= hi] == [r.steps]
        # a rebuilt command from the yaml text equals one from the same setting re-read: the file is the setting
        again = yaml.safe_load(yaml.safe_dump(setting))
        assert build_command(spec, again, port=30000) == argv


@pytest.mark.parametrize("bands, fragment", [
    ({"low": [4, 1]}, "analysis.bands.low: concurrencies must be increasing"),
    ({"low": [1, 4], "mid": [4, 16]}, "analysis.bands.mid: starts at 4, not above band low's last concurrency 4"),
    ({"high": [32], "low": [1]}, "analysis.bands.low: starts at 1"),
])
def test_overlapping_or_unsorted_bands_name_the_key(bands, fragment):
    assert fragment in bands_problem(bands)


def test_ranges_cover_every_batch_size_once_and_meet_between_the_concurrencies():
    # a measured concurrency is never a breakpoint: a server at C=8 whose batch dips to 5-7 stays in b's steps
    assert band_ranges({"a": [1, 2], "b": [8], "c": [32]}, 48) == [("a", 1, 3), ("b", 4, 15), ("c", 16, 48)]
    # in any key order (the rules pass the config with sorted keys); the first band from 1; none past the server's
    assert band_ranges({"high": [32, 64], "low": [2, 4], "mid": [16]}, 20) == [("low", 1, 7), ("mid", 8, 20)]
    # a band the server cannot reach is dropped before the bands meet: the last one kept runs to the server's limit
    assert band_ranges({"low": [1, 4], "mid": [16], "high": [32, 64]}, 8) == [("low", 1, 8)]
    assert [band_start(*pair) for pair in ((1, 4), (16, 32), (3, 4), (4, 16))] == [2, 23, 4, 8]
