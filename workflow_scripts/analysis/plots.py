"""The study's altair charts, each saved as interactive HTML (JS inlined: it must render offline) and static SVG.

    python -m workflow_scripts.analysis.plots --tables-dir results/S/tables --out-dir results/S/plots

An empty cell (every request errored) is drawn as a red dashed vertical rule at its concurrency, with a
tooltip, never as a point at 0 tok/s.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd
import vl_convert as vlc
from tqdm import tqdm

from workflow_scripts.analysis.cost_plots import acceptance_position_chart, cost_model_chart
from workflow_scripts.analysis.improvement import METRICS
from workflow_scripts.io import atomic_write_text

PLOTS = ["throughput", "speedup", "acceptance", "latency", "pareto", "acceptance_position", "cost_model", "survival"]
LOG2 = alt.Scale(type="log", base=2)
PANEL = {"width": 260, "height": 200}
EMPTY_RULE = {"color": "#d62728", "strokeDash": [4, 3], "strokeWidth": 2}


def _dash(sources: pd.Series) -> alt.StrokeDash:
    """Measured data solid, each external source with its own dash."""
    domain = sorted(set(sources), key=lambda x: (x != "measured", x))
    patterns = [[1, 0], [6, 3], [2, 2], [8, 2, 2, 2], [1, 4]]
    return alt.StrokeDash("source:N", scale=alt.Scale(domain=domain, range=patterns[:len(domain)] if len(domain)
                                                      <= len(patterns) else None))


def _mark_empty(data: pd.DataFrame, value: str, label: str, panel: list[str]) -> pd.DataFrame:
    """Flag rows without a value and write one note per panel × concurrency naming all of them."""
    data = data.copy()
    data["empty"] = data[value].isna()
    data["empty_note"] = ""
    empties = data[data["empty"]]
    for _, group in empties.groupby([*panel, "concurrency"]):
        data.loc[group.index[0], "empty_note"] = ", ".join(sorted(set(group[label]))) + ": no ok request"
    return data


def _empty_layers() -> list[alt.Chart]:
    """A red dashed rule spanning the panel at an empty cell's concurrency, labelled along it."""
    empty = alt.Chart().transform_filter("datum.empty")
    rule = empty.mark_rule(**EMPTY_RULE).encode(x="concurrency:Q", tooltip=["empty_note:N", "concurrency:Q"])
    text = alt.Chart().transform_filter("datum.empty_note != ''").mark_text(
        angle=90, align="left", baseline="bottom", dx=4, dy=-3, color=EMPTY_RULE["color"], fontSize=10).encode(
        x="concurrency:Q", y=alt.value(4), text="empty_note:N")
    return [rule, text]


def _conc_axis(title: str = "concurrency") -> alt.X:
    return alt.X("concurrency:Q", scale=LOG2, title=title, axis=alt.Axis(values=[1, 2, 4, 8, 16, 32, 64, 128]))


CONC_COLOR = alt.Color("conc:N", title="concurrency", sort=None)


def _grouped_by_concurrency() -> alt.Chart:
    """x = setting, one slot per concurrency; colour is set per layer so black ticks stay black."""
    return alt.Chart().encode(x=alt.X("setting:N"), xOffset=alt.XOffset("conc:N", sort=None))


def throughput_chart(summary: pd.DataFrame) -> alt.Chart:
    """Median tok/s (with CI) against concurrency per setting; rows: per-request/aggregate, columns: workload."""
    frames = []
    for metric, label in METRICS.items():
        frames.append(pd.DataFrame({
            "source": summary["source"], "setting": summary["setting"], "workload": summary["workload"],
            "concurrency": summary["concurrency"], "metric": label,
            "value": summary[f"{metric}_median"], "ci_low": summary[f"{metric}_ci_low"],
            "ci_high": summary[f"{metric}_ci_high"], "n_ok": summary["n_ok"], "n_err": summary["n_err"],
        }))
    data = pd.concat(frames, ignore_index=True)
    data["panel"] = data["workload"] + np.where(data["source"] == "measured", "", " · " + data["source"])
    data = _mark_empty(data, "value", "setting", ["panel", "metric"])
    tooltip = ["source:N", "setting:N", "workload:N", "concurrency:Q", alt.Tooltip("value:Q", format=".1f"),
               alt.Tooltip("ci_low:Q", format=".1f"), alt.Tooltip("ci_high:Q", format=".1f"), "n_ok:Q", "n_err:Q"]
    base = alt.Chart().encode(x=_conc_axis(), color="setting:N")
    ok = base.transform_filter("!datum.empty")
    line = ok.mark_line(point=True).encode(y=alt.Y("value:Q", title="tok/s"), tooltip=tooltip)
    bars = ok.mark_errorbar().encode(y=alt.Y("ci_low:Q", title="tok/s"), y2="ci_high:Q")
    return (alt.layer(line, bars, *_empty_layers(), data=data).properties(**PANEL)
            .facet(row=alt.Row("metric:N", title=None), column=alt.Column("panel:N", title="workload · source"))
            .resolve_scale(x="independent", y="independent")
            .properties(title="Throughput against concurrency (median over repeats, 95% CI)"))


def speedup_chart(improvement: pd.DataFrame) -> alt.Chart:
    """Improvement of each comparison (vs the baseline, and pairwise steps) in percent, with its paired 95% CI.

    External sources share the panels (percentages compare across hardware), drawn dashed.
    """
    data = improvement.copy()
    data["metric"] = data["metric"].map(METRICS)
    data["comparison"] = data["candidate"] + " vs " + data["baseline"]
    data = _mark_empty(data, "improvement_pct", "comparison", ["workload", "metric"])
    title = "improvement (%)"
    base = alt.Chart().encode(x=_conc_axis(), color=alt.Color("comparison:N"))
    ok = base.transform_filter("!datum.empty")
    line = ok.mark_line(point=True).encode(
        y=alt.Y("improvement_pct:Q", title=title), strokeDash=_dash(data["source"]),
        tooltip=["source:N", "candidate:N", "baseline:N", "concurrency:Q",
                 alt.Tooltip("improvement_pct:Q", format="+.1f"), alt.Tooltip("ci_low_pct:Q", format="+.1f"),
                 alt.Tooltip("ci_high_pct:Q", format="+.1f"), "within_noise:N"])
    bars = ok.mark_errorbar().encode(y=alt.Y("ci_low_pct:Q", title=title), y2="ci_high_pct:Q")
    zero = alt.Chart().mark_rule(color="black").encode(y=alt.datum(0))
    return (alt.layer(line, bars, zero, *_empty_layers(), data=data).properties(**PANEL)
            .facet(row=alt.Row("metric:N", title=None), column=alt.Column("workload:N"))
            .resolve_scale(y="independent")
            .properties(title="Speedup: each setting vs the baseline, and steps N vs N−1 (paired 95% CI)"))


def acceptance_chart(summary: pd.DataFrame) -> alt.Chart:
    """Token-weighted acceptance length (bars) and the request mean (ticks) per setting × concurrency."""
    data = summary.dropna(subset=["accept_length_mean"]).copy()
    data["conc"] = data["concurrency"].astype(str)
    base = _grouped_by_concurrency()
    tooltip = ["source:N", "setting:N", "concurrency:Q", alt.Tooltip("accept_length_token_weighted:Q", format=".2f"),
               alt.Tooltip("accept_length_mean:Q", format=".2f")]
    bars = base.mark_bar(opacity=0.8).encode(
        y=alt.Y("accept_length_token_weighted:Q", title="acceptance length (tokens per verify step)"),
        color=CONC_COLOR, tooltip=tooltip)
    ticks = base.mark_tick(color="black", thickness=2).encode(y="accept_length_mean:Q", tooltip=tooltip)
    return (alt.layer(bars, ticks, data=data).properties(**PANEL).facet(column=alt.Column("workload:N"))
            .properties(title="Acceptance length: bars token-weighted, ticks request mean"))


def latency_chart(quantiles: pd.DataFrame) -> alt.Chart:
    """Box plots from precomputed quantiles: whiskers p5–p95, box p25–p75, black tick at the median."""
    data = quantiles.copy()
    data["conc"] = data["concurrency"].astype(str)
    base = _grouped_by_concurrency()
    tooltip = ["setting:N", "concurrency:Q", "n:Q", *[alt.Tooltip(f"p{q}:Q", format=".1f") for q in (5, 25, 50, 75, 95)]]
    whisker = base.mark_rule().encode(y=alt.Y("p5:Q", scale=alt.Scale(type="log"), title="ms"), y2="p95:Q",
                                      color=CONC_COLOR)
    box = base.mark_bar(size=8).encode(y="p25:Q", y2="p75:Q", color=CONC_COLOR, tooltip=tooltip)
    median = base.mark_tick(color="black", size=10).encode(y="p50:Q", tooltip=tooltip)
    return (alt.layer(whisker, box, median, data=data).properties(**PANEL)
            .facet(row=alt.Row("metric:N", title=None), column=alt.Column("workload:N"))
            .resolve_scale(y="independent")
            .properties(title="Latency distributions: TTFT and TPOT (p5, p25, p50, p75, p95)"))


def pareto_front(points: pd.DataFrame, x: str, y: str) -> pd.Series:
    """True for points no other point beats on both x and y (higher is better on both)."""
    xs, ys = points[x].to_numpy(dtype="float64"), points[y].to_numpy(dtype="float64")
    finite = np.isfinite(xs) & np.isfinite(ys)
    on_front = []
    for i in range(len(points)):
        dominated = finite & (xs >= xs[i]) & (ys >= ys[i]) & ((xs > xs[i]) | (ys > ys[i]))
        on_front.append(bool(finite[i] and not dominated.any()))
    return pd.Series(on_front, index=points.index)


def pareto_chart(summary: pd.DataFrame) -> alt.Chart:
    """Each cell as a point (aggregate vs per-request tok/s); the front per source × workload is connected."""
    data = summary.dropna(subset=["per_request_tok_s_median", "aggregate_tok_s_median"]).copy()
    data["pareto"] = False
    for _, group in data.groupby(["source", "workload"]):
        data.loc[group.index, "pareto"] = pareto_front(group, "aggregate_tok_s_median", "per_request_tok_s_median")
    x = alt.X("aggregate_tok_s_median:Q", title="aggregate tok/s")
    y = alt.Y("per_request_tok_s_median:Q", title="per-request tok/s")
    points = alt.Chart().mark_point(filled=True, size=70).encode(
        x=x, y=y, color="setting:N", shape="source:N",
        opacity=alt.condition("datum.pareto", alt.value(1.0), alt.value(0.35)),
        tooltip=["source:N", "setting:N", "concurrency:Q", "pareto:N",
                 alt.Tooltip("aggregate_tok_s_median:Q", format=".1f"),
                 alt.Tooltip("per_request_tok_s_median:Q", format=".1f")])
    labels = alt.Chart().mark_text(dx=8, dy=-6, fontSize=9).encode(x=x, y=y, text="concurrency:Q")
    front = alt.Chart().transform_filter("datum.pareto").mark_line(color="black", strokeDash=[2, 2]).encode(
        x=x, y=y, detail="source:N", order="aggregate_tok_s_median:Q")
    data["panel"] = data["workload"] + np.where(data["source"] == "measured", "", " · " + data["source"])
    return (alt.layer(front, points, labels, data=data).properties(**PANEL)
            .facet(column=alt.Column("panel:N", title="workload · source"))
            .resolve_scale(x="independent", y="independent")
            .properties(title="Per-request against aggregate tok/s; dashed line = Pareto front (labels: concurrency)"))


def survival_chart(cells: pd.DataFrame, decisions: pd.DataFrame) -> alt.Chart:
    """Each setting's rounds per cell: a mark per round it was measured in, so an eliminated setting's row stops
    where the race dropped it and a decided cell's rows stop together (tables/decisions.csv names both)."""
    data = cells[["setting", "workload", "concurrency", "cohort", "repeat"]].drop_duplicates().copy()
    outcome = decisions[decisions["metric"] == "aggregate_tok_s"].set_index(["workload", "concurrency"])
    data["decision"] = [outcome["decision"].get((w, c), "") for w, c in zip(data["workload"], data["concurrency"])]
    gone = {(w, c, item.split("@")[0]) for (w, c), text in outcome["eliminated"].fillna("").items()
            for item in str(text).split(";") if item}
    data["status"] = ["eliminated" if (w, c, s) in gone else "in the race" for w, c, s in
                      zip(data["workload"], data["concurrency"], data["setting"])]
    return (alt.Chart(data).mark_square(size=70).encode(
        x=alt.X("repeat:O", title="round"), y=alt.Y("setting:N", title=None),
        color=alt.Color("status:N", scale=alt.Scale(domain=["in the race", "eliminated"],
                                                    range=["#1f77b4", "#d62728"])),
        tooltip=["setting:N", "workload:N", "concurrency:Q", "cohort:N", "repeat:Q", "decision:N", "status:N"])
        .properties(width=120, height=110)
        .facet(row=alt.Row("workload:N"), column=alt.Column("concurrency:O", title="concurrency"))
        .properties(title="Survival over rounds: the rounds each setting was measured in, per cell"))


def save(chart: alt.Chart, out_dir: Path, name: str) -> None:
    """HTML with vega inlined (offline, SVG renderer) and a static SVG, both written atomically."""
    atomic_write_text(out_dir / f"{name}.html", chart.to_html(inline=True, embed_options={"renderer": "svg"}))
    atomic_write_text(out_dir / f"{name}.svg", vlc.vegalite_to_svg(chart.to_json()))


def build_charts(tables_dir: Path) -> dict[str, Callable[[], alt.Chart]]:
    summary = pd.read_csv(tables_dir / "summary.csv")
    improvement = pd.read_csv(tables_dir / "improvement.csv")
    quantiles = pd.read_csv(tables_dir / "latency_quantiles.csv")
    by_position = pd.read_csv(tables_dir / "acceptance_by_position.csv")
    cost_predictions = pd.read_csv(tables_dir / "cost_model_predictions.csv")
    cells = pd.read_csv(tables_dir / "cells.csv")
    decisions = pd.read_csv(tables_dir / "decisions.csv")
    return {
        "throughput": lambda: throughput_chart(summary),
        "speedup": lambda: speedup_chart(improvement),
        "acceptance": lambda: acceptance_chart(summary),
        "latency": lambda: latency_chart(quantiles),
        "pareto": lambda: pareto_chart(summary),
        "acceptance_position": lambda: acceptance_position_chart(by_position),
        "cost_model": lambda: cost_model_chart(cost_predictions),
        "survival": lambda: survival_chart(cells, decisions),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables-dir", type=Path, required=True)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--only", nargs="*", choices=PLOTS, default=PLOTS, help="charts to draw (default: all)")
    args = parser.parse_args(argv)
    charts = build_charts(args.tables_dir)
    for name in tqdm(args.only, desc="plots", unit="chart"):
        save(charts[name](), args.out_dir, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
