"""Fixed-acceptance calibration: step costs from the calibration cells alone, and the study's cells against them."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from workflow_scripts.analysis.calibration import bound_gap, fit_costs, main, within_share
from workflow_scripts.analysis.cost_model.data import speculative_family
from workflow_scripts.analysis.study_config import StudyConfig


def standalone(k: int, **extra) -> dict:
    return {"speculative_algorithm": "STANDALONE", "speculative_num_steps": k, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": k + 1, **extra}


CAL = {(1, 2), (2, 2), (3, 2), (3, 4), (5, 2)}
CONFIG = {"settings": {"baseline": {}, **{f"steps{k}": standalone(k) for k in (1, 2, 3)},
                       **{f"cal{k}_{a}": standalone(k, simulate_acc_len=a) for k, a in CAL}},
          "workloads": {"synthetic": {}}}
COST = {1: (0.05, 0.10), 16: (0.10, 0.35)}  # C -> (o, s): r(k, C) = 1 + o + s·k
ACCEPTED = {1: 1.8, 2: 2.4, 3: 2.7}  # the study's own settings' tokens per verify


def summary(noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """A study whose speeds follow the cost model exactly (times a noise factor), baseline at 100 tok/s."""
    rng = np.random.default_rng(seed)
    rows = []
    for c, (o, s) in COST.items():
        rows.append({"setting": "baseline", "concurrency": c, "tokens": np.nan, "speedup": 1.0})
        rows += [{"setting": f"cal{k}_{a}", "concurrency": c, "tokens": min(a, k + 1), "k": k} for k, a in CAL]
        rows += [{"setting": f"steps{k}", "concurrency": c, "tokens": e, "k": k} for k, e in ACCEPTED.items()]
    frame = pd.DataFrame(rows)
    cost = 1 + frame["concurrency"].map(lambda c: COST[c][0]) + frame["concurrency"].map(lambda c: COST[c][1]) * frame["k"]
    speedup = (frame["tokens"] / cost).fillna(1.0) * (1 + noise * rng.standard_normal(len(frame)))
    return pd.DataFrame({"source": "measured", "setting": frame["setting"], "workload": "synthetic",
                         "concurrency": frame["concurrency"], "aggregate_tok_s_median": 100 * speedup,
                         "accept_length_mean": frame["tokens"], "accept_length_token_weighted": frame["tokens"]})


def test_costs_come_back_from_the_calibration_cells_alone():
    cfg = StudyConfig.from_dict(CONFIG)
    costs = fit_costs(summary(), cfg).set_index("concurrency")
    for c, (o, s) in COST.items():
        assert costs.loc[c, "o"] == pytest.approx(o) and costs.loc[c, "s"] == pytest.approx(s)
        assert costs.loc[c, "n_cells"] == len(CAL) and costs.loc[c, "spread_same_steps"] == pytest.approx(0, abs=1e-12)
    gap = bound_gap(summary(), cfg, fit_costs(summary(), cfg))
    assert set(gap["setting"]) == {"steps1", "steps2", "steps3"}  # never the calibration cells themselves
    assert np.allclose(gap["error"], 0) and within_share(gap) == 1.0
    assert np.allclose(gap["share_of_bound"], gap["tokens_per_verify"] / (gap["steps"] + 1))


def test_a_study_cell_does_not_move_the_costs():
    """The costs see calibration cells only: the study's own settings can be off the model without moving them."""
    cfg = StudyConfig.from_dict(CONFIG)
    skewed = summary()
    skewed.loc[skewed["setting"] == "steps3", "aggregate_tok_s_median"] *= 0.7
    assert fit_costs(skewed, cfg).equals(fit_costs(summary(), cfg))
    gap = bound_gap(skewed, cfg, fit_costs(skewed, cfg)).set_index(["setting", "concurrency"])
    assert gap.loc[("steps3", 16), "error"] == pytest.approx(1 / 0.7 - 1)


def test_cli_writes_both_tables(tmp_path):
    summary(noise=0.02).to_csv(tmp_path / "summary.csv", index=False)
    assert main(["--summary", str(tmp_path / "summary.csv"), "--config-json", json.dumps(CONFIG),
                 "--out-costs", str(tmp_path / "costs.csv"), "--out-gap", str(tmp_path / "gap.csv")]) == 0
    assert len(pd.read_csv(tmp_path / "costs.csv")) == 2 and len(pd.read_csv(tmp_path / "gap.csv")) == 6


def test_the_cost_model_fits_the_measured_acceptance_never_the_fixed_one():
    """Calibration settings (four step counts here, against the study's three) are not the cost model's family:
    their acceptance is set, not measured."""
    cfg = StudyConfig.from_dict(CONFIG)
    family, others = speculative_family(cfg, set(CONFIG["settings"]))
    assert family == ["steps1", "steps2", "steps3"] and others == []
