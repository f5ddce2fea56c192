"""The race's verdicts on a finished study's rounds, with each CI on its own rounds and with the pooled spread.

    python -m benchmarks.pooled_replay results/embedded-cpu/tables/cells.csv [more cells.csv ...] \
        [--control baseline] [--repeats 2] [--equivalence-pct 4]

Replays analysis/decisions.py on the rounds a study measured (its tables/cells.csv), once with every paired CI on
its own rounds alone (a t interval on n - 1 degrees of freedom) and once with the spread pooled over the study's
comparisons (paired.VariancePrior, as the study itself judges). Prints per file and variant: the cells decided per
metric, the fitted prior, and the A/A twin's CIs that cover 0 (pooling that made CIs too narrow would show there).
A replay, not a rerun: the rounds are those the study's own race chose to measure.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from workflow_scripts.analysis.decisions import UNDECIDED, RaceRule, decision_table
from workflow_scripts.analysis.improvement import variance_priors
from workflow_scripts.analysis.noise import aa_table
from workflow_scripts.analysis.paired import noise_floor_pct
from workflow_scripts.analysis.summarize import improvement_values
from workflow_scripts.client.cohorts import twin_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cells", nargs="+", type=Path, help="a study's tables/cells.csv")
    parser.add_argument("--control", default="baseline")
    parser.add_argument("--repeats", type=int, default=2, help="the study's benchmark.repeats (the race's start)")
    parser.add_argument("--equivalence-pct", type=float, default=4.0)
    args = parser.parse_args()
    twin = twin_name(args.control)
    print("| cells.csv | CIs | prior sd (aggregate, per-request) | decided aggregate | decided per-request "
          "| A/A floor | A/A CI covers 0 |")
    print("|---|---|---|---|---|---|---|")
    for path in args.cells:
        values = improvement_values(pd.read_csv(path))
        pooled = variance_priors(values, args.control)
        for name, priors in (("own rounds", None), ("pooled", pooled)):
            aa = aa_table(values, args.control, twin, priors)
            floor = noise_floor_pct(aa["diff_pct"].to_numpy())
            decisions = decision_table(values, args.control, twin, RaceRule(args.equivalence_pct, floor),
                                       args.repeats, priors)
            decided = {m: f"{int((g['decision'] != UNDECIDED).sum())}/{len(g)}"
                       for m, g in decisions.groupby("metric")}
            sds = ", ".join("—" if p is None else f"{math.sqrt(p.var) * 100:.1f}% (d0 {p.df:.1f})"
                            for p in (pooled.get("aggregate_tok_s"), pooled.get("per_request_tok_s")))
            covers = ((aa["ci_low_pct"] <= 0) & (aa["ci_high_pct"] >= 0)).mean()
            print(f"| {path} | {name} | {sds if priors else '—'} | {decided.get('aggregate_tok_s', '—')} | "
                  f"{decided.get('per_request_tok_s', '—')} | ±{floor:.1f}% | {covers:.0%} |")


if __name__ == "__main__":
    main()
