"""The whole analysis: the cost model for every source that has what it needs, its markdown summary, and the
recommendation table's predicted best steps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from workflow_scripts.analysis.acceptance import Histograms, acceptance_by_position, check_histograms
from workflow_scripts.analysis.cost_model.data import (SourceData, decode_lengths, external_data, measured_data,
                                                       speculative_family)
from workflow_scripts.analysis.cost_model.fit import (GOAL_ERROR_PCT, GOAL_SHARE, PARAM_COLUMNS, PREDICTION_COLUMNS,
                                                      VALIDATION_COLUMNS, StepShape, fit, leave_one_out,
                                                      parameter_table, predictions, stated_error, step_shape)
from workflow_scripts.analysis.forward_time import forward_times
from workflow_scripts.analysis.improvement import improvements
from workflow_scripts.analysis.paired import REAL
from workflow_scripts.analysis.study_config import StudyConfig
from workflow_scripts.analysis.summarize import MEASURED, improvement_values


@dataclass
class CostModelReport:
    """Everything the tables, plots and summary show of the model; ``lines`` is its markdown summary."""

    acceptance: pd.DataFrame
    params: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=PARAM_COLUMNS))
    predictions: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=PREDICTION_COLUMNS))
    validation: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=VALIDATION_COLUMNS))
    lines: list[str] = field(default_factory=list)

    @property
    def markdown(self) -> str:
        return "\n".join(self.lines) + "\n"


def analyse(requests: pd.DataFrame, summary: pd.DataFrame, cfg: StudyConfig,
            noise_floor_pct: float | None = None, noise_floor_text: str = "unknown",
            rounds: pd.DataFrame | None = None, profile: pd.DataFrame | None = None) -> CostModelReport:
    """Acceptance by position, and the cost model for every source that has what it needs (else one line why).

    ``rounds`` (metrics.cell_table of the measured requests) pairs the measured speedups by round; ``profile``
    (profiling/forward_profile.py) shapes the measured family's step cost."""
    hist = check_histograms(requests, cfg.steps)
    report = CostModelReport(acceptance=acceptance_by_position(hist, cfg.bootstrap))
    lines = report.lines
    if len(hist.bad):
        lines.append(f"- **Bad histograms**: {len(hist.bad)} request(s) flagged and kept out of the fit "
                     f"(details per request in the analysis log): "
                     + "; ".join(f"{p} ({n}×)" for p, n in hist.bad["problem"].str.replace(r"\d+", "N", regex=True)
                                 .value_counts().items()) + ".")
    sources = [MEASURED] + sorted(set(summary["source"]) - {MEASURED})
    params, preds, vals = [], [], []
    for source in sources:
        present = set(summary.loc[summary["source"] == source, "setting"])
        family, others = speculative_family(cfg, present)
        reason = _skip_reason(source, summary, hist, cfg, family)
        if reason:
            lines.append(f"- Cost model, {source}: skipped: {reason}.")
            continue
        if source == MEASURED:
            data = measured_data(summary, hist, cfg, family, rounds, forward_times(requests),
                                 decode_lengths(requests, cfg.baseline))
            shape = step_shape(profile, cfg, family, set(data.cells["concurrency"]))
        else:
            data, shape = external_data(summary, source, cfg, family), StepShape()
        model = fit(data, family, shape)
        validation = leave_one_out(data, family, shape)
        error_pct = stated_error(validation)
        pred = predictions(data, model, cfg.predict_max_steps, error_pct)
        params.append(parameter_table(source, model, cfg.predict_max_steps, data.cells))
        preds.append(pred)
        vals.append(validation)
        lines += _source_lines(source, data, shape, family, others, validation, error_pct, pred, noise_floor_pct,
                               noise_floor_text, rounds)
    if params:
        report.params = pd.concat(params, ignore_index=True)
        report.predictions = pd.concat(preds, ignore_index=True)
        report.validation = pd.concat(vals, ignore_index=True)
    return report


def _skip_reason(source: str, summary: pd.DataFrame, hist: Histograms, cfg: StudyConfig,
                 family: list[str]) -> str | None:
    rows = summary[summary["source"] == source]
    if not family:
        return "no speculative setting with data"
    if source == MEASURED and hist.valid[hist.valid["setting"].isin(family)].empty:
        return ("no usable spec_correct_drafts_histogram in the request records (the server did not report it, "
                "or every one was flagged)")
    if source != MEASURED and rows.loc[rows["setting"].isin(family), "accept_length_mean"].isna().all():
        return "no accept_length column, so no acceptance to fit"
    if cfg.baseline not in set(rows["setting"]):
        return f"no baseline ({cfg.baseline}) cells, so no plain decode speed to scale the costs from"
    return None


def _source_lines(source: str, data: SourceData, shape: StepShape, family: list[str], others: list[str],
                  validation: pd.DataFrame, error_pct: float, pred: pd.DataFrame, floor: float | None, floor_text: str,
                  rounds: pd.DataFrame | None) -> list[str]:
    left_out = f" ({', '.join(f'`{s}`' for s in others)} left out: another drafter or other server args)" if others else ""
    lines = [f"- Cost model, {source}: fitted on {', '.join(f'`{s}`' for s in family)}{left_out}."]
    lines.append(f"  - Step cost: {shape.text}.")
    if data.geometric:
        lines.append("  - From accept_length alone: one α for every draft position (no per-position acceptance), "
                     "no CIs (no repeats); steps past the measured ones assume that α holds.")
    if validation.empty:
        lines.append("  - Leave-one-setting-out validation needs two speculative settings: predictions come "
                     "without a stated error.")
    else:
        errors = validation["aggregate_error_pct"].abs().dropna()
        share = float((errors <= GOAL_ERROR_PCT).mean()) if len(errors) else float("nan")
        lines.append(f"  - Leave-one-setting-out: |error| of aggregate tok/s median {errors.median():.1f}%, "
                     f"80th percentile {error_pct:.1f}% (the stated error), max {errors.max():.1f}%; "
                     f"{100 * share:.0f}% of {len(errors)} speculative cells within {GOAL_ERROR_PCT:.0f}% "
                     f"(goal: {100 * GOAL_SHARE:.0f}%: {'met' if share >= GOAL_SHARE else 'not met'}).")
    unmeasured = pred[~pred["measured"] & (pred["steps"] > 0) & (pred["profile_error_pct"] > 0)]
    if np.isfinite(error_pct) and len(unmeasured):
        lines.append(f"  - Step counts never measured: stated error ±{unmeasured['stated_error_pct'].min():.1f}–"
                     f"{unmeasured['stated_error_pct'].max():.1f}%, the validation's and the profile's range at that "
                     f"step (its repeats' lowest to highest step cost: ±{unmeasured['profile_error_pct'].min():.1f}–"
                     f"{unmeasured['profile_error_pct'].max():.1f}% of tok/s) in quadrature.")
    lines += _noise_lines(data)
    lines += _step_cost_lines(data, pred)
    lines += _best_steps_lines(pred, floor, floor_text, rounds)
    lines.append("  - " + worth_measuring(pred, floor, floor_text))
    return lines


def _noise_lines(data: SourceData) -> list[str]:
    """What the fit cannot absorb: the spread between repeats, and speedups no step cost can explain."""
    spec = data.cells[(data.cells["steps"] > 0)].dropna(subset=["speedup", "committed_per_verify"])
    impossible = spec[spec["speedup"] > spec["committed_per_verify"]]
    cells = data.cells
    spread = ((cells["aggregate_ci_high"] - cells["aggregate_ci_low"]) / cells["paired_aggregate_tok_s"]).dropna()
    parts = []
    if len(spread):
        parts.append(f"between repeats a cell's aggregate tok/s spans a median {100 * spread.median():.0f}% of its "
                     f"value (95% CI width ÷ median, max {100 * spread.max():.0f}%)")
    if len(impossible):
        worst = impossible.loc[(impossible["speedup"] / impossible["committed_per_verify"]).idxmax()]
        parts.append(f"{len(impossible)} of {len(spec)} speculative cells beat the baseline by more than the tokens "
                     f"their verifies committed (a speculative step cheaper than a plain decode step; worst: "
                     f"`{worst.setting}` {worst.workload} C={worst.concurrency}, ×{worst.speedup:.2f} with "
                     f"{worst.committed_per_verify:.2f} tokens per verify), which only a machine load that changed "
                     "between the settings' runs explains")
    return [f"  - Measurement noise: {'; '.join(parts)}."] if parts else []


def _step_cost_lines(data: SourceData, pred: pd.DataFrame) -> list[str]:
    """The fit's check where the engine timed its forwards: fitted step cost ÷ the measured one, per cell."""
    measured = data.cells.dropna(subset=["measured_step_cost"])
    both = measured.merge(pred[["workload", "concurrency", "steps", "step_cost"]],
                          on=["workload", "concurrency", "steps"])
    ratio = (both["step_cost"] / both["measured_step_cost"]).dropna()
    if ratio.empty:
        return []
    worst = both.loc[(np.log(ratio)).abs().idxmax()]
    return [f"  - Step cost, fitted ÷ measured by the engine's forward times (a speculative step's seconds ÷ a plain "
            f"decode step's): median {ratio.median():.2f}, {ratio.min():.2f}–{ratio.max():.2f} over {len(ratio)} "
            f"cells (furthest: `{worst.setting}` {worst.workload} C={worst.concurrency}, fitted "
            f"{worst.step_cost:.2f} against {worst.measured_step_cost:.2f})."]


def _best_steps_lines(pred: pd.DataFrame, floor: float | None, floor_text: str,
                      rounds: pd.DataFrame | None = None) -> list[str]:
    """Predicted vs measured best steps (aggregate tok/s) per workload × concurrency among the measured steps.

    A cell is scored where the measured best leads the runner-up beyond noise. With rounds that is the verdict every
    improvement of the report gets (analysis/paired.py: the paired CI excludes 0 and the lead passes the floor), so
    a lead of two medians that the rounds do not support scores nothing; without rounds (an external table) the
    medians' gap against the floor decides. A pick that is not the measured best says whether the best beats it."""
    values = improvement_values(rounds) if rounds is not None else None
    agree = clear = 0
    rows, rules = [], set()
    for (workload, conc), g in pred[pred["measured"]].groupby(["workload", "concurrency"]):
        g = g.dropna(subset=["measured_aggregate_tok_s"]).sort_values("measured_aggregate_tok_s", ascending=False)
        if len(g) < 2 or g["predicted_aggregate_tok_s"].isna().all():
            continue
        best, runner_up = g.iloc[0], g.iloc[1]
        pick = g.loc[g["predicted_aggregate_tok_s"].idxmax()]
        lead = _paired_lead(values, runner_up, best, floor)
        if lead is None:
            gap = 100 * (best["measured_aggregate_tok_s"] / runner_up["measured_aggregate_tok_s"] - 1)
            beyond, text = floor is not None and gap > floor, f"gap {gap:.1f}%"
        else:
            beyond, text = floor is not None and lead.verdict == REAL, f"lead over {int(runner_up.steps)} {_fmt(lead)}"
        rules.add(lead is not None)
        clear += beyond
        agree += beyond and best.steps == pick.steps
        row = f"{workload} C={conc}: measured {int(best.steps)}, predicted {int(pick.steps)} ({text})"
        if best.steps != pick.steps and pick.steps != runner_up.steps:
            deficit = _paired_lead(values, pick, best, floor)
            row += f"; best over the pick {_fmt(deficit)}" if deficit is not None else ""
        if best.steps != pick.steps:
            row += _margin(g, pick)
        rows.append(row)
    if not rows:
        return []
    paired = "whose measured lead over the runner-up is beyond noise (its paired CI excludes 0 and it exceeds the " \
             f"noise floor, {floor_text})"
    medians = f"whose measured gap exceeds the noise floor, {floor_text}"
    # a cell whose two best settings share no rounds (measured in other cohorts) falls back to the medians' gap
    if rules == {True}:
        rule = paired
    elif rules == {False}:
        rule = medians
    else:
        rule = f"{paired}, or, where the two were not measured in the same rounds, {medians}"
    head = (f"  - Best steps among the measured ones (aggregate): predicted = measured in {agree} of {clear} cells "
            f"{rule}" if floor is not None
            else f"  - Best steps among the measured ones (aggregate); the noise floor is {floor_text}, so "
                 "agreement cannot be scored")
    return [head + ": " + "; ".join(rows) + "."]


def _margin(cell: pd.DataFrame, pick: pd.Series) -> str:
    """How far the model's pick leads its own second choice among the measured steps, against its stated error: a
    miss by a margin inside that error is a pick the model could not make."""
    others = cell.drop(index=pick.name).dropna(subset=["predicted_aggregate_tok_s"])
    if others.empty:
        return ""
    second = others.loc[others["predicted_aggregate_tok_s"].idxmax()]
    margin = 100 * (pick["predicted_aggregate_tok_s"] / second["predicted_aggregate_tok_s"] - 1)
    return (f"; the model put {int(pick.steps)} over {int(second.steps)} by {margin:.1f}%, against its stated error "
            f"±{pick['stated_error_pct']:.1f}%")


def _paired_lead(values: pd.DataFrame | None, control: pd.Series, candidate: pd.Series,
                 floor: float | None) -> pd.Series | None:
    """The study's paired comparison (analysis/improvement.py) of two measured settings' aggregate tok/s in one
    workload × concurrency, or None where the rounds do not hold both."""
    if values is None:
        return None
    cell = values[(values["workload"] == candidate.workload) & (values["concurrency"] == candidate.concurrency)]
    table = improvements(cell, [("best_steps", control.setting, candidate.setting)],
                         math.nan if floor is None else floor)
    table = table[(table["metric"] == "aggregate_tok_s") & (table["rounds"] > 1)]
    return None if table.empty else table.iloc[0]


def _fmt(row: pd.Series) -> str:
    """``+4.1% [−0.3, +8.0], within noise``: a paired comparison as the report prints it."""
    return f"{row.improvement_pct:+.1f}% [{row.ci_low_pct:+.1f}, {row.ci_high_pct:+.1f}], {row.verdict}"


def worth_measuring(pred: pd.DataFrame, floor: float | None, floor_text: str) -> str:
    """One sentence: the largest predicted gain of an unmeasured step count over the best measured setting, against
    the noise floor and that prediction's stated error."""
    best = None
    for (workload, conc), g in pred.groupby(["workload", "concurrency"]):
        measured = g[g["measured"]].dropna(subset=["measured_aggregate_tok_s"])
        unmeasured = g[~g["measured"]].dropna(subset=["predicted_aggregate_tok_s"])
        if measured.empty or unmeasured.empty:
            continue
        top = unmeasured.loc[unmeasured["predicted_aggregate_tok_s"].idxmax()]
        gain = 100 * (top["predicted_aggregate_tok_s"] / measured["measured_aggregate_tok_s"].max() - 1)
        if best is None or gain > best[0]:
            best = (gain, int(top["steps"]), workload, conc, float(top["stated_error_pct"]))
    if best is None:
        return "Every predicted step count was measured: nothing left to decide by measuring."
    gain, steps, workload, conc, error_pct = best
    if gain <= 0:
        return (f"Measuring more steps is not worth it: no unmeasured step count is predicted to beat the best "
                f"measured setting (closest: steps {steps}, {gain:+.1f}% at {workload} C={conc}).")
    error = f"; the model's stated error is ±{error_pct:.1f}%" if np.isfinite(error_pct) else ""
    if floor is None:
        verdict = f"whether that is worth measuring cannot be judged: the noise floor is {floor_text}"
    elif gain > max(floor, error_pct if np.isfinite(error_pct) else 0):
        verdict = f"above the noise floor ({floor_text}) and the model's error, so it is worth measuring"
    else:
        verdict = f"within the noise floor ({floor_text}) or the model's error, so measuring it is not worth it"
    return f"Steps {steps} is predicted at {gain:+.1f}% over the best measured setting ({workload} C={conc}){error}: " \
           f"{verdict}."


def add_predicted_best(recommendation: pd.DataFrame, report: CostModelReport, cfg: StudyConfig) -> pd.DataFrame:
    """The recommendation table's `predicted_best_steps` (per band × workload × metric) and its stated error."""
    out = recommendation.copy()
    pred = report.predictions[report.predictions["source"] == MEASURED]
    labels, errors = [], []
    for row in out.itertuples(index=False):
        g = pred[(pred["workload"] == row.workload) & pred["concurrency"].isin(cfg.bands.get(row.band, []))]
        by_steps = g.groupby("steps")[f"predicted_{row.metric}"].mean().dropna()
        if by_steps.empty:
            labels.append("")
            errors.append(np.nan)
            continue
        steps = int(by_steps.idxmax())
        measured = bool(g.loc[g["steps"] == steps, "measured"].any())
        labels.append(str(steps) + ("" if measured else " (predicted, not measured)"))
        errors.append(float(g.loc[g["steps"] == steps, "stated_error_pct"].iloc[0]))
    out["predicted_best_steps"] = labels
    out["predicted_error_pct"] = errors
    return out
