"""The analysis rules' file lists and report() flags, kept out of rules/analysis.smk so that it holds only rules.

Captions are paths relative to rules/ (Snakemake resolves them against the .smk file that holds the rule).
"""

from __future__ import annotations

import json
from typing import Any

from snakemake.io import report

PLOT_NAMES = ["throughput", "speedup", "acceptance", "latency", "pareto", "acceptance_position", "cost_model",
              "survival"]
PLOT_TITLES = {
    "throughput": "Throughput vs concurrency",
    "speedup": "Speedup with CI",
    "acceptance": "Acceptance length",
    "latency": "Latency distributions",
    "pareto": "Per-request vs aggregate (Pareto)",
    "acceptance_position": "Acceptance by draft position",
    "cost_model": "Cost model: predicted vs measured",
    "survival": "Survival of settings over rounds",
}
PLOT_CATEGORY = {
    "throughput": "2 Throughput and speedup",
    "speedup": "2 Throughput and speedup",
    "pareto": "2 Throughput and speedup",
    "acceptance": "3 Acceptance and lossless",
    "latency": "4 Latency",
    "acceptance_position": "3 Acceptance and lossless",
    "cost_model": "2 Throughput and speedup",
    "survival": "2 Throughput and speedup",
}
# tables with an HTML view in the report: name -> (category, caption file stem)
TABLE_VIEWS = {
    "article_tables": ("1 Summary", "article_tables"),
    "recommendation": ("1 Summary", "recommendation"),
    "summary": ("2 Throughput and speedup", "summary_table"),
    "improvement": ("2 Throughput and speedup", "improvement"),
    "gap": ("2 Throughput and speedup", "gap"),
    "lossless": ("3 Acceptance and lossless", "lossless"),
    "aa": ("2 Throughput and speedup", "aa"),
    "decisions": ("1 Summary", "decisions"),
    "adaptive": ("1 Summary", "adaptive"),
    "thresholds": ("1 Summary", "thresholds"),
    "acceptance_by_position": ("3 Acceptance and lossless", "acceptance_by_position"),
    "cost_model": ("2 Throughput and speedup", "cost_model"),
}
CSV_TABLES = ["summary", "cells", "improvement", "article_tables", "gap", "recommendation",
              "recommendation_scores", "lossless", "latency_quantiles", "aa", "precision", "decisions", "adaptive",
              "thresholds", "acceptance_by_position",
              "cost_model_params", "cost_model_predictions", "cost_model_validation"]
CSV_CATEGORY = "6 Data (CSV)"


def analysis_config_json(config: dict[str, Any]) -> str:
    """The part of the config the analysis reads; a change to it re-runs the analysis (params are tracked)."""
    cfg = {key: config[key] for key in ("settings", "workloads", "analysis")}
    cfg["benchmark"] = {key: config["benchmark"][key]
                        for key in ("aa_control", "precision_pct", "equivalence_pct", "repeats")}
    return json.dumps(cfg, sort_keys=True, default=str)


def tables_dir(results: str) -> str:
    return f"{results}/tables"


def plots_dir(results: str) -> str:
    return f"{results}/plots"


def table_outputs(results: str) -> dict[str, Any]:
    """Named outputs of analysis_tables: every CSV, every HTML view (report-flagged) and the markdown tables."""
    out: dict[str, Any] = {}
    for name in CSV_TABLES:
        out[f"{name}_csv"] = report(f"{tables_dir(results)}/{name}.csv", caption="../report/csv.rst",
                                    category=CSV_CATEGORY, labels={"item": f"{name}.csv", "format": "CSV"})
    for name, (category, caption) in TABLE_VIEWS.items():
        out[f"{name}_html"] = report(f"{tables_dir(results)}/{name}.html", caption=f"../report/{caption}.rst",
                                     category=category, labels={"item": name.replace("_", " "), "format": "table"})
    out["article_md"] = f"{tables_dir(results)}/article_tables.md"
    out["noise_floor_json"] = f"{tables_dir(results)}/noise_floor.json"
    out["cost_model_md"] = f"{tables_dir(results)}/cost_model.md"
    return out


def plot_outputs(results: str) -> dict[str, Any]:
    """Named outputs of analysis_plots: each chart as static SVG and interactive HTML, both report-flagged."""
    out: dict[str, Any] = {}
    for name in PLOT_NAMES:
        for ext, fmt in (("svg", "static SVG"), ("html", "interactive HTML")):
            out[f"{name}_{ext}"] = report(f"{plots_dir(results)}/{name}.{ext}",
                                          caption=f"../report/plot_{name}.rst", category=PLOT_CATEGORY[name],
                                          labels={"item": PLOT_TITLES[name], "format": fmt})
    return out


def summary_outputs(results: str) -> dict[str, Any]:
    return {
        "md": report(f"{results}/summary.md", caption="../report/csv.rst", category=CSV_CATEGORY,
                     labels={"item": "summary.md", "format": "markdown"}),
        "html": report(f"{results}/summary.html", caption="../report/summary.rst", category="1 Summary",
                       labels={"item": "study summary", "format": "text"}),
    }


def metadata_outputs(results: str) -> dict[str, Any]:
    return {
        "json": f"{results}/metadata/study.json",
        "html": report(f"{results}/metadata/study.html", caption="../report/metadata.rst",
                       category="7 Study metadata",
                       labels={"item": "config, packages, hardware, model, git", "format": "text"}),
    }


def all_outputs(results: str) -> list[str]:
    """Every file the analysis produces (plain paths, for `rule all`)."""
    groups = [table_outputs(results), plot_outputs(results), summary_outputs(results), metadata_outputs(results)]
    return [str(path) for group in groups for path in group.values()]
