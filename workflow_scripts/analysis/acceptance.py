"""Acceptance by draft position, from SGLang's per-request ``spec_correct_drafts_histogram``.

histogram[i] counts the request's verify forwards that accepted exactly i drafts (bonus token not counted), so
with chain drafting (topk 1) draft position p (1-based) was accepted in Σ_{i≥p} histogram[i] verifies and reached
in Σ_{i≥p−1} histogram[i] of them. Per position:

- ``accept_rate``   = accepted_p ÷ verifies: P(at least p drafts accepted), as SGLang's docs read the histogram;
- ``conditional_rate`` = accepted_p ÷ reached_p: α_p, the chance position p is accepted once p−1 were, the
  per-position α of the speculative-decoding cost model (Leviathan et al. 2023 assume one α for all p).

CIs resample requests (a request's verifies share its prompt, so they are not independent draws).
A histogram that does not add up to the request's ``spec_verify_ct``, or has more buckets than the setting's
steps + 1 allow, is flagged, logged per request and left out.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workflow_scripts.analysis.stats import Bootstrap

log = logging.getLogger(__name__)

HISTOGRAM = "spec_correct_drafts_histogram"
POSITION_COLUMNS = ["setting", "workload", "temperature", "steps", "position", "n_requests", "n_verify",
                    "reached", "accepted", "accept_rate", "accept_rate_ci_low", "accept_rate_ci_high",
                    "conditional_rate", "conditional_ci_low", "conditional_ci_high", "n_bad_histograms"]
BAD_COLUMNS = ["setting", "workload", "concurrency", "repeat", "request_id", "problem"]


@dataclass(frozen=True)
class Histograms:
    """The usable histograms of ok, non-warm-up speculative requests, and the flagged ones."""

    valid: pd.DataFrame  # setting, workload, concurrency, temperature, steps, histogram (np.ndarray of length
    # steps+1), output_tokens (NaN where the records lack it)
    bad: pd.DataFrame  # BAD_COLUMNS

    @property
    def empty(self) -> bool:
        return self.valid.empty


def _problem(histogram: object, verify_ct: object, steps: int) -> str | None:
    if steps < 1:
        return f"setting has no speculative steps but reports {HISTOGRAM}"
    counts = np.asarray(histogram, dtype="float64")
    if counts.ndim != 1 or len(counts) == 0:
        return f"{HISTOGRAM} is empty"
    if (counts < 0).any():
        return f"{HISTOGRAM} has a negative count: {counts.astype(int).tolist()}"
    if len(counts) > steps + 1:
        return f"{HISTOGRAM} has {len(counts)} buckets, but steps {steps} allow at most {steps + 1}"
    if pd.isna(verify_ct) or int(counts.sum()) != int(verify_ct):
        return f"{HISTOGRAM} counts sum to {int(counts.sum())}, but spec_verify_ct is {verify_ct}"
    return None


def check_histograms(requests: pd.DataFrame, steps_of: Callable[[str], int]) -> Histograms:
    """Split the histograms of ok, non-warm-up requests into valid (padded to steps + 1) and bad ones (logged)."""
    valid_rows, bad_rows = [], []
    if HISTOGRAM in requests.columns:
        sel = requests[requests["ok"] & ~requests["warmup"].astype(bool) & requests[HISTOGRAM].notna()]
        for row in sel.itertuples(index=False):
            steps = steps_of(row.setting)
            histogram = getattr(row, HISTOGRAM)
            problem = _problem(histogram, row.spec_verify_ct, steps)
            if problem:
                log.warning("bad histogram: setting %s, workload %s, C=%s, repeat %s, request %s: %s",
                            row.setting, row.workload, row.concurrency, row.repeat, row.request_id, problem)
                bad_rows.append({"setting": row.setting, "workload": row.workload, "concurrency": row.concurrency,
                                 "repeat": row.repeat, "request_id": row.request_id, "problem": problem})
                continue
            padded = np.zeros(steps + 1, dtype="int64")
            padded[: len(histogram)] = np.asarray(histogram, dtype="int64")
            valid_rows.append({"setting": row.setting, "workload": row.workload, "concurrency": row.concurrency,
                               "temperature": row.temperature, "steps": steps, "histogram": padded,
                               "output_tokens": getattr(row, "output_tokens", np.nan)})
    valid = pd.DataFrame(valid_rows, columns=["setting", "workload", "concurrency", "temperature", "steps",
                                              "histogram", "output_tokens"])
    return Histograms(valid, pd.DataFrame(bad_rows, columns=BAD_COLUMNS))


def position_counts(histograms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request (rows) and position p = 1..K (columns): (accepted_p, reached_p, verifies).

    ``histograms`` is [requests, K + 1]; accepted_p = Σ_{i≥p} h_i, reached_p = Σ_{i≥p−1} h_i.
    """
    tail = np.cumsum(histograms[:, ::-1], axis=1)[:, ::-1]  # tail[:, i] = Σ_{j≥i} h_j
    return tail[:, 1:], tail[:, :-1], tail[:, 0]


def _ratio_ci(num: np.ndarray, den: np.ndarray, bootstrap: Bootstrap) -> tuple[np.ndarray, np.ndarray]:
    """Per column, the bootstrap CI of Σ num ÷ Σ den with requests (rows) resampled; NaN below two requests."""
    n, k = num.shape
    if n < 2:
        return np.full(k, np.nan), np.full(k, np.nan)
    picks = np.random.default_rng(bootstrap.seed).integers(0, n, size=(bootstrap.resamples, n))
    tail = (1 - bootstrap.ci) / 2 * 100
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a position no resample reached: NaN, not a warning
        ratios = num[picks].sum(axis=1) / den[picks].sum(axis=1)  # [resamples, k]
        low, high = np.nanpercentile(ratios, [tail, 100 - tail], axis=0)
    return low, high


def acceptance_by_position(hist: Histograms, bootstrap: Bootstrap) -> pd.DataFrame:
    """One row per setting × workload × draft position, pooled over concurrencies and repeats."""
    rows = []
    n_bad = hist.bad.groupby(["setting", "workload"]).size()
    for (setting, workload), group in hist.valid.groupby(["setting", "workload"], sort=True):
        accepted, reached, verify = position_counts(np.stack(group["histogram"].to_numpy()))
        rate_low, rate_high = _ratio_ci(accepted, np.repeat(verify[:, None], accepted.shape[1], axis=1), bootstrap)
        cond_low, cond_high = _ratio_ci(accepted, reached, bootstrap)
        total_verify = int(verify.sum())
        for p in range(accepted.shape[1]):
            acc, rea = int(accepted[:, p].sum()), int(reached[:, p].sum())
            rows.append({
                "setting": setting, "workload": workload, "temperature": float(group["temperature"].iloc[0]),
                "steps": int(group["steps"].iloc[0]), "position": p + 1, "n_requests": len(group),
                "n_verify": total_verify, "reached": rea, "accepted": acc,
                "accept_rate": acc / total_verify if total_verify else np.nan,
                "accept_rate_ci_low": rate_low[p], "accept_rate_ci_high": rate_high[p],
                "conditional_rate": acc / rea if rea else np.nan,
                "conditional_ci_low": cond_low[p], "conditional_ci_high": cond_high[p],
                "n_bad_histograms": int(n_bad.get((setting, workload), 0)),
            })
    return pd.DataFrame(rows, columns=POSITION_COLUMNS)
