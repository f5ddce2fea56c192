"""The integration tier names real files, and marks their tests: a renamed file must not drop out of it silently."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import INTEGRATION, TESTS


def test_every_integration_file_exists():
    assert sorted(name for name in INTEGRATION if not (TESTS / name).is_file()) == []


def test_the_marker_selects_the_integration_files():
    """`-m "not integration"` (make test-fast) collects no test of an integration file."""
    def collected(expr: str) -> set[str]:
        proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", expr,
                               str(TESTS / "workflow" / "test_config_errors.py"), str(TESTS / "test_io.py")],
                              capture_output=True, text=True, cwd=TESTS.parent, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return {line.split("::")[0].removeprefix("tests/") for line in proc.stdout.splitlines() if "::" in line}

    assert collected("not integration") == {"test_io.py"}
