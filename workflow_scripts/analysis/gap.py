"""How much the synthetic workload (random prompts, often T=0 + ignore_eos) overstates the realistic gain.

For every setting compared against the baseline and every concurrency: the speedup under each synthetic
workload beside the speedup under each realistic one, and the overstatement in percentage points.
"""

from __future__ import annotations

import pandas as pd

from workflow_scripts.analysis.improvement import fmt_pct
from workflow_scripts.analysis.study_config import StudyConfig

GAP_COLUMNS = ["source", "setting", "concurrency", "metric", "synthetic_workload", "realistic_workload",
               "synthetic_improvement_pct", "realistic_improvement_pct", "overstatement_pp"]


def gap_table(improvement: pd.DataFrame, cfg: StudyConfig) -> pd.DataFrame:
    vs_base = improvement[improvement["kind"] == "vs_baseline"]
    rows = []
    for synth in cfg.workloads_of_kind("synthetic"):
        for real in cfg.workloads_of_kind("realistic"):
            s = vs_base[vs_base["workload"] == synth]
            r = vs_base[vs_base["workload"] == real]
            both = s.merge(r, on=["source", "candidate", "concurrency", "metric"], suffixes=("_s", "_r"))
            for row in both.itertuples():
                rows.append({"source": row.source, "setting": row.candidate, "concurrency": row.concurrency,
                             "metric": row.metric, "synthetic_workload": synth, "realistic_workload": real,
                             "synthetic_improvement_pct": row.improvement_pct_s,
                             "realistic_improvement_pct": row.improvement_pct_r,
                             "overstatement_pp": row.improvement_pct_s - row.improvement_pct_r})
    return pd.DataFrame(rows, columns=GAP_COLUMNS)


def gap_sentence(gap: pd.DataFrame, metric: str = "per_request_tok_s") -> str:
    """One plain sentence on the measured per-request gap."""
    sel = gap[(gap["source"] == "measured") & (gap["metric"] == metric)].dropna(subset=["overstatement_pp"])
    if sel.empty:
        return ("The synthetic-vs-realistic gap could not be measured: the study needs a synthetic and a "
                "realistic workload with data for the baseline and at least one other setting.")
    mean_gap = sel["overstatement_pp"].mean()
    worst = sel.loc[sel["overstatement_pp"].abs().idxmax()]
    direction = "overstates" if mean_gap > 0 else "understates"
    n_over = int((sel["overstatement_pp"] > 0).sum())
    return (f"Across {len(sel)} setting × concurrency pairs, the synthetic workload {direction} the per-request "
            f"speedup against the baseline by {abs(mean_gap):.0f} percentage points on average (it promises more "
            f"in {n_over} of {len(sel)} pairs; "
            f"mean {fmt_pct(sel['synthetic_improvement_pct'].mean())} synthetic vs "
            f"{fmt_pct(sel['realistic_improvement_pct'].mean())} realistic); the largest gap is "
            f"{worst['setting']} at concurrency {int(worst['concurrency'])} "
            f"({fmt_pct(worst['synthetic_improvement_pct'])} vs {fmt_pct(worst['realistic_improvement_pct'])}).")

