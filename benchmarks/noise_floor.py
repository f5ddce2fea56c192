"""The measurement design's goals, read from a finished study (and a second cold run of it).

    python -m benchmarks.noise_floor --study results/embedded-cpu [--compare results-2nd-run/embedded-cpu]

Prints, for the study's A/A twin and its comparisons:
- honesty: the share of (workload, concurrency, metric) A/A cells whose 95% CI includes 0 (goal >= 90%);
- closeness: median and worst |A/A difference| (goals <= 2% and <= 5%), per metric;
- precision: the median paired-CI half-width over every comparison (goal <= 3%), and the cells at the target;
- with --compare: how many comparisons of the two runs agree within their CIs (the CIs overlap);
- the design, the measuring time and the machine's memory bandwidth the figures came from;
- the machine itself: its memory speed probed around every cell (spread over the cohort), and how much of the A/A
  gap it explains: the correlation, over rounds, of log(twin ÷ control) with log(their cells' memory speeds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from workflow_scripts.analysis.metrics import cell_table
from workflow_scripts.analysis.study_inputs import load_study, read_study_config, study_files


def _load(study: Path) -> dict:
    tables = study / "tables"
    for name in ("aa.csv", "improvement.csv", "precision.csv", "noise_floor.json"):
        if not (tables / name).is_file():
            raise SystemExit(f"{tables / name}: missing; run the study (snakemake --cores 4) first")
    files = study_files(study)
    inputs = load_study(read_study_config(study), files.requests, files.metas, files.profile, profile_required=False)
    return {
        "aa": pd.read_csv(tables / "aa.csv"),
        "improvement": pd.read_csv(tables / "improvement.csv"),
        "precision": pd.read_csv(tables / "precision.csv"),
        "floor": json.loads((tables / "noise_floor.json").read_text()),
        "metas": inputs.metas,
        "requests": inputs.requests,
    }


def machine_lines(frame: pd.DataFrame, control: str, twin: str) -> list[str]:
    """The per-cell memory probe (cell_mem_gbs) against the A/A ratio of the same round, and what the A/A gap
    would be with the probe as a covariate (a what-if: the study's own statistic does not adjust)."""
    if frame.empty:
        return []
    if "cell_mem_gbs" not in frame or frame["cell_mem_gbs"].isna().all():
        return ["machine: no per-cell memory probe in these records (measured before cell_mem_gbs existed)"]
    keys = ["workload", "concurrency", "cohort", "repeat"]
    cells = cell_table(frame).merge(frame.groupby(["setting", *keys], as_index=False)["cell_mem_gbs"].first(),
                                    on=["setting", *keys]).dropna(subset=["aggregate_tok_s", "cell_mem_gbs"])
    lines = [f"machine: memory speed around {len(cells)} cells: median {cells.cell_mem_gbs.median():.1f} GB/s, "
             f"5-95% {cells.cell_mem_gbs.quantile(0.05):.1f}-{cells.cell_mem_gbs.quantile(0.95):.1f} GB/s"]
    # elasticity of tok/s to memory speed, within each (setting, workload, concurrency), from every member but the
    # twin, so that the A/A figures below are out of sample
    others = cells[cells.setting != twin].assign(y=lambda d: np.log(d.aggregate_tok_s), x=lambda d: np.log(d.cell_mem_gbs))
    group = others.groupby(["setting", "workload", "concurrency"])
    dy, dx = others.y - group.y.transform("mean"), others.x - group.x.transform("mean")
    beta = float((dx * dy).sum() / (dx * dx).sum()) if (dx * dx).sum() > 0 else float("nan")
    both = cells[cells.setting == control].merge(cells[cells.setting == twin], on=keys, suffixes=("_c", "_t"))
    if len(both) < 3 or not np.isfinite(beta):
        return lines
    aa = np.log(both.aggregate_tok_s_t / both.aggregate_tok_s_c)
    machine = np.log(both.cell_mem_gbs_t / both.cell_mem_gbs_c)
    if not machine.abs().gt(0).any():  # sliced rounds: the pair ran in one block, probed once around it
        return lines + [f"machine: over {len(both)} rounds the control and the twin ran in the same time-sliced "
                        f"block, probed once around it, so no A/A gap can follow the probe; A/A log-ratio sd "
                        f"{aa.std(ddof=1):.3f}"]
    r = float(np.corrcoef(aa, machine)[0, 1])
    adjusted = both.assign(raw=aa, adj=aa - beta * machine).groupby(["workload", "concurrency"])[["raw", "adj"]].mean()
    raw_pct, adj_pct = (100 * np.expm1(adjusted[c]).abs() for c in ("raw", "adj"))
    lines += [
        f"machine: over {len(both)} rounds, log(A/A aggregate ratio) vs log(memory-speed ratio): r = {r:.2f} "
        f"(r^2 = {r * r:.0%}); A/A log-ratio sd {aa.std(ddof=1):.3f}, after adjusting {(aa - beta * machine).std(ddof=1):.3f}",
        f"machine: elasticity of tok/s to memory speed within cells (all members but the twin) {beta:.2f}; "
        f"median |A/A aggregate| {raw_pct.median():.1f}% -> {adj_pct.median():.1f}% adjusted, worst "
        f"{raw_pct.max():.1f}% -> {adj_pct.max():.1f}% (what-if; the study's tables do not adjust)",
    ]
    return lines


def aa_goals(aa: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for metric, g in [("both", aa), *aa.groupby("metric")]:
        g = g.dropna(subset=["diff_pct"])
        with_ci = g.dropna(subset=["ci_low_pct", "ci_high_pct"])  # a cell of one round has no CI to include 0
        honest = ((with_ci.ci_low_pct <= 0) & (with_ci.ci_high_pct >= 0)).mean()
        rows.append({"metric": metric, "cells": len(g), "CI includes 0 (>= 90%)": f"{honest:.0%} of {len(with_ci)}",
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
    analysed = set(run["precision"]["cohort"])  # cohorts of an older engine or model may still lie in benchmark/
    run["metas"] = [m for m in run["metas"] if m["cohort"] in analysed]
    floor = run["floor"]
    print(f"study {args.study}: design {floor['schedule']}, noise floor ±{floor['noise_floor_pct']:.2f}% "
          f"(95th percentile of |A/A|), at least {floor['rounds']} rounds per A/A cell")
    for meta in run["metas"]:
        print(f"  cohort {meta['cohort']}: {len(meta['members'])} servers, measuring {meta['measuring_s'] / 60:.1f} min"
              f"{' (time budget hit)' if meta['budget_hit'] else ''}, memory bandwidth {meta['mem_bandwidth_gbs']:.1f} GB/s")
    print(aa_goals(run["aa"]).to_markdown(index=False))
    print(precision_goal(run["improvement"], run["precision"]))
    control = run["metas"][0]["control"]
    for line in machine_lines(run["requests"], control, f"{control}_aa"):
        print(line)
    if args.compare:
        print(agreement(run["improvement"], _load(args.compare)["improvement"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
