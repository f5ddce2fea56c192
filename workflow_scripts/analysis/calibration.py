"""Fixed-acceptance calibration: a speculative step's cost measured where acceptance cannot move it.

    python -m workflow_scripts.analysis.calibration --config-json '{...}' --requests requests/*.parquet \
        --out-costs tables/calibration_costs.csv --out-gap tables/calibration_gap.csv

The cost model (cost_model/) fits step cost and acceptance from the same cells, so a draft that is accepted less
than its histogram says reads as a dearer step. Calibration cells separate the two: a setting with
`simulate_acc_len: a` runs its server with SGLang's SGLANG_SIMULATE_ACC_LEN=a (engine/simulated_acceptance.py), so
every verify commits exactly min(a, k + 1) tokens whatever the draft proposed. Each is read in the cost model's
terms (cost_model/data.py: the paired speedup, the tokens a verify committed E', the prefill's share of the
baseline's forward time f and a speculative prefill's cost ratio ρ) and:
- each calibration cell gives a step cost r in plain decode steps (fit.observed_step_cost: the speedup with the
  prefill taken out, times E'), ρ the median of the calibration cells' own; the cells of one k at different a must
  agree, and their spread is the calibration's own noise, reported;
- per workload, C and k, r(k, C) is the mean over those cells; a k the calibration did not run takes the line
  1 + o + s·k fitted per workload and C over the ones it did;
- every other speculative cell of the study is then predicted from its measured acceptance alone, leave one setting
  out: CostFit.speedup with its own E' and f, the calibrated r(k, C), and ρ from the study's other settings (the
  cost model's own fit), and bounded by what r allows at perfect acceptance (E' = k + 1):
  `share_of_bound` = measured ÷ bound says how much of the step's possible gain the draft delivers, and
  `error` = predicted ÷ measured − 1 checks the costs on cells the fit never saw.
A prefill is sped up by nothing: read without f, a cell that commits more tokens per verify looks like a dearer step
(its requests finish sooner, so prefills take a larger share of its time). `forward_step_cost`, the engine's own
seconds per decode forward ÷ the baseline's, checks r where the records have forward times.
Calibration settings are never candidates for a recommendation or a schedule: their output is not the model's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from workflow_scripts.analysis.acceptance import check_histograms
from workflow_scripts.analysis.cost_model.data import decode_lengths, measured_data
from workflow_scripts.analysis.cost_model.fit import CostFit, observed_step_cost
from workflow_scripts.analysis.forward_time import forward_times
from workflow_scripts.analysis.output import write_csv
from workflow_scripts.analysis.study_config import CALIBRATION_KEY, StudyConfig, is_adaptive, is_calibration
from workflow_scripts.analysis.study_inputs import load_study
from workflow_scripts.analysis.summarize import summarize_measured

WITHIN = 0.10  # a prediction within 10% of the measured speedup counts as good (the cost model's own yardstick)
CELL_COLUMNS = ["setting", "steps", "workload", "concurrency", "speedup", "tokens_per_verify", "committed_per_verify",
                "prefill_share", "prefill_ratio", "measured_step_cost"]
COST_COLUMNS = ["workload", "concurrency", "steps", "step_cost", "n_cells", "simulate_acc_len", "spread_same_steps",
                "forward_step_cost", "prefill_ratio", "o", "s"]
GAP_COLUMNS = ["workload", "concurrency", "setting", "steps", "tokens_per_verify", "committed_per_verify",
               "prefill_share", "prefill_ratio", "step_cost", "speedup", "predicted", "upper_bound", "share_of_bound",
               "error"]


def _median_ratio(cells: pd.DataFrame) -> float | None:
    """The median prefill ratio of the cells, None where the records had no forward times (the model without it)."""
    ratios = cells["prefill_ratio"].dropna()
    return float(ratios.median()) if len(ratios) else None


def speculative_cells(requests: pd.DataFrame, rounds: pd.DataFrame, cfg: StudyConfig) -> pd.DataFrame:
    """Every static speculative cell, calibration or not, in the cost model's terms (CELL_COLUMNS)."""
    static = [name for name, args in cfg.settings.items()
              if cfg.steps(name) > 0 and not is_adaptive(args)]
    summary = summarize_measured(requests, rounds, cfg.bootstrap)
    data = measured_data(summary, check_histograms(requests, cfg.steps), cfg, static, rounds,
                         forward_times(requests), decode_lengths(requests, cfg.baseline))
    cells = data.cells[data.cells["steps"] > 0]
    return cells.dropna(subset=["speedup", "committed_per_verify"])[CELL_COLUMNS].reset_index(drop=True)


def fit_costs(cells: pd.DataFrame, cfg: StudyConfig) -> pd.DataFrame:
    """r(k, C) per workload × C × k from the calibration cells alone (COST_COLUMNS)."""
    cal = cells[cells["setting"].map(lambda s: is_calibration(cfg.settings.get(s, {})))]
    rows = []
    for workload, w_cells in cal.groupby("workload", sort=True):
        rho = _median_ratio(w_cells)
        w_cells = w_cells.assign(cost=observed_step_cost(w_cells, 1.0 if rho is None else rho))
        for conc, group in w_cells.groupby("concurrency", sort=True):
            k, r = group["steps"].to_numpy(float), group["cost"].to_numpy(float) - 1.0
            s, o = np.polyfit(k, r, 1) if len(set(k)) > 1 else (float(np.mean(r / k)), 0.0)
            for steps, same in group.groupby("steps", sort=True):
                rows.append({"workload": workload, "concurrency": conc, "steps": steps,
                             "step_cost": float(same["cost"].mean()), "n_cells": len(same),
                             "simulate_acc_len": " ".join(str(a) for a in sorted(
                                 cfg.settings[name][CALIBRATION_KEY] for name in same["setting"])),
                             "spread_same_steps": float(same["cost"].max() / same["cost"].min() - 1),
                             "forward_step_cost": float(same["measured_step_cost"].mean()),
                             "prefill_ratio": rho, "o": float(o), "s": float(s)})
    return pd.DataFrame(rows, columns=COST_COLUMNS)


def calibrated_cost(costs: pd.DataFrame, workload: str, concurrency: int, steps: int) -> float:
    """r(k, C): the calibration's own where it ran k, else its line at that workload and C (NaN: not calibrated)."""
    here = costs[(costs["workload"] == workload) & (costs["concurrency"] == concurrency)]
    if here.empty:
        return float("nan")
    same = here[here["steps"] == steps]
    return float(same["step_cost"].iloc[0]) if len(same) else float(1.0 + here["o"].iloc[0] + here["s"].iloc[0] * steps)


def bound_gap(cells: pd.DataFrame, cfg: StudyConfig, costs: pd.DataFrame) -> pd.DataFrame:
    """The study's own speculative cells against the calibrated costs: prediction, upper bound and gap (GAP_COLUMNS)."""
    study = cells[cells["setting"].map(lambda s: not is_calibration(cfg.settings.get(s, {})))]
    rows = []
    for r in study.itertuples(index=False):
        cost = calibrated_cost(costs, r.workload, r.concurrency, r.steps)
        if not np.isfinite(cost):
            continue
        # leave one setting out: the prefill ratio of the study's other settings at this workload, as the cost
        # model would fit it without this one
        others = study[(study["workload"] == r.workload) & (study["setting"] != r.setting)]
        rho = _median_ratio(others)
        model = CostFit(0.0, {}, rho)
        predicted = model.speedup(r.committed_per_verify, r.steps, r.concurrency, r.prefill_share, cost)
        bound = model.speedup(r.steps + 1, r.steps, r.concurrency, r.prefill_share, cost)
        rows.append({"workload": r.workload, "concurrency": r.concurrency, "setting": r.setting, "steps": r.steps,
                     "tokens_per_verify": r.tokens_per_verify, "committed_per_verify": r.committed_per_verify,
                     "prefill_share": r.prefill_share, "prefill_ratio": rho, "step_cost": cost, "speedup": r.speedup,
                     "predicted": predicted, "upper_bound": bound, "share_of_bound": r.speedup / bound,
                     "error": predicted / r.speedup - 1})
    return pd.DataFrame(rows, columns=GAP_COLUMNS)


def within_share(gap: pd.DataFrame) -> float:
    """Share of the study's cells whose calibrated prediction is within WITHIN of the measured speedup."""
    return float((gap["error"].abs() <= WITHIN).mean()) if len(gap) else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config-json", required=True, help="the study config (settings, workloads, analysis) as JSON")
    p.add_argument("--requests", nargs="+", type=Path, required=True, help="requests/{setting}.parquet files")
    p.add_argument("--out-costs", type=Path, required=True)
    p.add_argument("--out-gap", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        cfg = StudyConfig.from_json(args.config_json)
        study = load_study(cfg, args.requests).without([cfg.twin])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cells = speculative_cells(study.requests, study.cells, cfg)
    costs = fit_costs(cells, cfg)
    gap = bound_gap(cells, cfg, costs)
    write_csv(costs, args.out_costs)
    write_csv(gap, args.out_gap)
    line = (f"calibrated costs for {len(costs)} workload x concurrency x steps cells; {len(gap)} study cells "
            f"predicted, {within_share(gap):.0%} within {WITHIN:.0%}")
    check = costs.dropna(subset=["forward_step_cost"])
    if len(check):
        offset = np.median(check["forward_step_cost"] / check["step_cost"] - 1)
        line += f"; the engine's forward times give step costs {offset:+.1%} from these (median of {len(check)})"
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
