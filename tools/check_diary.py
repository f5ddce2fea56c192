"""Fail on diary text in the code: run numbers, issue numbers, ordinal sessions and dates.

Docstrings and comments state rules and reasons; the evidence (which run measured what, and when) lives in
docs/ with its command, and git history keeps the rest. A line that must hold such text as data (a log line a
test parses, say) ends with the marker `diary: ok`. A variable named `session` (an aiohttp session) is fine:
only an ordinal before the word counts.

    python -m tools.check_diary [PATH ...]    # default: workflow_scripts benchmarks tests
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOTS = ("workflow_scripts", "benchmarks", "tests")
ORDINALS = r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|[a-z]+teenth|twentieth"
DIARY = re.compile(
    r"\brun S?[0-9]+\b"  # a run of a study: "run 11", "run S5"
    r"|\bissue [0-9]+\b"  # an issue number
    rf"|\b({ORDINALS}) session\b"  # "the sixteenth session"
    r"|\b20[0-9]{2}-[0-9]{2}-[0-9]{2}\b",  # a date
    re.IGNORECASE,
)
ALLOW = "diary: ok"


def diary_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line of `text` holding diary text and not marked `diary: ok`."""
    for number, line in enumerate(text.splitlines(), start=1):
        if DIARY.search(line) and ALLOW not in line:
            yield number, line


def python_files(paths: Iterable[Path]) -> Iterator[Path]:
    """The .py files under `paths` (a file is taken as is), in sorted order."""
    for path in paths:
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
        else:
            raise FileNotFoundError(f"check_diary: no such file or directory: {path}")


def findings(paths: Iterable[Path]) -> list[str]:
    """`file:line: text` for every diary line in the .py files under `paths`."""
    return [f"{path}:{number}: {line.strip()}"
            for path in python_files(paths) for number, line in diary_lines(path.read_text(encoding="utf-8"))]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    found = findings(Path(arg) for arg in (args or ROOTS))
    for finding in found:
        print(finding)
    if found:
        print(f"check_diary: {len(found)} line(s) of diary text (run/issue numbers, ordinal sessions, dates); "
              f"state the rule and its reason, and put the evidence in docs/", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
