"""Shared fixtures (the smoke model pair, built once per test session) and the two test tiers.

Set SPECSTUDY_SMOKE_PAIR_CACHE=DIR to keep the pair between sessions: DIR/target and DIR/draft are
reused when both hold a build_info.json, and built there otherwise.

The files in INTEGRATION drive whole external systems (real Snakemake, a one-node Slurm, headless Chromium,
schemathesis, a whole cohort of servers) and take most of the suite's time; their tests are marked
`integration`. `make test-fast` runs the rest (`-m "not integration"`). The study on a one-node Slurm (CLUSTER), a
quarter of the suite's time and mostly waiting on the Slurm plugin's status checks, is also marked `cluster`:
`make test` runs everything else (`-m "not cluster"`), `make test-cluster` that study; CI runs both.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SMOKE_SEED = 0
TESTS = Path(__file__).resolve().parent

# paths relative to tests/
INTEGRATION = frozenset({
    "workflow/test_smoke_study.py",  # the whole smoke study under Snakemake, then partial reruns
    "workflow/test_config_errors.py",  # Snakemake started on bad configs
    "workflow/test_timing_jobs.py",  # Snakemake's scheduling of the timing jobs
    "moe/test_rules.py",  # the MoE rules under Snakemake
    "slurm/test_profile_checks.py",  # Snakemake dry runs of the Slurm profile's checks
    "slurm/test_slurm_study.py",  # a study on a real one-node Slurm
    "analysis/test_report.py",  # the Snakemake report rendered in headless Chromium
    "server/test_openapi.py",  # schemathesis against a live server
    "client/test_run_cohort.py",  # whole cohort jobs: servers, rounds, the cache, signals
})
CLUSTER = frozenset({"slurm/test_slurm_study.py"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of an INTEGRATION file `integration`, and of a CLUSTER file `cluster` too."""
    for item in items:
        path = Path(str(item.fspath)).resolve()
        name = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
        if name in INTEGRATION:
            item.add_marker(pytest.mark.integration)
        if name in CLUSTER:
            item.add_marker(pytest.mark.cluster)


def is_built_pair(root: Path) -> bool:
    """True when `root` holds a complete pair (build_info.json is written last, then the dir renamed in)."""
    return all((root / role / "build_info.json").is_file() for role in ("target", "draft"))


def build_smoke_pair(root: Path, seed: int = SMOKE_SEED) -> tuple[Path, Path]:
    """Build the smoke pair into root/target and root/draft (in-process: ~10-20 s on 2 cores)."""
    from workflow_scripts.models.build import build_pair

    build_pair("smoke", seed, root / "target", root / "draft")
    return root / "target", root / "draft"


@pytest.fixture(scope="session")
def smoke_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target_dir, draft_dir) of the smoke pair, built with seed SMOKE_SEED."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cache = os.environ.get("SPECSTUDY_SMOKE_PAIR_CACHE")
    root = Path(cache) if cache else tmp_path_factory.mktemp("smoke_pair")
    if is_built_pair(root):
        return root / "target", root / "draft"
    return build_smoke_pair(root)
