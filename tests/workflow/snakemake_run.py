"""Run the real Snakemake on the repository's Snakefile in a scratch working directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def snakemake_env() -> dict[str, str]:
    """The repo importable and this venv's Python first on PATH (the rules run `python -m ...`)."""
    return dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")


def snakemake_argv(workdir: Path, configfile: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--configfile", str(configfile), *args]


def snakemake(workdir: Path, config: dict, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    """`snakemake --configfile <workdir>/study.yaml -d <workdir> ...` with the repo importable."""
    cfg = workdir / "study.yaml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = subprocess.run(snakemake_argv(workdir, cfg, *args), capture_output=True, text=True, timeout=timeout, env=snakemake_env())
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def planned_jobs(workdir: Path, config: dict) -> dict[str, int]:
    """Job counts per rule from a dry run (`snakemake -n`)."""
    proc = snakemake(workdir, config, "-n", "--cores", "2")
    out = proc.stdout + proc.stderr
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1]
    jobs = dict((m.group(1), int(m.group(2))) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M))
    jobs.pop("total", None)
    return jobs


def planned_jobs_fields(workdir: Path, config: dict, field: str) -> list[tuple[str, str]]:
    """(rule, the job's `field:` line or "") for every planned job, from a dry run."""
    proc = snakemake(workdir, config, "-n", "--cores", "2")
    found = []
    for block in re.split(r"\n(?=\[.*\]\nrule |rule )", proc.stdout):
        rule = re.search(r"^rule (\w+):", block, re.M)
        if rule:
            m = re.search(rf"{field}: (.*)", block)
            found.append((rule.group(1), m.group(1) if m else ""))
    return found


def planned_wildcards(workdir: Path, config: dict, rule: str) -> list[str]:
    """The `wildcards:` lines of the planned jobs of one rule, from a dry run."""
    return sorted(value for name, value in planned_jobs_fields(workdir, config, "wildcards") if name == rule)


def planned_cohorts(workdir: Path, config: dict) -> list[str]:
    """The ids of the cohorts a dry run would measure (each names its settings: steps3-vs-baseline-1a2b3c4d)."""
    return [wc.split("=", 1)[1] for wc in planned_wildcards(workdir, config, "benchmark")]
