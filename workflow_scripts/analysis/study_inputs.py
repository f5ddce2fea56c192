"""A finished study's inputs to the analysis, loaded one way for every reader (the tables, the cost model's
command line and the benchmarks that read a study): per-request records with their metrics, per-round cells, the
cohorts' meta files, the external tables the config names, and the engine's forward profile.

Files (DESIGN.md): results/{study}/requests/{setting}.parquet, benchmark/{cohort}.json and
profile/forward_profile.csv.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workflow_scripts.analysis.external import load_externals
from workflow_scripts.analysis.metrics import add_request_metrics, cell_table, load_requests
from workflow_scripts.analysis.noise import read_cohort_meta
from workflow_scripts.analysis.study_config import StudyConfig
from workflow_scripts.profiling import FORWARD_PROFILE_COLUMNS

PROFILE_FILE = "profile/forward_profile.csv"  # in the study's results dir (rules/profile.smk)


@dataclass(frozen=True)
class StudyFiles:
    """Where a study's inputs lie: its results folder's request records, cohort meta files and forward profile."""

    requests: list[Path]
    metas: list[Path]
    profile: Path


def study_files(study: Path) -> StudyFiles:
    """The input files of the study whose results folder is `study`; no request records is an error naming it."""
    requests = sorted((study / "requests").glob("*.parquet"))
    if not requests:
        raise ValueError(f"{study / 'requests'}: no per-request records (*.parquet); run the study first")
    return StudyFiles(requests, sorted((study / "benchmark").glob("*.json")), study / PROFILE_FILE)


def read_study_config(study: Path, config_json: str | None = None) -> StudyConfig:
    """The study config given as JSON, else the one the study recorded in metadata/study.json."""
    if config_json:
        return StudyConfig.from_json(config_json)
    meta = study / "metadata" / "study.json"
    if not meta.is_file():
        raise ValueError(f"{meta}: not found; pass --config-json with the study config (settings, workloads, analysis)")
    data = json.loads(meta.read_text())
    return StudyConfig.from_dict(data.get("config", data))


@dataclass(frozen=True)
class StudyInputs:
    """Everything the analysis reads. `requests` and `cells` hold every measured member, the A/A twin included."""

    requests: pd.DataFrame  # metrics.add_request_metrics of every record
    cells: pd.DataFrame  # metrics.cell_table: one row per setting × workload × concurrency × cohort × round
    metas: list[dict]  # the cohorts' benchmark/{cohort}.json
    external: pd.DataFrame  # external.load_externals
    profile: pd.DataFrame | None  # the engine's forward profile, where one was made

    def without(self, settings: Collection[str]) -> StudyInputs:
        """The same inputs with `settings`' requests and cells dropped (the twin, or settings left out of a fit)."""
        drop = set(settings)
        return StudyInputs(self.requests[~self.requests["setting"].isin(drop)],
                           self.cells[~self.cells["setting"].isin(drop)], self.metas, self.external, self.profile)


def read_profile(path: Path | None, required: bool = True) -> pd.DataFrame | None:
    """A forward profile (profiling/forward_profile.py's CSV); None where there is none and none was required."""
    if path is None or (not required and not path.is_file()):
        return None
    try:
        profile = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise ValueError(f"{path}: not a forward profile ({err})") from err
    if missing := [c for c in FORWARD_PROFILE_COLUMNS if c not in profile.columns]:
        raise ValueError(f"{path}: column(s) {', '.join(missing)} missing (a forward profile has "
                         f"{', '.join(FORWARD_PROFILE_COLUMNS)})")
    return profile


def load_study(cfg: StudyConfig, request_paths: Sequence[Path], meta_paths: Sequence[Path] = (),
               profile_path: Path | None = None, *, profile_required: bool = True) -> StudyInputs:
    """Read the records (checked: metrics.load_requests), their cells, the meta files, the config's external
    tables and the forward profile (absent and not required: None). Bad input raises ValueError naming the file."""
    requests = add_request_metrics(load_requests(list(request_paths)))
    return StudyInputs(requests, cell_table(requests), read_cohort_meta(list(meta_paths)), load_externals(cfg),
                       read_profile(profile_path, profile_required))
