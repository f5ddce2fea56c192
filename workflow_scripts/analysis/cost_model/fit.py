"""The step cost's shape, the cost fit, predictions and leave-one-setting-out validation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import isotonic_regression

from workflow_scripts.analysis.cost_model.data import METRIC_COLUMNS, SourceData
from workflow_scripts.analysis.cost_model.speculation import committed_per_verify, expected_tokens
from workflow_scripts.analysis.study_config import StudyConfig
from workflow_scripts.analysis.summarize import MEASURED

GOAL_ERROR_PCT = 10.0  # a prediction within this |error| of the measured cell counts as right ...
GOAL_SHARE = 0.8  # ... and the model is good enough when this share of the speculative cells are
STATED_QUANTILE = 0.8

PARAM_COLUMNS = ["source", "parameter", "workload", "concurrency", "position", "value", "note"]
PREDICTION_COLUMNS = ["source", "workload", "concurrency", "steps", "setting", "measured", "tokens_per_verify",
                      "committed_per_verify", "step_cost", "predicted_speedup", "predicted_aggregate_tok_s",
                      "predicted_per_request_tok_s", "stated_error_pct", "profile_error_pct",
                      "measured_aggregate_tok_s", "measured_aggregate_ci_low", "measured_aggregate_ci_high", "note"]
VALIDATION_COLUMNS = ["source", "left_out", "steps", "workload", "concurrency", "measured_aggregate_tok_s",
                      "predicted_aggregate_tok_s", "aggregate_error_pct", "measured_per_request_tok_s",
                      "predicted_per_request_tok_s", "per_request_error_pct", "within_goal"]


@dataclass(frozen=True)
class StepShape:
    """What shapes the step cost: u(k, C) per (C, k) from a forward profile ({}: linear in k), half the range of u
    over the profile's repeats per (C, k) (its uncertainty), and a line saying which."""

    units: dict[tuple[int, int], float] = field(default_factory=dict)
    spread: dict[tuple[int, int], float] = field(default_factory=dict)
    text: str = "linear in the drafts"


@dataclass(frozen=True)
class CostFit:
    """One workload's costs: r(k, C) = 1 + overhead + per_draft[C]·u(k, C) plain decode steps per speculative step
    (k = 0: 1), u from ``shape.units`` (the profiled step cost − 1 per (C, k), overhead 0) where given, else k; a
    speculative setting's prefill costs prefill_ratio times the baseline's (None: not measured, 1); a finished
    request's slot stays empty for gaps[C] decode forwards (0 where not measured; committed_per_verify)."""

    overhead: float
    per_draft: dict[int, float]
    prefill_ratio: float | None = None
    shape: StepShape = field(default_factory=StepShape)  # u(k, C) and its spread, from profile_units
    gaps: dict[int, float] = field(default_factory=dict)

    def step_cost(self, steps: int, concurrency: int) -> float:
        if steps == 0:
            return 1.0
        if concurrency not in self.per_draft:
            return float("nan")
        return 1.0 + self.overhead + self.per_draft[concurrency] * draft_units(self.shape.units, steps, concurrency)

    def speedup(self, tokens_per_verify: float, steps: int, concurrency: int, prefill_share: float,
                step_cost: float | None = None) -> float:
        """tok/s(k, C) ÷ tok/s(baseline, C): the decode share sped up by E' ÷ r(k, C) (or ÷ ``step_cost``), the
        prefill share not; ``tokens_per_verify`` is E' (committed_per_verify)."""
        if steps == 0:
            return 1.0
        rho = 1.0 if self.prefill_ratio is None else self.prefill_ratio
        cost = self.step_cost(steps, concurrency) if step_cost is None else step_cost
        return 1.0 / ((1 - prefill_share) * cost / tokens_per_verify + prefill_share * rho)

    def profile_error_pct(self, tokens_per_verify: float, steps: int, concurrency: int, prefill_share: float) -> float:
        """The largest |predicted ÷ true − 1| (%, the validation's convention) if the true step cost lay anywhere
        in the profile's range at (C, k): the step cost ± s_C × half the range of u over the profile's repeats
        (0 without a profile)."""
        spread = self.shape.spread.get((concurrency, steps), 0.0)
        if steps == 0 or not spread:
            return 0.0
        cost, delta = self.step_cost(steps, concurrency), self.per_draft.get(concurrency, np.nan) * spread
        predicted = self.speedup(tokens_per_verify, steps, concurrency, prefill_share)
        # a step that drafts costs at least a plain decode step, however wide the range
        return 100 * max(abs(predicted / self.speedup(tokens_per_verify, steps, concurrency, prefill_share,
                                                      max(cost + d, 1.0)) - 1) for d in (delta, -delta))


def draft_units(units: dict[tuple[int, int], float], steps: int, concurrency: int) -> float:
    """u(k, C): a step's extra work in draft positions, the profiled step cost − 1 (NaN past the profile), or k."""
    if not units:
        return float(steps)
    return units.get((concurrency, steps), float("nan"))


def profile_units(profile: pd.DataFrame | None, concurrencies: set[int]) -> StepShape:
    """The step cost's shape from a forward profile: linear in k without one, or where it lacks one of the
    measured concurrencies."""
    if profile is None or profile.empty:
        return StepShape(text="linear in the drafts (no forward profile of the engine)")
    missing = sorted(concurrencies - set(profile["concurrency"].astype(int)))
    if missing:
        return StepShape(text=f"linear in the drafts (the forward profile lacks C={', '.join(map(str, missing))})")
    units = {}
    for c, g in profile.sort_values("steps").groupby("concurrency"):
        # a step of more drafts never costs less: the medians are made non-decreasing in k, so that one noisy
        # size cannot bend the curve the predictions follow
        cost = isotonic_regression(g["step_cost"].to_numpy(dtype="float64")).x
        units |= {(int(c), int(k)): float(v) - 1 for k, v in zip(g["steps"], cost) if k > 0}
    spread = {(int(r.concurrency), int(r.steps)): (r.step_cost_high - r.step_cost_low) / 2
              for r in profile.itertuples(index=False) if r.steps > 0}
    return StepShape(units, spread, f"shaped by the engine's own step, profiled in-process (steps "
                                    f"1–{int(profile['steps'].max())} at each C), its scale fitted")


def step_shape(profile: pd.DataFrame | None, cfg: StudyConfig, family: Sequence[str],
               concurrencies: set[int]) -> StepShape:
    """The measured family's step cost shape: the engine's forward profile times a STANDALONE step (a draft model's
    forwards), so it shapes only a family that drafts that way; any other family's step is linear in the drafts."""
    algorithms = {str(cfg.settings[s].get("speculative_algorithm", "")).upper() for s in family}
    if profile is not None and algorithms != {"STANDALONE"}:
        return StepShape(text=f"linear in the drafts (the forward profile times a STANDALONE step; the family runs "
                              f"{', '.join(sorted(algorithms))})")
    return profile_units(profile, concurrencies)


def observed_step_cost(cells: pd.DataFrame, prefill_ratio: float) -> pd.Series:
    """Each cell's step cost r in plain decode steps, CostFit.speedup solved for it: the measured speedup with the
    prefill's share (sped up by nothing, and costing ``prefill_ratio`` times the baseline's) taken out, times the
    tokens a verify committed (E')."""
    share = cells["prefill_share"]
    return cells["committed_per_verify"] * (1 / cells["speedup"] - share * prefill_ratio) / (1 - share)


def fit_costs(cells: pd.DataFrame, shape: StepShape | None = None) -> CostFit:
    """Weighted least squares of r_obs on (1, u(k, C) at each C), without the 1 where a profile gives u (it holds
    the step's fixed part); cells: one workload's concurrency, steps, E', speedup, prefill_share, prefill_ratio,
    gap. A cell whose prefill alone would take longer than its measured time (noise) is left out."""
    shape = shape or StepShape()
    units = shape.units
    cells = cells[np.isfinite(cells["committed_per_verify"]) & (cells["speedup"] > 0) & (cells["steps"] > 0)]
    measured_rho = cells["prefill_ratio"].dropna()
    prefill_ratio = float(measured_rho.median()) if len(measured_rho) else None
    gaps = {int(c): float(g.median()) for c, g in cells.dropna(subset=["gap"]).groupby("concurrency")["gap"]}
    r_obs = observed_step_cost(cells, 1.0 if prefill_ratio is None else prefill_ratio)
    cells, r_obs = cells[r_obs > 0], r_obs[r_obs > 0].to_numpy()
    u = np.array([draft_units(units, int(k), int(c)) for k, c in zip(cells["steps"], cells["concurrency"])])
    known = np.isfinite(u)  # a measured step past the profile's last has no shape to fit
    cells, r_obs, u = cells[known], r_obs[known], u[known]
    if cells.empty:
        return CostFit(0.0, {}, prefill_ratio, shape, gaps)
    concs = sorted(cells["concurrency"].unique())
    with_overhead = cells["steps"].nunique() >= 2 and not units
    columns = [np.ones(len(cells))] if with_overhead else []
    columns += [np.where(cells["concurrency"] == c, u, 0.0) for c in concs]
    design = np.column_stack(columns) / r_obs[:, None]  # relative residuals: (r_obs - r) / r_obs
    coef, *_ = np.linalg.lstsq(design, (r_obs - 1) / r_obs, rcond=None)
    overhead = float(coef[0]) if with_overhead else 0.0
    per_draft = dict(zip((int(c) for c in concs), (float(x) for x in coef[1 if with_overhead else 0:])))
    return CostFit(overhead, per_draft, prefill_ratio, shape, gaps)


@dataclass(frozen=True)
class Model:
    alphas: dict[str, list[float]]  # workload -> α per position
    costs: dict[str, CostFit]  # workload -> its step and prefill costs


NO_COSTS = CostFit(0.0, {})  # a workload without fitted cells: every step cost, and so every prediction, is NaN


def fit(data: SourceData, settings: Sequence[str], shape: StepShape) -> Model:
    """α and the costs per workload, from the given settings' cells only."""
    train = data.cells[data.cells["setting"].isin(settings)]
    workloads = sorted(data.cells["workload"].unique())
    alphas = {w: data.alphas_from(settings, w) for w in workloads}
    costs = {w: fit_costs(train[train["workload"] == w], shape) for w in workloads}
    return Model({w: a for w, a in alphas.items() if a}, costs)


def predict(model: Model, base: pd.DataFrame, steps: int,
            lengths: dict[tuple[str, int], np.ndarray] | None = None) -> pd.DataFrame:
    """Predicted metrics at `steps` for each baseline row (workload, concurrency, baseline metrics), the requests
    of the baseline's cell ``lengths`` long (decode_lengths; without them, E' = E)."""
    out = base[["workload", "concurrency"]].copy()
    out["steps"] = steps
    out["tokens_per_verify"] = [expected_tokens(model.alphas[w], steps) if w in model.alphas else np.nan
                                for w in base["workload"]]
    out["committed_per_verify"] = [
        committed_per_verify(model.alphas[w], steps, (lengths or {}).get((w, int(c))),
                             model.costs.get(w, NO_COSTS).gaps.get(int(c), 0.0)) if w in model.alphas else np.nan
        for w, c in zip(base["workload"], base["concurrency"])]
    rows = [(model.costs.get(w, NO_COSTS), e, int(c), f) for w, e, c, f in
            zip(base["workload"], out["committed_per_verify"], base["concurrency"], base["prefill_share"])]
    out["step_cost"] = [costs.step_cost(steps, c) for costs, _, c, _ in rows]
    out["predicted_speedup"] = [costs.speedup(e, steps, c, f) for costs, e, c, f in rows]
    out["profile_error_pct"] = [costs.profile_error_pct(e, steps, c, f) for costs, e, c, f in rows]
    for metric in METRIC_COLUMNS:
        out[f"predicted_{metric}"] = base[metric].to_numpy() * out["predicted_speedup"].to_numpy()
    return out


def _baseline_rows(data: SourceData) -> pd.DataFrame:
    base = data.cells[data.cells["steps"] == 0]
    return base[["workload", "concurrency", "prefill_share", *METRIC_COLUMNS]].reset_index(drop=True)


def leave_one_out(data: SourceData, family: Sequence[str], shape: StepShape) -> pd.DataFrame:
    """Each family setting predicted from the others (needs two settings with data)."""
    rows = []
    present = [s for s in family if s in set(data.cells["setting"])]
    if len(present) < 2:
        return pd.DataFrame(columns=VALIDATION_COLUMNS)
    for left_out in present:
        model = fit(data, [s for s in present if s != left_out], shape)
        truth = data.cells[data.cells["setting"] == left_out]
        steps = int(truth["steps"].iloc[0])
        pred = predict(model, _baseline_rows(data), steps, data.lengths)
        both = truth.merge(pred, on=["workload", "concurrency"], suffixes=("", "_pred"))
        for r in both.itertuples(index=False):
            agg_err = 100 * (r.predicted_aggregate_tok_s / r.paired_aggregate_tok_s - 1)
            req_err = 100 * (r.predicted_per_request_tok_s / r.paired_per_request_tok_s - 1)
            rows.append({"source": data.source, "left_out": left_out, "steps": steps, "workload": r.workload,
                         "concurrency": r.concurrency, "measured_aggregate_tok_s": r.paired_aggregate_tok_s,
                         "predicted_aggregate_tok_s": r.predicted_aggregate_tok_s, "aggregate_error_pct": agg_err,
                         "measured_per_request_tok_s": r.paired_per_request_tok_s,
                         "predicted_per_request_tok_s": r.predicted_per_request_tok_s,
                         "per_request_error_pct": req_err,
                         "within_goal": bool(abs(agg_err) <= GOAL_ERROR_PCT) if np.isfinite(agg_err) else None})
    return pd.DataFrame(rows, columns=VALIDATION_COLUMNS)


def stated_error(validation: pd.DataFrame) -> float:
    """The 80th percentile of |aggregate LOO error| (%), NaN without validation."""
    errors = validation["aggregate_error_pct"].abs().dropna().to_numpy(dtype="float64")
    return float(np.quantile(errors, STATED_QUANTILE)) if len(errors) else float("nan")


def predictions(data: SourceData, model: Model, max_steps: int, error_pct: float) -> pd.DataFrame:
    """Steps 0..max_steps at every measured concurrency per workload, beside the measured values where they exist."""
    base = _baseline_rows(data)
    extra = sorted(set(data.cells["steps"]) - set(range(max_steps + 1)))
    frames = [predict(model, base, int(k), data.lengths) for k in [*range(max_steps + 1), *extra]]
    out = pd.concat(frames, ignore_index=True)
    measured = data.cells.rename(columns={"paired_aggregate_tok_s": "measured_aggregate_tok_s",
                                          "aggregate_ci_low": "measured_aggregate_ci_low",
                                          "aggregate_ci_high": "measured_aggregate_ci_high"})
    out = out.merge(measured[["setting", "steps", "workload", "concurrency", "measured_aggregate_tok_s",
                              "measured_aggregate_ci_low", "measured_aggregate_ci_high"]],
                    on=["steps", "workload", "concurrency"], how="left")
    out["source"] = data.source
    out["measured"] = out["setting"].notna()
    out["setting"] = out["setting"].fillna("")
    # a measured step count's error is the validation's; one never measured adds the profile's own uncertainty
    unmeasured = np.hypot(error_pct, out["profile_error_pct"].fillna(0.0))
    out["stated_error_pct"] = np.where(out["steps"] == 0, 0.0, np.where(out["measured"], error_pct, unmeasured))
    max_measured = {w: len(a) for w, a in model.alphas.items()}
    out["note"] = [_note(k, m, max_measured.get(w, 0)) for k, m, w in out[["steps", "measured", "workload"]].itertuples(
        index=False)]
    return out[PREDICTION_COLUMNS].sort_values(["workload", "concurrency", "steps"]).reset_index(drop=True)


def _note(steps: int, measured: bool, alpha_positions: int) -> str:
    parts = [] if measured or steps == 0 else ["predicted, not measured"]
    if steps > alpha_positions > 0 and not measured:
        parts.append(f"α past position {alpha_positions} extrapolated")
    return "; ".join(parts)


def parameter_table(source: str, model: Model, max_steps: int, cells: pd.DataFrame) -> pd.DataFrame:
    """The fitted parameters, and from ``cells`` (SourceData.cells) the prefill shares and measured step costs."""
    base = cells[cells["steps"] == 0]
    rows = [{"source": source, "parameter": "alpha", "workload": w, "position": p + 1, "value": a,
             "note": "one α for all positions (from accept_length)" if source != MEASURED else ""}
            for w, alphas in model.alphas.items() for p, a in enumerate(alphas)]
    for w, costs in model.costs.items():
        overhead_note = "plain decode steps per speculative step, on top of 1" + (
            "; negative, which no engine does: the fit absorbs speed differences between the settings' runs"
            if costs.overhead < 0 else "")
        rows.append({"source": source, "parameter": "fixed_overhead", "workload": w, "value": costs.overhead,
                     "note": overhead_note})
        for c, s in costs.per_draft.items():
            rows.append({"source": source, "parameter": "per_draft_cost", "workload": w, "concurrency": c, "value": s,
                         "note": "the profiled step cost's extra work scaled to the server's (1: as profiled)"
                         if costs.shape.units else
                         "plain decode steps per draft position (draft forward + one more verified token)"})
            rows += [{"source": source, "parameter": "spec_step_cost", "workload": w, "concurrency": c, "position": k,
                      "value": costs.step_cost(k, c), "note": f"one step with {k} drafts, in plain decode steps"}
                     for k in range(1, max_steps + 1)]
        if costs.prefill_ratio is not None:
            rows.append({"source": source, "parameter": "prefill_ratio", "workload": w, "value": costs.prefill_ratio,
                         "note": "a speculative setting's prefill seconds per token ÷ the baseline's (median of the "
                                 "fitted settings' cells over every concurrency)"})
    rows += [{"source": source, "parameter": "prefill_share", "workload": r.workload, "concurrency": r.concurrency,
              "value": r.prefill_share, "note": "the baseline's prefill-only forwards, share of its forward time "
              "(not sped up by speculation)"} for r in base.itertuples(index=False) if r.prefill_share > 0]
    rows += [{"source": source, "parameter": "measured_step_cost", "workload": r.workload, "concurrency": r.concurrency,
              "position": r.steps, "value": r.measured_step_cost,
              "note": f"`{r.setting}`: its seconds per decode forward ÷ the baseline's, from the engine's forward "
                      "times (the fit's check: compare spec_step_cost)"}
             for r in cells[cells["measured_step_cost"].notna()].itertuples(index=False)]
    return pd.DataFrame(rows, columns=PARAM_COLUMNS)
