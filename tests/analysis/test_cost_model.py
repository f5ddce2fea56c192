"""The cost model recovers the α per position and the step costs it generated cells from (with noise), skips a
source without acceptance data in one line, and keeps flagged histograms out of the fit."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pandas as pd
import pytest

from workflow_scripts.analysis.cost_model.fit import CostFit, StepShape, profile_units
from workflow_scripts.analysis.cost_model.report import _best_steps_lines, analyse
from workflow_scripts.analysis.cost_model.speculation import (committed_per_verify, expected_tokens, geometric_alpha,
                                                              verifies_to_commit)
from workflow_scripts.analysis.study_config import StudyConfig
from workflow_scripts.analysis.summarize import MEASURED

ALPHAS = {"synthetic": [0.85, 0.75, 0.7, 0.65], "realistic": [0.6, 0.5, 0.45, 0.4]}
TEMPERATURE = {"synthetic": 0.0, "realistic": 0.7}
TRUE_COSTS = CostFit(overhead=0.08, per_draft={1: 0.55, 4: 0.35, 16: 0.18, 64: 0.12})
BASE_TOK_S = {1: 40.0, 4: 120.0, 16: 300.0, 64: 520.0}
STEPS = {"steps1": 1, "steps2": 2, "steps3": 3, "steps4": 4}
RHO = {"synthetic": 1.3, "realistic": 0.9}  # a speculative setting's prefill per token ÷ the baseline's


def study_config(settings=STEPS, **analysis) -> StudyConfig:
    spec = {name: {"speculative_algorithm": "STANDALONE", "speculative_num_steps": k, "speculative_eagle_topk": 1,
                   "speculative_num_draft_tokens": k + 1} for name, k in settings.items()}
    return StudyConfig.from_dict({"settings": {"baseline": {}, **spec},
                                  "analysis": {"bootstrap": {"resamples": 200}, **analysis}})


def sample_histogram(rng: np.random.Generator, alphas: list[float], steps: int, verifies: int) -> list[int]:
    """Chain drafting: position j is accepted with α_j once every position before it was."""
    accepted = np.zeros(verifies, dtype=int)
    alive = np.ones(verifies, dtype=bool)
    for j in range(steps):
        alive &= rng.random(verifies) < alphas[j]
        accepted += alive
    histogram = np.bincount(accepted, minlength=steps + 1)
    return histogram[: accepted.max() + 1].tolist()  # SGLang grows the list only as far as the largest count


def sample_request(rng: np.random.Generator, alphas: list[float], steps: int, length: int) -> list[int]:
    """The histogram of one request that decodes ``length`` tokens: verifies until it has them, the last one's
    accepted drafts counted whole, as the engine counts them, though it commits only what the length has left."""
    counts = np.zeros(steps + 1, dtype=int)
    committed = 0
    while committed < length:
        accepted = 0
        while accepted < steps and rng.random() < alphas[accepted]:
            accepted += 1
        counts[accepted] += 1
        committed += accepted + 1
    return counts[: np.flatnonzero(counts).max() + 1].tolist()


def synthetic_study(rng: np.random.Generator, settings=STEPS, noise=0.02, requests_per_cell=12,
                    prefill: dict[int, float] | None = None, rho: dict[str, float] | None = None,
                    true: CostFit = TRUE_COSTS, own: dict[str, CostFit] | None = None,
                    length: int | None = None, gap: float = 0.0, acceptance: dict[str, list[float]] = ALPHAS):
    """Requests (with histograms) and a summary whose tok/s follow the model (``true``'s step costs, or a
    workload's ``own``), with multiplicative noise. With ``prefill`` ({C: the baseline's prefill share}),
    speculation speeds up only the rest, its prefill costs ``rho`` ({workload: ρ}, 1 by default) times the
    baseline's, and each request carries its cell's forward times as the client records them. With ``length``,
    every request decodes that many tokens after its first, and a finished request's slot stays empty ``gap``
    decode forwards at C > 1 (the tokens a verify commits are then committed_per_verify's, not E_k). ``acceptance``:
    α per position per workload."""
    req_rows, sum_rows = [], []
    for workload, alphas in acceptance.items():
        for conc, base in BASE_TOK_S.items():
            slot_gap = gap if conc > 1 else 0.0
            for setting, k in {"baseline": 0, **settings}.items():
                share = (prefill or {}).get(conc, 0.0)
                ratio = (rho or {}).get(workload, 1.0)
                costs = dataclasses.replace((own or {}).get(workload, true), prefill_ratio=ratio)
                per_verify = (committed_per_verify(alphas, k, np.array([length]), slot_gap) if length
                              else expected_tokens(alphas, k))
                speedup = costs.speedup(per_verify, k, conc, share)
                value = base * speedup * (1 + noise * rng.standard_normal())
                tokens = 1000.0  # the cell's: its forward seconds at the baseline's speed are 1000 / base
                decode_s = (1 - share) * tokens / base * (speedup if k == 0 else costs.step_cost(k, conc) / per_verify)
                extend_s = share * tokens / base * (ratio if k else 1.0)
                # one decode forward per verify step: plain decode steps of the baseline's, each E_k tokens a row;
                # with lengths, C·V ÷ (V + g) rows a forward, each L ÷ V tokens (the baseline's V = L)
                if length:
                    verifies = verifies_to_commit(alphas, k, length)[length]
                    rows, per_row = conc * verifies / (verifies + slot_gap), length / verifies
                else:
                    rows, per_row = conc, per_verify
                forwards = tokens / (rows * per_row)
                metrics = json.dumps({"specstudy:decode_forward_seconds_total": decode_s,
                                      "specstudy:decode_forwards_total": forwards,
                                      "specstudy:extend_forward_seconds_total": extend_s,
                                      "specstudy:mixed_forward_seconds_total": 0.0,
                                      "sglang:generation_tokens_total": tokens,
                                      "sglang:spec_verify_calls_total": forwards * rows if k else 0.0,
                                      }) if prefill or length else None
                sum_rows.append({"source": MEASURED, "setting": setting, "workload": workload, "concurrency": conc,
                                 "aggregate_tok_s_median": value, "aggregate_tok_s_ci_low": value * 0.97,
                                 "aggregate_tok_s_ci_high": value * 1.03,
                                 "per_request_tok_s_median": value / conc, "accept_length_mean": np.nan})
                for i in range(requests_per_cell):
                    if length:
                        histogram = sample_request(rng, alphas, k, length) if k else None
                        verify_ct = sum(histogram) if k else None
                    else:
                        verify_ct = int(rng.integers(20, 40))
                        histogram = sample_histogram(rng, alphas, k, verify_ct) if k else None
                    req_rows.append({"setting": setting, "workload": workload, "concurrency": conc, "repeat": 0,
                                     "request_id": f"{setting}-{workload}-{conc}-{i}", "ok": True, "warmup": False,
                                     "temperature": TEMPERATURE[workload],
                                     "spec_verify_ct": verify_ct if k else None,
                                     "output_tokens": length + 1 if length else None,
                                     "spec_correct_drafts_histogram": histogram, "cell_server_metrics": metrics})
    return pd.DataFrame(req_rows), pd.DataFrame(sum_rows)


def param(params: pd.DataFrame, name: str, source: str = MEASURED, **where) -> float:
    sel = params[(params["source"] == source) & (params["parameter"] == name)]
    for key, value in where.items():
        sel = sel[sel[key] == value]
    assert len(sel) == 1, (name, where)
    return float(sel["value"].iloc[0])


def test_fit_recovers_known_alphas_and_costs_from_noisy_cells():
    requests, summary = synthetic_study(np.random.default_rng(0))
    report = analyse(requests, summary, study_config())
    for workload, alphas in ALPHAS.items():
        for position, alpha in enumerate(alphas, start=1):
            assert param(report.params, "alpha", workload=workload, position=position) == pytest.approx(alpha, abs=0.05)
    for workload in ALPHAS:
        assert param(report.params, "fixed_overhead", workload=workload) == pytest.approx(TRUE_COSTS.overhead,
                                                                                         abs=0.06)
        for conc, cost in TRUE_COSTS.per_draft.items():
            assert param(report.params, "per_draft_cost", workload=workload,
                         concurrency=conc) == pytest.approx(cost, rel=0.15, abs=0.02)
    # 2% noise: leave-one-setting-out errors stay well inside the 10% goal
    errors = report.validation["aggregate_error_pct"].abs()
    assert len(errors) == len(STEPS) * len(ALPHAS) * len(BASE_TOK_S) and (errors < 10).mean() >= 0.8
    # the acceptance table agrees with the α the fit used
    table = report.acceptance
    row = table[(table["setting"] == "steps4") & (table["workload"] == "synthetic") & (table["position"] == 1)].iloc[0]
    assert row["conditional_ci_low"] <= row["conditional_rate"] <= row["conditional_ci_high"]
    assert row["conditional_rate"] == pytest.approx(ALPHAS["synthetic"][0], abs=0.05)


def test_unmeasured_steps_are_predicted_and_marked():
    rng = np.random.default_rng(1)
    measured = {"steps1": 1, "steps2": 2, "steps3": 3}
    requests, summary = synthetic_study(rng, settings=measured)
    report = analyse(requests, summary, study_config(measured, predict_max_steps=5))
    pred = report.predictions
    assert sorted(pred["steps"].unique()) == [0, 1, 2, 3, 4, 5]
    unmeasured = pred[pred["steps"] >= 4]
    assert (~unmeasured["measured"]).all() and unmeasured["note"].str.contains("predicted, not measured").all()
    assert unmeasured["note"].str.contains("extrapolated").all()  # α at positions 4, 5 was never observed
    # the truth at steps 4 uses α_4 = last α's neighbour: within the stated error plus the extrapolation's gap
    for row in unmeasured[unmeasured["steps"] == 4].itertuples():
        truth = BASE_TOK_S[row.concurrency] * expected_tokens(ALPHAS[row.workload], 4) / TRUE_COSTS.step_cost(
            4, row.concurrency)
        assert row.predicted_aggregate_tok_s == pytest.approx(truth, rel=0.12)
    assert any("Steps " in line or "not worth" in line for line in report.lines)


# a forward profile's extra step cost u(k, C) = step cost − 1, k = 1..6: concave at C=1 (the distinct experts a
# verify touches saturate), linear at C=16, convex at C=64 (the MoE compute-bound, a second pass past its block)
PROFILE_UNITS = {1: [0.5 * k**0.5 for k in range(1, 7)], 4: [0.4 * k**0.8 for k in range(1, 7)],
                 16: [0.3 * k for k in range(1, 7)], 64: [0.2 * k**1.5 for k in range(1, 7)]}


def forward_profile(units: dict[int, list[float]], spread: float = 0.0) -> pd.DataFrame:
    """A profile of step costs 1 + u, its repeats ranging over 1 + u·(1 ± spread)."""
    rows = []
    for c, u in units.items():
        for k in range(7):
            extra = u[k - 1] if k else 0.0
            rows.append({"concurrency": c, "steps": k, "seconds": 0.01 * (1 + extra), "step_cost": 1 + extra,
                         "step_cost_low": 1 + extra * (1 - spread), "step_cost_high": 1 + extra * (1 + spread)})
    return pd.DataFrame(rows)


def test_a_forward_profile_shapes_the_step_cost_past_the_measured_steps():
    """Cells made with a step cost that is not linear in k, measured at steps 1-3: the profile's shape predicts
    steps 4 and 5 where a line through 1-3 cannot, and the fit recovers the profile's scale."""
    units = {(c, k): u[k - 1] for c, u in PROFILE_UNITS.items() for k in range(1, 7)}
    true = CostFit(overhead=0.0, per_draft={1: 1.3, 4: 1.1, 16: 0.9, 64: 0.8}, shape=StepShape(units))
    measured = {"steps1": 1, "steps2": 2, "steps3": 3}
    requests, summary = synthetic_study(np.random.default_rng(5), settings=measured, noise=0.01, true=true)
    cfg = study_config(measured, predict_max_steps=5)
    shaped = analyse(requests, summary, cfg, profile=forward_profile(PROFILE_UNITS))
    linear = analyse(requests, summary, cfg)
    assert any("Step cost: shaped by the engine's own step, profiled" in line for line in shaped.lines)
    assert any("Step cost: linear in the drafts (no forward profile" in line for line in linear.lines)
    for workload in ALPHAS:
        for conc, scale in true.per_draft.items():
            assert param(shaped.params, "per_draft_cost", workload=workload,
                         concurrency=conc) == pytest.approx(scale, rel=0.15)
        # the profiled step holds its fixed part
        assert param(shaped.params, "fixed_overhead", workload=workload) == 0.0

    def worst_error(report) -> float:
        pred = report.predictions[report.predictions["steps"] >= 4]
        truth = [BASE_TOK_S[c] * expected_tokens(ALPHAS[w], k) / true.step_cost(k, c)
                 for w, c, k in pred[["workload", "concurrency", "steps"]].itertuples(index=False)]
        return float((pred["predicted_aggregate_tok_s"] / truth - 1).abs().max())

    # α at positions 4, 5 reuses α_3 (the truth's α_4 is lower), which bounds both fits from below
    assert worst_error(shaped) < 0.10 < worst_error(linear)


def test_the_profiles_range_widens_the_stated_error_of_the_unmeasured_steps_only():
    """The engine the cells came from costs 20% more per draft at steps 4 and 5 than the profile's medians say, well
    inside the range of its repeats (±40%): the stated error of steps 4 and 5 grows to cover the truth, while the measured
    steps keep the validation's error."""
    off = {c: [x * (1.2 if k >= 4 else 1.0) for k, x in enumerate(u, 1)] for c, u in PROFILE_UNITS.items()}
    true = CostFit(overhead=0.0, per_draft={1: 1.3, 4: 1.1, 16: 0.9, 64: 0.8},
                   shape=StepShape({(c, k): u[k - 1] for c, u in off.items() for k in range(1, 7)}))
    measured = {"steps1": 1, "steps2": 2, "steps3": 3}
    requests, summary = synthetic_study(np.random.default_rng(8), settings=measured, noise=0.01, true=true)
    cfg = study_config(measured, predict_max_steps=5)
    narrow = analyse(requests, summary, cfg, profile=forward_profile(PROFILE_UNITS))
    wide = analyse(requests, summary, cfg, profile=forward_profile(PROFILE_UNITS, spread=0.4))

    def scored(report) -> pd.DataFrame:
        pred = report.predictions[report.predictions["steps"] > 0].copy()
        truth = [BASE_TOK_S[c] * expected_tokens(ALPHAS[w], k) / true.step_cost(k, c)
                 for w, c, k in pred[["workload", "concurrency", "steps"]].itertuples(index=False)]
        pred["error_pct"] = 100 * (pred["predicted_aggregate_tok_s"] / truth - 1).abs()
        return pred

    n, w = scored(narrow), scored(wide)
    loo = float(n["stated_error_pct"].iloc[0])
    assert (n["stated_error_pct"] == loo).all() and (n["profile_error_pct"] == 0).all()
    assert (w.loc[w["measured"], "stated_error_pct"] == loo).all()  # the fit and its validation are the same
    late = w[~w["measured"]]
    assert len(late) == 16 and (late["profile_error_pct"] > 5).all()
    assert late["stated_error_pct"].to_numpy() == pytest.approx(np.hypot(loo, late["profile_error_pct"]))
    assert (n.loc[~n["measured"], "error_pct"] > loo).any()  # the medians alone miss steps 4 and 5 ...
    assert (late["error_pct"] <= late["stated_error_pct"]).all()  # ... which the profile's range covers
    assert any(line.startswith("  - Step counts never measured: stated error ±") for line in wide.lines)
    assert not any(line.startswith("  - Step counts never measured") for line in narrow.lines)


def test_a_forward_profile_missing_a_concurrency_leaves_the_step_cost_linear():
    requests, summary = synthetic_study(np.random.default_rng(6), settings={"steps1": 1, "steps2": 2})
    partial = forward_profile({c: u for c, u in PROFILE_UNITS.items() if c != 64})
    report = analyse(requests, summary, study_config({"steps1": 1, "steps2": 2}), profile=partial)
    assert any("Step cost: linear in the drafts (the forward profile lacks C=64)" in line for line in report.lines)


def test_a_setting_measured_past_the_profile_is_kept_out_of_the_fit_not_a_crash():
    measured = {"steps1": 1, "steps2": 2, "steps3": 3}
    requests, summary = synthetic_study(np.random.default_rng(7), settings=measured)
    short = forward_profile({c: u[:2] + [np.nan] * 4 for c, u in PROFILE_UNITS.items()}).dropna()  # steps 0-2 only
    report = analyse(requests, summary, study_config(measured, predict_max_steps=3), profile=short)
    pred = report.predictions
    assert pred.loc[pred["steps"] == 3, "predicted_aggregate_tok_s"].isna().all()  # no shape, no prediction
    assert pred.loc[pred["steps"].isin([1, 2]), "predicted_aggregate_tok_s"].notna().all()


def test_a_dip_in_the_profile_is_made_non_decreasing_in_k():
    """More drafts never cost less: a noisy size below its neighbour is pooled with it (isotonic regression)."""
    shape = profile_units(forward_profile({1: [0.5, 0.9, 0.7, 1.2, 1.3, 1.4]}), {1})
    assert [shape.units[(1, k)] for k in range(1, 7)] == pytest.approx([0.5, 0.8, 0.8, 1.2, 1.3, 1.4])
    assert shape.text.startswith("shaped by the engine's own step")


def test_external_without_acceptance_is_skipped_in_one_line():
    rng = np.random.default_rng(2)
    requests, summary = synthetic_study(rng)
    external = summary[summary["workload"] == "synthetic"].assign(source="article", accept_length_mean=np.nan)
    report = analyse(requests, pd.concat([summary, external], ignore_index=True), study_config())
    skipped = [line for line in report.lines if line.startswith("- Cost model, article: skipped")]
    assert skipped == ["- Cost model, article: skipped: no accept_length column, so no acceptance to fit."]
    assert set(report.predictions["source"]) == {MEASURED}


def test_external_with_accept_length_fits_one_alpha_and_says_what_it_cannot():
    rng = np.random.default_rng(3)
    requests, summary = synthetic_study(rng)
    alpha = 0.7
    external = summary[summary["workload"] == "synthetic"].assign(source="article")
    external["accept_length_mean"] = [expected_tokens([alpha], STEPS.get(s, 0)) if s in STEPS else np.nan
                                      for s in external["setting"]]
    report = analyse(requests, pd.concat([summary, external], ignore_index=True), study_config())
    assert param(report.params, "alpha", source="article", position=1) == pytest.approx(alpha, abs=1e-6)
    assert any("one α for every draft position" in line for line in report.lines)
    assert geometric_alpha(expected_tokens([0.6], 3), 3) == pytest.approx(0.6)


def test_bad_histograms_are_flagged_logged_and_kept_out(caplog):
    rng = np.random.default_rng(4)
    requests, summary = synthetic_study(rng)
    spec = requests.index[requests["setting"] == "steps2"]
    requests.at[spec[0], "spec_correct_drafts_histogram"] = [1, 2, 3, 4]  # 4 buckets, steps 2 allow 3
    requests.at[spec[1], "spec_verify_ct"] = 999  # counts no longer add up
    with caplog.at_level(logging.WARNING, logger="workflow_scripts.analysis.acceptance"):
        report = analyse(requests, summary, study_config())
    flagged = [r.getMessage() for r in caplog.records if "bad histogram" in r.getMessage()]
    assert len(flagged) == 2
    assert any(requests.at[spec[0], "request_id"] in m and "4 buckets" in m for m in flagged)
    assert any(requests.at[spec[1], "request_id"] in m and "spec_verify_ct is 999" in m for m in flagged)
    assert any(line.startswith("- **Bad histograms**: 2 request(s)") for line in report.lines)
    acc = report.acceptance
    flagged_cell = acc[(acc["setting"] == "steps2") & (acc["workload"] == requests.at[spec[0], "workload"])]
    assert (flagged_cell["n_bad_histograms"] == 2).all()
    assert (flagged_cell["n_requests"] == 12 * len(BASE_TOK_S) - 2).all()


def test_no_histograms_skips_the_measured_model_in_one_line():
    rng = np.random.default_rng(5)
    requests, summary = synthetic_study(rng)
    report = analyse(requests.drop(columns=["spec_correct_drafts_histogram"]), summary, study_config())
    assert report.predictions.empty and report.acceptance.empty
    assert [line for line in report.lines if "skipped" in line] == [
        "- Cost model, measured: skipped: no usable spec_correct_drafts_histogram in the request records (the server "
        "did not report it, or every one was flagged)."]


def test_speedups_are_paired_by_round_so_drift_between_cohorts_does_not_bias_the_fit():
    """Steps 3-4 measured in a later cohort, on a machine 30% slower, with a fresh control: the ratio of
    medians across cohorts is off by ~15%, the within-round pairs are not."""
    rng = np.random.default_rng(4)
    requests, _ = synthetic_study(rng)
    cohort_of = {"steps1": "early", "steps2": "early", "steps3": "late", "steps4": "late"}
    speed = {"early": 1.0, "late": 0.7}
    rounds = []
    for workload, alphas in ALPHAS.items():
        for conc, base in BASE_TOK_S.items():
            for cohort in speed:
                for repeat in range(4):
                    phase = speed[cohort] * (1 + 0.03 * rng.standard_normal())  # shared by the round's members
                    members = {"baseline": 0, **{s: k for s, k in STEPS.items() if cohort_of[s] == cohort}}
                    for setting, k in members.items():
                        speedup = expected_tokens(alphas, k) / TRUE_COSTS.step_cost(k, conc) if k else 1.0
                        value = base * speedup * phase * (1 + 0.005 * rng.standard_normal())
                        rounds.append({"setting": setting, "workload": workload, "concurrency": conc,
                                       "cohort": cohort, "repeat": repeat, "aggregate_tok_s": value,
                                       "per_request_tok_s_median": value / conc})
    rounds = pd.DataFrame(rounds)
    medians = rounds.groupby(["setting", "workload", "concurrency"], as_index=False)[
        ["aggregate_tok_s", "per_request_tok_s_median"]].median()
    summary = medians.rename(columns={"aggregate_tok_s": "aggregate_tok_s_median"}).assign(
        source=MEASURED, accept_length_mean=np.nan,
        aggregate_tok_s_ci_low=lambda d: d.aggregate_tok_s_median * 0.97,
        aggregate_tok_s_ci_high=lambda d: d.aggregate_tok_s_median * 1.03)
    unpaired = analyse(requests, summary, study_config()).validation
    paired = analyse(requests, summary, study_config(), rounds=rounds).validation
    assert unpaired["aggregate_error_pct"].abs().median() > 8  # drift, not the model, is what it measures
    assert paired["aggregate_error_pct"].abs().median() < 4 and (paired["aggregate_error_pct"].abs() < 10).mean() >= 0.8
    late = paired[paired["left_out"] == "steps4"].iloc[0]
    base = medians[(medians.setting == "baseline") & (medians.workload == late.workload)
                   & (medians.concurrency == late.concurrency)].aggregate_tok_s.iloc[0]
    true_speedup = expected_tokens(ALPHAS[late.workload], 4) / TRUE_COSTS.step_cost(4, late.concurrency)
    # in the baseline's units (its median over both cohorts), not the slow cohort's
    assert late.measured_aggregate_tok_s == pytest.approx(base * true_speedup, rel=0.03)


def test_the_prefill_share_is_not_sped_up_and_the_forward_times_say_how_large_it_is():
    """Steps 1-3 measured where prefill-only forwards took 3-30% of the baseline's forward time (more at high C, as
    on the embedded engine) and cost a speculative setting 1.3x the baseline's on one workload and 0.9x on the other
    (RHO): with the forward times the fit recovers the step costs and each workload's ratio and predicts steps 4;
    without them it counts the prefill as step cost."""
    shares = {1: 0.03, 4: 0.08, 16: 0.18, 64: 0.30}
    measured = {"steps1": 1, "steps2": 2, "steps3": 3}
    requests, summary = synthetic_study(np.random.default_rng(5), settings=measured, noise=0.01, prefill=shares,
                                        rho=RHO)
    cfg = study_config(measured, predict_max_steps=4)
    report = analyse(requests, summary, cfg)
    blind = analyse(requests.drop(columns="cell_server_metrics"), summary, cfg)
    for workload, ratio in RHO.items():
        assert param(report.params, "prefill_ratio", workload=workload) == pytest.approx(ratio)
    for conc, share in shares.items():
        assert param(report.params, "prefill_share", workload="synthetic", concurrency=conc) == pytest.approx(share)
        for k in (1, 2, 3):
            true = TRUE_COSTS.step_cost(k, conc)
            for workload in ALPHAS:
                assert param(report.params, "spec_step_cost", workload=workload, concurrency=conc,
                             position=k) == pytest.approx(true, rel=0.1)
            # the engine's forward times measure the same step cost, and the report compares the two
            assert param(report.params, "measured_step_cost", workload="synthetic", concurrency=conc,
                         position=k) == pytest.approx(true)
    assert any(line.strip().startswith("- Step cost, fitted ÷ measured") for line in report.lines)
    # blind to the prefill, the fit charges it to the speculative step: at C=64 on the workload whose speculative
    # prefill costs 1.3x the baseline's, a quarter too expensive by steps 3
    assert param(blind.params, "spec_step_cost", workload="synthetic", concurrency=64,
                 position=3) > 1.25 * TRUE_COSTS.step_cost(3, 64)
    steps4 = report.predictions[report.predictions["steps"] == 4].set_index(["workload", "concurrency"])
    for workload, alphas in ALPHAS.items():
        for conc, share in shares.items():
            costs = CostFit(TRUE_COSTS.overhead, TRUE_COSTS.per_draft, RHO[workload])
            truth = BASE_TOK_S[conc] * costs.speedup(expected_tokens(alphas, 4), 4, conc, share)
            assert steps4.loc[(workload, conc), "predicted_aggregate_tok_s"] == pytest.approx(truth, rel=0.05)


def test_one_concurrencys_prefill_ratio_does_not_bend_that_cells_predictions():
    """One cell's ρ is a ratio of two short windows' prefill seconds, and one cell's can sit far from every other
    cell's without explaining its throughput. Here the throughput follows RHO everywhere but the forward times say
    a third of it at synthetic C=16: the fit keeps each workload's ρ and predicts steps 4 there as everywhere else."""
    shares = {1: 0.03, 4: 0.08, 16: 0.18, 64: 0.30}
    measured = {"steps1": 1, "steps2": 2, "steps3": 3}
    requests, summary = synthetic_study(np.random.default_rng(5), settings=measured, noise=0.01, prefill=shares,
                                        rho=RHO)
    odd = (requests["workload"] == "synthetic") & (requests["concurrency"] == 16) & (requests["setting"] != "baseline")

    def third_of_the_extend(metrics: str) -> str:
        values = json.loads(metrics)
        values["specstudy:extend_forward_seconds_total"] /= 3
        return json.dumps(values)

    requests.loc[odd, "cell_server_metrics"] = requests.loc[odd, "cell_server_metrics"].map(third_of_the_extend)
    report = analyse(requests, summary, study_config(measured, predict_max_steps=4))
    assert param(report.params, "prefill_ratio", workload="synthetic") == pytest.approx(RHO["synthetic"])
    cell = report.predictions.set_index(["workload", "concurrency", "steps"]).loc[("synthetic", 16, 4)]
    costs = CostFit(TRUE_COSTS.overhead, TRUE_COSTS.per_draft, RHO["synthetic"])
    truth = BASE_TOK_S[16] * costs.speedup(expected_tokens(ALPHAS["synthetic"], 4), 4, 16, shares[16])
    assert cell["predicted_aggregate_tok_s"] == pytest.approx(truth, rel=0.05)
    validation = report.validation.set_index(["workload", "concurrency"])
    assert (validation.loc[("synthetic", 16), "aggregate_error_pct"].abs() < 5).all()  # per (w, C) ρ: 14–24%


def test_each_workload_has_its_own_step_cost():
    """The realistic workload's steps cost 30% more per draft than the synthetic one's (the embedded engine's
    forward times differ by workload too, as what a step carries does): the fit recovers both scales, and leaving a setting out predicts it from its workload's own cells. One scale for both
    would sit between them, off for each."""
    heavy = dataclasses.replace(TRUE_COSTS, per_draft={c: 1.3 * s for c, s in TRUE_COSTS.per_draft.items()})
    own = {"synthetic": TRUE_COSTS, "realistic": heavy}
    requests, summary = synthetic_study(np.random.default_rng(11), noise=0.01, own=own)
    report = analyse(requests, summary, study_config())
    for workload, true in own.items():
        for conc, scale in true.per_draft.items():
            assert param(report.params, "per_draft_cost", workload=workload,
                         concurrency=conc) == pytest.approx(scale, rel=0.12, abs=0.02)
    errors = report.validation["aggregate_error_pct"].abs()
    assert errors.median() < 3 and errors.max() < 8  # one scale for both: median 4.9%, max 11.3%


def best_steps_cell(workload: str, ratios: list[float], predicted_best: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One concurrency-16 cell of steps4 and steps5: rounds where steps5 ran ``ratios`` × steps4, and predictions
    that make ``predicted_best`` the pick."""
    rounds = pd.DataFrame([{"setting": s, "workload": workload, "concurrency": 16, "cohort": "c", "repeat": r,
                            "aggregate_tok_s": 100.0 * (ratio if s == "steps5" else 1.0),
                            "per_request_tok_s_median": 6.0} for r, ratio in enumerate(ratios)
                           for s in ("steps4", "steps5")])
    medians = rounds.groupby("setting")["aggregate_tok_s"].median()
    pred = pd.DataFrame({"setting": ["steps4", "steps5"], "steps": [4, 5], "workload": workload, "concurrency": 16,
                         "measured": True, "measured_aggregate_tok_s": [medians["steps4"], medians["steps5"]],
                         "predicted_aggregate_tok_s": [110.0, 100.0] if predicted_best == 4 else [100.0, 110.0],
                         "stated_error_pct": 8.0})
    return rounds, pred


def test_best_steps_are_scored_only_where_the_rounds_support_the_measured_lead():
    """A 4% lead of medians that the rounds' paired CI does not support (the study calls it noise) scores
    nothing, however the medians fall against the floor; a lead the rounds support does, and a wrong pick is a miss."""
    noisy_rounds, noisy_pred = best_steps_cell("synthetic", [0.90, 1.01, 0.92, 1.02, 0.95], predicted_best=5)
    clear_rounds, clear_pred = best_steps_cell("realistic", [1.08, 1.07, 1.09, 1.08, 1.085], predicted_best=4)
    rounds = pd.concat([noisy_rounds, clear_rounds], ignore_index=True)
    pred = pd.concat([noisy_pred, clear_pred], ignore_index=True)
    [line] = _best_steps_lines(pred, 2.7, "2.7%", rounds)
    assert "predicted = measured in 0 of 1 cells whose measured lead over the runner-up is beyond noise" in line
    assert "synthetic C=16: measured 4, predicted 5 (lead over 5 +4.3% [" in line and "within noise" in line
    assert "realistic C=16: measured 5, predicted 4 (lead over 4 +8.1% [" in line and "real)" in line
    # a miss says by how much the model preferred its pick, against its own error
    assert "the model put 4 over 5 by 10.0%, against its stated error ±8.0%" in line
    # the right pick where the lead is real scores 1 of 1
    rounds, pred = best_steps_cell("realistic", [1.08, 1.07, 1.09, 1.08, 1.085], predicted_best=5)
    [line] = _best_steps_lines(pred, 2.7, "2.7%", rounds)
    assert "in 1 of 1 cells" in line and "the model put" not in line
    # without rounds (an external table) the medians' gap against the floor decides, and the noisy cell counts
    [line] = _best_steps_lines(noisy_pred, 2.7, "2.7%")
    assert "in 0 of 1 cells whose measured gap exceeds the noise floor" in line and "(gap 5.3%)" in line
    # rounds that pair one cell and not the other (settings of other cohorts): the header names both rules
    [line] = _best_steps_lines(pd.concat([noisy_pred, clear_pred], ignore_index=True), 2.7, "2.7%", clear_rounds)
    assert "(gap 5.3%)" in line and "(lead over 4 +8.1% [" in line
    assert "in 0 of 2 cells whose measured lead over the runner-up is beyond noise" in line
    assert "or, where the two were not measured in the same rounds, whose measured gap exceeds" in line


def test_the_verifies_a_length_needs_match_simulated_requests():
    """The renewal count behind committed_per_verify against requests drawn one verify at a time: at 31 tokens the
    last verify's lost drafts cost steps 4 half a verify a request more than 31 ÷ E_4."""
    rng = np.random.default_rng(2)
    alphas = ALPHAS["synthetic"]
    for steps, length in ((1, 5), (3, 31), (4, 31), (4, 100)):
        drawn = [sum(sample_request(rng, alphas, steps, length)) for _ in range(4000)]
        expected = verifies_to_commit(alphas, steps, length)[length]
        assert expected == pytest.approx(np.mean(drawn), rel=0.01)
    assert verifies_to_commit(alphas, 4, 31)[31] > 31 / expected_tokens(alphas, 4) + 0.4
    assert verifies_to_commit(alphas, 0, 7).tolist() == list(range(8))


def test_a_requests_last_verify_and_its_empty_slot_are_charged():
    """Requests of 31 tokens after the first, and a finished request's slot empty one decode forward until its
    successor is prefilled (the embedded engine's gap is near one forward at C ≥ 4). A
    verify of 3 drafts then adds 2.67 tokens to the cell where E_3 = 2.93. Fitted on steps 1–3 with a profiled step
    shape (no fixed overhead to soak it up), the model finds the true step costs and predicts steps 4 from the
    requests' lengths and the gap the forward counters show. With E_k alone it charges the loss to the step cost:
    ~10% too dear by steps 3 on the synthetic workload, more with every draft. (α_4 = α_3 here, so that steps 1–3
    tell the fit every α steps 4 needs.)"""
    measured = {"steps1": 1, "steps2": 2, "steps3": 3}
    acceptance = {w: [*a[:3], a[2]] for w, a in ALPHAS.items()}
    true = CostFit(overhead=0.0, per_draft={1: 1.3, 4: 1.1, 16: 0.9, 64: 0.8},
                   shape=StepShape({(c, k): u[k - 1] for c, u in PROFILE_UNITS.items() for k in range(1, 7)}))
    requests, summary = synthetic_study(np.random.default_rng(3), settings=measured, noise=0.005, requests_per_cell=80,
                                        true=true, length=31, gap=1.0, acceptance=acceptance)
    cfg = study_config(measured, predict_max_steps=4)
    report = analyse(requests, summary, cfg, profile=forward_profile(PROFILE_UNITS))
    blind = analyse(requests.drop(columns="output_tokens"), summary, cfg, profile=forward_profile(PROFILE_UNITS))
    assert committed_per_verify(acceptance["synthetic"], 3, np.array([31]), 1.0) < 0.92 * expected_tokens(
        acceptance["synthetic"], 3)
    for workload in ALPHAS:
        for conc in BASE_TOK_S:
            for k in (1, 2, 3):
                fitted = param(report.params, "spec_step_cost", workload=workload, concurrency=conc, position=k)
                assert fitted == pytest.approx(true.step_cost(k, conc), rel=0.035)
    for conc in (4, 16, 64):
        assert param(blind.params, "spec_step_cost", workload="synthetic", concurrency=conc,
                     position=3) > 1.08 * true.step_cost(3, conc)
    pred = report.predictions[report.predictions["steps"] == 4]
    truth = [BASE_TOK_S[c] * true.speedup(committed_per_verify(acceptance[w], 4, np.array([31]), 1.0 if c > 1 else 0.0),
                                          4, c, 0.0)
             for w, c in pred[["workload", "concurrency"]].itertuples(index=False)]
    assert (pred["predicted_aggregate_tok_s"] / truth - 1).abs().max() < 0.04
