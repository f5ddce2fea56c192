"""One setting's requests file from the cohorts that measured it: `requests/{setting}.parquet` (docs/DESIGN.md).

    python -m workflow_scripts.client.gather --setting S --cells '[[cohort, workload, concurrency], ...]' \
        --out results/X/requests/S.parquet results/X/benchmark/COHORT.parquet ...

Only the listed cells are kept: a cohort may also hold the setting's rows of a cell the config no longer asks for.
The control's file holds its rows of every cohort, each cohort with its own rounds (`cohort`, `repeat`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from workflow_scripts.client.records import read_records, write_parquet_atomic


def gather(setting: str, cells: list[list], paths: list[Path]) -> pd.DataFrame:
    wanted = {(str(cohort), str(workload), int(c)) for cohort, workload, c in cells}
    frames = []
    for path in paths:
        frame = read_records(path)
        frame = frame[frame["setting"] == setting]
        keys = zip(frame["cohort"], frame["workload"], frame["concurrency"].astype(int))
        frames.append(frame[[key in wanted for key in keys]])
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    found = set(zip(out["cohort"], out["workload"], out["concurrency"].astype(int))) if len(out) else set()
    missing = sorted(wanted - found)
    if missing:
        raise ValueError(f"setting {setting}: no records for cell(s) {missing} in {', '.join(map(str, paths))}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", required=True)
    parser.add_argument("--cells", required=True, help="JSON list of [cohort, workload, concurrency]")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("cohorts", nargs="+", type=Path, help="benchmark/{cohort}.parquet files")
    args = parser.parse_args(argv)
    try:
        frame = gather(args.setting, json.loads(args.cells), args.cohorts)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_parquet_atomic(frame, args.out)
    print(f"{args.setting}: {len(frame)} requests from {frame['cohort'].nunique()} cohort(s) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
