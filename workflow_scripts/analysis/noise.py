"""The A/A control, the noise floor it gives, and the precision each cohort's cells reached.

The twin runs the control's setting as a second, independent server in the same rounds, so its difference from
the control is pure measurement noise: what the study would call an effect if nothing changed. Its 95th
percentile over cells is the noise floor every improvement must exceed to be called real.

Files (pinned; other tools read them): tables/aa.csv, tables/noise_floor.json, and tables/precision.csv.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from workflow_scripts.analysis.improvement import Priors, improvements
from workflow_scripts.analysis.paired import noise_floor_pct

AA_COLUMNS = ["workload", "concurrency", "metric", "diff_pct", "ci_low_pct", "ci_high_pct", "rounds"]
PRECISION_COLUMNS = ["cohort", "schedule", "workload", "concurrency", "rounds", "half_width_pct", "precision_pct",
                     "precision_met", "budget_hit"]


def aa_table(values: pd.DataFrame, control: str, twin: str | None, priors: Priors | None = None) -> pd.DataFrame:
    """The twin against the control per workload x concurrency x metric, paired by round, its CI pooled as every
    comparison's is (`priors`): whether it covers 0 checks the pooling too."""
    if twin is None:
        return pd.DataFrame(columns=AA_COLUMNS)
    imp = improvements(values[values["source"] == "measured"], [("aa", control, twin)], math.nan, priors=priors)
    return imp.rename(columns={"improvement_pct": "diff_pct"})[AA_COLUMNS]


def read_cohort_meta(paths: list[Path]) -> list[dict]:
    return [json.loads(Path(p).read_text()) for p in paths]


def precision_table(metas: list[dict]) -> pd.DataFrame:
    """Per cohort and cell: the rounds measured and the widest paired-CI half-width reached against the target."""
    rows = [{"cohort": m["cohort"], "schedule": m["schedule"], **{k: cell[k] for k in
             ("workload", "concurrency", "rounds", "half_width_pct")}, "precision_pct": m["precision_pct"],
             "precision_met": cell["precision_met"], "budget_hit": m["budget_hit"]}
            for m in metas for cell in m["cells"]]
    return pd.DataFrame(rows, columns=PRECISION_COLUMNS)


def noise_floor(aa: pd.DataFrame, metas: list[dict], twin: str | None) -> dict:
    """`{"noise_floor_pct", "schedule", "rounds"}`: the floor, the design that measured the twin, its fewest rounds."""
    schedules = sorted({m["schedule"] for m in metas if twin in m["members"]})
    finite = aa.dropna(subset=["diff_pct"])
    return {
        "noise_floor_pct": noise_floor_pct(finite["diff_pct"].to_numpy()) if len(finite) else None,
        "schedule": "+".join(schedules) if schedules else None,
        "rounds": int(finite["rounds"].min()) if len(finite) else 0,
    }


def floor_text(floor: dict) -> tuple[float | None, str]:
    """(noise floor in %, how it is known) from the contents of noise_floor.json (analysis/noise.py)."""
    if floor.get("noise_floor_pct") is None:
        return None, "unknown (no A/A twin measured)"
    pct = float(floor["noise_floor_pct"])
    return pct, f"{pct:.1f}% ({floor.get('schedule', '?')} schedule, {floor.get('rounds', '?')} rounds)"


def read_noise_floor(path: Path) -> tuple[float | None, str]:
    """floor_text of a study's noise_floor.json; None when absent or unreadable."""
    if not path.is_file():
        return None, f"unknown ({path.name} absent)"
    try:
        return floor_text(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as err:
        return None, f"unknown ({path}: {err})"
