"""The integration and cluster tiers name real files, and mark their tests: a renamed file must not drop out of a tier
silently."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import CLUSTER, INTEGRATION, TESTS


def test_every_integration_file_exists():
    assert sorted(name for name in INTEGRATION | CLUSTER if not (TESTS / name).is_file()) == []
    assert CLUSTER <= INTEGRATION  # make test-fast skips the cluster tier too


def test_the_markers_select_the_tiers():
    """`-m "not integration"` (make test-fast) collects no test of an integration file, `-m "not cluster"` (make
    test) none of the Slurm study's, and `-m cluster` (make test-cluster) only those."""
    files = [TESTS / "workflow" / "test_config_errors.py", TESTS / "slurm" / "test_slurm_study.py",
             TESTS / "test_io.py"]

    def collected(expr: str) -> set[str]:
        proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", expr, *map(str, files)],
                              capture_output=True, text=True, cwd=TESTS.parent, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return {line.split("::")[0].removeprefix("tests/") for line in proc.stdout.splitlines() if "::" in line}

    assert collected("not integration") == {"test_io.py"}
    assert collected("not cluster") == {"test_io.py", "workflow/test_config_errors.py"}
    assert collected("cluster") == {"slurm/test_slurm_study.py"}
