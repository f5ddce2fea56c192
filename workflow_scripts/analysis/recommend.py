"""The best setting per concurrency band × workload, by a rule that prefers steady speed over lucky peaks.

Score at one concurrency = median − 1.4826·MAD of the setting's values there:
- per-request tok/s: every ok, non-warm-up request;
- aggregate tok/s: every repeat's cell value.
The band's score is the mean of those scores over the band's measured concurrencies (scoring per concurrency
keeps the spread between concurrencies out of the MAD).
Settings within ``tie_tolerance`` (relative) of the best score tie, and the tie goes to the fewest speculative
steps (cheaper, and less to go wrong). A setting with any errored request in the band × workload is never
recommended, nor is one without data there.
The recommendation's ``verdict`` says whether the pick's paired improvement over the baseline is real (CI excludes
0 and beyond the A/A noise floor) at every concurrency of the band; otherwise the pick is within noise of it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workflow_scripts.analysis.paired import REAL, WITHIN_NOISE
from workflow_scripts.analysis.stats import robust_score
from workflow_scripts.analysis.study_config import StudyConfig

SCORE_COLUMNS = ["band", "workload", "metric", "setting", "steps", "n_values", "n_err", "median", "mad", "score",
                 "eligible", "note"]
RECOMMENDATION_COLUMNS = ["band", "workload", "metric", "concurrencies", "recommended", "score", "median",
                          "score_vs_baseline", "verdict", "tied_with", "excluded", "note"]


def _values(requests: pd.DataFrame, cells: pd.DataFrame, metric: str) -> pd.DataFrame:
    if metric == "per_request_tok_s":
        ok = requests[requests["ok"] & ~requests["warmup"].astype(bool)]
        return ok[["setting", "workload", "concurrency", "per_request_tok_s"]].rename(
            columns={"per_request_tok_s": "value"})
    return cells[["setting", "workload", "concurrency", "aggregate_tok_s"]].rename(
        columns={"aggregate_tok_s": "value"})


def score_table(requests: pd.DataFrame, cells: pd.DataFrame, cfg: StudyConfig) -> pd.DataFrame:
    """Every setting's score per band × workload × metric."""
    rows = []
    for metric in ("per_request_tok_s", "aggregate_tok_s"):
        values = _values(requests, cells, metric)
        for band, concs in cfg.bands.items():
            band_cells = cells[cells["concurrency"].isin(concs)]
            for workload, w_cells in band_cells.groupby("workload", sort=True):
                measured_concs = sorted(w_cells["concurrency"].unique())
                for setting, s_cells in w_cells.groupby("setting", sort=True):
                    sel = values[(values["workload"] == workload) & (values["setting"] == setting)]
                    per_c = [robust_score(sel.loc[sel["concurrency"] == c, "value"].to_numpy(dtype="float64"))
                             for c in measured_concs]
                    n_err = int(s_cells["n_err"].sum())
                    missing = [c for c, (score, _, _) in zip(measured_concs, per_c) if not np.isfinite(score)]
                    note = "errored" if n_err else (f"no data at C={' '.join(map(str, missing))}" if missing else "")
                    scores, medians, mads = (np.array(x, dtype="float64") for x in zip(*per_c))
                    rows.append({"band": band, "workload": workload, "metric": metric, "setting": setting,
                                 "steps": cfg.steps(setting), "n_values": int(sel["concurrency"].isin(concs).sum()),
                                 "n_err": n_err, "median": _mean(medians), "mad": _mean(mads),
                                 "score": _mean(scores), "eligible": not note, "note": note})
    return pd.DataFrame(rows, columns=SCORE_COLUMNS)


def _mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else np.nan


def _verdict(improvement: pd.DataFrame, cfg: StudyConfig, pick: str, workload: str, metric: str,
             concs: list[int]) -> str:
    """real when the pick beats the baseline, paired by round, beyond the noise at every concurrency of the band."""
    if pick == cfg.baseline:
        return "baseline"
    rows = improvement[(improvement["source"] == "measured") & (improvement["kind"] == "vs_baseline")
                       & (improvement["candidate"] == pick) & (improvement["workload"] == workload)
                       & (improvement["metric"] == metric) & improvement["concurrency"].isin(concs)]
    real = (rows["verdict"] == REAL) & (rows["improvement_pct"] > 0)
    return REAL if len(rows) and real.all() else WITHIN_NOISE


def recommend(scores: pd.DataFrame, cfg: StudyConfig, improvement: pd.DataFrame) -> pd.DataFrame:
    """One recommendation per band × workload × metric (``recommended`` empty when nothing is eligible)."""
    rows = []
    for (band, workload, metric), group in scores.groupby(["band", "workload", "metric"], sort=False):
        eligible = group[group["eligible"]]
        excluded = ", ".join(f"{r.setting} ({r.note})" for r in group[~group["eligible"]].itertuples())
        row = {"band": band, "workload": workload, "metric": metric,
               "concurrencies": " ".join(str(c) for c in cfg.bands[band]), "excluded": excluded}
        if eligible.empty:
            rows.append({**row, "recommended": "", "note": "no eligible setting"})
            continue
        best = eligible["score"].max()
        tied = eligible[eligible["score"] >= best - cfg.tie_tolerance * abs(best)]
        pick = tied.sort_values(["steps", "score"], ascending=[True, False]).iloc[0]
        base = group[(group["setting"] == cfg.baseline) & group["eligible"]]
        vs_base = pick["score"] / base["score"].iloc[0] if len(base) and base["score"].iloc[0] > 0 else np.nan
        others = [s for s in tied["setting"] if s != pick["setting"]]
        note = "tie within tolerance; fewer speculative steps wins" if others and pick["score"] < best else ""
        rows.append({**row, "recommended": pick["setting"], "score": pick["score"], "median": pick["median"],
                     "score_vs_baseline": vs_base,
                     "verdict": _verdict(improvement, cfg, pick["setting"], workload, metric, cfg.bands[band]),
                     "tied_with": ", ".join(others), "note": note})
    return pd.DataFrame(rows, columns=RECOMMENDATION_COLUMNS)
