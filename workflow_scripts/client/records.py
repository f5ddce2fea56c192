"""The per-request record of the benchmark (docs/DESIGN.md) and how a measured cell becomes rows of it.

Every file is written to a temporary name and renamed, so a crash never leaves a file that looks complete.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from workflow_scripts.client.cell import CellResult
from workflow_scripts.io import atomic_write

RECORD_SCHEMA = pa.schema(
    [
        ("setting", pa.string()),
        ("workload", pa.string()),
        ("concurrency", pa.int64()),
        ("repeat", pa.int64()),  # the round of the cohort (docs/DESIGN.md): cells of one round are paired
        ("cohort", pa.string()),
        ("request_id", pa.string()),
        ("prompt_id", pa.int64()),
        ("sampling_seed", pa.int64()),  # the request's random stream; the same seed samples the same text at T>0
        ("warmup", pa.bool_()),
        ("temperature", pa.float64()),
        ("send_ts", pa.float64()),
        ("first_token_ts", pa.float64()),
        ("chunk_ts", pa.list_(pa.float64())),
        ("chunk_tokens", pa.list_(pa.int64())),
        ("end_ts", pa.float64()),
        ("ttft_s", pa.float64()),
        ("e2e_s", pa.float64()),
        ("prompt_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("finish_reason", pa.string()),
        ("spec_verify_ct", pa.int64()),
        ("accept_length", pa.float64()),
        ("spec_correct_drafts_histogram", pa.list_(pa.int64())),
        ("spec_num_correct_drafts", pa.int64()),
        ("spec_num_proposed_drafts", pa.int64()),
        ("output_ids", pa.list_(pa.int64())),
        ("text_hash", pa.string()),
        ("error", pa.string()),
        ("cell_wall_s", pa.float64()),
        ("cell_client_cpu_s", pa.float64()),
        ("cell_start_ts", pa.float64()),  # wall clock (time.time()) when the cell started: the drift axis
        ("cell_mem_gbs", pa.float64()),  # the machine's memory speed around the cell (machine.memory_speed_gbs)
        ("cell_server_metrics", pa.string()),  # JSON: the server's /metrics deltas over the cell, null if not scraped
        ("window_server_metrics", pa.string()),  # JSON: the same over the cell's steady window (client/cell.py)
        # a sliced cell (client/slicing.py): the share of its wall time its server ran; its timestamps are on the
        # server's running clock. Null for a cell measured alone
        ("cell_run_share", pa.float64()),
    ]
)
# columns added after cells were first cached: a cached cell without one reads it as null, not as a foreign file
LATER_COLUMNS = ("window_server_metrics", "cell_run_share")


def write_parquet_atomic(df: pd.DataFrame, path: Path) -> None:
    """Per-request records under RECORD_SCHEMA, written atomically (a cached cell is trusted on sight)."""
    table = pa.Table.from_pandas(df, schema=RECORD_SCHEMA, preserve_index=False)
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def read_records(path: Path) -> pd.DataFrame:
    """A cached cell or a requests file, checked against RECORD_SCHEMA: a truncated or foreign file raises."""
    table = pq.read_table(path)
    missing = [name for name in RECORD_SCHEMA.names if name not in table.column_names and name not in LATER_COLUMNS]
    if missing:
        raise ValueError(f"{path}: not a per-request record file (missing column(s) {', '.join(missing)})")
    df = table.to_pandas()
    for name in LATER_COLUMNS:
        if name not in df.columns:
            df[name] = None
    return df


def cell_frame(result: CellResult, setting: str, workload: str, temperature: float, concurrency: int,
               round_: int, cohort: str, start_ts: float, mem_gbs: float | None = None) -> pd.DataFrame:
    """The rows of one measured cell, in RECORD_SCHEMA's column order."""
    df = pd.DataFrame([r.as_row() for r in result.records])
    df.insert(0, "setting", setting)
    df.insert(1, "workload", workload)
    df.insert(2, "concurrency", concurrency)
    df.insert(3, "repeat", round_)
    df["cohort"] = cohort
    df["warmup"] = df["request_id"].isin(result.warmup_ids)
    df["temperature"] = float(temperature)
    df["cell_wall_s"] = result.wall_s
    df["cell_client_cpu_s"] = result.client_cpu_s
    df["cell_start_ts"] = start_ts
    df["cell_mem_gbs"] = mem_gbs
    df["cell_server_metrics"] = json.dumps(result.server_metrics, sort_keys=True) if result.server_metrics else None
    df["window_server_metrics"] = json.dumps(result.window_metrics, sort_keys=True) if result.window_metrics else None
    df["cell_run_share"] = None
    return df[RECORD_SCHEMA.names]
