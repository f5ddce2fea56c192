"""The summary's account of how the study measured: design, A/A noise floor, precision reached, where time went.

A reader who must defend a number needs these beside it: which design paired the cells, how far apart two
identical settings landed, which cells reached the precision target, and on what machine (its memory bandwidth
drives the CPU engine's speed, so absolute figures only compare across runs of one machine).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workflow_scripts.analysis.improvement import fmt_ci, to_markdown

BUSY_SPREAD = 1.1  # p95/p5 of the per-cell memory speed beyond which the summary calls the host busy


def aa_markdown(aa: pd.DataFrame) -> str:
    """The A/A differences per workload and concurrency, both metrics side by side."""
    if aa.empty:
        return ""
    text = [fmt_ci(*r) for r in aa[["diff_pct", "ci_low_pct", "ci_high_pct"]].itertuples(index=False)]
    wide = aa.assign(text=text).pivot_table(
        index=["workload", "concurrency"], columns="metric", values="text", aggfunc="first").reset_index()
    wide = wide.rename(columns={"concurrency": "C", "aggregate_tok_s": "aggregate tok/s",
                                "per_request_tok_s": "per-request tok/s"})
    return to_markdown(wide)


def floor_sentence(floor: dict, aa: pd.DataFrame) -> str:
    if floor["noise_floor_pct"] is None:
        return ("No A/A twin was measured (benchmark.aa_control: false): an improvement counts as real when its "
                "paired CI excludes 0, with no noise floor to clear.")
    finite = aa.dropna(subset=["diff_pct"])
    with_ci = finite.dropna(subset=["ci_low_pct", "ci_high_pct"])  # one round gives a ratio but no interval
    honest = ((with_ci["ci_low_pct"] <= 0) & (with_ci["ci_high_pct"] >= 0)).mean() if len(with_ci) else np.nan
    no_ci = f" ({len(finite) - len(with_ci)} more had one round: no CI)" if len(with_ci) < len(finite) else ""
    return (f"The control's twin (the same setting on a second server, in the same rounds) landed "
            f"{finite['diff_pct'].abs().median():.1f}% from the control in the median cell and "
            f"{finite['diff_pct'].abs().max():.1f}% in the worst; its CI included 0 in {honest:.0%} of the "
            f"{len(with_ci)} cells × metrics with a CI{no_ci}. The **noise floor** (95th percentile of |A/A difference|) is "
            f"**±{floor['noise_floor_pct']:.1f}%**: an improvement is *real* only when its paired CI excludes 0 "
            f"and it is larger than that.")


def design_lines(metas: list[dict], precision: pd.DataFrame) -> list[str]:
    """Design per cohort, rounds, the precision target reached or not, the budget, time and the machine."""
    lines = []
    for meta in metas:
        cells = precision[precision["cohort"] == meta["cohort"]]
        met = cells[cells["precision_met"]]
        missed = cells[~cells["precision_met"]]
        budget = (f"; the time budget ({meta['time_budget_min']} min) ended the measuring"
                  if meta["budget_hit"] else "")
        lines.append(
            f"- Cohort `{meta['cohort']}` ({', '.join(f'`{m}`' for m in meta['members'])}): design "
            f"**{meta['schedule']}** (configured {meta['schedule_configured']}), {int(cells['rounds'].min())}–"
            f"{int(cells['rounds'].max())} rounds per cell (minimum {meta['repeats']}, limit {meta['max_repeats']}); "
            f"{len(met)} of {len(cells)} cells reached the ±{meta['precision_pct']:g}% precision target{budget}.")
        if len(missed):
            worst = ", ".join(f"{r.workload} C={r.concurrency} "
                              + (f"±{r.half_width_pct:.1f}%" if np.isfinite(r.half_width_pct) else "one round, no CI")
                              for r in missed.sort_values("half_width_pct", ascending=False).itertuples())
            lines.append(f"  - Not at the target (widest CI half-width reached): {worst}.")
        if stopped := [c for c in meta["cells"] if c.get("out_of_reach_round") is not None]:
            lines.append(f"  - Out of reach of {meta['max_repeats']} rounds at their leads and spread, so given no "
                         "more (docs/racing.md): " + ", ".join(
                             f"{c['workload']} C={c['concurrency']} after {c['out_of_reach_round']}"
                             for c in stopped) + ".")
        per_member = ", ".join(f"`{m}` {s / 60:.1f}" for m, s in meta["member_s"].items())
        lines.append(f"  - Measuring took {meta['measuring_s'] / 60:.1f} min (per setting, min: {per_member}) on a "
                     f"machine streaming {meta['mem_bandwidth_gbs']:.1f} GB/s from memory (one thread).")
        if spread := meta.get("cell_mem_gbs"):
            lines.append(f"  - {machine_sentence(spread)}")
    return lines


def machine_sentence(spread: dict) -> str:
    """How far the machine's own memory speed moved around the cells: the part of the A/A gap no design can pair
    away when the host's other tenants change phase faster than a round."""
    ratio = spread["p95"] / spread["p5"] if spread["p5"] > 0 else float("inf")
    text = (f"The machine's memory speed, probed around each of {spread['cells']} cells: median "
            f"{spread['median']:.1f} GB/s, 5–95% {spread['p5']:.1f}–{spread['p95']:.1f} GB/s (×{ratio:.2f})")
    if ratio < BUSY_SPREAD:
        return text + "."
    return (text + ": a busy host. The CPU engine's speed follows memory speed, so cells of a few seconds "
            "differ by about this much whatever setting they run; expect the A/A gap and the CIs to reflect it.")
