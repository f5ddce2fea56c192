"""Cached cells are read back checked against the record schema; a column added since they were cached reads as
null, so a client change does not turn last week's cells into foreign files."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.analysis.request_data import cell
from workflow_scripts.client.records import RECORD_SCHEMA, read_records


def _write_without(tmp_path, column: str):
    table = pa.Table.from_pylist(cell("baseline", "synthetic", 2, 0, n=3), schema=RECORD_SCHEMA)
    path = tmp_path / "cell.parquet"
    pq.write_table(table.drop_columns([column]), path)
    return path


def test_a_cell_cached_before_the_window_scrapes_reads_them_as_null(tmp_path):
    records = read_records(_write_without(tmp_path, "window_server_metrics"))
    assert len(records) == 4 and records["window_server_metrics"].isna().all()
    assert set(RECORD_SCHEMA.names) <= set(records.columns)


def test_a_file_missing_any_other_column_is_not_a_record_file(tmp_path):
    with pytest.raises(ValueError, match=r"cell\.parquet: not a per-request record file .*chunk_tokens"):
        read_records(_write_without(tmp_path, "chunk_tokens"))
