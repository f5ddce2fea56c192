"""Fixed-acceptance calibration: step costs from the calibration cells alone, and the study's cells against them."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.analysis.request_data import cell, write_parquet
from workflow_scripts.analysis.calibration import CELL_COLUMNS, bound_gap, fit_costs, main, within_share
from workflow_scripts.analysis.cost_model.data import speculative_family
from workflow_scripts.analysis.study_config import StudyConfig


def standalone(k: int, **extra) -> dict:
    return {"speculative_algorithm": "STANDALONE", "speculative_num_steps": k, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": k + 1, **extra}


CAL = {(1, 2), (2, 2), (3, 2), (3, 4), (5, 2)}  # (steps, fixed acceptance): no calibration cell at steps 4
ACCEPTED = {1: 1.8, 2: 2.4, 3: 2.7, 4: 3.0}  # the study's own settings' tokens per verify
CONFIG = {"settings": {"baseline": {}, **{f"steps{k}": standalone(k) for k in ACCEPTED},
                       **{f"cal{k}_{a}": standalone(k, simulate_acc_len=a) for k, a in CAL}},
          "workloads": {"synthetic": {}}}
COST = {1: (0.05, 0.10), 16: (0.10, 0.35), 64: (0.20, 0.30)}  # C -> (o, s): r(k, C) = 1 + o + s·k
PREFILL = {1: 0.05, 16: 0.2, 64: 0.3}  # the baseline's prefill share at each C (the embedded engine's, roughly)
RHO = 1.2  # a speculative prefill's cost ÷ the baseline's


def true_cost(k: int, c: int) -> float:
    o, s = COST[c]
    return 1 + o + s * k


def cells(prefill: dict[int, float] = PREFILL) -> pd.DataFrame:
    """Every speculative cell of a study whose speeds follow the cost model exactly, in CELL_COLUMNS."""
    rows = []
    for c in COST:
        f = prefill[c]
        for name, args in CONFIG["settings"].items():
            k = args.get("speculative_num_steps", 0)
            if not k:
                continue
            e = min(args["simulate_acc_len"], k + 1) if "simulate_acc_len" in args else ACCEPTED[k]
            r = true_cost(k, c)
            rows.append({"setting": name, "steps": k, "workload": "synthetic", "concurrency": c,
                         "speedup": 1 / ((1 - f) * r / e + f * RHO), "tokens_per_verify": e,
                         "committed_per_verify": e, "prefill_share": f, "prefill_ratio": RHO,
                         "measured_step_cost": r})
    return pd.DataFrame(rows, columns=CELL_COLUMNS)


def test_costs_come_back_from_the_calibration_cells_alone():
    cfg = StudyConfig.from_dict(CONFIG)
    costs = fit_costs(cells(), cfg)
    assert sorted(set(costs["steps"])) == [1, 2, 3, 5] and len(costs) == 4 * len(COST)
    for r in costs.itertuples():
        assert r.step_cost == pytest.approx(true_cost(r.steps, r.concurrency))
        assert r.forward_step_cost == pytest.approx(r.step_cost) and r.prefill_ratio == pytest.approx(RHO)
        assert (r.o, r.s) == pytest.approx(COST[r.concurrency])
        assert r.spread_same_steps == pytest.approx(0, abs=1e-12)
        assert (r.n_cells, r.simulate_acc_len) == ((2, "2 4") if r.steps == 3 else (1, "2"))
    gap = bound_gap(cells(), cfg, costs)
    assert set(gap["setting"]) == {f"steps{k}" for k in ACCEPTED}  # never the calibration cells themselves
    assert np.allclose(gap["error"], 0) and within_share(gap) == 1.0
    # steps 4 was not calibrated: its cost is the line's
    assert np.allclose(gap.loc[gap["steps"] == 4, "step_cost"], [true_cost(4, c) for c in COST])
    f = gap["prefill_share"]
    assert np.allclose(gap["upper_bound"], 1 / ((1 - f) * gap["step_cost"] / (gap["steps"] + 1) + f * RHO))
    assert np.allclose(gap["share_of_bound"], gap["speedup"] / gap["upper_bound"])


def test_read_without_the_prefill_more_acceptance_looks_like_a_dearer_step():
    """The prefill is sped up by nothing, so a cell that commits 4 tokens a verify spends a larger share of its time
    prefilling than one that commits 2. Charged to the step (no prefill share), steps 3 at a = 4 costs far more than
    at a = 2; with the share taken out both give the true cost."""
    cfg = StudyConfig.from_dict(CONFIG)
    blind = cells().assign(prefill_share=0.0)
    spread = fit_costs(blind, cfg).set_index(["concurrency", "steps"])["spread_same_steps"]
    assert spread[(64, 3)] > 0.3 and spread[(1, 3)] < spread[(16, 3)] < spread[(64, 3)]
    assert (fit_costs(cells(), cfg)["spread_same_steps"].abs() < 1e-12).all()


def test_a_study_cell_does_not_move_the_costs():
    """The costs see calibration cells only: the study's own settings can be off the model without moving them."""
    cfg = StudyConfig.from_dict(CONFIG)
    skewed = cells()
    skewed.loc[skewed["setting"] == "steps3", "speedup"] *= 0.7
    assert fit_costs(skewed, cfg).equals(fit_costs(cells(), cfg))
    gap = bound_gap(skewed, cfg, fit_costs(skewed, cfg)).set_index(["setting", "concurrency"])
    assert gap.loc[("steps3", 16), "error"] == pytest.approx(1 / 0.7 - 1)


def test_a_cells_prefill_ratio_comes_from_the_other_settings():
    """Leave one setting out: the prediction of a cell takes the prefill ratio of the study's other settings, so its
    own cannot make it right."""
    cfg = StudyConfig.from_dict(CONFIG)
    odd = cells()
    odd.loc[odd["setting"] == "steps3", "prefill_ratio"] = 3.0
    base = bound_gap(cells(), cfg, fit_costs(cells(), cfg)).set_index(["setting", "concurrency"])
    gap = bound_gap(odd, cfg, fit_costs(odd, cfg)).set_index(["setting", "concurrency"])
    assert gap.loc["steps3", "prefill_ratio"].eq(RHO).all()
    assert np.allclose(gap.loc["steps3", "predicted"], base.loc["steps3", "predicted"])


def test_cli_reads_the_records_and_writes_both_tables(tmp_path):
    """End to end from request records: each speculative request decodes 24 tokens after its first in verifies of E
    tokens (its histogram), its stream counted at the baseline's speed × E ÷ r(k); without forward times the model
    has no prefill."""
    c, tokens = 4, 25
    rows = cell("baseline", "synthetic", c, 0, n=16, tok_s=100.0, ttft_s=1e-4, tokens=tokens)
    for name, args in CONFIG["settings"].items():
        k = args.get("speculative_num_steps", 0)
        e = int(args.get("simulate_acc_len", 3))  # the study's own settings commit 3 a verify here
        if not k or e > k + 1:
            continue
        histogram = [0] * (k + 1)
        histogram[e - 1] = (tokens - 1) // e
        # the stream's whole chunks of e count ceil(25 ÷ e)·e tokens in the time 25 take
        streamed = -(-tokens // e) * e / tokens
        rows += cell(name, "synthetic", c, 0, n=16, tok_s=100.0 * e / (1.0 + 0.2 * k) / streamed, ttft_s=1e-4,
                     tokens=tokens, tokens_per_chunk=e, histogram=histogram)
    paths = [str(write_parquet([r for r in rows if r["setting"] == s], tmp_path / "requests" / f"{s}.parquet"))
             for s in sorted({r["setting"] for r in rows})]
    assert main(["--config-json", json.dumps(CONFIG), "--requests", *paths,
                 "--out-costs", str(tmp_path / "costs.csv"), "--out-gap", str(tmp_path / "gap.csv")]) == 0
    costs, gap = pd.read_csv(tmp_path / "costs.csv"), pd.read_csv(tmp_path / "gap.csv")
    assert costs["steps"].tolist() == [1, 2, 3, 5]  # cal1_2, cal2_2, cal3_2 and cal3_4, cal5_2
    assert np.allclose(costs["step_cost"], 1 + 0.2 * costs["steps"], rtol=0.03)
    assert sorted(gap["setting"]) == ["steps2", "steps3", "steps4"]  # steps1 cannot commit 3 a verify
    assert (gap["error"].abs() < 0.03).all()


def test_the_cost_model_fits_the_measured_acceptance_never_the_fixed_one():
    """Calibration settings (four step counts here, against the study's four) are not the cost model's family:
    their acceptance is set, not measured."""
    cfg = StudyConfig.from_dict(CONFIG)
    family, others = speculative_family(cfg, set(CONFIG["settings"]))
    assert family == ["steps1", "steps2", "steps3", "steps4"] and others == []
