"""The study's metric definitions, written down once and used by every table, plot and summary.

Definitions (per request = one row of ``requests/{setting}.parquet``; a request is *ok* when ``error`` is null
and ``output_tokens`` and ``first_token_ts`` are present; warm-up requests never count):

- per-request tok/s = ``output_tokens / (end_ts - first_token_ts)``: the decode speed one user sees, with the
  prefill (TTFT) left out. Undefined (NaN) when the decode time is not positive (e.g. a single-token answer).
- TTFT = ``first_token_ts - send_ts`` (the client's ``ttft_s``).
- TPOT = ``(end_ts - first_token_ts) / (output_tokens - 1)``: time per output token after the first. Unlike the
  gap between stream chunks it stays honest under speculation, where one chunk carries several tokens.
- ITL = the gaps between consecutive stream chunks (``diff(chunk_ts)``), pooled over requests. Under
  speculation ITL grows while TPOT shrinks; that contrast is the point of reporting both.
- e2e latency = ``end_ts - send_ts``.
- acceptance length: request mean = mean of the per-request ``accept_length``; token-weighted =
  ``sum(output_tokens) / sum(spec_verify_ct)`` over the cell, so long answers weigh more.
- aggregate tok/s of a cell (one setting × workload × concurrency × round of a cohort) = the tokens streamed while the
  server held exactly ``concurrency`` requests ÷ that time: the window opens at the first non-warm-up ``send_ts``
  and closes at the first end that no new request replaced. In the closed loop of client/cell.py the first
  N − C of a cell's N ends (in time order) each start the next request at once, so that is its (N − C + 1)-th
  ``end_ts``. Every ok request's chunks inside the window count, warm-up requests' too, by ``chunk_ts`` and
  ``chunk_tokens``. A cell is only two waves, so a span from first send to last end was mostly
  ramp and drain, and they differ between settings: a speculative batch finishes at scattered steps, so its
  measured requests start among warm-up requests whose tokens did not count, and it ends in a tail of the least
  accepted requests decoding nearly alone, where the baseline's wave starts and ends together.
- a cell with no ok request is *empty*: every metric is NaN (shown as "—"), never 0 tok/s.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

CELL_KEYS = ["setting", "workload", "concurrency", "cohort", "repeat"]
GROUP_KEYS = ["setting", "workload", "concurrency"]

REQUIRED_COLUMNS = {
    "setting", "workload", "concurrency", "cohort", "repeat", "prompt_id", "warmup", "temperature", "send_ts",
    "first_token_ts", "chunk_ts", "chunk_tokens", "end_ts", "output_tokens", "finish_reason", "spec_verify_ct",
    "accept_length", "error",
}
OUTPUT_IDENTITY_COLUMNS = ("output_ids", "text_hash")


def load_requests(paths: list[Path | str]) -> pd.DataFrame:
    """Read and concatenate per-request parquet files, checking the columns the analysis needs."""
    frames = []
    for path in paths:
        frame = pd.read_parquet(path)
        missing = sorted(REQUIRED_COLUMNS - set(frame.columns))
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} in the per-request records")
        if not any(col in frame.columns for col in OUTPUT_IDENTITY_COLUMNS):
            raise ValueError(f"{path}: needs column output_ids or text_hash for the lossless check")
        frames.append(frame)
    if not frames:
        raise ValueError("no per-request parquet files given")
    return pd.concat(frames, ignore_index=True)


def _positive_or_nan(values: pd.Series) -> pd.Series:
    return values.where(values > 0)


def add_request_metrics(requests: pd.DataFrame) -> pd.DataFrame:
    """Return a copy with ``ok`` and the per-request metrics (seconds and tok/s) as defined above."""
    df = requests.copy()
    out_tokens = pd.to_numeric(df["output_tokens"], errors="coerce").astype("float64")
    first = pd.to_numeric(df["first_token_ts"], errors="coerce").astype("float64")
    df["ok"] = df["error"].isna() & out_tokens.notna() & first.notna()
    decode_s = _positive_or_nan(df["end_ts"].astype("float64") - first)
    df["per_request_tok_s"] = (out_tokens / decode_s).where(df["ok"])
    df["ttft_s_"] = (first - df["send_ts"].astype("float64")).where(df["ok"])
    df["tpot_s"] = (decode_s / _positive_or_nan(out_tokens - 1)).where(df["ok"])
    df["e2e_s_"] = (df["end_ts"].astype("float64") - df["send_ts"].astype("float64")).where(df["ok"])
    df["out_tokens_"] = out_tokens.where(df["ok"])
    df["verify_ct_"] = pd.to_numeric(df["spec_verify_ct"], errors="coerce").astype("float64").where(df["ok"])
    df["accept_length_"] = pd.to_numeric(df["accept_length"], errors="coerce").astype("float64").where(df["ok"])
    return df


def inter_chunk_gaps(chunk_ts: pd.Series) -> np.ndarray:
    """All gaps between consecutive stream chunks of the given requests, pooled (seconds)."""
    gaps = [np.diff(np.asarray(ts, dtype="float64")) for ts in chunk_ts if ts is not None and len(ts) > 1]
    return np.concatenate(gaps) if gaps else np.array([], dtype="float64")


def steady_window_tok_s(measured_sends: np.ndarray, ends: np.ndarray, concurrency: int, chunk_ts: np.ndarray,
                        chunk_tokens: np.ndarray) -> float:
    """The steady-window aggregate (defined above) from plain arrays: the sends of the measured requests, the ends
    of all of the cell's requests, and the ok requests' chunks pooled. NaN for a window with no length; the one
    definition for the study's records and for a benchmark that drives the engine in its own process."""
    if not len(measured_sends) or not len(ends):
        return float("nan")
    opens = float(np.min(measured_sends))
    ends = np.sort(np.asarray(ends, dtype="float64"))
    closes = float(ends[max(len(ends) - int(concurrency), 0)])
    if not closes > opens:
        return float("nan")
    inside = (chunk_ts > opens) & (chunk_ts <= closes)
    return float(chunk_tokens[inside].sum() / (closes - opens))


def aggregate_tok_s(cell: pd.DataFrame) -> float:
    """Aggregate tok/s of one cell (its warm-up rows included) over its steady window, as defined above; NaN for
    an empty cell or a window with no length."""
    measured = cell[~cell["warmup"].astype(bool)]
    if not measured["ok"].any():
        return float("nan")
    ok = cell[cell["ok"]]
    return steady_window_tok_s(
        measured["send_ts"].to_numpy(dtype="float64"),
        cell["end_ts"].dropna().to_numpy(dtype="float64"),
        int(cell["concurrency"].iloc[0]),
        np.concatenate([np.asarray(ts, dtype="float64") for ts in ok["chunk_ts"]]),
        np.concatenate([np.asarray(n, dtype="float64") for n in ok["chunk_tokens"]]),
    )


def token_weighted_acceptance(ok: pd.DataFrame) -> float:
    """sum(output_tokens) / sum(spec_verify_ct) over requests that report verify counts; NaN if none do."""
    with_verify = ok[ok["verify_ct_"] > 0]
    if with_verify.empty:
        return float("nan")
    return float(with_verify["out_tokens_"].sum() / with_verify["verify_ct_"].sum())


def cell_table(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per setting × workload × concurrency × cohort × round: non-warm-up requests only, but for the
    aggregate's window, which also counts the warm-up requests' tokens inside it."""
    rows = []
    for key, whole in requests.groupby(CELL_KEYS, sort=True):
        cell = whole[~whole["warmup"].astype(bool)]
        if cell.empty:
            continue
        ok = cell[cell["ok"]]
        rows.append({
            **dict(zip(CELL_KEYS, key)),
            "n_ok": int(len(ok)),
            "n_err": int(len(cell) - len(ok)),
            "per_request_tok_s_median": float(ok["per_request_tok_s"].median()) if len(ok) else np.nan,
            "per_request_tok_s_mean": float(ok["per_request_tok_s"].mean()) if len(ok) else np.nan,
            "aggregate_tok_s": aggregate_tok_s(whole),
        })
    return pd.DataFrame(rows, columns=[*CELL_KEYS, "n_ok", "n_err", "per_request_tok_s_median",
                                       "per_request_tok_s_mean", "aggregate_tok_s"])
