"""Build every table of the study from the per-request records and the external CSVs.

    python -m workflow_scripts.analysis.tables --config-json '{"settings": ..., "workloads": ..., "analysis": ...}' \
        --requests results/S/requests/*.parquet --cohort-meta results/S/benchmark/*.json --out-dir results/S/tables

Writes (all atomically) into --out-dir: summary, cells, improvement, article_tables (.md too), gap,
recommendation, recommendation_scores, lossless, latency_quantiles, aa, precision, decisions, adaptive and
thresholds as CSV, noise_floor.json, the cost model's acceptance_by_position, cost_model_params,
cost_model_predictions, cost_model_validation (CSV) and cost_model.md, and HTML views for the report. The control's A/A twin appears only
in aa.csv, the noise floor and cells.csv.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from workflow_scripts.analysis import launch_position
from workflow_scripts.analysis.adaptive_check import adaptive_settings, adaptive_table
from workflow_scripts.analysis.cost_model.report import CostModelReport, add_predicted_best, analyse
from workflow_scripts.analysis.decisions import RaceRule, decision_table, round_seconds
from workflow_scripts.analysis.gap import gap_sentence, gap_table
from workflow_scripts.analysis.improvement import METRICS, article_table, improvements, to_markdown, variance_priors
from workflow_scripts.analysis.lossless import lossless_table
from workflow_scripts.analysis.noise import aa_table, floor_text, noise_floor, precision_table
from workflow_scripts.analysis.output import html_page, write_csv
from workflow_scripts.io import atomic_write_text
from workflow_scripts.analysis.recommend import recommend, score_table
from workflow_scripts.analysis.study_config import StudyConfig, is_calibration
from workflow_scripts.analysis.study_inputs import load_study
from workflow_scripts.analysis.thresholds import threshold_table
from workflow_scripts.analysis.summarize import (MEASURED, improvement_values, latency_quantiles,
                                                 summarize_external, summarize_measured)


def article_tables(summary: pd.DataFrame, improvement: pd.DataFrame, cfg: StudyConfig,
                   aa: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(heading, table) per source × workload × metric, in the article's layout."""
    out = []
    comparisons = [(b, c) for _, b, c in cfg.comparisons()]
    for (source, workload), cells in summary.groupby(["source", "workload"], sort=False):
        present = set(cells["setting"])
        settings = [s for s in cfg.settings if s in present] + sorted(present - set(cfg.settings))
        pairs = [(b, c) for b, c in comparisons if b in present and c in present]
        for metric, label in METRICS.items():
            table = article_table(summary, improvement, source, workload, metric, settings, pairs,
                                  aa if source == MEASURED else None)
            out.append((f"{workload}: {label} (source: {source})", table))
    return out


@dataclass
class StudyTables:
    """Every table of the study; ``articles`` holds (heading, table) in the article's layout."""

    summary: pd.DataFrame
    cells: pd.DataFrame
    improvement: pd.DataFrame
    articles: list[tuple[str, pd.DataFrame]]
    gap: pd.DataFrame
    gap_sentence: str
    recommendation: pd.DataFrame
    recommendation_scores: pd.DataFrame
    lossless: pd.DataFrame
    latency_quantiles: pd.DataFrame
    cost_model: CostModelReport
    aa: pd.DataFrame
    noise_floor: dict
    precision: pd.DataFrame
    decisions: pd.DataFrame
    adaptive: pd.DataFrame
    thresholds: pd.DataFrame

    @property
    def floor_sentence(self) -> str:
        floor = self.noise_floor["noise_floor_pct"]
        if floor is None:
            return "No A/A twin was measured: an improvement is real when its paired CI excludes 0."
        return (f"Noise floor (95th percentile of |A/A difference| over cells): ±{floor:.1f}%, design "
                f"{self.noise_floor['schedule']}, at least {self.noise_floor['rounds']} rounds per cell. An "
                "improvement is real only when its paired CI excludes 0 and it exceeds the floor.")

    @property
    def article_markdown(self) -> str:
        return "\n".join(f"**{h}**\n\n{to_markdown(t)}\n" for h, t in self.articles)

    def csvs(self) -> dict[str, pd.DataFrame]:
        article_long = pd.concat([t.assign(table=h) for h, t in self.articles], ignore_index=True) \
            if self.articles else pd.DataFrame(columns=["table"])
        return {"summary": self.summary, "cells": self.cells, "improvement": self.improvement,
                "article_tables": article_long, "gap": self.gap, "recommendation": self.recommendation,
                "recommendation_scores": self.recommendation_scores, "lossless": self.lossless,
                "latency_quantiles": self.latency_quantiles, "aa": self.aa, "precision": self.precision,
                "decisions": self.decisions, "adaptive": self.adaptive, "thresholds": self.thresholds,
                "acceptance_by_position": self.cost_model.acceptance, "cost_model_params": self.cost_model.params,
                "cost_model_predictions": self.cost_model.predictions,
                "cost_model_validation": self.cost_model.validation}

    def html_views(self) -> dict[str, str]:
        return {
            "summary": html_page("Summary per source × setting × workload × concurrency", [("", self.summary)]),
            "improvement": html_page("Improvement against the baseline and pairwise, paired by round, with verdict",
                                     [("", self.improvement)], self.floor_sentence),
            "aa": html_page("A/A control: the baseline's twin against the baseline, paired by round",
                            [("A/A", self.aa), ("Precision reached per cell", self.precision)],
                            self.floor_sentence),
            "article_tables": html_page("The article's tables", self.articles),
            "decisions": html_page("Decisions per cell: the race's winner, equivalent settings, or undecided",
                                   [("", self.decisions)], self.floor_sentence),
            "adaptive": html_page("Adaptive speculation and deployed schedules against the best static setting",
                                  [("", self.adaptive)], self.floor_sentence),
            "thresholds": html_page("Deployed schedules at their switching thresholds, against the static setting "
                                    "they run on each side", [("", self.thresholds)], self.floor_sentence),
            "gap": html_page("Synthetic vs realistic speedup", [("", self.gap)], self.gap_sentence),
            "recommendation": html_page("Recommendation per concurrency band × workload",
                                        [("Recommendation", self.recommendation),
                                         ("All scores", self.recommendation_scores)]),
            "lossless": html_page("Lossless check at temperature 0", [("", self.lossless)]),
            "acceptance_by_position": html_page("Acceptance by draft position (95% CI over requests)",
                                                [("", self.cost_model.acceptance)]),
            "cost_model": html_page("Cost model: leave-one-setting-out validation, predictions, parameters",
                                    [("Validation", self.cost_model.validation),
                                     ("Predictions", self.cost_model.predictions),
                                     ("Parameters", self.cost_model.params)], self.cost_model.markdown),
        }

    def write(self, out_dir: Path) -> None:
        for name, frame in self.csvs().items():
            write_csv(frame, out_dir / f"{name}.csv")
        atomic_write_text(out_dir / "article_tables.md", self.article_markdown)
        atomic_write_text(out_dir / "cost_model.md", self.cost_model.markdown)
        for name, page in self.html_views().items():
            atomic_write_text(out_dir / f"{name}.html", page)
        atomic_write_text(out_dir / "noise_floor.json", json.dumps(self.noise_floor, indent=1) + "\n")


def build(cfg: StudyConfig, request_paths: list[Path], meta_paths: list[Path] = (),
          profile_path: Path | None = None) -> StudyTables:
    """Compute all tables from the per-request files, the cohorts' meta files, the configured external CSVs and
    the engine's forward profile (the cost model's step cost shape) where one was made."""
    with tqdm(total=6, desc="analysis tables", unit="step") as steps:
        study = load_study(cfg, request_paths, meta_paths, profile_path)
        all_cells, metas, external = study.cells, study.metas, study.external
        measured = study.without([cfg.twin])
        # fixed-acceptance calibration settings are measured, not deployable: they never race or get recommended
        calibration = [name for name, setting in cfg.settings.items() if is_calibration(setting)]
        requests, cells = measured.requests, measured.cells
        steps.update()
        summary = pd.concat([summarize_measured(requests, cells, cfg.bootstrap), summarize_external(external)],
                            ignore_index=True).astype({"n_repeats": "Int64", "n_ok": "Int64", "n_err": "Int64"})
        steps.update()
        launches = launch_position.launch_orders(metas)
        position = launch_position.fit(improvement_values(all_cells), launches, cfg.baseline)

        def values(frame: pd.DataFrame, ext: pd.DataFrame | None = None) -> pd.DataFrame:
            """Rounds to pair, each measured value freed of its server's start position."""
            return launch_position.adjust(improvement_values(frame, ext), launches, position)

        all_values = values(all_cells)
        priors = variance_priors(all_values, cfg.baseline)
        aa = aa_table(all_values, cfg.baseline, cfg.twin, priors)
        floor = noise_floor(aa, metas, cfg.twin) | {"launch_position": launch_position.as_json(position)}
        floor_pct = math.nan if floor["noise_floor_pct"] is None else floor["noise_floor_pct"]
        improvement = improvements(values(cells, external), cfg.comparisons(), floor_pct, cfg.equivalence_pct,
                                   priors)
        rule = RaceRule(cfg.equivalence_pct, floor_pct)
        decisions = decision_table(all_values, cfg.baseline, cfg.twin, rule, cfg.repeats, priors, calibration,
                                   cfg.max_repeats, round_seconds(study.requests), adaptive_settings(cfg))
        measured_values = values(cells)
        adaptive = adaptive_table(measured_values, cfg, rule, priors)
        thresholds = threshold_table(measured_values, cfg, rule, priors)
        gap = gap_table(improvement, cfg)
        steps.update()
        contenders = measured.without(calibration)
        scores = score_table(contenders.requests, contenders.cells, cfg)
        steps.update()
        cost = analyse(requests, summary, cfg, *floor_text(floor), rounds=cells, profile=study.profile)
        steps.update()
        tables = StudyTables(
            summary=summary, cells=all_cells, improvement=improvement,
            articles=article_tables(summary, improvement, cfg, aa), gap=gap, gap_sentence=gap_sentence(gap),
            recommendation=add_predicted_best(recommend(scores, cfg, improvement), cost, cfg),
            recommendation_scores=scores, lossless=lossless_table(requests, cfg.baseline),
            latency_quantiles=latency_quantiles(requests), cost_model=cost,
            aa=aa, noise_floor=floor, precision=precision_table(metas), decisions=decisions,
            adaptive=adaptive, thresholds=thresholds)
        steps.update()
    return tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-json", required=True, help="study config as JSON (settings, workloads, analysis)")
    parser.add_argument("--requests", nargs="+", type=Path, required=True, help="requests/{setting}.parquet files")
    parser.add_argument("--cohort-meta", nargs="*", type=Path, default=[], help="benchmark/{cohort}.json files")
    parser.add_argument("--forward-profile", type=Path, default=None,
                        help="the embedded engine's forward profile (profiling/forward_profile.py), where made")
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        tables = build(StudyConfig.from_json(args.config_json), args.requests, args.cohort_meta, args.forward_profile)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tables.write(args.out_dir)
    n_measured = int((tables.summary["source"] == MEASURED).sum())
    print(f"wrote the tables ({n_measured} measured cells) to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
