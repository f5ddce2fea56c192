"""Atomic writes: the mode a plain open gives, the old file intact and no temp file left when a write fails."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from workflow_scripts.client.records import RECORD_SCHEMA, read_records, write_parquet_atomic
from workflow_scripts.io import atomic_write, atomic_write_json, atomic_write_text


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield 0o027
    os.umask(old)


@pytest.mark.parametrize("durable", [True, False])
def test_mode_matches_a_plain_open(tmp_path: Path, umask_027, durable):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    atomic_write_text(tmp_path / "atomic.txt", "x", durable=durable)
    assert (tmp_path / "atomic.txt").stat().st_mode == plain.stat().st_mode
    assert (tmp_path / "atomic.txt").stat().st_mode & 0o777 == 0o640


def test_replaces_and_creates_the_folder(tmp_path: Path):
    target = tmp_path / "new" / "dir" / "out.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_json(target, {"a": 2})
    assert target.read_text() == '{\n  "a": 2\n}\n'
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]


class Interrupted(Exception):
    pass


def test_failure_mid_write_keeps_the_old_file_and_removes_the_temp(tmp_path: Path):
    target = tmp_path / "table.csv"
    atomic_write_text(target, "old\n")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half a ta")
        raise Interrupted

    with pytest.raises(Interrupted):
        atomic_write(target, half_then_fail)
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_unserialisable_json_leaves_nothing(tmp_path: Path):
    target = tmp_path / "shard.json"
    atomic_write_json(target, {"ok": 1})
    with pytest.raises(TypeError):
        atomic_write_json(target, {"bad": object()})
    assert json.loads(target.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["shard.json"]


def test_records_writer_cleans_up_on_a_frame_that_breaks_the_schema(tmp_path: Path):
    """The per-request record writer goes through the same path: a bad frame leaves no temp parquet behind."""
    target = tmp_path / "cell.parquet"
    empty = pd.DataFrame({name: pd.Series([], dtype=object) for name in RECORD_SCHEMA.names})
    write_parquet_atomic(empty, target)
    assert len(read_records(target)) == 0
    with pytest.raises(Exception):
        write_parquet_atomic(pd.DataFrame({"setting": [object()]}), target)
    assert [p.name for p in tmp_path.iterdir()] == ["cell.parquet"]
    assert len(read_records(target)) == 0
