"""Improvement of one setting over another, with a bootstrap CI, and the seed article's table layout.

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
from workflow_scripts.analysis.stats import Bootstrap, within_noise

METRICS = {"per_request_tok_s": "per-request tok/s", "aggregate_tok_s": "aggregate tok/s"}
IMPROVEMENT_COLUMNS = ["source", "kind", "baseline", "candidate", "workload", "concurrency", "metric",
                       "baseline_value", "candidate_value", "improvement_pct", "ci_low_pct", "ci_high_pct",
                       "within_noise", "n_baseline", "n_candidate"]


def improvements(values: pd.DataFrame, comparisons: list[tuple[str, str, str]],
                 bootstrap: Bootstrap) -> pd.DataFrame:
    """Long table of improvements in percent.

    ``values`` holds one row per repeat (one row per cell for external sources) with columns
    ``source, setting, workload, concurrency`` and the METRICS; ``comparisons`` are (kind, baseline, candidate).
    Pairs absent from a source are skipped; an empty side gives NaN, never 0.
    """
    rows = []
    for (source, workload, concurrency), group in values.groupby(["source", "workload", "concurrency"], sort=True):
        by_setting = {name: g for name, g in group.groupby("setting")}
        for kind, base, cand in comparisons:
            if base not in by_setting or cand not in by_setting:
                continue
            for metric in METRICS:
                b = by_setting[base][metric].to_numpy(dtype="float64")
                c = by_setting[cand][metric].to_numpy(dtype="float64")
                point, low, high = bootstrap.ratio_ci(b, c)
                rows.append({
                    "source": source, "kind": kind, "baseline": base, "candidate": cand, "workload": workload,
                    "concurrency": int(concurrency), "metric": metric,
                    "baseline_value": _nanmedian(b), "candidate_value": _nanmedian(c),
                    "improvement_pct": point * 100, "ci_low_pct": low * 100, "ci_high_pct": high * 100,
                    "within_noise": within_noise(low, high),
                    "n_baseline": int(np.isfinite(b).sum()), "n_candidate": int(np.isfinite(c).sum()),
                })
    return pd.DataFrame(rows, columns=IMPROVEMENT_COLUMNS)


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


def fmt_improvement(row: pd.Series) -> str:
    """Percent, with the CI and a 'within noise' mark when the study has repeats."""
    text = fmt_pct(row["improvement_pct"])
    if np.isfinite(row["ci_low_pct"]):
        text += f" [{fmt_pct(row['ci_low_pct'])}, {fmt_pct(row['ci_high_pct'])}]"
        if row["within_noise"]:
            text += " ≈ noise"
    return text


def article_table(summary: pd.DataFrame, improvement: pd.DataFrame, source: str, workload: str, metric: str,
                  settings: list[str], comparisons: list[tuple[str, str]]) -> pd.DataFrame:
    """Article layout: one row per concurrency, one column per setting, one Improvement column per comparison.

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
    imp = improvements(values, [("pairwise", args.baseline, args.candidate)], Bootstrap())
    summary = values.rename(columns={m: f"{m}_median" for m in METRICS})
    for (source, workload), _ in imp.groupby(["source", "workload"], sort=True):
        for metric, label in METRICS.items():
            table = article_table(summary, imp, source, workload, metric, [args.baseline, args.candidate],
                                  [(args.baseline, args.candidate)])
            print(f"**{workload}: {label}** (source: {source})\n\n{to_markdown(table)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
