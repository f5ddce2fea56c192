"""The documentation stays navigable: every relative link in README.md, CHANGELOG.md and docs/ points to a file that
exists, the README stays short, and it speaks of the project alone.

Links to a URL or to an anchor in the same page are not checked: the first needs a network, the second a renderer.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", REPO / "CHANGELOG.md", *(REPO / "docs").rglob("*.md")])
# [text](target) and [text](target "title"); images too
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
README_MAX_LINES = 300
# words of a diary: run numbers, issue numbers, ordinal sessions, dates
DIARY = re.compile(r"\brun S?[0-9]+\b|\bissue [0-9]+\b|\bsessions?\b|\b20[0-9]{2}-[0-9]{2}-[0-9]{2}\b", re.I)


def relative_links(page: Path) -> list[str]:
    """The relative link targets of a markdown page, outside fenced code, without their #anchor."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    targets = (m.group(1) for m in LINK.finditer(text))
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I) and t.split("#", 1)[0]]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path):
    missing = [t for t in relative_links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(REPO)} links to files that do not exist: {missing}"


def test_the_link_check_sees_links():
    """A parser that found no link would pass every page: the README links to docs/method.md."""
    assert "docs/method.md" in relative_links(REPO / "README.md")


def test_readme_is_short():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; measured figures belong in docs/measurements/"


def test_readme_speaks_of_the_project_alone():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = [m.group(0) for m in DIARY.finditer(text)]
    assert not found, f"README.md keeps a diary ({found}); dated figures belong in docs/measurements/"


def test_the_readme_gpu_command_plans_its_dag(tmp_path: Path):
    """The README's SGLang command, as a dry run (no GPU here): the config validates and the DAG plans."""
    config = REPO / "config" / "sglang-qwen3.5-122b-rtxpro6000.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "-n",
         "--cores", "8", "--resources", "gpu=4", "--configfile", str(config)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "benchmark" in proc.stdout and "moe_tune_shard" in proc.stdout
