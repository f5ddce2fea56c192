"""Shared fixtures: the smoke model pair, built once per test session.

Set SPECSTUDY_SMOKE_PAIR_CACHE=DIR to keep the pair between sessions: DIR/target and DIR/draft are
reused when both hold a build_info.json, and built there otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SMOKE_SEED = 0


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
