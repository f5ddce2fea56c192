"""Fixed-acceptance calibration: a speculative step's cost measured where acceptance cannot move it.

    python -m workflow_scripts.analysis.calibration --summary tables/summary.csv --config-json '{...}' \
        --out-costs tables/calibration_costs.csv --out-gap tables/calibration_gap.csv

The cost model (cost_model.py) fits step cost and acceptance from the same cells, so a draft that is accepted less
than its histogram says reads as a dearer step. Calibration cells separate the two: a setting with
`simulate_acc_len: a` runs its server with SGLang's SGLANG_SIMULATE_ACC_LEN=a (engine/simulated_acceptance.py), so
every verify commits exactly min(a, k + 1) tokens whatever the draft proposed, and its speedup over the baseline at
concurrency C is E ÷ r(k, C) with E known. So:
- each calibration cell gives a step cost r = E ÷ speedup (E: the cell's own tokens per verify, which the last
  verify of a request can cut below a), in plain decode steps at the same C and workload;
- per workload and C, r(k, C) = 1 + o + s·k by least squares over the calibration cells (o = 0 with one k only);
  cells of one k at different a must agree: their spread is the calibration's own noise, reported;
- every other speculative cell of the study is then predicted from its measured acceptance alone,
  speedup = E_measured ÷ r(k, C), and bounded by what the fitted costs allow at perfect acceptance,
  (k + 1) ÷ r(k, C): `share_of_bound` = measured ÷ bound says how much of the step's possible gain the draft delivers,
  and `error` = predicted ÷ measured − 1 checks the costs on cells the fit never saw.
Calibration settings are never candidates for a recommendation or a schedule: their output is not the model's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from workflow_scripts.analysis.output import write_csv
from workflow_scripts.analysis.study_config import StudyConfig

CALIBRATION_KEY = "simulate_acc_len"
METRIC = "aggregate_tok_s_median"
WITHIN = 0.10  # a prediction within 10% of the measured speedup counts as good (the cost model's own yardstick)
COST_COLUMNS = ["workload", "concurrency", "o", "s", "n_cells", "steps", "spread_same_steps", "max_rel_residual"]
GAP_COLUMNS = ["workload", "concurrency", "setting", "steps", "tokens_per_verify", "speedup", "predicted",
               "upper_bound", "share_of_bound", "error"]


def is_calibration(setting: dict) -> bool:
    return setting.get(CALIBRATION_KEY) is not None


def _speedups(summary: pd.DataFrame, cfg: StudyConfig) -> pd.DataFrame:
    """Every measured speculative cell with its speedup over the baseline at the same workload and C."""
    measured = summary[summary["source"] == "measured"]
    base = measured[measured["setting"] == cfg.baseline].set_index(["workload", "concurrency"])[METRIC]
    cells = measured[measured["setting"].map(lambda s: cfg.steps(s) > 0)].copy()
    cells["steps"] = cells["setting"].map(cfg.steps)
    cells["speedup"] = cells[METRIC].to_numpy() / base.reindex(
        pd.MultiIndex.from_frame(cells[["workload", "concurrency"]])).to_numpy()
    weighted = cells.get("accept_length_token_weighted", pd.Series(np.nan, index=cells.index))
    cells["tokens_per_verify"] = weighted.fillna(cells["accept_length_mean"])
    return cells.dropna(subset=["speedup", "tokens_per_verify"])


def fit_costs(summary: pd.DataFrame, cfg: StudyConfig) -> pd.DataFrame:
    """r(k, C) = 1 + o + s·k per workload × C, from the calibration cells alone."""
    cells = _speedups(summary, cfg)
    cal = cells[cells["setting"].map(lambda s: is_calibration(cfg.settings.get(s, {})))].copy()
    cal["cost"] = cal["tokens_per_verify"] / cal["speedup"]
    rows = []
    for (workload, conc), group in cal.groupby(["workload", "concurrency"], sort=True):
        k, r = group["steps"].to_numpy(float), group["cost"].to_numpy(float) - 1.0
        if len(set(k)) > 1:
            s, o = np.polyfit(k, r, 1)
        else:
            s, o = float(np.mean(r / k)), 0.0
        fitted = 1.0 + o + s * k
        spread = group.groupby("steps")["cost"].agg(lambda c: c.max() / c.min() - 1).max()
        rows.append({"workload": workload, "concurrency": conc, "o": o, "s": s, "n_cells": len(group),
                     "steps": " ".join(str(int(x)) for x in sorted(set(k))), "spread_same_steps": spread,
                     "max_rel_residual": float(np.max(np.abs(fitted / (r + 1.0) - 1.0)))})
    return pd.DataFrame(rows, columns=COST_COLUMNS)


def bound_gap(summary: pd.DataFrame, cfg: StudyConfig, costs: pd.DataFrame) -> pd.DataFrame:
    """The study's own speculative cells against the calibrated costs: prediction, upper bound and gap."""
    cells = _speedups(summary, cfg)
    cells = cells[cells["setting"].map(lambda s: not is_calibration(cfg.settings.get(s, {}))
                                       and not cfg.settings.get(s, {}).get("speculative_adaptive"))]
    fit = costs.set_index(["workload", "concurrency"])
    rows = []
    for r in cells.itertuples():
        if (r.workload, r.concurrency) not in fit.index:
            continue
        c = fit.loc[(r.workload, r.concurrency)]
        cost = 1.0 + c["o"] + c["s"] * r.steps
        predicted, bound = r.tokens_per_verify / cost, (r.steps + 1) / cost
        rows.append({"workload": r.workload, "concurrency": r.concurrency, "setting": r.setting, "steps": r.steps,
                     "tokens_per_verify": r.tokens_per_verify, "speedup": r.speedup, "predicted": predicted,
                     "upper_bound": bound, "share_of_bound": r.speedup / bound, "error": predicted / r.speedup - 1})
    return pd.DataFrame(rows, columns=GAP_COLUMNS)


def within_share(gap: pd.DataFrame) -> float:
    """Share of the study's cells whose calibrated prediction is within WITHIN of the measured speedup."""
    return float((gap["error"].abs() <= WITHIN).mean()) if len(gap) else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--summary", type=Path, required=True, help="tables/summary.csv")
    p.add_argument("--config-json", required=True, help="the study config (settings, workloads, analysis) as JSON")
    p.add_argument("--out-costs", type=Path, required=True)
    p.add_argument("--out-gap", type=Path, required=True)
    args = p.parse_args(argv)
    cfg = StudyConfig.from_dict(json.loads(args.config_json))
    summary = pd.read_csv(args.summary)
    costs = fit_costs(summary, cfg)
    gap = bound_gap(summary, cfg, costs)
    write_csv(costs, args.out_costs)
    write_csv(gap, args.out_gap)
    print(f"calibrated costs for {len(costs)} workload x concurrency cells; {len(gap)} study cells predicted, "
          f"{within_share(gap):.0%} within {WITHIN:.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
