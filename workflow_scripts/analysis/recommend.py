"""The best setting per concurrency band × workload, by a rule that prefers steady speed over lucky peaks.

Score at one concurrency = median − 1.4826·MAD of the setting's values there, from the rounds that measured every
setting of the cell (racing's later rounds measure only the survivors, on the machine of a later hour):
- per-request tok/s: every ok, non-warm-up request;
- aggregate tok/s: every repeat's cell value.
The band's score is the mean of those scores over the band's measured concurrencies (scoring per concurrency
keeps the spread between concurrencies out of the MAD).
Settings within ``tie_tolerance`` (relative) of the best score tie, and the tie goes to the fewest speculative
steps (cheaper, and less to go wrong). A setting with any errored request in the band × workload is never
recommended, nor is one without data there.
Among settings shown *equivalent* (a TOST on their paired ratio within ±``benchmark.equivalence_pct``, at every
concurrency of the band), the fewest speculative steps wins too, and the note says so: a tie shown is as good as
one within the tolerance, and fewer steps cost less.
The recommendation's ``verdict`` says whether the pick's paired improvement over the baseline is real (CI excludes
0 and beyond the A/A noise floor) at every concurrency of the band, or equivalent to it; otherwise the pick is
within noise of it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workflow_scripts.analysis.paired import EQUIVALENT, REAL, WITHIN_NOISE
from workflow_scripts.analysis.stats import robust_score
from workflow_scripts.analysis.study_config import StudyConfig

SCORE_COLUMNS = ["band", "workload", "metric", "setting", "steps", "n_values", "n_err", "median", "mad", "score",
                 "eligible", "note"]
RECOMMENDATION_COLUMNS = ["band", "workload", "metric", "concurrencies", "recommended", "score", "median",
                          "score_vs_baseline", "verdict", "tied_with", "excluded", "note"]


ROUND = ["workload", "concurrency", "cohort", "repeat"]


def _values(requests: pd.DataFrame, cells: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per value a score counts, from the rounds every setting of its cell was measured in (shared_rounds)."""
    if metric == "per_request_tok_s":
        ok = requests[requests["ok"] & ~requests["warmup"].astype(bool)]
        values = ok[["setting", *ROUND, "per_request_tok_s"]].rename(columns={"per_request_tok_s": "value"})
    else:
        values = cells[["setting", *ROUND, "aggregate_tok_s"]].rename(columns={"aggregate_tok_s": "value"})
    return values.merge(shared_rounds(cells), on=ROUND)[["setting", "workload", "concurrency", "value"]]


def shared_rounds(cells: pd.DataFrame) -> pd.DataFrame:
    """Per cell, the rounds (cohort, repeat) that measured every one of its settings; all of its rounds where none
    did (settings of different cohorts). Racing stops measuring what lost, so the survivors' later rounds ran on
    the machine of a later hour: a median over each setting's own rounds would compare hours as well as settings."""
    keys = cells[["setting", *ROUND]].drop_duplicates()
    out = []
    for _, cell in keys.groupby(["workload", "concurrency"]):
        rounds = cell.groupby(["cohort", "repeat"])["setting"].nunique()
        shared = rounds[rounds == cell["setting"].nunique()]
        out.append(cell[ROUND].drop_duplicates().set_index(["cohort", "repeat"])
                   .loc[shared.index if len(shared) else rounds.index].reset_index())
    return pd.concat(out, ignore_index=True)[ROUND] if out else keys[ROUND]


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


def band_verdict(improvement: pd.DataFrame, cfg: StudyConfig, pick: str, workload: str, metric: str,
                 concs: list[int]) -> str:
    """real when the pick beats the baseline, paired by round, beyond the noise at every concurrency of the band;
    equivalent when a TOST shows it ties the baseline at every one."""
    if pick == cfg.baseline:
        return "baseline"
    rows = measured_between(improvement, cfg.baseline, pick, workload, metric, concs)
    real = (rows["verdict"] == REAL) & (rows["improvement_pct"] > 0)
    if len(rows) and real.all():
        return REAL
    return EQUIVALENT if len(rows) and (rows["verdict"] == EQUIVALENT).all() else WITHIN_NOISE


def measured_between(improvement: pd.DataFrame, a: str, b: str, workload: str, metric: str,
                     concs: list[int]) -> pd.DataFrame:
    """The measured comparisons of a and b (either way round) in one band x workload x metric."""
    pair = ((improvement["baseline"] == a) & (improvement["candidate"] == b)) | (
        (improvement["baseline"] == b) & (improvement["candidate"] == a))
    return improvement[(improvement["source"] == "measured") & pair & (improvement["workload"] == workload)
                       & (improvement["metric"] == metric) & improvement["concurrency"].isin(concs)]


def _fewer_steps_equivalent(improvement: pd.DataFrame, eligible: pd.DataFrame, pick: pd.Series, workload: str,
                            metric: str, concs: list[int]) -> pd.Series | None:
    """The eligible setting with the fewest steps below the pick's that a TOST shows equivalent to it at every
    concurrency of the band; None when there is none."""
    for _, other in eligible[eligible["steps"] < pick["steps"]].sort_values(
            ["steps", "score"], ascending=[True, False]).iterrows():
        rows = measured_between(improvement, pick["setting"], other["setting"], workload, metric, concs)
        if len(rows) and (rows["verdict"] == EQUIVALENT).all():
            return other
    return None


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
        others = [s for s in tied["setting"] if s != pick["setting"]]
        note = "tie within tolerance; fewer speculative steps wins" if others and pick["score"] < best else ""
        fewer = _fewer_steps_equivalent(improvement, eligible, pick, workload, metric, cfg.bands[band])
        if fewer is not None:
            note = (f"equivalent to {pick['setting']} (TOST within ±{cfg.equivalence_pct:g}%); fewer speculative "
                    "steps wins")
            others = [pick["setting"], *[s for s in others if s != fewer["setting"]]]
            pick = fewer
        base = group[(group["setting"] == cfg.baseline) & group["eligible"]]
        vs_base = pick["score"] / base["score"].iloc[0] if len(base) and base["score"].iloc[0] > 0 else np.nan
        rows.append({**row, "recommended": pick["setting"], "score": pick["score"], "median": pick["median"],
                     "score_vs_baseline": vs_base,
                     "verdict": band_verdict(improvement, cfg, pick["setting"], workload, metric, cfg.bands[band]),
                     "tied_with": ", ".join(others), "note": note})
    return pd.DataFrame(rows, columns=RECOMMENDATION_COLUMNS)
