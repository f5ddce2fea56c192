"""profiles/slurm with the site values a user fills in, set for the one-node test cluster."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.workflow.snakemake_run import REPO


def write_site_profile(dest: Path, partition: str = "debug", node_cores: int = 2, benchmark_mem_mb: int = 2000) -> Path:
    """A copy of profiles/slurm/config.yaml in dest/ with the SITE values set (and no accounting to guess from),
    and quick status checks so that a toy run is not dominated by the 40 s and 10 s defaults."""
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    profile["default-resources"]["slurm_partition"] = partition
    profile["max-threads"] = node_cores
    profile["set-resources"]["benchmark"]["mem_mb"] = benchmark_mem_mb
    profile["slurm-init-seconds-before-status-checks"] = 5
    # Snakemake's own 10 s between rounds of status checks: the smoke study's ~20 jobs, mostly one after another,
    # spent most of the fixture's time waiting on them
    profile["seconds-between-status-checks"] = 2
    profile["slurm-no-account"] = True
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return dest
