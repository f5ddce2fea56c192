"""Per-request test data in the client's parquet schema, with values chosen so the expected statistics are known.

Requests of a cell run in ``concurrency`` parallel lanes, each request on the lane that frees first (the client's
closed loop); each decodes ``tokens`` tokens at exactly
``tok_s`` after a TTFT of ``ttft_s``, in chunks of ``tokens_per_chunk`` tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from workflow_scripts.client.records import RECORD_SCHEMA

SCHEMA = RECORD_SCHEMA
COHORT = "cohort-test"


def cell(setting: str, workload: str, concurrency: int, repeat: int, *, n: int = 8, tok_s: float | list[float] = 100.0,
         ttft_s: float = 0.05, tokens: int = 16, tokens_per_chunk: int = 1, temperature: float = 0.0,
         error: str | None = None, warmup: int = 1, output_ids=None, finish_reason: str = "length",
         t0: float = 1000.0, cohort: str = COHORT, histogram: list[int] | None = None) -> list[dict]:
    """Rows of one cell: ``warmup`` warm-up requests then ``n`` measured ones (all errored if ``error``), each with
    the engine's ``histogram`` of accepted drafts per verify where given."""
    speeds = np.broadcast_to(np.asarray(tok_s, dtype="float64"), (n + warmup,))
    lanes = [t0] * concurrency
    rows = []
    for i in range(n + warmup):
        lane = int(np.argmin(lanes))
        send = lanes[lane]
        prompt_id = i % 4
        decode = tokens / speeds[i]
        first = send + ttft_s
        end = first + decode
        lanes[lane] = end
        n_chunks = -(-tokens // tokens_per_chunk)
        chunk_ts = list(np.linspace(first, end, n_chunks)) if n_chunks > 1 else [first]
        ids = output_ids(prompt_id) if output_ids else [prompt_id * 100 + k for k in range(tokens)]
        spec = tokens_per_chunk > 1
        ok = error is None
        rows.append({
            "setting": setting, "workload": workload, "concurrency": concurrency, "repeat": repeat,
            "cohort": cohort, "request_id": f"{setting}-{workload}-{concurrency}-{repeat}-{i}", "prompt_id": prompt_id,
            "warmup": i < warmup, "temperature": temperature, "send_ts": send,
            "first_token_ts": first if ok else None, "chunk_ts": chunk_ts if ok else [],
            "chunk_tokens": [tokens_per_chunk] * n_chunks if ok else [], "end_ts": end,
            "ttft_s": ttft_s if ok else None, "e2e_s": end - send if ok else None, "prompt_tokens": 16,
            "output_tokens": tokens if ok else None, "finish_reason": finish_reason if ok else "abort",
            "spec_verify_ct": (sum(histogram) if histogram else n_chunks) if ok and spec else None,
            "accept_length": tokens / n_chunks if ok and spec else None,
            "output_ids": ids if ok else [], "text_hash": str(hash(tuple(ids))), "error": error,
            "spec_correct_drafts_histogram": histogram if ok and spec else None,
        })
    return rows


def frame(rows: list[dict]) -> pd.DataFrame:
    return pa.Table.from_pylist(rows, schema=SCHEMA).to_pandas()


def write_parquet(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return path


def study_rows(speedups: dict[str, dict[str, float]], concurrencies=(1, 4), repeats: int = 3,
               base_tok_s: float = 100.0, jitter: float = 0.02) -> list[dict]:
    """A small study: per setting and workload a speedup factor over ``base_tok_s``; repeats vary by ±jitter."""
    rows = []
    for setting, by_workload in speedups.items():
        for workload, factor in by_workload.items():
            temperature = 0.0 if workload == "synthetic" else 0.7
            for c in concurrencies:
                for r in range(repeats):
                    speed = base_tok_s * factor * (1 + jitter * (r - (repeats - 1) / 2)) / (1 + 0.1 * c)
                    rows += cell(setting, workload, c, r, n=2 * c, tok_s=speed, temperature=temperature,
                                 tokens_per_chunk=1 if setting == "baseline" else 2,
                                 finish_reason="length" if workload == "synthetic" else "stop",
                                 t0=1000.0 + 100 * r)
    return rows
