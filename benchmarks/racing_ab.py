"""Even against racing allocation, side by side on the same study: decided cells per minute of measuring.

    python -m benchmarks.racing_ab --config config/config.yaml --target results/embedded-cpu/models/target \
        --draft results/embedded-cpu/models/draft [--moe-installed results/embedded-cpu/moe/installed.json] \
        [--concurrency 4 16] [--repeats 2] [--max-repeats 6] [--budget-min 7] [--cell-seconds 2] \
        [--designs even racing racing-restart] [--pairs 1] [--out-dir /tmp/racing_ab]

Each design runs the study's benchmark job (workflow_scripts/client/run_cohort.py) on the same plan, in a cache
folder of its own, under the same time budget; the designs alternate in a seeded order per pair. A design is
- `even`: every setting in every round until the precision target or max_repeats (`benchmark.allocation: even`);
- `racing`: only what is still undecided after `repeats` rounds (`benchmark.allocation: racing`);
- `racing-restart`: racing with fresh servers each round (`benchmark.restart_each_round: true`).
Every design's rounds are freed of the servers' start positions fitted on its own rounds, as the study's tables
are (analysis/launch_position.py), then judged by one rule (analysis/decisions.py) with one equivalence margin
and one noise floor, the 95th percentile of |A/A difference| pooled over the designs' cells, so a design cannot
decide more by drawing a smaller floor; each design's CIs pool the spread of its own comparisons
(paired.VariancePrior), as its study would. Prints per design: cells x metrics decided (of the total), minutes
of measuring (the job's own clock, servers' start-up included), decided per minute, the A/A twin's share of
cells where it ran faster and the A/A CIs that cover 0; then racing's decided-per-minute over even's.
Without --moe-installed, settings with `moe_config: tuned` run the engine's default MoE config instead.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml
from snakemake.utils import validate

from workflow_scripts.analysis import launch_position
from workflow_scripts.analysis.decisions import UNDECIDED, RaceRule, decision_table, twin_faster_share
from workflow_scripts.analysis.improvement import variance_priors
from workflow_scripts.analysis.metrics import add_request_metrics, cell_table
from workflow_scripts.analysis.noise import aa_table
from workflow_scripts.analysis.paired import noise_floor_pct
from workflow_scripts.analysis.summarize import improvement_values
from workflow_scripts.client.cohorts import cohort_plan, plan_cohorts, twin_name
from workflow_scripts.client.rounds import seeded_order
from workflow_scripts.machine import stream_bandwidth_gbs

REPO = Path(__file__).resolve().parents[1]
DESIGNS = {"even": {"allocation": "even"}, "racing": {"allocation": "racing"},
           "racing-restart": {"allocation": "racing", "restart_each_round": True}}


def study_config(args: argparse.Namespace) -> dict:
    """The study's validated config with the reduced benchmark of the command line."""
    config = yaml.safe_load(args.config.read_text())
    bench = config.setdefault("benchmark", {})
    for key, value in (("concurrency", args.concurrency), ("repeats", args.repeats),
                       ("max_repeats", args.max_repeats), ("time_budget_min", args.budget_min),
                       ("cell_seconds", args.cell_seconds)):
        if value is not None:
            bench[key] = value
    if args.moe_installed is None:
        for setting in config["settings"].values():
            if setting.get("moe_config") == "tuned":
                setting["moe_config"] = "default"
    validate(config, str(REPO / "config" / "schema.yaml"), set_default=True)
    return config


def run_design(config: dict, design: str, args: argparse.Namespace, out: Path) -> tuple[pd.DataFrame, dict]:
    """One benchmark job of the design in a fresh cache folder: its per-round cell values and its meta."""
    config = copy.deepcopy(config)
    config["benchmark"].update(DESIGNS[design])
    cells_root = out / "cells"
    (cohort,) = plan_cohorts(config, cells_root)
    plan = cohort_plan(config, cohort)
    argv = [sys.executable, "-m", "workflow_scripts.client.run_cohort", "--plan", json.dumps(plan),
            "--target", str(args.target), "--cells-dir", str(cells_root / cohort.id),
            "--server-log-dir", str(out / "servers"), "--out", str(out / "records.parquet"),
            "--meta-out", str(out / "meta.json"), "--threads", str(args.threads)]
    argv += ["--draft", str(args.draft)] if args.draft else []
    argv += ["--moe-installed", str(args.moe_installed)] if args.moe_installed else []
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "benchmark.log", "w") as log:
        subprocess.run(argv, check=True, stderr=log, env=dict(os.environ, PYTHONPATH=str(REPO)))
    cells = cell_table(add_request_metrics(pd.read_parquet(out / "records.parquet")))
    meta = json.loads((out / "meta.json").read_text())
    # as the study's tables judge them: freed of the servers' start positions, fitted on this design's own rounds
    values, launches = improvement_values(cells), launch_position.launch_orders([meta])
    effects = launch_position.fit(values, launches, config["analysis"]["baseline"])
    print(f"{design}: {launch_position.sentence(launch_position.as_json(effects))}", flush=True)
    return launch_position.adjust(values, launches, effects), meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "config" / "config.yaml")
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", type=Path)
    parser.add_argument("--moe-installed", type=Path)
    parser.add_argument("--concurrency", type=int, nargs="+")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--max-repeats", type=int)
    parser.add_argument("--budget-min", type=float, help="each design's time budget (benchmark.time_budget_min)")
    parser.add_argument("--cell-seconds", type=float, help="time-boxed cells (benchmark.cell_seconds)")
    parser.add_argument("--designs", nargs="+", choices=list(DESIGNS), default=["even", "racing"])
    parser.add_argument("--pairs", type=int, default=1, help="runs of every design, in a seeded order each")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--out-dir", type=Path, default=Path("/tmp/racing_ab"))
    args = parser.parse_args()
    if len(args.designs) < 2 or args.pairs < 1:
        parser.error("--designs needs two designs or more, --pairs at least 1")
    config = study_config(args)
    bench, control = config["benchmark"], config["analysis"]["baseline"]
    twin = twin_name(control) if bench["aa_control"] else None
    print(f"machine: {stream_bandwidth_gbs():.1f} GB/s streaming; load {os.getloadavg()[0]:.1f}; concurrency "
          f"{bench['concurrency']}, repeats {bench['repeats']}-{bench['max_repeats']}, budget "
          f"{bench['time_budget_min']} min, cell_seconds {bench['cell_seconds']}, settings "
          f"{', '.join(config['settings'])}", flush=True)
    runs: list[tuple[str, pd.DataFrame, dict]] = []
    for pair in range(args.pairs):
        for design in seeded_order(args.designs, "racing_ab", bench["seed"], pair):
            t0 = time.perf_counter()
            values, meta = run_design(config, design, args, args.out_dir / f"{pair}-{design}")
            runs.append((design, values, meta))
            print(f"pair {pair}: {design} measured {meta['measuring_s'] / 60:.1f} min "
                  f"(job {(time.perf_counter() - t0) / 60:.1f} min)", flush=True)
    priors = [variance_priors(values, control) for _, values, _ in runs]  # each design's own, as its study's
    aas = [aa_table(values, control, twin, prior) for (_, values, _), prior in zip(runs, priors)]
    floor = noise_floor_pct(pd.concat(aas)["diff_pct"].to_numpy()) if twin else float("nan")
    rule = RaceRule(bench["equivalence_pct"], floor)
    print(f"\none rule for every design: equivalence ±{bench['equivalence_pct']:g}%, pooled A/A floor ±{floor:.1f}%")
    print("| design | pair | decided (cells × metrics) | aggregate | per-request | rounds per cell | minutes "
          "| decided / min | own A/A floor | twin faster | A/A CI covers 0 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rates: dict[str, list[float]] = {d: [] for d in args.designs}
    pairs = [p for p in range(args.pairs) for _ in args.designs]
    for (design, values, meta), aa, prior, pair in zip(runs, aas, priors, pairs):
        decisions = decision_table(values, control, twin, rule, bench["repeats"], prior)
        decided = decisions["decision"] != UNDECIDED
        per = {m: f"{int(decided[decisions.metric == m].sum())}/{int((decisions.metric == m).sum())}"
               for m in ("aggregate_tok_s", "per_request_tok_s")}
        minutes = meta["measuring_s"] / 60
        rates[design].append(decided.sum() / minutes)
        covers = ((aa["ci_low_pct"] <= 0) & (aa["ci_high_pct"] >= 0)).mean() if len(aa) else float("nan")
        rounds = "–".join(str(n) for n in sorted({int(decisions["rounds"].min()), int(decisions["rounds"].max())}))
        own = noise_floor_pct(aa["diff_pct"].to_numpy())
        print(f"| {design} | {pair} | {int(decided.sum())}/{len(decisions)} | {per['aggregate_tok_s']} | "
              f"{per['per_request_tok_s']} | {rounds} | {minutes:.1f} | {rates[design][-1]:.2f} | ±{own:.1f}% | "
              f"{twin_faster_share(aa):.0%} | {covers:.0%} |")
    if "even" in rates and "racing" in rates:
        even, racing = (sum(rates[d]) / len(rates[d]) for d in ("even", "racing"))
        print(f"\ndecided per minute: racing {racing:.2f}, even {even:.2f}"
              + (f"; racing/even {racing / even:.2f}x (goal: >= 2x)" if even > 0 else "; even decided none"))


if __name__ == "__main__":
    main()
