"""Atomic file writes: readers (and a rerun after a crash) see the old file or the new one, never half of one.

Every result file is written to a temp file in its own folder (so the rename stays on one file system), given
the mode a plain `open(path, "w")` would give it (mkstemp makes 0600, which would hide results from a shared
group), flushed to disk, and renamed over `path`. On any failure the temp file is removed, so nothing that looks
like a result is left behind. `durable=False` skips the fsyncs for files that are cheap to rebuild and written
often (the rename alone still protects readers from a killed process; the fsync also protects against a power
loss, which could otherwise leave the renamed file empty).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path | str, write: Callable[[Path], None], *, durable: bool = True) -> None:
    """Call `write(tmp)` on a temp path beside `path`, then move the finished file into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        if durable:
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(path.parent)


def atomic_write_text(path: Path | str, text: str, *, durable: bool = True) -> None:
    """`text` (UTF-8) written atomically to `path`."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), durable=durable)


def atomic_write_json(path: Path | str, data: Any, *, durable: bool = True) -> None:
    """JSON (indented, trailing newline) written atomically to `path`."""
    atomic_write_text(path, json.dumps(data, indent=2) + "\n", durable=durable)
