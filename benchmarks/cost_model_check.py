"""Did the cost model predict settings it had never seen? Compares predictions saved BEFORE measuring with the
measured speedups of those settings, cell by cell, against the prediction's stated error.

    python -m workflow_scripts.analysis.cost_model --study results/embedded-cpu --predict-steps 4 5 \
        --out results/embedded-cpu/predicted_before_measuring.csv
    (add steps4 and steps5 to the study config, run the study again)
    python -m benchmarks.cost_model_check --predictions results/embedded-cpu/predicted_before_measuring.csv \
        --improvement results/embedded-cpu/tables/improvement.csv --setting 4=steps4 5=steps5

The comparison is of speedups over the control, not of tok/s: the new settings are measured in a later cohort,
beside a fresh control, and the machine may run faster or slower than when the predictions were made. The
measured speedup is the paired one of the new cohort (geometric mean of within-round ratios, with its CI); the
predicted one is the model's, applied to whatever the control does in those rounds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def compare(predictions: pd.DataFrame, improvement: pd.DataFrame, settings: dict[int, str], baseline: str) -> pd.DataFrame:
    """One row per predicted cell of the given steps, with the measured paired speedup and whether it fell inside."""
    pred = predictions[(predictions["source"] == "measured") & predictions["steps"].isin(settings)].copy()
    pred["setting"] = pred["steps"].map(settings)
    measured = improvement[(improvement["source"] == "measured") & (improvement["baseline"] == baseline)
                           & (improvement["metric"] == "aggregate_tok_s")]
    measured = measured.assign(
        measured_speedup=1 + measured["improvement_pct"] / 100, measured_ci_low=1 + measured["ci_low_pct"] / 100,
        measured_ci_high=1 + measured["ci_high_pct"] / 100, setting=measured["candidate"],
    )[["setting", "workload", "concurrency", "measured_speedup", "measured_ci_low", "measured_ci_high", "rounds"]]
    out = pred[["setting", "steps", "workload", "concurrency", "predicted_speedup", "stated_error_pct"]].merge(
        measured, on=["setting", "workload", "concurrency"], how="left")
    out["error_pct"] = 100 * (out["predicted_speedup"] / out["measured_speedup"] - 1)
    out["inside_stated_error"] = out["error_pct"].abs() <= out["stated_error_pct"]
    out["inside_10pct"] = out["error_pct"].abs() <= 10
    out["inside_measured_ci"] = out["predicted_speedup"].between(out["measured_ci_low"], out["measured_ci_high"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--predictions", type=Path, required=True, help="cost_model --out CSV, saved before measuring")
    parser.add_argument("--improvement", type=Path, required=True, help="tables/improvement.csv after measuring")
    parser.add_argument("--baseline", default="baseline", help="the control the speedups are over (analysis.baseline)")
    parser.add_argument("--setting", nargs="+", required=True, metavar="STEPS=SETTING",
                        help="which measured setting has which step count, e.g. 4=steps4")
    args = parser.parse_args(argv)
    try:
        settings = {int(k): v for k, v in (item.split("=", 1) for item in args.setting)}
    except ValueError:
        parser.error(f"--setting: expected STEPS=SETTING items, got {args.setting}")
    table = compare(pd.read_csv(args.predictions), pd.read_csv(args.improvement), settings, args.baseline)
    missing = table["measured_speedup"].isna()
    if missing.all():
        print(f"error: {args.improvement} has no paired comparison of {sorted(settings.values())} against "
              f"{args.baseline}", file=sys.stderr)
        return 2
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    done = table[~missing]
    errors = done["error_pct"].abs()
    print(f"\n{int(done['inside_stated_error'].sum())}/{len(done)} cells inside the stated error "
          f"(±{done['stated_error_pct'].min():.1f}–{done['stated_error_pct'].max():.1f}%); {int(done['inside_10pct'].sum())}/{len(done)} within 10%; "
          f"{int(done['inside_measured_ci'].sum())}/{len(done)} inside the measured speedup's 95% CI; "
          f"|error| median {np.median(errors):.1f}%, max {errors.max():.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
