"""The analysis stage's tables from one recorded smoke study, compared byte for byte with recorded tables.

tests/data/smoke_study/ holds the inputs of the smoke study's `analysis_tables` job (the per-request records, the
cohort's meta file, the forward profile and the job's --config-json) and, under tables/, what that job wrote.
Measurements differ run to run, so the inputs are frozen and only the analysis is re-run: a refactor of the
analysis code must leave every recorded table unchanged. A table that appears in tables/ only after the recording
is not compared until it is recorded; record (or re-record after an intended change) with

    SPECSTUDY_RECORD_TABLES=1 pytest tests/analysis/test_golden_tables.py

and commit tests/data/smoke_study/tables/ with the change that explains the difference.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "smoke_study"
RECORDED = DATA / "tables"
REPO = Path(__file__).resolve().parents[2]
RECORD = os.environ.get("SPECSTUDY_RECORD_TABLES") == "1"


def run_tables(out_dir: Path) -> None:
    """The analysis_tables job's command line on the recorded inputs (relative paths, as Snakemake passes them)."""
    requests = sorted(str(p.relative_to(DATA)) for p in (DATA / "requests").glob("*.parquet"))
    metas = sorted(str(p.relative_to(DATA)) for p in (DATA / "benchmark").glob("*.json"))
    argv = [sys.executable, "-m", "workflow_scripts.analysis.tables",
            "--config-json", (DATA / "config.json").read_text(), "--requests", *requests, "--cohort-meta", *metas,
            "--forward-profile", "profile/forward_profile.csv", "--out-dir", str(out_dir)]
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    proc = subprocess.run(argv, cwd=DATA, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tables")
    run_tables(out)
    if RECORD:
        shutil.rmtree(RECORDED, ignore_errors=True)
        shutil.copytree(out, RECORDED)
    return out


def same(written: Path, recorded: Path) -> bool:
    """Byte for byte, except a CSV's floats, which may differ in their last bits between CPUs (numpy's SIMD sums:
    tables recorded on an AVX-512 Xeon read back on an AVX2 EPYC) and are compared to 1e-9 relative."""
    if not written.is_file():
        return False
    if written.read_bytes() == recorded.read_bytes():
        return True
    if written.suffix != ".csv":
        return False
    try:
        pd.testing.assert_frame_equal(pd.read_csv(written), pd.read_csv(recorded), check_exact=False, rtol=1e-9,
                                      atol=1e-12)
    except AssertionError:
        return False
    return True


def test_every_recorded_table_is_unchanged(tables: Path):
    recorded = sorted(p.name for p in RECORDED.iterdir())
    assert "summary.csv" in recorded and "cost_model.md" in recorded, f"nothing recorded in {RECORDED}"
    changed = [name for name in recorded if not same(tables / name, RECORDED / name)]
    assert changed == [], (f"tables differ from {RECORDED} (re-record with SPECSTUDY_RECORD_TABLES=1 if intended): "
                           f"{changed}")


def test_no_recorded_table_disappears_and_new_ones_are_listed(tables: Path):
    """Every table the job writes is either recorded or reported here, so a new table is recorded on purpose."""
    written = {p.name for p in tables.iterdir()}
    recorded = {p.name for p in RECORDED.iterdir()}
    assert recorded <= written
    unrecorded = sorted(written - recorded)
    if unrecorded:
        pytest.skip(f"written but not recorded yet (SPECSTUDY_RECORD_TABLES=1 records them): {unrecorded}")
