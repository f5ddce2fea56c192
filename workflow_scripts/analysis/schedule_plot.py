"""The step schedule drawn over the measured throughput curves: where each band starts, and which curve it rides."""

from __future__ import annotations

import altair as alt
import pandas as pd

from workflow_scripts.analysis.study_config import StudyConfig


def schedule_chart(summary: pd.DataFrame, schedule: pd.DataFrame, cfg: StudyConfig) -> alt.Chart:
    """Aggregate tok/s against concurrency per setting (thin lines), the scheduled steps' own points on them (large
    marks labelled with the steps), and a rule at each band's first batch size, per workload."""
    measured = summary[summary["source"] == "measured"].copy()
    measured["steps"] = measured["setting"].map(cfg.steps)
    points = []
    for r in schedule.itertuples():
        concs = [int(c) for c in str(r.concurrencies).split()]
        on = measured[(measured["workload"] == r.workload) & measured["concurrency"].isin(concs)
                      & (measured["steps"] == r.steps)
                      & measured["setting"].map(lambda s: not cfg.settings.get(s, {}).get("speculative_adaptive"))]
        if r.steps > 0 and r.recommended:
            on = on[on["setting"] == r.recommended]
        points.append(on.assign(band=r.band, scheduled=f"{r.steps} steps", reason=r.reason))
    chosen = pd.concat(points, ignore_index=True) if points else measured.iloc[:0]
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
