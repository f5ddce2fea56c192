"""The step schedule drawn over the measured throughput curves: where each band starts, and which curve it rides."""

from __future__ import annotations

import altair as alt
import pandas as pd

from workflow_scripts.analysis.study_config import StudyConfig, is_adaptive


def scheduled_points(measured: pd.DataFrame, schedule: pd.DataFrame, cfg: StudyConfig) -> pd.DataFrame:
    """The measured points of the static setting each band runs: the recommended one where the band runs its steps,
    else (the cost model chose another step count) the setting of its algorithm with the band's steps; with 0 steps,
    every setting without speculation."""
    steps = measured["setting"].map(cfg.steps)
    static = measured["setting"].map(lambda s: not is_adaptive(cfg.settings.get(s, {})))
    algorithm = measured["setting"].map(lambda s: cfg.settings.get(s, {}).get("speculative_algorithm"))
    points = []
    for r in schedule.itertuples():
        concs = [int(c) for c in str(r.concurrencies).split()]
        on = (measured["workload"] == r.workload) & measured["concurrency"].isin(concs) & (steps == r.steps) & static
        if r.steps > 0 and r.recommended:
            on &= (measured["setting"] == r.recommended) if cfg.steps(r.recommended) == r.steps else (
                algorithm == cfg.settings[r.recommended].get("speculative_algorithm"))
        points.append(measured[on].assign(band=r.band, scheduled=f"{r.steps} steps", reason=r.reason))
    return pd.concat(points, ignore_index=True) if points else measured.iloc[:0]


def schedule_chart(summary: pd.DataFrame, schedule: pd.DataFrame, cfg: StudyConfig) -> alt.Chart:
    """Aggregate tok/s against concurrency per setting (thin lines), the scheduled steps' own points on them (large
    marks labelled with the steps), and a rule at each band's first batch size, per workload."""
    measured = summary[summary["source"] == "measured"]
    chosen = scheduled_points(measured, schedule, cfg)
    x = alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2), title="concurrency (batch size)")
    y = alt.Y("aggregate_tok_s_median:Q", title="aggregate tok/s (median)")
    curves = alt.Chart(measured).mark_line(point=True, strokeWidth=1, opacity=0.6).encode(
        x=x, y=y, color="setting:N", tooltip=["setting:N", "concurrency:Q", "aggregate_tok_s_median:Q"])
    marks = alt.Chart(chosen).mark_point(size=220, filled=False, strokeWidth=3, color="black").encode(
        x=x, y=y, tooltip=["band:N", "scheduled:N", "setting:N", "reason:N"])
    labels = alt.Chart(chosen).mark_text(dy=-16, fontWeight="bold").encode(x=x, y=y, text="scheduled:N")
    breaks = alt.Chart(schedule).mark_rule(strokeDash=[4, 4], color="gray").encode(
        x=alt.X("batch_from:Q"), tooltip=["band:N", "batch_from:Q", "batch_to:Q", "steps:Q", "reason:N"])
    panels = []
    for workload in schedule["workload"].unique():
        layer = alt.layer(
            curves.transform_filter(alt.datum.workload == workload), marks.transform_filter(alt.datum.workload == workload),
            labels.transform_filter(alt.datum.workload == workload), breaks.transform_filter(alt.datum.workload == workload))
        panels.append(layer.properties(title=str(workload), width=360, height=240))
    return alt.hconcat(*panels).properties(
        title="Step schedule over the measured throughput (circled: the scheduled steps; dashed: band starts)")
