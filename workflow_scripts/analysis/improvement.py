"""Improvement of one setting over another, paired by round (analysis/paired.py), and the article's table layout.

The article prints tok/s as integers and the improvement as ``candidate/baseline − 1`` in whole percent,
rounded half up (123 → 186 is +51%). The CLI prints that table from any external-format CSV (or a study's
``tables/summary.csv``):

    python -m workflow_scripts.analysis.improvement --baseline steps1 --candidate steps2 tests/data/article.csv
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from workflow_scripts.analysis.external import load_external
from workflow_scripts.analysis.paired import (EQUIVALENT, NO_DATA, REAL, TOST_CI, VariancePrior, paired_ratio,
                                              round_logs, verdict)
from workflow_scripts.analysis.summarize import MEASURED

METRICS = {"per_request_tok_s": "per-request tok/s", "aggregate_tok_s": "aggregate tok/s"}
IMPROVEMENT_COLUMNS = ["source", "kind", "baseline", "candidate", "workload", "concurrency", "metric",
                       "baseline_value", "candidate_value", "improvement_pct", "ci_low_pct", "ci_high_pct",
                       "within_noise", "n_baseline", "n_candidate", "rounds", "half_width_pct", "verdict"]
ROUND_KEYS = ["cohort", "repeat"]
Priors = dict[str, VariancePrior | None]  # metric -> the pooled spread of its measured comparisons


def variance_priors(values: pd.DataFrame, control: str) -> Priors:
    """Per metric, the pooled spread (paired.VariancePrior) of every measured setting's round ratios against the
    control, over all cells: the comparisons whose CIs it narrows are measured by the same design, in the same run."""
    measured = values[values["source"] == MEASURED]
    logs: dict[str, list[np.ndarray]] = {metric: [] for metric in METRICS}
    for _, cell in measured.groupby(["workload", "concurrency"], sort=True):
        base = cell[cell["setting"] == control]
        for setting, group in cell.groupby("setting"):
            if setting == control:
                continue
            pairs = base.merge(group, on=ROUND_KEYS, suffixes=("_b", "_c"))
            for metric in METRICS:
                logs[metric].append(round_logs(pairs[f"{metric}_b"], pairs[f"{metric}_c"]))
    return {metric: VariancePrior.fit(found) for metric, found in logs.items()}


def improvements(values: pd.DataFrame, comparisons: list[tuple[str, str, str]], floor_pct: float,
                 equivalence_pct: float = math.nan, priors: Priors | None = None) -> pd.DataFrame:
    """Long table of paired improvements in percent, each with its verdict against the noise floor (and, with an
    equivalence margin, `equivalent` where a TOST shows the tie). `priors` (variance_priors) pool the measured
    comparisons' spread; without them each CI rests on its own rounds alone.

    ``values`` holds one row per round (one row per cell for external sources) with columns
    ``source, setting, workload, concurrency, cohort, repeat`` and the METRICS; ``comparisons`` are
    (kind, baseline, candidate). Only rounds both settings were measured in are paired: two settings of different
    cohorts share none and get "no data", as does a cell whose control has no value (never 0).
    """
    rows = []
    for (source, workload, concurrency), group in values.groupby(["source", "workload", "concurrency"], sort=True):
        by_setting = {name: g for name, g in group.groupby("setting")}
        for kind, base, cand in comparisons:
            if base not in by_setting or cand not in by_setting:
                continue
            pairs = by_setting[base].merge(by_setting[cand], on=ROUND_KEYS, suffixes=("_b", "_c"))
            for metric in METRICS:
                b = pairs[f"{metric}_b"].to_numpy(dtype="float64")
                c = pairs[f"{metric}_c"].to_numpy(dtype="float64")
                prior = (priors or {}).get(metric) if source == MEASURED else None
                paired = paired_ratio(b, c, prior=prior)
                rows.append({
                    "source": source, "kind": kind, "baseline": base, "candidate": cand, "workload": workload,
                    "concurrency": int(concurrency), "metric": metric,
                    "baseline_value": _nanmedian(b), "candidate_value": _nanmedian(c),
                    "improvement_pct": paired.diff_pct, "ci_low_pct": paired.ci_low_pct,
                    "ci_high_pct": paired.ci_high_pct,
                    "within_noise": _includes_zero(paired.ci_low_pct, paired.ci_high_pct),
                    "n_baseline": int(np.isfinite(b).sum()), "n_candidate": int(np.isfinite(c).sum()),
                    "rounds": paired.rounds, "half_width_pct": paired.half_width_pct,
                    "verdict": verdict(paired, floor_pct, paired_ratio(b, c, TOST_CI, prior), equivalence_pct),
                })
    return pd.DataFrame(rows, columns=IMPROVEMENT_COLUMNS)


def _includes_zero(low: float, high: float) -> bool | None:
    """True when the CI includes 0; None when there is no CI (fewer than two paired rounds)."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return None
    return bool(low <= 0 <= high)


def _nanmedian(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if len(finite) else np.nan


def round_half_up(x: float) -> int:
    """Round as people do (and as the article does): 0.5 goes up."""
    return int(math.floor(x + 0.5))


def fmt_tok_s(x: float) -> str:
    return "—" if not np.isfinite(x) else str(round_half_up(x))


def fmt_pct(pct: float) -> str:
    """+51%, -3%, or — when undefined."""
    if not np.isfinite(pct):
        return "—"
    value = round_half_up(pct)
    return f"{'+' if value >= 0 else ''}{value}%"


def fmt_ci(pct: float, low: float, high: float) -> str:
    """+12% [+8%, +15%], or +12% alone when there is no CI."""
    text = fmt_pct(pct)
    return text + f" [{fmt_pct(low)}, {fmt_pct(high)}]" if np.isfinite(low) else text


def fmt_improvement(row: pd.Series) -> str:
    """Percent; with a paired CI (two rounds or more) the CI too, '≡ equivalent' for a tie a TOST showed, and
    '≈ noise' for the rest that is not real."""
    if row["verdict"] == NO_DATA:
        return "—"
    text = fmt_ci(row["improvement_pct"], row["ci_low_pct"], row["ci_high_pct"])
    if row["verdict"] == EQUIVALENT:
        return text + " ≡ equivalent"
    return text + " ≈ noise" if np.isfinite(row["ci_low_pct"]) and row["verdict"] != REAL else text


def article_table(summary: pd.DataFrame, improvement: pd.DataFrame, source: str, workload: str, metric: str,
                  settings: list[str], comparisons: list[tuple[str, str]],
                  aa: pd.DataFrame | None = None) -> pd.DataFrame:
    """Article layout: one row per concurrency, one column per setting, one Improvement column per comparison,
    and, for a measured study with a twin, the A/A difference beside the effects.

    ``summary`` has one row per source × setting × workload × concurrency with ``{metric}_median``.
    """
    cells = summary[(summary["source"] == source) & (summary["workload"] == workload)]
    imp = improvement[(improvement["source"] == source) & (improvement["workload"] == workload)
                      & (improvement["metric"] == metric)]
    value_col = f"{metric}_median"
    rows = []
    for conc in sorted(cells["concurrency"].unique()):
        row = {"C": int(conc)}
        at_c = cells[cells["concurrency"] == conc].set_index("setting")[value_col]
        for name in settings:
            row[f"{name} tok/s"] = fmt_tok_s(at_c.get(name, np.nan))
        for base, cand in comparisons:
            hit = imp[(imp["concurrency"] == conc) & (imp["baseline"] == base) & (imp["candidate"] == cand)]
            label = "Improvement" if len(comparisons) == 1 else f"{cand} vs {base}"
            row[label] = fmt_improvement(hit.iloc[0]) if len(hit) else "—"
        if aa is not None and len(aa):
            noise = aa[(aa["workload"] == workload) & (aa["concurrency"] == conc) & (aa["metric"] == metric)]
            row["A/A (noise)"] = (fmt_ci(*noise.iloc[0][["diff_pct", "ci_low_pct", "ci_high_pct"]])
                                  if len(noise) else "—")
        rows.append(row)
    return pd.DataFrame(rows)


def to_markdown(table: pd.DataFrame) -> str:
    return table.to_markdown(index=False, stralign="right", numalign="right")


def read_values(path: Path) -> pd.DataFrame:
    """An external-format CSV, or a study's summary.csv (its ``*_median`` columns are the values)."""
    header = pd.read_csv(path, nrows=0).columns
    if "per_request_tok_s_median" in header:
        frame = pd.read_csv(path)
        return frame.rename(columns={f"{m}_median": m for m in METRICS})
    return load_external(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the article-style improvement table of B against A.")
    parser.add_argument("--baseline", required=True, help="setting name of A")
    parser.add_argument("--candidate", required=True, help="setting name of B")
    parser.add_argument("csv", type=Path, help="external-format CSV or a study's tables/summary.csv")
    args = parser.parse_args(argv)
    try:
        values = read_values(args.csv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name in (args.baseline, args.candidate):
        if name not in set(values["setting"]):
            print(f"error: {args.csv}: column setting: no rows for {name!r} "
                  f"(found: {', '.join(sorted(set(values['setting'])))})", file=sys.stderr)
            return 2
    if "source" not in values.columns:
        values["source"] = args.csv.stem
    values = values.assign(cohort="external", repeat=0)  # one value per cell: a point estimate, no CI
    imp = improvements(values, [("pairwise", args.baseline, args.candidate)], float("nan"))
    summary = values.rename(columns={m: f"{m}_median" for m in METRICS})
    for (source, workload), _ in imp.groupby(["source", "workload"], sort=True):
        for metric, label in METRICS.items():
            table = article_table(summary, imp, source, workload, metric, [args.baseline, args.candidate],
                                  [(args.baseline, args.candidate)])
            print(f"**{workload}: {label}** (source: {source})\n\n{to_markdown(table)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
