"""How much a server's start position moved its throughput in a finished study with counterbalanced launches.

    python -m benchmarks.position_effect results/embedded-cpu [--control baseline]

A cohort whose servers started twice, the second time in the reverse order (`benchmark.counterbalance_launches`),
measured every member at two start positions. Prints per cohort and metric the effect of one start position later
with its 95% CI, as the analysis fits and removes it (analysis/launch_position.py), then each member's mean change
of its log ratio against the control from the first launch's rounds to the second's, by its first-launch position
(the raw pattern the fitted line summarises). Needs tables/cells.csv and benchmark/*.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from workflow_scripts.analysis import launch_position
from workflow_scripts.analysis.summarize import improvement_values

LABELS = {"aggregate_tok_s": "aggregate tok/s", "per_request_tok_s": "per-request tok/s"}


def launch_changes(values: pd.DataFrame, by_round: dict[int, list[str]], control: str, metric: str) -> pd.Series:
    """Per (first-launch position, member): the mean over cells of its log ratio to the control in the second
    launch's rounds minus in the first's, in percent."""
    first, second = sorted(by_round)[:2]
    rows = []
    for _, cell in values.groupby(["workload", "concurrency"]):
        table = cell.pivot_table(index="repeat", columns="setting", values=metric)
        logs = np.log(table.div(table[control], axis=0)).drop(columns=control)
        means = logs.groupby([launch_position.launch_of(r, by_round) for r in table.index]).mean()
        if {first, second} <= set(means.index):
            rows += [{"position": by_round[first].index(m), "member": m,
                      "change": means.at[second, m] - means.at[first, m]} for m in logs.columns]
    changes = pd.DataFrame(rows, columns=["position", "member", "change"]).dropna()
    return changes.groupby(["position", "member"])["change"].mean().mul(100).round(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a study's results folder, e.g. results/embedded-cpu")
    parser.add_argument("--control", default="baseline")
    args = parser.parse_args()
    values = improvement_values(pd.read_csv(args.results / "tables" / "cells.csv"))
    metas = [json.loads(path.read_text()) for path in sorted((args.results / "benchmark").glob("*.json"))]
    for cohort, by_round in launch_position.launch_orders(metas).items():
        if len(by_round) < 2:
            print(f"{cohort}: one launch, nothing to compare")
            continue
        ours = values[values["cohort"] == cohort]
        print(f"{cohort}: launches {by_round}")
        effects = launch_position.fit(ours, {cohort: by_round}, args.control)
        for metric, effect in effects.items():
            if not effect.identified:
                print(f"- {LABELS[metric]}: no setting measured in both launches")
                continue
            print(f"- {LABELS[metric]}: one start position later {100 * effect.beta:+.2f}% "
                  f"[{100 * effect.ci_low:+.2f}, {100 * effect.ci_high:+.2f}], over {effect.comparisons} "
                  "settings × cells")
            print("  second launch ÷ first, against the control, by first-launch position: " + ", ".join(
                f"{pos} {member} {value:+.1f}%" for (pos, member), value in
                launch_changes(ours, by_round, args.control, metric).items()))


if __name__ == "__main__":
    main()
