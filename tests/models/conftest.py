"""Fixtures of the model-build tests (the smoke pair itself comes from tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SMOKE_SEED, build_smoke_pair


@pytest.fixture(scope="session")
def second_smoke_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A second, independent build with the same seed: the determinism check compares it byte for byte."""
    return build_smoke_pair(tmp_path_factory.mktemp("smoke_pair_again"), SMOKE_SEED)
