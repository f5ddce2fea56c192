"""The cost model's charts: acceptance per draft position (T=0 synthetic against T>0 realistic), and the predicted
tok/s against steps with the measured points on top. An empty table (no histograms, model skipped) draws a
one-line chart that says so, never an empty frame that looks like zero."""

from __future__ import annotations

import altair as alt
import pandas as pd

PANEL = {"width": 260, "height": 200}


def _nothing(title: str, reason: str) -> alt.Chart:
    return alt.Chart(pd.DataFrame({"text": [reason]})).mark_text(fontSize=13).encode(text="text:N").properties(
        width=420, height=60, title=title)


def acceptance_position_chart(acceptance: pd.DataFrame) -> alt.Chart:
    """α per draft position with its CI; colour = workload (labelled with its temperature), one panel per setting."""
    title = "Acceptance by draft position: α_p (accepted once 1..p−1 were), 95% CI over requests"
    if acceptance.empty:
        return _nothing(title, "no spec_correct_drafts_histogram in the request records")
    data = acceptance.copy()
    data["workload_t"] = data["workload"] + " (T=" + data["temperature"].map("{:g}".format) + ")"
    color = alt.Color("workload_t:N", title="workload")
    x = alt.X("position:O", title="draft position")
    tooltip = ["setting:N", "workload:N", "temperature:Q", "position:O", "n_requests:Q", "reached:Q", "accepted:Q",
               alt.Tooltip("conditional_rate:Q", format=".3f"), alt.Tooltip("conditional_ci_low:Q", format=".3f"),
               alt.Tooltip("conditional_ci_high:Q", format=".3f"), alt.Tooltip("accept_rate:Q", format=".3f")]
    line = alt.Chart().mark_line(point=True).encode(
        x=x, y=alt.Y("conditional_rate:Q", title="acceptance α_p", scale=alt.Scale(domain=[0, 1])), color=color,
        tooltip=tooltip)
    bars = alt.Chart().mark_errorbar().encode(x=x, y=alt.Y("conditional_ci_low:Q", title="acceptance α_p"),
                                              y2="conditional_ci_high:Q", color=color)
    return (alt.layer(line, bars, data=data).properties(**PANEL).facet(column=alt.Column("setting:N"))
            .properties(title=title))


def cost_model_chart(predictions: pd.DataFrame) -> alt.Chart:
    """Predicted aggregate tok/s against steps per concurrency (band = stated error), measured medians + CIs on top."""
    title = "Cost model: predicted aggregate tok/s against steps (lines, band = stated error), measured (points, 95% CI)"
    if predictions.empty:
        return _nothing(title, "cost model skipped (see summary.md for why)")
    data = predictions.copy()
    data["panel"] = data["workload"] + pd.Series(
        ["" if s == "measured" else f" · {s}" for s in data["source"]], index=data.index)
    data["conc"] = data["concurrency"].astype(str)
    data["low"] = data["predicted_aggregate_tok_s"] * (1 - data["stated_error_pct"].fillna(0) / 100)
    data["high"] = data["predicted_aggregate_tok_s"] * (1 + data["stated_error_pct"].fillna(0) / 100)
    color = alt.Color("conc:N", title="concurrency", sort=alt.SortField("concurrency"))
    x = alt.X("steps:Q", title="speculative steps (0 = none)", axis=alt.Axis(tickMinStep=1))
    y = alt.Y("predicted_aggregate_tok_s:Q", title="aggregate tok/s", scale=alt.Scale(type="log"))
    tooltip = ["workload:N", "concurrency:Q", "steps:Q", "setting:N", "note:N",
               alt.Tooltip("predicted_aggregate_tok_s:Q", format=".1f"), alt.Tooltip("stated_error_pct:Q", format=".1f"),
               alt.Tooltip("measured_aggregate_tok_s:Q", format=".1f")]
    y_title = "aggregate tok/s"
    band = alt.Chart().mark_area(opacity=0.12).encode(x=x, y=alt.Y("low:Q", title=y_title), y2="high:Q", color=color)
    line = alt.Chart().mark_line(strokeDash=[4, 2]).encode(x=x, y=y, color=color)
    predicted = alt.Chart().transform_filter("!datum.measured").mark_point(filled=False, size=50).encode(
        x=x, y=y, color=color, tooltip=tooltip)
    measured = alt.Chart().transform_filter("datum.measured").mark_point(filled=True, size=60).encode(
        x=x, y=alt.Y("measured_aggregate_tok_s:Q", title=y_title), color=color, tooltip=tooltip)
    bars = alt.Chart().transform_filter("datum.measured").mark_errorbar().encode(
        x=x, y=alt.Y("measured_aggregate_ci_low:Q", title=y_title), y2="measured_aggregate_ci_high:Q", color=color)
    return (alt.layer(band, line, predicted, bars, measured, data=data).properties(**PANEL)
            .facet(column=alt.Column("panel:N", title="workload · source")).resolve_scale(y="independent")
            .properties(title=title))
