"""What a reader needs to reproduce the study: config, package versions, hardware, model build info, git commit,
and where the time went (each phase's wall time from Snakemake's `benchmark:` files).

    python -m workflow_scripts.analysis.metadata --config-json JSON [--build-info models/target/build_info.json] \
        [--phases-dir results/S/benchmarks --cohorts ID ...] --out-json results/S/metadata/study.json --out-html results/S/metadata/study.html
"""

from __future__ import annotations

import argparse
import html
import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import pandas as pd

from workflow_scripts.analysis.output import TABLE_CSS
from workflow_scripts.io import atomic_write_text
from workflow_scripts.redaction import redact_config

CODE_ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str]) -> str | None:
    """Output of a local command, or None when it is missing or fails (the report says 'not available')."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True)
    except (subprocess.SubprocessError, OSError):
        return None
    return done.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def hardware() -> dict[str, Any]:
    gpus = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "cores_available_to_process": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _mem_total_gib(),
        "gpus": gpus.splitlines() if gpus else [],
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }


def packages() -> dict[str, str]:
    """Every installed distribution with its version."""
    found = {dist.metadata["Name"]: dist.version for dist in importlib_metadata.distributions()
             if dist.metadata["Name"]}
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def git_state(repo: Path) -> dict[str, Any]:
    commit = _run(["git", "-C", str(repo), "rev-parse", "HEAD"])
    status = _run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"])
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


# a job's phase, by the prefix of its benchmark file (rules/*.smk `benchmark:`)
PHASES = {"build_models": "model build", "moe_tune_shard": "MoE tuning", "benchmark": "measuring",
          "analysis": "analysis"}
COHORT_FILE = "benchmark_"  # rules/benchmark.smk: benchmarks/benchmark_{cohort}.tsv


def phase_times(folder: Path | None, cohorts: set[str] | None = None) -> dict[str, float]:
    """Wall seconds per phase of the last run of each job (a job rerun replaces its file); absent phases left out.

    A cohort's id changes with what shapes its cells, so the folder keeps the files of cohorts an earlier config
    measured; with `cohorts` (the study's current ones), only theirs count as measuring."""
    out: dict[str, float] = {}
    for path in sorted(folder.glob("*.tsv")) if folder and folder.is_dir() else []:
        if cohorts is not None and path.stem.startswith(COHORT_FILE) and path.stem[len(COHORT_FILE):] not in cohorts:
            continue
        phase = next((name for prefix, name in PHASES.items() if path.stem.startswith(prefix)), None)
        seconds = pd.read_csv(path, sep="\t")["s"]
        if phase is not None and len(seconds):
            out[phase] = round(out.get(phase, 0.0) + float(seconds.iloc[-1]), 1)
    return out


def collect(config: dict[str, Any], build_info: Path | None, repo: Path, phases: Path | None = None,
            cohorts: set[str] | None = None) -> dict[str, Any]:
    """Everything the metadata page shows; `server.env` values are redacted (they may be tokens), keys kept."""
    info = None
    if build_info is not None and build_info.exists():
        info = json.loads(build_info.read_text(encoding="utf-8"))
    return {"git": git_state(repo), "hardware": hardware(), "config": redact_config(config),
            "model_build_info": info, "phase_seconds": phase_times(phases, cohorts), "packages": packages()}


def _section(title: str, value: Any) -> str:
    if isinstance(value, dict) and value and all(not isinstance(v, (dict, list)) for v in value.values()):
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th>"
                       f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>" for k, v in value.items())
        return f"<h3>{title}</h3><table>{rows}</table>"
    text = "not available" if value is None else json.dumps(value, indent=2, default=str)
    return f"<h3>{title}</h3><pre>{html.escape(text)}</pre>"


def to_html(meta: dict[str, Any]) -> str:
    hw = {k: (", ".join(v) or "none") if isinstance(v, list) else v for k, v in meta["hardware"].items()}
    body = "".join([
        "<h2>Study metadata</h2>",
        _section("Git", meta["git"]), _section("Hardware", hw),
        _section("Wall time per phase, seconds (Snakemake benchmark files)", meta["phase_seconds"] or None),
        _section("Model build info (models/target/build_info.json)", meta["model_build_info"]),
        _section("Config (validated, defaults filled)", meta["config"]),
        _section("Packages", meta["packages"]),
    ])
    return f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Study metadata</title>{TABLE_CSS}</head>" \
           f"<body>{body}</body></html>"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-json", required=True, help="the full study config as JSON")
    parser.add_argument("--build-info", type=Path, help="model build_info.json (skipped when absent)")
    parser.add_argument("--repo", type=Path, default=CODE_ROOT,
                        help="git checkout whose commit is recorded (default: the one holding this code)")
    parser.add_argument("--phases-dir", type=Path, help="Snakemake benchmark files of the study's jobs")
    parser.add_argument("--cohorts", nargs="*", help="the study's current cohort ids: only their measuring counts")
    parser.add_argument("--out-json", type=Path, required=True)
    parser.add_argument("--out-html", type=Path, required=True)
    args = parser.parse_args(argv)
    meta = collect(json.loads(args.config_json), args.build_info, args.repo, args.phases_dir,
                   None if args.cohorts is None else set(args.cohorts))
    atomic_write_text(args.out_json, json.dumps(meta, indent=2, default=str) + "\n")
    atomic_write_text(args.out_html, to_html(meta))
    print(f"metadata: git {meta['git']['commit']}, {meta['hardware']['cpu_model']}, "
          f"{len(meta['hardware']['gpus'])} GPU(s), {len(meta['packages'])} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
