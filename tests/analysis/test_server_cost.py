"""The summary's server-cost line: a warning below the threshold, nothing without the file, the path on bad input."""

import json
from pathlib import Path

import pytest

from workflow_scripts.analysis.server_cost import server_cost_lines


def _check(tmp_path: Path, ratio: float) -> Path:
    path = tmp_path / "served_overhead.json"
    path.write_text(json.dumps({"ratio": ratio, "warn_below": 0.8, "served_tok_s": 300 * ratio,
                                "in_process_tok_s": 300.0, "rounds": 5, "engine_torch": {"num_threads": 1}}))
    return path


def test_ratio_above_the_threshold_is_stated_without_a_warning(tmp_path):
    (line, _) = server_cost_lines(_check(tmp_path, 0.93))
    assert "at 0.93 of the same engine in-process" in line and "1 torch thread" in line and "⚠" not in line


def test_ratio_below_the_threshold_warns(tmp_path):
    (line, _) = server_cost_lines(_check(tmp_path, 0.28))
    assert "⚠ below 0.80" in line and "more about the server than about speculation" in line


def test_absent_file_gives_no_line(tmp_path):
    assert server_cost_lines(tmp_path / "served_overhead.json") == []


def test_malformed_file_names_the_path(tmp_path):
    path = tmp_path / "served_overhead.json"
    path.write_text(json.dumps({"served_tok_s": 1.0}))
    with pytest.raises(ValueError, match="served_overhead.json: not a served-overhead result"):
        server_cost_lines(path)
