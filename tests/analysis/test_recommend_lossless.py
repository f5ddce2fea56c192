"""The recommendation rule (robust score, ties, errored settings) and the lossless check."""

from __future__ import annotations

import pytest

from tests.analysis.request_data import cell, frame
import math

import pandas as pd

from workflow_scripts.analysis.improvement import improvements
from workflow_scripts.analysis.lossless import lossless_table
from workflow_scripts.analysis.metrics import add_request_metrics, cell_table
from workflow_scripts.analysis.recommend import recommend, score_table
from workflow_scripts.analysis.study_config import StudyConfig
from workflow_scripts.analysis.summarize import improvement_values


def _cfg(**analysis) -> StudyConfig:
    spec = {"speculative_algorithm": "STANDALONE"}
    return StudyConfig.from_dict({
        "settings": {"baseline": {}, "steps1": {**spec, "speculative_num_steps": 1},
                     "steps2": {**spec, "speculative_num_steps": 2}, "steps3": {**spec, "speculative_num_steps": 3}},
        "workloads": {"synthetic": {"kind": "synthetic", "temperature": 0.0},
                      "realistic": {"kind": "realistic", "temperature": 0.7}},
        "analysis": {"bands": {"low": [1], "mid": [4]}, **analysis},
    })


def _recommend(rows, cfg, equivalence_pct=math.nan, floor_pct=math.nan):
    df = add_request_metrics(frame(rows))
    cells = cell_table(df)
    scores = score_table(df, cells, cfg)
    external = pd.DataFrame(columns=["source", "setting", "workload", "concurrency", "per_request_tok_s",
                                     "aggregate_tok_s"])
    improvement = improvements(improvement_values(cells, external), cfg.comparisons(), floor_pct,
                               equivalence_pct)
    return recommend(scores, cfg, improvement), scores


def _pick(rec, band="low", metric="per_request_tok_s"):
    return rec[(rec["band"] == band) & (rec["metric"] == metric)].iloc[0]


def test_steady_setting_beats_an_erratic_one_with_a_higher_median():
    rows = (cell("baseline", "synthetic", 1, 0, n=9, tok_s=100.0)
            # steps1: median 120 but swinging 60..180 -> MAD 60 -> score far below steps2
            + cell("steps1", "synthetic", 1, 0, n=9, tok_s=[60, 180, 120, 60, 180, 120, 60, 180, 120, 120])
            + cell("steps2", "synthetic", 1, 0, n=9, tok_s=110.0))
    rec, scores = _recommend(rows, _cfg())
    assert _pick(rec)["recommended"] == "steps2"
    s1 = scores[(scores["setting"] == "steps1") & (scores["metric"] == "per_request_tok_s")].iloc[0]
    assert s1["median"] == pytest.approx(120.0) and s1["score"] < 110.0
    assert _pick(rec)["score_vs_baseline"] == pytest.approx(1.1)


def test_the_verdict_says_whether_the_pick_beats_the_baseline_beyond_noise():
    rows = []
    for r, gain in enumerate([1.20, 1.22, 1.21]):
        rows += cell("baseline", "synthetic", 1, r, n=6, tok_s=100.0) + cell("steps1", "synthetic", 1, r, n=6,
                                                                             tok_s=100.0 * gain)
    rec, _ = _recommend(rows, _cfg())
    assert _pick(rec)["recommended"] == "steps1" and _pick(rec)["verdict"] == "real"
    one_round = [row for row in rows if row["repeat"] == 0]
    rec, _ = _recommend(one_round, _cfg())
    assert _pick(rec)["recommended"] == "steps1" and _pick(rec)["verdict"] == "within noise"  # no CI from one round


def test_tie_within_tolerance_goes_to_fewer_steps_and_errored_is_never_recommended():
    rows = (cell("baseline", "synthetic", 1, 0, n=6, tok_s=100.0)
            + cell("steps1", "synthetic", 1, 0, n=6, tok_s=150.0)
            + cell("steps2", "synthetic", 1, 0, n=6, tok_s=151.0)   # +0.7%: a tie at 1% tolerance
            # steps3 is fastest but one request failed
            + cell("steps3", "synthetic", 1, 0, n=6, tok_s=300.0)
            + cell("steps3", "synthetic", 1, 1, n=1, warmup=0, error="server died"))
    rec, _ = _recommend(rows, _cfg())
    pick = _pick(rec)
    assert pick["recommended"] == "steps1"
    assert pick["tied_with"] == "steps2"
    assert "steps3 (errored)" in pick["excluded"]
    # with no tolerance the faster one wins
    rec, _ = _recommend(rows, _cfg(tie_tolerance=0.0))
    assert _pick(rec)["recommended"] == "steps2"


def test_among_settings_shown_equivalent_fewer_steps_wins_and_the_note_says_so():
    rows = []
    for r, drift in enumerate([1.0, 0.9, 1.1, 1.05]):
        rows += (cell("baseline", "synthetic", 1, r, n=6, tok_s=100.0 * drift)
                 + cell("steps1", "synthetic", 1, r, n=6, tok_s=130.0 * drift * (1 + 0.002 * (r % 2)))
                 + cell("steps2", "synthetic", 1, r, n=6, tok_s=131.0 * drift))
    # steps2 scores 0.7% above steps1: beyond a 0.5% tie tolerance, inside a 2% noise floor and the default 4%
    # equivalence margin
    cfg = _cfg(tie_tolerance=0.005)
    rec, _ = _recommend(rows, cfg, equivalence_pct=cfg.equivalence_pct, floor_pct=2.0)
    pick = _pick(rec)
    assert pick["recommended"] == "steps1" and pick["tied_with"] == "steps2" and pick["verdict"] == "real"
    assert pick["note"].startswith("equivalent to steps2 (TOST within ±4%)")
    rec, _ = _recommend(rows, cfg, floor_pct=2.0)  # no margin: no tie shown, the top wins
    assert _pick(rec)["recommended"] == "steps2"


def test_band_without_any_eligible_setting_recommends_nothing():
    rows = (cell("baseline", "synthetic", 4, 0, n=4, error="oom") + cell("steps1", "synthetic", 4, 0, n=4, error="oom")
            + cell("baseline", "synthetic", 1, 0, n=4, tok_s=100.0))
    rec, _ = _recommend(rows, _cfg())
    mid = _pick(rec, band="mid")
    assert mid["recommended"] == "" and mid["note"] == "no eligible setting"
    assert _pick(rec, band="low")["recommended"] == "baseline"


def test_setting_missing_a_band_concurrency_is_not_eligible():
    cfg = _cfg(bands={"both": [1, 4]})
    rows = (cell("baseline", "synthetic", 1, 0, n=4, tok_s=100.0) + cell("baseline", "synthetic", 4, 0, n=4, tok_s=90.0)
            + cell("steps1", "synthetic", 1, 0, n=4, tok_s=500.0))
    rec, scores = _recommend(rows, cfg)
    assert _pick(rec, band="both")["recommended"] == "baseline"
    assert "no data at C=4" in scores.loc[scores["setting"] == "steps1", "note"].iloc[0]


def test_lossless_counts_token_identical_outputs_at_temperature_zero():
    def changed(prompt_id):  # steps2 diverges on prompt 0 only
        return [prompt_id * 100 + k + (1 if prompt_id == 0 and k > 5 else 0) for k in range(16)]

    rows = (cell("baseline", "synthetic", 1, 0, n=8) + cell("steps1", "synthetic", 1, 0, n=8)
            + cell("steps2", "synthetic", 1, 0, n=8, output_ids=changed)
            # sampled workload: not part of the check
            + cell("steps2", "realistic", 1, 0, n=8, temperature=0.7, output_ids=changed))
    table = lossless_table(add_request_metrics(frame(rows)), "baseline").set_index("setting")
    assert table.loc["steps1", "share_identical"] == 1.0
    # prompts cycle 0..3 over 9 requests (1 warm-up): prompt 0 appears twice among the 8 measured
    assert (table.loc["steps2", "n_compared"], table.loc["steps2", "n_identical"]) == (8, 6)
    assert set(table["workload"]) == {"synthetic"}


def test_lossless_falls_back_to_text_hash_without_token_ids():
    rows = cell("baseline", "synthetic", 1, 0, n=4) + cell("steps1", "synthetic", 1, 0, n=4)
    for r in rows:
        r["output_ids"] = []
    rows[-1]["text_hash"] = "different"
    table = lossless_table(add_request_metrics(frame(rows)), "baseline").set_index("setting")
    assert table.loc["steps1", "n_identical"] == 3 and table.loc["steps1", "n_compared"] == 4


def test_scores_count_only_the_rounds_every_setting_of_the_cell_shares():
    """Racing kept measuring steps2 after steps1 lost, on a machine 30% slower by then: over its own rounds steps2's
    median would fall below steps1's although the two ran alike in every round they shared."""
    rows = []
    for r in range(6):
        speed = 1.0 if r < 2 else 0.7
        rows += cell("baseline", "synthetic", 1, r, n=6, tok_s=100.0 * speed)
        rows += cell("steps2", "synthetic", 1, r, n=6, tok_s=130.0 * speed)
        if r < 2:
            rows += cell("steps1", "synthetic", 1, r, n=6, tok_s=120.0 * speed)
    rec, scores = _recommend(rows, _cfg())
    assert _pick(rec)["recommended"] == "steps2"
    assert _pick(rec, metric="aggregate_tok_s")["recommended"] == "steps2"
    steps2 = scores[(scores["setting"] == "steps2") & (scores["metric"] == "per_request_tok_s")].iloc[0]
    assert steps2["median"] == pytest.approx(130.0) and steps2["n_values"] == 12  # rounds 0 and 1 only
