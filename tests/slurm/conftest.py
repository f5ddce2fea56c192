"""A real one-node Slurm cluster for the session: started here, stopped at the end, nothing mocked."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from workflow_scripts.scaleout.local_slurm import LocalSlurm, missing_binaries


@pytest.fixture(scope="session")
def slurm_cluster() -> LocalSlurm:
    """munged + slurmctld + slurmd on 127.0.0.1 with a private config; skipped only where Slurm is not installed."""
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed (missing {', '.join(missing)}); `make system-deps` installs it")
    # not under pytest's tmp dir: munged needs every directory above its socket to be searchable by the munge user
    root = Path(tempfile.mkdtemp(prefix="specstudy-slurm-", dir="/tmp"))
    cluster = LocalSlurm(root)
    try:
        with cluster:
            yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)
