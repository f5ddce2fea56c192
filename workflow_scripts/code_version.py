"""Digests of this package's own source, so that editing the code that made an artifact remakes it.

Snakemake reruns a job when its rule's shell command or params change, not when a module that command
imports does: a faster engine would otherwise leave last week's measurements in place, looking current.
Rules pass `source_digest(...)` of the subpackages their job runs as a param (and benchmark cells key on it).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def source_digest(*subpackages: str, root: Path = PACKAGE) -> str:
    """SHA-256 (16 hex digits) over the paths and bytes of every .py file under the named subpackages of root."""
    digest = hashlib.sha256()
    for name in subpackages:
        folder = root / name
        if not folder.is_dir():
            raise ValueError(f"source_digest: {folder} is not a subpackage of {root}")
        for path in sorted(folder.rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
