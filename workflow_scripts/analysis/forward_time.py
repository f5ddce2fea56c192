"""The target's forward time by mode in each cell, from the server metrics the client recorded beside it: the
deltas of the embedded engine's `specstudy:{decode,extend,mixed}_forward_seconds_total` and
`specstudy:decode_forwards_total` over the cell's steady window (`window_server_metrics`, the stretch the aggregate
tok/s counts), or over the whole cell (`cell_server_metrics`) in records from before the window was scraped. The
whole cell holds the warm-up wave's prefill and the drain, whose forwards carry few rows; they differ between
settings and are not in the throughput the cost model explains.

Speculation speeds up decode forwards only. A prefill-only (extend) forward runs the newcomers' prompts, and while
it runs every running request waits: at C=64 on the default pair it was 30% of the baseline's time in-process. So
the cost model needs, per cell, the share of the baseline's forward time that no speculative setting can speed up,
and how much a speculative setting's own prefill costs against the baseline's (its draft prefills the prompts too,
and its requests finish at scattered steps, so it prefills in more, smaller forwards). The seconds per decode
forward also give what one speculative step (its drafting and its verify) costs against a plain decode step: the
fitted step cost, measured. A mixed forward (prompt chunks in a decode batch, `--enable-mixed-chunk`) counts in
the total only: its prefill's part is not known, so with mixing the prefill share is a lower bound.

A speculative cell also gives how many rows its decode forwards carried (`sglang:spec_verify_calls_total`, one per
row verified, ÷ `specstudy:decode_forwards_total`). It falls short of C: a row's slot stays empty from the forward
that finished its request until its successor's prompt is prefilled, and a setting that commits more tokens per
forward finishes more requests per forward (cost_model.committed_per_verify).

A time-sliced cell (client/slicing.py) is read with the engine thread's CPU clock instead
(`specstudy:*_forward_cpu_seconds_total`): its server was frozen in the middle of forwards, whose wall time the
engine counts whole, so the wall seconds carry the other members' turns, while the CPU clock stands still through
them. The engine reports that clock only where its thread runs the forwards alone (one torch thread, the study's
default); a sliced cell without it has no forward times.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from workflow_scripts.engine.types import FORWARD_MODES

GROUP = ["setting", "workload", "concurrency"]
# the forward-time counters a cell is read with, by whether it was time-sliced
CLOCKS = {False: "forward_seconds", True: "forward_cpu_seconds"}
COLUMNS = [*GROUP, "extend_share", "extend_s_per_token", "decode_s_per_forward", "rows_per_forward"]
TOKENS = "sglang:generation_tokens_total"
VERIFIES = "sglang:spec_verify_calls_total"


def _seconds(metrics: str | None, clock: str) -> dict[str, float] | None:
    """{mode: seconds} by `clock` (CLOCKS), the decode forwards, the cell's generated tokens and its rows verified
    (NaN without speculation) from one cell's metrics JSON; None without forward times."""
    if not isinstance(metrics, str):
        return None
    values = json.loads(metrics)
    names = {mode: f"specstudy:{mode}_{clock}_total" for mode in FORWARD_MODES}
    names["decode_forwards"] = "specstudy:decode_forwards_total"
    if not all(name in values for name in names.values()) or not values.get(TOKENS):
        return None
    return {key: float(values[name]) for key, name in names.items()} | {
        "tokens": float(values[TOKENS]), "verifies": float(values.get(VERIFIES) or "nan")}


def forward_times(requests: pd.DataFrame) -> pd.DataFrame:
    """Per setting × workload × concurrency, the median over rounds of the extend forwards' share of the forward
    time, of their seconds per generated token, of the seconds per decode forward and of the rows a decode forward
    verified (NaN without speculation; COLUMNS); empty when no cell carries forward times."""
    sources = [name for name in ("window_server_metrics", "cell_server_metrics") if name in requests.columns]
    if not sources:
        return pd.DataFrame(columns=COLUMNS)
    sliced = requests["cell_run_share"].notna() if "cell_run_share" in requests.columns else False
    cells = requests.assign(clock=np.where(sliced, CLOCKS[True], CLOCKS[False]))
    cells = cells.groupby([*GROUP, "repeat"], sort=True)[[*sources, "clock"]].first()
    rows = []
    for key, metrics in cells.iterrows():
        seconds = next((found for name in sources if (found := _seconds(metrics[name], metrics["clock"])) is not None),
                       None)
        total = sum(seconds[mode] for mode in FORWARD_MODES) if seconds else 0.0
        if total > 0:
            forwards = seconds["decode_forwards"] or np.nan
            rows.append({**dict(zip(GROUP, key[:3])), "extend_share": seconds["extend"] / total,
                         "extend_s_per_token": seconds["extend"] / seconds["tokens"],
                         "decode_s_per_forward": seconds["decode"] / forwards,
                         "rows_per_forward": seconds["verifies"] / forwards})
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    return pd.DataFrame(rows).groupby(GROUP, as_index=False)[COLUMNS[len(GROUP):]].median()


def attach(cells: pd.DataFrame, times: pd.DataFrame | None, baseline: str) -> pd.DataFrame:
    """On the cost model's cells: `prefill_share` (the baseline's extend share at the cell's workload ×
    concurrency; 0 where unknown, which is the model without it), `prefill_ratio` (the setting's extend seconds per
    token ÷ the baseline's), `measured_step_cost` (its seconds per decode forward ÷ the baseline's: one
    speculative step in plain decode steps), the last two NaN where unknown and for the baseline itself; and
    `rows_per_forward` (the setting's own, NaN without speculation). ``times`` is forward_times' table; None (an
    external source) or empty gives the model without forward times."""
    times = pd.DataFrame(columns=COLUMNS) if times is None else times
    base = times[times["setting"] == baseline].drop(columns=["setting", "rows_per_forward"])
    out = cells.merge(base.rename(columns={"extend_share": "prefill_share", "extend_s_per_token": "base_s_per_token",
                                           "decode_s_per_forward": "base_s_per_forward"}),
                      on=["workload", "concurrency"], how="left")
    out = out.merge(times[[*GROUP, "extend_s_per_token", "decode_s_per_forward", "rows_per_forward"]], on=GROUP,
                    how="left")
    out["rows_per_forward"] = out["rows_per_forward"].astype("float64")
    for name, own, base_col in (("prefill_ratio", "extend_s_per_token", "base_s_per_token"),
                                ("measured_step_cost", "decode_s_per_forward", "base_s_per_forward")):
        ratio = out[own].astype("float64") / out[base_col].astype("float64")
        out[name] = ratio.where((out["setting"] != baseline) & np.isfinite(ratio))
    out["prefill_share"] = out["prefill_share"].astype("float64").fillna(0.0)
    return out.drop(columns=["base_s_per_token", "extend_s_per_token", "base_s_per_forward", "decode_s_per_forward"])
