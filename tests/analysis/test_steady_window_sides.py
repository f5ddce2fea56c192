"""benchmarks/client_overhead.py compares HTTP with in-process on the study's own figure: both of its sides must
count the same steady window as the study's table does, from their own kinds of records."""

from __future__ import annotations

import pytest

from benchmarks.client_overhead import http_tok_s, in_process_tok_s
from workflow_scripts.engine.closed_loop import Timed
from tests.analysis.request_data import cell, frame
from workflow_scripts.analysis.metrics import add_request_metrics, cell_table
from workflow_scripts.client.cell import CellResult
from workflow_scripts.client.streaming import RequestRecord

# a warm-up wave of 2 ends together; then one measured request of 0.21 s and one straggler of 0.69 s, in chunks
# of 2 tokens: the study's window holds 0.21-0.42 s (see test_statistics.py)
ROWS = cell("s", "w", 2, 0, n=2, warmup=2, tok_s=[100, 100, 100, 25], tokens=16, tokens_per_chunk=2)


def test_both_sides_of_the_overhead_benchmark_count_the_studys_steady_window():
    table = cell_table(add_request_metrics(frame(ROWS))).loc[0, "aggregate_tok_s"]
    records = [RequestRecord(r["request_id"], r["prompt_id"], r["send_ts"], chunk_ts=r["chunk_ts"],
                             chunk_tokens=r["chunk_tokens"], end_ts=r["end_ts"], output_tokens=r["output_tokens"])
               for r in ROWS]
    result = CellResult(records, {r["request_id"] for r in ROWS if r["warmup"]}, wall_s=1.0, client_cpu_s=0.1)
    # in-process, the engine's sink stamps each of a step's tokens with the step's time
    timed = [Timed(r["send_ts"], [t for t, n in zip(r["chunk_ts"], r["chunk_tokens"]) for _ in range(n)], 16)
             for r in ROWS]
    assert table == pytest.approx(20 / 0.21, rel=0.1)  # the chunks make the count coarser than per-token timing
    assert http_tok_s(result, 2) == pytest.approx(table)
    assert in_process_tok_s(timed, 2, 2) == pytest.approx(table)
    # the warm-up count matters: taking none as warm-up opens the window at the first send
    assert in_process_tok_s(timed, 0, 2) != pytest.approx(table)
