"""The study's plain-language summary: headline, recommendation, synthetic-vs-realistic gap, lossless check.

    python -m workflow_scripts.analysis.summary --config-json JSON --study NAME --tables-dir results/S/tables \
        --cohort-meta results/S/benchmark/*.json --out results/S/summary.md --html results/S/tables/summary.html

Writes summary.md (standalone) and the same text as HTML for the Snakemake report, then prints the
article-style tables so that they close the run's output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from markdown_it import MarkdownIt

from workflow_scripts.analysis import launch_position
from workflow_scripts.analysis.adaptive_check import adaptive_lines
from workflow_scripts.analysis.decisions import decision_lines
from workflow_scripts.analysis.gap import gap_sentence
from workflow_scripts.analysis.improvement import METRICS, fmt_improvement, fmt_pct, fmt_tok_s, to_markdown
from workflow_scripts.analysis.measurement import aa_markdown, design_lines, floor_sentence
from workflow_scripts.analysis.noise import read_cohort_meta
from workflow_scripts.analysis.paired import REAL
from workflow_scripts.analysis.output import TABLE_CSS
from workflow_scripts.analysis.server_cost import server_cost_lines
from workflow_scripts.analysis.thresholds import threshold_lines
from workflow_scripts.io import atomic_write_text
from workflow_scripts.analysis.study_config import StudyConfig


def _read(tables_dir: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(tables_dir / f"{name}.csv")


def headline(improvement: pd.DataFrame, summary: pd.DataFrame, settings: list[str]) -> list[str]:
    """Per workload: the best setting against the baseline at the lowest and highest concurrency measured. Only a
    real improvement (paired CI excludes 0, beyond the noise floor) is called best; otherwise the line says so."""
    lines = []
    vs_base = improvement[(improvement["source"] == "measured") & (improvement["kind"] == "vs_baseline")
                          & (improvement["metric"] == "per_request_tok_s")].dropna(subset=["improvement_pct"])
    for workload, group in vs_base.groupby("workload", sort=True):
        for conc in sorted({group["concurrency"].min(), group["concurrency"].max()}):
            at_c = group[group["concurrency"] == conc]
            real = at_c[at_c["verdict"] == REAL]
            if real.empty or real["improvement_pct"].max() <= 0:
                top = at_c.loc[at_c["improvement_pct"].idxmax()]
                lines.append(f"- **{workload}, concurrency {conc}**: no setting is faster than the baseline beyond "
                             f"the noise (largest: `{top['candidate']}` {fmt_improvement(top)}).")
                continue
            best = real.loc[real["improvement_pct"].idxmax()]
            agg = improvement[(improvement["source"] == "measured") & (improvement["kind"] == "vs_baseline")
                              & (improvement["metric"] == "aggregate_tok_s") & (improvement["workload"] == workload)
                              & (improvement["concurrency"] == conc) & (improvement["candidate"] == best["candidate"])]
            agg_text = f"; aggregate {fmt_improvement(agg.iloc[0])}" if len(agg) else ""
            lines.append(f"- **{workload}, concurrency {conc}**: best is `{best['candidate']}` with "
                         f"{fmt_tok_s(best['candidate_value'])} vs {fmt_tok_s(best['baseline_value'])} per-request "
                         f"tok/s, {fmt_improvement(best)}{agg_text}.")
    if not lines:
        lines.append("- No comparison against the baseline could be computed (no measured data for one side).")
    measured = summary[summary["source"] == "measured"]
    empty = measured[measured["n_ok"] == 0]
    errored = measured[measured["n_err"] > 0]
    if len(errored):
        lines.append(f"- **Errors**: {int(errored['n_err'].sum())} request(s) failed in {len(errored)} cell(s); "
                     f"{len(empty)} cell(s) have no successful request and show as — (no data)"
                     + "".join(f"{', ' if i else ': '}`{r.setting}` {r.workload} C={r.concurrency}"
                               for i, r in enumerate(empty.itertuples())) + ".")
    missing = [name for name in settings if name not in set(measured["setting"])]
    if missing:
        lines.append(f"- **Not measured**: no request records for {', '.join(f'`{m}`' for m in missing)}.")
    return lines


def external_comparison(improvement: pd.DataFrame) -> str:
    """External improvements beside this study's for the same comparison, workload and concurrency."""
    keys = ["kind", "baseline", "candidate", "workload", "concurrency", "metric"]
    measured = improvement[improvement["source"] == "measured"]
    external = improvement[improvement["source"] != "measured"]
    both = external.merge(measured, on=keys, suffixes=("_ext", ""))
    if both.empty:
        return ""
    table = pd.DataFrame({
        "source": both["source_ext"], "comparison": both["candidate"] + " vs " + both["baseline"],
        "workload": both["workload"], "C": both["concurrency"], "metric": both["metric"].map(METRICS),
        "external": both["improvement_pct_ext"].map(fmt_pct),
        "this study": both.apply(fmt_improvement, axis=1),
    })
    return to_markdown(table)


def recommendation_lines(rec: pd.DataFrame) -> str:
    rows = []
    for r in rec.itertuples():
        rows.append({"band": f"{r.band} (C={r.concurrencies})", "workload": r.workload,
                     "metric": METRICS.get(r.metric, r.metric),
                     "recommended": r.recommended if isinstance(r.recommended, str) and r.recommended else "— (none)",
                     "score × baseline": "—" if not np.isfinite(r.score_vs_baseline) else f"{r.score_vs_baseline:.2f}",
                     "vs baseline": r.verdict if isinstance(r.verdict, str) else "",
                     "tied with": r.tied_with if isinstance(r.tied_with, str) else "",
                     "never recommended": r.excluded if isinstance(r.excluded, str) else "",
                     **_predicted_cell(r)})
    return to_markdown(pd.DataFrame(rows)) if rows else "No band has data."


def _predicted_cell(r) -> dict[str, str]:
    """The cost model's best steps, with its stated error beside it (absent when the model was skipped)."""
    best = getattr(r, "predicted_best_steps", None)
    if not isinstance(best, str) or not best:
        return {}
    error = getattr(r, "predicted_error_pct", np.nan)
    return {"predicted best steps": best + (f" (±{error:.0f}%)" if np.isfinite(error) and error > 0 else "")}


def lossless_lines(lossless: pd.DataFrame, baseline: str) -> list[str]:
    if lossless.empty:
        return ["No temperature-0 workload was measured, so token identity could not be checked."]
    lines = []
    for setting, g in lossless.groupby("setting", sort=True):
        compared, identical = int(g["n_compared"].sum()), int(g["n_identical"].sum())
        share = identical / compared if compared else np.nan
        text = "—" if not np.isfinite(share) else f"{share:.1%}"
        role = " (baseline against its own most frequent output)" if setting == baseline else ""
        flag = " **⚠ under 100%: not token-identical**" if np.isfinite(share) and share < 1 else ""
        unmatched = int(g["n_no_reference"].sum())
        note = f"; {unmatched} without a baseline output to compare with" if unmatched else ""
        lines.append(f"- `{setting}`{role}: {identical}/{compared} requests identical ({text}){flag}{note}")
    return lines


def eos_lines(summary: pd.DataFrame, cfg: StudyConfig) -> list[str]:
    measured = summary[summary["source"] == "measured"].dropna(subset=["eos_share"])
    lines = []
    for workload in cfg.workloads_of_kind("realistic"):
        g = measured[measured["workload"] == workload]
        if len(g):
            lines.append(f"- `{workload}`: {g['eos_share'].mean():.0%} of answers stopped on EOS "
                         f"(the rest hit the max_new_tokens cap), averaged over settings and concurrencies.")
    return lines


def render(cfg: StudyConfig, study: str, tables_dir: Path, metas: list[dict]) -> str:
    summary, improvement = _read(tables_dir, "summary"), _read(tables_dir, "improvement")
    aa, precision = _read(tables_dir, "aa"), _read(tables_dir, "precision")
    floor = json.loads((tables_dir / "noise_floor.json").read_text())
    gap, rec = _read(tables_dir, "gap"), _read(tables_dir, "recommendation")
    lossless = _read(tables_dir, "lossless")
    articles = (tables_dir / "article_tables.md").read_text(encoding="utf-8")
    gap_rows = gap[(gap["source"] == "measured") & (gap["metric"] == "per_request_tok_s")]
    gap_md = to_markdown(pd.DataFrame({
        "setting": gap_rows["setting"], "C": gap_rows["concurrency"],
        "synthetic": gap_rows["synthetic_improvement_pct"].map(fmt_pct),
        "realistic": gap_rows["realistic_improvement_pct"].map(fmt_pct),
        "overstated by": gap_rows["overstatement_pp"].map(lambda x: "—" if not np.isfinite(x) else f"{x:+.0f} pp"),
    })) if len(gap_rows) else ""
    parts = [
        f"# Study `{study}`: speculative decoding against `{cfg.baseline}`", "",
        *decision_lines(_read(tables_dir, "decisions"), aa, _read(tables_dir, "cells"), cfg.max_repeats),
        *adaptive_lines(_read(tables_dir, "adaptive")),
        *threshold_lines(_read(tables_dir, "thresholds")),
        "Throughput is the median over rounds. Every comparison pairs cells measured in the same round (a round "
        "measures one cell on every setting); brackets give the 95% CI of the geometric-mean ratio over rounds "
        "(a t interval on the log ratios, their spread pooled over the study's comparisons: docs/method.md), and "
        "“≈ noise” marks a difference that is not *real*: its CI includes 0, or it is within the A/A noise "
        "floor. — means no data (every request failed, or the two settings share no round), never 0.", "",
        "## Headline", *headline(improvement, summary, list(cfg.settings)), "",
        "## How it was measured", "", floor_sentence(floor, aa), "",
        launch_position.sentence(floor.get("launch_position")), "", *design_lines(metas, precision), "",
        *server_cost_lines(tables_dir.parent / "profile" / "served_overhead.json"),
        *(["A/A differences (twin vs control, paired by round):", "", aa_markdown(aa), ""] if len(aa) else []),
        "## Recommendation", "",
        "Per concurrency band and workload, the setting with the highest median − 1.4826·MAD of its tok/s; "
        f"scores within {cfg.tie_tolerance:.0%} tie and go to fewer speculative steps; a setting with errors is "
        "never recommended. *vs baseline* says whether the pick beats the baseline for real (paired, beyond the "
        "noise floor) at every concurrency of the band.", "", recommendation_lines(rec), "",
        "## Synthetic vs realistic workload", "", gap_sentence(gap), "", gap_md, "",
        "## Lossless check (temperature 0)", "", *lossless_lines(lossless, cfg.baseline), "",
    ]
    external = external_comparison(improvement)
    if external:
        parts += ["## Against external results", "",
                  "The same comparison, workload and concurrency in an external table (e.g. the seed article, "
                  "measured on GPUs) and in this study:", "", external, ""]
    cost_model = (tables_dir / "cost_model.md").read_text(encoding="utf-8").strip()
    if cost_model:
        parts += ["## Cost model: acceptance by position, and what other steps would do", "",
                  "Fitted to this study's own cells (`workflow_scripts/analysis/cost_model/`); predictions carry "
                  "their leave-one-setting-out error.", "", cost_model, ""]
    eos = eos_lines(summary, cfg)
    if eos:
        parts += ["## How realistic answers ended", "", *eos, ""]
    parts += ["## The article's tables", "", articles]
    return "\n".join(parts)


def to_html(markdown: str, title: str) -> str:
    body = MarkdownIt("commonmark").enable("table").render(markdown)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>{TABLE_CSS}</head>"
            f"<body>{body}</body></html>")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--study", required=True)
    parser.add_argument("--tables-dir", type=Path, required=True)
    parser.add_argument("--cohort-meta", nargs="*", type=Path, default=[], help="benchmark/{cohort}.json files")
    parser.add_argument("--out", type=Path, required=True, help="summary.md")
    parser.add_argument("--html", type=Path, required=True, help="the same summary as HTML for the report")
    args = parser.parse_args(argv)
    markdown = render(StudyConfig.from_json(args.config_json), args.study, args.tables_dir,
                      read_cohort_meta(args.cohort_meta))
    atomic_write_text(args.out, markdown)
    atomic_write_text(args.html, to_html(markdown, f"Summary of {args.study}"))
    print((args.tables_dir / "article_tables.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
