"""Did the cost model predict settings it had never seen? Compares predictions saved BEFORE measuring with the
measured aggregate tok/s of those settings, cell by cell, against the prediction's stated error.

    python -m workflow_scripts.analysis.cost_model --study results/cost-model --predict-steps 4 5 \
        --out results/cost-model/predicted_before_measuring.csv
    (add steps4 and steps5 to the study config, run the study again)
    python -m benchmarks.cost_model_check --predictions results/cost-model/predicted_before_measuring.csv \
        --summary results/cost-model/tables/summary.csv --setting 4=steps4 5=steps5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def compare(predictions: pd.DataFrame, summary: pd.DataFrame, settings: dict[int, str]) -> pd.DataFrame:
    """One row per predicted cell of the given steps, with the measured median and whether it fell inside."""
    pred = predictions[(predictions["source"] == "measured") & predictions["steps"].isin(settings)].copy()
    pred["setting"] = pred["steps"].map(settings)
    measured = summary[summary["source"] == "measured"][["setting", "workload", "concurrency",
                                                         "aggregate_tok_s_median", "aggregate_tok_s_ci_low",
                                                         "aggregate_tok_s_ci_high"]]
    out = pred[["setting", "steps", "workload", "concurrency", "predicted_aggregate_tok_s", "stated_error_pct"]].merge(
        measured, on=["setting", "workload", "concurrency"], how="left")
    out["error_pct"] = 100 * (out["predicted_aggregate_tok_s"] / out["aggregate_tok_s_median"] - 1)
    out["inside_stated_error"] = out["error_pct"].abs() <= out["stated_error_pct"]
    out["inside_10pct"] = out["error_pct"].abs() <= 10
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--predictions", type=Path, required=True, help="cost_model --out CSV, saved before measuring")
    parser.add_argument("--summary", type=Path, required=True, help="tables/summary.csv after measuring")
    parser.add_argument("--setting", nargs="+", required=True, metavar="STEPS=SETTING",
                        help="which measured setting has which step count, e.g. 4=steps4")
    args = parser.parse_args(argv)
    try:
        settings = {int(k): v for k, v in (item.split("=", 1) for item in args.setting)}
    except ValueError:
        parser.error(f"--setting: expected STEPS=SETTING items, got {args.setting}")
    table = compare(pd.read_csv(args.predictions), pd.read_csv(args.summary), settings)
    missing = table["aggregate_tok_s_median"].isna()
    if missing.all():
        print(f"error: {args.summary} has no measured cells of {sorted(settings.values())}", file=sys.stderr)
        return 2
    print(table.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    done = table[~missing]
    errors = done["error_pct"].abs()
    print(f"\n{int(done['inside_stated_error'].sum())}/{len(done)} cells inside the stated error "
          f"(±{done['stated_error_pct'].iloc[0]:.1f}%); {int(done['inside_10pct'].sum())}/{len(done)} within 10%; "
          f"|error| median {np.median(errors):.1f}%, max {errors.max():.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
