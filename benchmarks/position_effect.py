"""How much a server's start position moved its throughput in a finished study with counterbalanced launches.

    python -m benchmarks.position_effect results/embedded-cpu [--control baseline]

A cohort whose servers started twice, the second time in the reverse order (`benchmark.counterbalance_launches`),
measured every member at two start positions. Per cell and member (the control aside), the change of its log
ratio against the control from the first launch's rounds to the second's, regressed through the origin on the
change of its position relative to the control's, is the effect of one start position later (the member's own
effect and the round's drift cancel in that difference). Prints it per metric with a 95% CI, then each member's
mean change between the launches by its first-launch position. Needs tables/cells.csv and benchmark/*.json.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

METRICS = {"aggregate_tok_s": "aggregate tok/s", "per_request_tok_s_median": "per-request tok/s"}


def launch_of(round_: int, launches: dict[int, list[str]]) -> int:
    """The launch that served a round: the latest one started at or before it."""
    return max(r for r in launches if r <= round_)


def launch_changes(cells: pd.DataFrame, launches: dict[int, list[str]], control: str, metric: str) -> pd.DataFrame:
    """Per cell and member: its position change against the control's (x) and its log ratio change (y), second
    launch minus first."""
    first, second = sorted(launches)[:2]
    rows = []
    for (workload, conc), cell in cells.groupby(["workload", "concurrency"]):
        values = cell.pivot_table(index="repeat", columns="setting", values=metric)
        values["launch"] = [launch_of(r, launches) for r in values.index]
        logs = np.log(values.drop(columns="launch").div(values[control], axis=0))
        means = logs.groupby(values["launch"]).mean()
        if first not in means.index or second not in means.index:
            continue
        for member in means.columns.drop(control):
            pos = {k: launches[k].index(member) - launches[k].index(control) for k in (first, second)}
            y = means.at[second, member] - means.at[first, member]
            if math.isfinite(y):
                rows.append({"workload": workload, "concurrency": conc, "member": member,
                             "first_position": launches[first].index(member),
                             "x": pos[second] - pos[first], "y": y})
    return pd.DataFrame(rows)


def slope(changes: pd.DataFrame) -> tuple[float, float, float]:
    """The effect of one position later (fraction) and its 95% CI: least squares through the origin."""
    x, y = changes["x"].to_numpy(float), changes["y"].to_numpy(float)
    beta = float(x @ y / (x @ x))
    resid = y - beta * x
    se = math.sqrt(resid @ resid / (len(x) - 1) / (x @ x))
    t = stats.t.ppf(0.975, len(x) - 1)
    return beta, beta - t * se, beta + t * se


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a study's results folder, e.g. results/embedded-cpu")
    parser.add_argument("--control", default="baseline")
    args = parser.parse_args()
    cells = pd.read_csv(args.results / "tables" / "cells.csv")
    for meta_path in sorted((args.results / "benchmark").glob("*.json")):
        meta = json.loads(meta_path.read_text())
        launches = {int(r): order for r, order in meta["launch_order"].items()}
        if len(launches) < 2:
            print(f"{meta['cohort']}: one launch, nothing to compare")
            continue
        cohort = cells[cells["cohort"] == meta["cohort"]]
        print(f"{meta['cohort']}: launches {launches}")
        for metric, label in METRICS.items():
            changes = launch_changes(cohort, launches, args.control, metric)
            if len(changes) < 2:
                print(f"- {label}: fewer than two cells measured in both launches")
                continue
            beta, low, high = slope(changes)
            n_cells = changes.groupby(["workload", "concurrency"]).ngroups
            print(f"- {label}: one start position later {100 * beta:+.2f}% [{100 * low:+.2f}, {100 * high:+.2f}], "
                  f"over {len(changes)} member-cells in {n_cells} cells")
            by_position = changes.groupby(["first_position", "member"])["y"].mean().mul(100).round(1)
            print("  second launch ÷ first, against the control, by first-launch position: " + ", ".join(
                f"{pos} {member} {value:+.1f}%" for (pos, member), value in by_position.items()))


if __name__ == "__main__":
    main()
