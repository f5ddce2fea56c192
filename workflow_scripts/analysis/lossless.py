"""Lossless check: at temperature 0, speculation must reproduce the baseline's tokens exactly.

For each prompt (workload, prompt_id) of a T=0 workload the reference is the baseline's most frequent output
over all its concurrencies and repeats. Every ok, non-warm-up T=0 request of every setting is compared to it.
The baseline's own row shows how stable plain decoding is across batch sizes: a speculative setting can't be
expected to beat that, and anything under 100% is called out in the summary.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

LOSSLESS_COLUMNS = ["setting", "workload", "concurrency", "n_compared", "n_identical", "share_identical",
                    "n_no_reference"]


def _signature(row: pd.Series) -> object:
    ids = row.get("output_ids")
    if ids is not None and not isinstance(ids, float) and len(ids):
        return tuple(int(t) for t in ids)
    return row.get("text_hash")  # e.g. the OpenAI API path, which streams text without token ids


def lossless_table(requests: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Share of T=0 requests token-identical to the baseline's reference output, per setting × workload × C."""
    greedy = requests[requests["ok"] & ~requests["warmup"].astype(bool) & (requests["temperature"] == 0)].copy()
    if greedy.empty:
        return pd.DataFrame(columns=LOSSLESS_COLUMNS)
    greedy["sig"] = greedy.apply(_signature, axis=1)
    base = greedy[greedy["setting"] == baseline]
    reference = base.groupby(["workload", "prompt_id"])["sig"].agg(lambda s: s.value_counts().index[0])
    keys = list(zip(greedy["workload"], greedy["prompt_id"]))
    greedy["has_ref"] = [k in reference.index for k in keys]
    greedy["identical"] = [bool(r) and reference[k] == s for k, s, r in zip(keys, greedy["sig"], greedy["has_ref"])]
    rows = []
    for (setting, workload, conc), g in greedy.groupby(["setting", "workload", "concurrency"], sort=True):
        compared = g[g["has_ref"]]
        rows.append({"setting": setting, "workload": workload, "concurrency": int(conc),
                     "n_compared": len(compared), "n_identical": int(compared["identical"].sum()),
                     "share_identical": compared["identical"].mean() if len(compared) else np.nan,
                     "n_no_reference": int((~g["has_ref"]).sum())})
    return pd.DataFrame(rows, columns=LOSSLESS_COLUMNS)
