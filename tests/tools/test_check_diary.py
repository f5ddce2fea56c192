"""The diary check on fixture text: what it flags, what it lets through, and its exit status and listing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.check_diary import diary_lines, main

FLAGGED = [
    "# measured in run 11 of the default study",  # diary: ok
    '"""Run S5 put steps 3 first."""',  # diary: ok
    "    # see issue 5's misses",  # diary: ok
    "the sixteenth session found it",  # diary: ok
    "as the Third session measured",  # diary: ok
    "# timings of 2026-12-02",  # diary: ok
]
CLEAN = [
    "async with aiohttp.ClientSession() as session:",
    "session = requests.Session()",
    "def run(steps: int) -> None:",
    "for run in range(3):",
    "# a run of 5 rounds",
    "# a second pass over the session's records",
    "issue a request per slot",
    'log = "[2026-03-01 10:00:00 TP0] Using MoE kernel config"  # diary: ok',
]


@pytest.mark.parametrize("line", FLAGGED)
def test_flags_diary_text(line):
    assert [n for n, _ in diary_lines(line)] == [1]


@pytest.mark.parametrize("line", CLEAN)
def test_lets_rules_and_variables_through(line):
    assert list(diary_lines(line)) == []


def test_lists_file_and_line_and_fails(tmp_path: Path, capsys):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("\n".join(["x = 1", FLAGGED[0], CLEAN[0], FLAGGED[3]]) + "\n")
    (tmp_path / "pkg" / "notes.txt").write_text(FLAGGED[0])  # only Python files are checked
    assert main([str(tmp_path / "pkg")]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == [f"{tmp_path}/pkg/mod.py:2: {FLAGGED[0]}", f"{tmp_path}/pkg/mod.py:4: {FLAGGED[3]}"]
    assert "2 line(s)" in out.err


def test_passes_clean_tree(tmp_path: Path, capsys):
    (tmp_path / "mod.py").write_text("\n".join(CLEAN) + "\n")
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""


def test_missing_path_is_named(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        main([str(tmp_path / "nothing-here")])
