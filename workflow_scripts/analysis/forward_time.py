"""The target's forward time by mode in each cell, from the server metrics the client recorded beside it
(`cell_server_metrics`: the embedded engine's `specstudy:{decode,extend,mixed}_forward_seconds_total` deltas).

Speculation speeds up decode forwards only. A prefill-only (extend) forward runs the newcomers' prompts, and while
it runs every running request waits: at C=64 on the default pair it was 30% of the baseline's time in-process. So
the cost model needs, per cell, the share of the baseline's forward time that no speculative setting can speed up,
and how much a speculative setting's own prefill costs against the baseline's (its draft prefills the prompts too,
and its requests finish at scattered steps, so it prefills in more, smaller forwards). A mixed forward (prompt
chunks in a decode batch, `--enable-mixed-chunk`) counts as decode: its prefill's part is not known.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from workflow_scripts.engine.types import FORWARD_MODES

GROUP = ["setting", "workload", "concurrency"]
COLUMNS = [*GROUP, "extend_share", "extend_s_per_token"]
TOKENS = "sglang:generation_tokens_total"


def _seconds(metrics: str | None) -> dict[str, float] | None:
    """{mode: seconds} and the cell's generated tokens from one cell's metrics JSON; None without forward times."""
    if not isinstance(metrics, str):
        return None
    values = json.loads(metrics)
    names = {mode: f"specstudy:{mode}_forward_seconds_total" for mode in FORWARD_MODES}
    if not all(name in values for name in names.values()) or not values.get(TOKENS):
        return None
    return {mode: float(values[name]) for mode, name in names.items()} | {"tokens": float(values[TOKENS])}


def prefill_shares(requests: pd.DataFrame) -> pd.DataFrame:
    """Per setting × workload × concurrency, the median over rounds of the extend forwards' share of the forward
    time and of their seconds per generated token (COLUMNS); empty when no cell carries forward times."""
    if "cell_server_metrics" not in requests.columns:
        return pd.DataFrame(columns=COLUMNS)
    cells = requests.groupby([*GROUP, "repeat"], sort=True)["cell_server_metrics"].first()
    rows = []
    for key, metrics in cells.items():
        seconds = _seconds(metrics)
        total = sum(seconds[mode] for mode in FORWARD_MODES) if seconds else 0.0
        if total > 0:
            rows.append({**dict(zip(GROUP, key[:3])), "extend_share": seconds["extend"] / total,
                         "extend_s_per_token": seconds["extend"] / seconds["tokens"]})
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    return pd.DataFrame(rows).groupby(GROUP, as_index=False)[["extend_share", "extend_s_per_token"]].median()


def attach(cells: pd.DataFrame, shares: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """`prefill_share` (the baseline's extend share at the cell's workload × concurrency; 0 where unknown, which is
    the model without it) and `prefill_ratio` (the setting's extend seconds per token ÷ the baseline's; NaN where
    unknown or for the baseline itself) on the cost model's cells."""
    base = shares[shares["setting"] == baseline].drop(columns="setting")
    out = cells.merge(base.rename(columns={"extend_share": "prefill_share", "extend_s_per_token": "base_s_per_token"}),
                      on=["workload", "concurrency"], how="left")
    out = out.merge(shares[[*GROUP, "extend_s_per_token"]], on=GROUP, how="left")
    ratio = out["extend_s_per_token"].astype("float64") / out["base_s_per_token"].astype("float64")
    out["prefill_ratio"] = ratio.where((out["setting"] != baseline) & np.isfinite(ratio))
    out["prefill_share"] = out["prefill_share"].astype("float64").fillna(0.0)
    return out.drop(columns=["base_s_per_token", "extend_s_per_token"])
