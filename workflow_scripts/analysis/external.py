"""External result tables (published numbers, older runs) as a tidy CSV.

Format (DESIGN.md "External results CSV"): one row per cell, no repeats needed.
Required columns: ``setting, workload, concurrency, per_request_tok_s, aggregate_tok_s``.
Optional: ``source`` (else the label given in the config), ``accept_length``, ``ttft_p50_ms``.
Errors name the file, the row (line number in the file, header = line 1) and the column.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import pandas as pd

from workflow_scripts.analysis.study_config import StudyConfig

REQUIRED = ["setting", "workload", "concurrency", "per_request_tok_s", "aggregate_tok_s"]
OPTIONAL_NUMERIC = ["accept_length", "ttft_p50_ms"]


class ExternalCSVError(ValueError):
    """A bad external CSV; the message names file, row and column."""


def load_external(path: Path | str, label: str | None = None,
                  known_settings: Collection[str] | None = None) -> pd.DataFrame:
    """Read and validate one external CSV; returns rows with a ``source`` column."""
    path = Path(path)
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ExternalCSVError(f"{path}: cannot read as CSV: {exc}") from exc
    raw.columns = [c.strip() for c in raw.columns]
    missing = [c for c in REQUIRED if c not in raw.columns]
    if missing:
        raise ExternalCSVError(f"{path}: row 1 (header): missing column(s) {', '.join(missing)}")
    if raw.empty:
        raise ExternalCSVError(f"{path}: no data rows")
    out = pd.DataFrame({
        "source": raw["source"].str.strip() if "source" in raw.columns else (label or path.stem),
        "setting": raw["setting"].str.strip(),
        "workload": raw["workload"].str.strip(),
    })
    for col in ("setting", "workload"):
        _check_nonempty(path, raw, out[col], col)
    if known_settings is not None:
        unknown = ~out["setting"].isin(set(known_settings))
        if unknown.any():
            row = int(unknown.to_numpy().argmax())
            raise ExternalCSVError(
                f"{path}: row {row + 2}, column setting: unknown setting {out['setting'].iloc[row]!r} "
                f"(known: {', '.join(sorted(known_settings))})")
    for col in ["per_request_tok_s", "aggregate_tok_s", *[c for c in OPTIONAL_NUMERIC if c in raw.columns]]:
        out[col] = _numeric(path, raw, col, allow_empty=col in OPTIONAL_NUMERIC)
    concurrency = _numeric(path, raw, "concurrency", allow_empty=False)
    bad = (concurrency < 1) | (concurrency != concurrency.round())
    if bad.any():
        row = int(bad.to_numpy().argmax())
        raise ExternalCSVError(f"{path}: row {row + 2}, column concurrency: "
                               f"{raw['concurrency'].iloc[row]!r} is not a positive integer")
    out.insert(3, "concurrency", concurrency.astype("int64"))
    dup = out.duplicated(["source", "setting", "workload", "concurrency"])
    if dup.any():
        row = int(dup.to_numpy().argmax())
        raise ExternalCSVError(f"{path}: row {row + 2}: duplicate cell (source, setting, workload, concurrency)")
    return out


def _check_nonempty(path: Path, raw: pd.DataFrame, values: pd.Series, col: str) -> None:
    empty = values == ""
    if empty.any():
        raise ExternalCSVError(f"{path}: row {int(empty.to_numpy().argmax()) + 2}, column {col}: empty value")


def _numeric(path: Path, raw: pd.DataFrame, col: str, allow_empty: bool) -> pd.Series:
    text = raw[col].str.strip()
    values = pd.to_numeric(text, errors="coerce")
    bad = values.isna() & ~(allow_empty & (text == ""))
    if bad.any():
        row = int(bad.to_numpy().argmax())
        raise ExternalCSVError(f"{path}: row {row + 2}, column {col}: {raw[col].iloc[row]!r} is not a number")
    if (values < 0).any():
        row = int((values < 0).to_numpy().argmax())
        raise ExternalCSVError(f"{path}: row {row + 2}, column {col}: negative value {raw[col].iloc[row]!r}")
    return values.astype("float64")


def load_externals(cfg: StudyConfig) -> pd.DataFrame:
    """Every external CSV the study config names (analysis.external), in one frame; empty with the columns the
    summary needs when there is none."""
    frames = [load_external(ext["path"], ext["label"], known_settings=cfg.settings) for ext in cfg.external]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["source", "setting", "workload", "concurrency", "per_request_tok_s", "aggregate_tok_s"])
