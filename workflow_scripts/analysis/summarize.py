"""Per setting × workload × concurrency summary of the measured requests, and of external tables.

Throughput: median over rounds of each round's value, with a bootstrap CI over rounds (an absolute figure, pooled
over the cohorts that measured the setting; comparisons between settings are paired by round, analysis/paired.py).
Latencies and acceptance: pooled over the ok, non-warm-up requests of all repeats.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workflow_scripts.analysis.metrics import GROUP_KEYS, inter_chunk_gaps, token_weighted_acceptance
from workflow_scripts.analysis.stats import Bootstrap

SUMMARY_COLUMNS = [
    "source", "setting", "workload", "concurrency", "n_repeats", "n_ok", "n_err",
    "per_request_tok_s_median", "per_request_tok_s_ci_low", "per_request_tok_s_ci_high", "per_request_tok_s_mean",
    "aggregate_tok_s_median", "aggregate_tok_s_ci_low", "aggregate_tok_s_ci_high",
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms",
    "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms",
    "accept_length_mean", "accept_length_token_weighted", "eos_share",
]
PERCENTILES = (50, 90, 99)
LATENCY_QUANTILES = (5, 25, 50, 75, 95)
MEASURED = "measured"


def _percentiles(values: np.ndarray, name: str) -> dict[str, float]:
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return {f"{name}_p{p}_ms": np.nan for p in PERCENTILES}
    return {f"{name}_p{p}_ms": float(v) * 1000 for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES))}


def summarize_measured(requests: pd.DataFrame, cells: pd.DataFrame, bootstrap: Bootstrap) -> pd.DataFrame:
    """One row per setting × workload × concurrency from requests (with metrics) and the cell table."""
    measured = requests[~requests["warmup"].astype(bool)]
    by_group = dict(iter(measured.groupby(GROUP_KEYS, sort=True)))
    rows = []
    for key, group_cells in cells.groupby(GROUP_KEYS, sort=True):
        ok = by_group[key][by_group[key]["ok"]]
        per_req = bootstrap.median_ci(group_cells["per_request_tok_s_median"].to_numpy())
        agg = bootstrap.median_ci(group_cells["aggregate_tok_s"].to_numpy())
        finish = ok["finish_reason"].dropna()
        rows.append({
            "source": MEASURED, **dict(zip(GROUP_KEYS, key)),
            "n_repeats": int(len(group_cells)),  # rounds, over every cohort that measured the setting
            "n_ok": int(group_cells["n_ok"].sum()), "n_err": int(group_cells["n_err"].sum()),
            "per_request_tok_s_median": per_req[0], "per_request_tok_s_ci_low": per_req[1],
            "per_request_tok_s_ci_high": per_req[2],
            "per_request_tok_s_mean": float(ok["per_request_tok_s"].mean()) if len(ok) else np.nan,
            "aggregate_tok_s_median": agg[0], "aggregate_tok_s_ci_low": agg[1], "aggregate_tok_s_ci_high": agg[2],
            **_percentiles(ok["ttft_s_"].to_numpy(dtype="float64"), "ttft"),
            **_percentiles(ok["tpot_s"].to_numpy(dtype="float64"), "tpot"),
            **_percentiles(inter_chunk_gaps(ok["chunk_ts"]), "itl"),
            **_percentiles(ok["e2e_s_"].to_numpy(dtype="float64"), "e2e"),
            "accept_length_mean": float(ok["accept_length_"].mean()) if len(ok) else np.nan,
            "accept_length_token_weighted": token_weighted_acceptance(ok),
            "eos_share": float((finish == "stop").mean()) if len(finish) else np.nan,
        })
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def summarize_external(external: pd.DataFrame) -> pd.DataFrame:
    """External rows in the summary layout: their value is the 'median', with no CI and no counts."""
    out = pd.DataFrame({
        "source": external["source"], "setting": external["setting"], "workload": external["workload"],
        "concurrency": external["concurrency"], "n_repeats": 1,
        "per_request_tok_s_median": external["per_request_tok_s"],
        "aggregate_tok_s_median": external["aggregate_tok_s"],
    })
    for optional in ("accept_length", "ttft_p50_ms"):
        if optional in external.columns:
            out["accept_length_mean" if optional == "accept_length" else optional] = external[optional]
    return out.reindex(columns=SUMMARY_COLUMNS)


def improvement_values(cells: pd.DataFrame, external: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per round (measured: keyed by cohort and repeat, for pairing) or per cell (external: one round)."""
    measured = pd.DataFrame({
        "source": MEASURED, "setting": cells["setting"], "workload": cells["workload"],
        "concurrency": cells["concurrency"], "cohort": cells["cohort"], "repeat": cells["repeat"],
        "per_request_tok_s": cells["per_request_tok_s_median"], "aggregate_tok_s": cells["aggregate_tok_s"],
    })
    if external is None or external.empty:
        return measured
    ext = external[["source", "setting", "workload", "concurrency", "per_request_tok_s", "aggregate_tok_s"]]
    ext = ext.assign(cohort="external", repeat=0)
    return pd.concat([measured, ext], ignore_index=True)


def latency_quantiles(requests: pd.DataFrame) -> pd.DataFrame:
    """TTFT and TPOT quantiles (ms) per setting × workload × concurrency, for the latency box plot."""
    ok = requests[requests["ok"] & ~requests["warmup"].astype(bool)]
    rows = []
    for key, group in ok.groupby(GROUP_KEYS, sort=True):
        for metric, col in (("TTFT", "ttft_s_"), ("TPOT", "tpot_s")):
            values = group[col].dropna().to_numpy(dtype="float64") * 1000
            if len(values) == 0:
                continue
            qs = np.percentile(values, LATENCY_QUANTILES)
            rows.append({**dict(zip(GROUP_KEYS, key)), "metric": metric, "n": len(values),
                         **{f"p{q}": float(v) for q, v in zip(LATENCY_QUANTILES, qs)}})
    return pd.DataFrame(rows, columns=[*GROUP_KEYS, "metric", "n", *[f"p{q}" for q in LATENCY_QUANTILES]])
