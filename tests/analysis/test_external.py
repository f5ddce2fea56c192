"""External result CSVs: the seed article's numbers through the real CLI, and bad files named precisely."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workflow_scripts.analysis.external import ExternalCSVError, load_external

REPO = Path(__file__).resolve().parents[2]
ARTICLE = REPO / "tests" / "data" / "article.csv"
HEADER = "setting,workload,concurrency,per_request_tok_s,aggregate_tok_s\n"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workflow_scripts.analysis.improvement", *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def _improvement_column(markdown: str) -> list[str]:
    lines = [line for line in markdown.splitlines() if line.startswith("|") and "%" in line]
    return [line.strip("|").split("|")[-1].strip() for line in lines]


def test_article_numbers_reproduce_the_articles_improvements():
    proc = _cli("--baseline", "steps1", "--candidate", "steps2", str(ARTICLE))
    assert proc.returncode == 0, proc.stderr
    per_request, aggregate = proc.stdout.split("aggregate tok/s")
    assert "per-request tok/s" in per_request
    assert _improvement_column(per_request) == ["+51%", "+36%", "+27%", "+56%", "+50%"]
    assert _improvement_column(aggregate) == ["+50%", "+36%", "+26%", "+10%", "+17%"]
    assert "186" in per_request and "1844" in aggregate


def test_cli_names_a_setting_missing_from_the_file():
    proc = _cli("--baseline", "steps1", "--candidate", "steps9", str(ARTICLE))
    assert proc.returncode == 2
    assert "article.csv" in proc.stderr and "column setting" in proc.stderr and "steps9" in proc.stderr


@pytest.mark.parametrize("body, where", [
    ("setting,workload,concurrency,per_request_tok_s\nsteps1,synthetic,1,10\n",
     "row 1 (header): missing column(s) aggregate_tok_s"),
    (HEADER + "steps1,synthetic,1,10,20\nsteps2,synthetic,1,fast,20\n", "row 3, column per_request_tok_s"),
    (HEADER + "steps1,synthetic,1,10,20\nsteps1,synthetic,four,10,20\n", "row 3, column concurrency"),
    (HEADER + "steps1,synthetic,0,10,20\n", "row 2, column concurrency"),
    (HEADER + "steps1,synthetic,1,10,-5\n", "row 2, column aggregate_tok_s"),
    (HEADER + "steps1,,1,10,5\n", "row 2, column workload"),
    (HEADER + "steps1,synthetic,1,10,5\nsteps1,synthetic,1,11,6\n", "row 3: duplicate cell"),
    (HEADER, "no data rows"),
])
def test_bad_csv_names_file_row_and_column(tmp_path: Path, body: str, where: str):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(ExternalCSVError) as err:
        load_external(path)
    assert str(path) in str(err.value) and where in str(err.value)


def test_unknown_setting_is_named_with_its_row(tmp_path: Path):
    path = tmp_path / "other.csv"
    path.write_text(HEADER + "steps1,synthetic,1,10,20\nsteps7,synthetic,1,10,20\n")
    with pytest.raises(ExternalCSVError, match=r"other\.csv: row 3, column setting: unknown setting 'steps7'"):
        load_external(path, known_settings={"steps1", "steps2"})


def test_label_fills_source_and_optional_columns_are_numbers(tmp_path: Path):
    path = tmp_path / "old.csv"
    path.write_text("setting,workload,concurrency,per_request_tok_s,aggregate_tok_s,accept_length\n"
                    "steps1,synthetic,4,10.5,40,2.5\nsteps2,synthetic,4,12,48,\n")
    df = load_external(path, label="older run", known_settings={"steps1", "steps2"})
    assert set(df["source"]) == {"older run"}
    assert df["concurrency"].tolist() == [4, 4]
    assert df["accept_length"].iloc[0] == 2.5 and df["accept_length"].isna().iloc[1]
    assert load_external(ARTICLE)["source"].unique().tolist() == ["article"]
