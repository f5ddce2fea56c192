"""The measurement design's goals (issue 10), read from a finished study (and a second cold run of it).

    python -m benchmarks.noise_floor --study results/embedded-cpu [--compare results-2nd-run/embedded-cpu]

Prints, for the study's A/A twin and its comparisons:
- honesty: the share of (workload, concurrency, metric) A/A cells whose 95% CI includes 0 (goal >= 90%);
- closeness: median and worst |A/A difference| (goals <= 2% and <= 5%), per metric;
- precision: the median paired-CI half-width over every comparison (goal <= 3%), and the cells at the target;
- with --compare: how many comparisons of the two runs agree within their CIs (the CIs overlap);
- the design, the measuring time and the machine's memory bandwidth the figures came from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd


def _load(study: Path) -> dict:
    tables = study / "tables"
    for name in ("aa.csv", "improvement.csv", "precision.csv", "noise_floor.json"):
        if not (tables / name).is_file():
            raise SystemExit(f"{tables / name}: missing; run the study (snakemake --cores 4) first")
    return {
        "aa": pd.read_csv(tables / "aa.csv"),
        "improvement": pd.read_csv(tables / "improvement.csv"),
        "precision": pd.read_csv(tables / "precision.csv"),
        "floor": json.loads((tables / "noise_floor.json").read_text()),
        "metas": [json.loads(p.read_text()) for p in sorted((study / "benchmark").glob("*.json"))],
    }


def aa_goals(aa: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for metric, g in [("both", aa), *aa.groupby("metric")]:
        g = g.dropna(subset=["diff_pct"])
        honest = ((g.ci_low_pct <= 0) & (g.ci_high_pct >= 0)).mean()
        rows.append({"metric": metric, "cells": len(g), "CI includes 0 (>= 90%)": f"{honest:.0%}",
                     "median |A/A| (<= 2%)": f"{g.diff_pct.abs().median():.2f}%",
                     "worst |A/A| (<= 5%)": f"{g.diff_pct.abs().max():.2f}%",
                     "median CI half-width": f"{((g.ci_high_pct - g.ci_low_pct) / 2).median():.2f}%"})
    return pd.DataFrame(rows)


def precision_goal(improvement: pd.DataFrame, precision: pd.DataFrame) -> str:
    measured = improvement[(improvement.source == "measured") & (improvement.rounds >= 2)]
    return (f"median paired-CI half-width over {len(measured)} comparisons: "
            f"{measured.half_width_pct.median():.2f}% (goal <= 3%); cells at the precision target: "
            f"{int(precision.precision_met.sum())} of {len(precision)}; rounds per cell "
            f"{int(precision.rounds.min())}-{int(precision.rounds.max())}")


def agreement(a: pd.DataFrame, b: pd.DataFrame) -> str:
    keys = ["kind", "baseline", "candidate", "workload", "concurrency", "metric"]
    both = a[a.source == "measured"].merge(b[b.source == "measured"], on=keys, suffixes=("_1", "_2"))
    both = both.dropna(subset=["ci_low_pct_1", "ci_low_pct_2"])
    overlap = (both.ci_low_pct_1 <= both.ci_high_pct_2) & (both.ci_low_pct_2 <= both.ci_high_pct_1)
    gap = (both.improvement_pct_1 - both.improvement_pct_2).abs()
    return (f"two runs: {int(overlap.sum())} of {len(both)} comparisons agree within their CIs "
            f"({overlap.mean():.0%}); median |difference| between the runs {gap.median():.2f} pp, worst {gap.max():.2f} pp")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", type=Path, required=True, help="a finished study's results/{study} folder")
    parser.add_argument("--compare", type=Path, help="the same study's folder from a second, separate cold run")
    args = parser.parse_args(argv)
    run = _load(args.study)
    floor = run["floor"]
    print(f"study {args.study}: design {floor['schedule']}, noise floor ±{floor['noise_floor_pct']:.2f}% "
          f"(95th percentile of |A/A|), at least {floor['rounds']} rounds per A/A cell")
    for meta in run["metas"]:
        print(f"  cohort {meta['cohort']}: {len(meta['members'])} servers, measuring {meta['measuring_s'] / 60:.1f} min"
              f"{' (time budget hit)' if meta['budget_hit'] else ''}, memory bandwidth {meta['mem_bandwidth_gbs']:.1f} GB/s")
    print(aa_goals(run["aa"]).to_markdown(index=False))
    print(precision_goal(run["improvement"], run["precision"]))
    if args.compare:
        print(agreement(run["improvement"], _load(args.compare)["improvement"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
