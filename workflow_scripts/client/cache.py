"""The cohort's cache of measured cells: `cells/{cohort}/{runtime key}/{cell}-r{round}-{member}.parquet`.

The runtime key holds what the config cannot know (the built weights, the tuned MoE file, the design that ran), so
a change to any of them measures the cohort again rather than pairing cells of two setups. A cell is written once
its server proved alive after it; a truncated or foreign file is measured again, never read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
from safetensors import safe_open

from workflow_scripts.analysis.metrics import add_request_metrics, cell_table
from workflow_scripts.client.records import read_records, write_parquet_atomic
from workflow_scripts.client.rounds import Ledger
from workflow_scripts.client.servers import Models

log = logging.getLogger("benchmark")

CELL_FILE = re.compile(r"^(?P<cell>[0-9a-f]+)-r(?P<round>\d+)-(?P<member>[A-Za-z0-9_-]+)\.parquet$")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_weights(path: Path) -> None:
    """A damaged weights file fails the job in one line naming it, before any server starts (not as a server's
    start-up traceback): safetensors' header must describe exactly the bytes that are there."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():
                fh.get_slice(name)
        with open(path, "rb") as fh:  # the header only: the weights were just read through safe_open
            header = int.from_bytes(fh.read(8), "little")
            data = json.loads(fh.read(header))
        end = max(t["data_offsets"][1] for k, t in data.items() if k != "__metadata__")
        if path.stat().st_size != 8 + header + end:
            raise ValueError(f"{path.stat().st_size} bytes on disk, the header describes {8 + header + end}")
    except Exception as err:  # safetensors raises its own error types for a bad header
        raise SystemExit(f"{path}: damaged model weights ({err}); rebuild the pair (delete its folder and rerun)")


def runtime_key(plan: dict, models: Models, schedule: str) -> str:
    """What the config cannot know: the built weights, the tuned MoE file and the design `auto` resolved to (and a
    sliced design's turn length). A change re-measures the cohort: cells of two designs are never paired."""
    if plan["engine"] == "embedded":
        files = {role: d / "model.safetensors" for role, d in (("target", models.target), ("draft", models.draft)) if d}
        for path in files.values():
            check_weights(path)
        weights = {role: sha256_file(path) for role, path in files.items()}
    else:
        weights = {"target": str(models.target), "draft": str(models.draft)}
    moe = sha256_file(Path(models.moe_installed["file"])) if models.moe_installed else None
    design = [schedule, plan["slice_ms"]] if schedule == "sliced" else [schedule]
    return hashlib.sha256(json.dumps([weights, moe, design], sort_keys=True).encode()).hexdigest()[:12]


def cell_metrics(frame: pd.DataFrame) -> dict[str, float]:
    """The cell's aggregate and median per-request tok/s, as the analysis defines them (analysis/metrics.py)."""
    row = cell_table(add_request_metrics(frame)).iloc[0]
    return {"aggregate_tok_s": float(row["aggregate_tok_s"]), "per_request_tok_s": float(row["per_request_tok_s_median"])}


class CellCache:
    """One runtime key's folder of measured cells, one parquet file per cell, member and round."""

    def __init__(self, folder: Path) -> None:
        self.dir = folder

    def path(self, cell: str, member: str, round_: int) -> Path:
        return self.dir / f"{cell}-r{round_}-{member}.parquet"

    def load(self, ledger: Ledger, cells: Iterable[str], members: Iterable[str]) -> int:
        """Enter the finished cells of earlier runs in the ledger; a truncated or foreign file is measured again,
        never read. Returns how many were read."""
        cells, members = set(cells), set(members)
        n = 0
        for path in sorted(self.dir.glob("*.parquet")) if self.dir.is_dir() else []:
            match = CELL_FILE.match(path.name)
            if not match or match["cell"] not in cells or match["member"] not in members:
                continue
            try:
                frame = read_records(path)
            except Exception as err:  # pyarrow raises several types for a damaged file
                log.warning("cached cell %s is unreadable (%s): measuring it again", path, err)
                path.unlink()
                continue
            ledger.add(match["cell"], match["member"], int(match["round"]), cell_metrics(frame))
            n += 1
        return n

    def write(self, frame: pd.DataFrame, cell: str, member: str, round_: int) -> None:
        write_parquet_atomic(frame, self.path(cell, member, round_))

    def records(self, keys: Iterable[tuple[str, str, int]]) -> pd.DataFrame:
        """The cached cells `keys` ((cell, member, round)), in their order, as one frame."""
        return pd.concat([read_records(self.path(cell, member, r)) for cell, member, r in keys], ignore_index=True)
