"""A speculative-decoding cost model fitted to the study's own cells: why a setting won, and what steps 4, 5, ... do.

    python -m workflow_scripts.analysis.cost_model --study results/embedded-cpu --predict-steps 4 5 \
        [--leave-out steps4 steps5 --out predicted.csv]

The model (Leviathan et al. 2023, with one α per draft position and a cost that depends on concurrency C), fitted
for each workload w on its own:

- tokens per verify with k drafts: E_k = 1 + Σ_{j=1..k} α_1·…·α_j, where α_j is the chance draft position j is
  accepted once the j−1 before it were (``acceptance.py``); positions past the measured ones reuse the last α;
- one speculative step costs r(k, C) = 1 + o + s_C·u(k, C) plain decode steps at the same concurrency. Without
  more knowledge u = k: each draft position adds a draft forward and one more token per row in the verify, s_C
  plain decode steps, and o is a fixed overhead per step (the draft's catch-up on the tokens the last verify
  committed, the acceptance bookkeeping). Where the engine's own step was profiled
  (``profiling/forward_profile.py``: the embedded engine's seconds per decode forward at each C and k, in-process,
  made non-decreasing in k), u(k, C) is the profiled step cost − 1, which holds the fixed part too (o = 0), and
  s_C scales it to what the server pays in the study's cells. The step's cost is not linear in k: at C=64 the
  verify's MoE turns compute-bound and its blocking adds a pass past 256 tokens, and a line through steps 1-3
  misses steps 4 and 5;
- speculation speeds up decode forwards only: where the server reports its forward time by mode (the embedded
  engine's ``specstudy:*_forward_seconds_total``, ``forward_time.py``), a share f of the baseline's forward time
  went to prefill-only forwards, and a speculative setting's prefill costs ρ_w times the baseline's on workload w
  (its draft prefills too, in more and smaller forwards);
- a verify adds E'_k ≤ E_k tokens to the cell (``committed_per_verify``): a request's last verify commits only
  what its length has left (the drafts past EOS or max_new_tokens are lost), and a finished request's slot stays
  empty for g decode forwards until its successor is prefilled, so a setting that commits more per verify
  finishes more requests per forward and runs fewer rows. E'_k = (L̄ + g) ÷ (V̄_k + g), from the baseline's
  lengths L (tokens after the first) and the verifies V_k(L) they need (a renewal count over α); g is measured
  where the engine counts verifies and decode forwards (rows per forward = C·V̄ ÷ (V̄ + g)), 0 elsewhere;
- so tok/s(k, C) = tok/s(baseline, C) ÷ ((1 − f)·r(k, C) ÷ E'_k + f·ρ_w), for aggregate and per-request tok/s
  alike (Amdahl's law; f = 0 without forward times, which is the plain E'_k ÷ r(k, C)).

α comes from the requests' ``spec_correct_drafts_histogram``; f and each setting's ρ from the forward times;
ρ_w is the median ρ of the fitted settings' cells of workload w over every C: one cell's ρ is a ratio of two short
windows' prefill seconds, and in run 11 of the default study the three settings' ρ at synthetic C=32 were 0.40–0.44
where every other cell's were 0.8–1.7. With those, the forward times' own account (1 ÷ ((1 − f)·measured step
cost ÷ E_k + f·ρ)) overshot the measured speedups there by 28–44%, with ρ = 1 by 6–15%, and a per-C ρ moved the
predictions at that C off the workload's own s_C (LOO: 73% of 30 cells within 10% with ρ per workload and C,
83% with ρ_w; run S5 80% and 83%, both with one s_C shared by the workloads). o and s_C come from the measured
speedups by weighted least squares (r_obs = E'_measured · (1 ÷ speedup − f·ρ_w) ÷ (1 − f), relative residuals)
over settings × concurrency. The verify's and the draft's shares of s_C are not separable from throughput (both grow by
one forward per draft); o is fitted only when at least two step counts are measured and no profile shapes the
step, else it is 0.

o, s_C and ρ are a workload's own: the workloads differ in what a step carries (the realistic answers run to 128
tokens, the synthetic ones stop at 64), and the engine's forward times differ with them: in run 12 of the default
study a steps-3 step cost 2.45 plain steps on realistic C=32 and 2.20 on synthetic, 2.95 and 2.62 at
C=64. One s_C shared by both workloads split that difference, over- and under-predicting each (LOO within 10%:
83% → 87% of 30 cells in run 11, 87% → 90% in run 12, 90% → 93% in run 13, 83% → 90% in run S5, and in run S6,
measured after the change, 83% → 90%).

E'_k is what the throughput sees. The embedded engine's gap was 0.7–1.2 forwards at every C ≥ 4 (0 at C=1,
where an empty slot idles the engine instead) in run 12 of the default study and in run S6, and at synthetic C=64
(63 tokens after the first) steps 1–5 committed 2.0–7.9% less per verify than E_k, growing with k. A fit on E_k
charged that to the step cost, which then grew too fast in k for the profiled shape: in run S6 it put steps 3 over
steps 2 at synthetic C=64 by 0.5%, where the rounds measured steps 2 ahead by 3.6% [+2.4, +4.9]; with E'_k it
picks steps 2, and the LOO cells within 10% go from 90% to 93%. Measured after the change: run S7 97% (90% with
E_k), run 14 of the default study 100% (90%), every best-steps cell beyond noise picked right (1 of 1, 3 of 3).

Validation: leave one setting out, fit α and costs on the others, predict its cells; the 80th percentile of the
absolute errors is the *stated error* printed beside every prediction. A step count that was never measured is
predicted where the fit never looked, from the profile's shape alone, so its stated error also holds the profile's
own uncertainty: the step cost moved over the profile's range between its repeats (s_C × half the range of u),
carried through to tok/s and added in quadrature.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import isotonic_regression

from workflow_scripts.analysis.acceptance import Histograms, acceptance_by_position, check_histograms, position_counts
from workflow_scripts.analysis.forward_time import attach, forward_times
from workflow_scripts.analysis.improvement import improvements
from workflow_scripts.analysis.paired import REAL
from workflow_scripts.analysis.study_config import StudyConfig
from workflow_scripts.analysis.summarize import improvement_values
from workflow_scripts.profiling import FORWARD_PROFILE_COLUMNS

log = logging.getLogger(__name__)

MEASURED = "measured"
GOAL_ERROR_PCT = 10.0  # the goal: |LOO error| <= 10% ...
GOAL_SHARE = 0.8  # ... in >= 80% of the speculative cells
STATED_QUANTILE = 0.8
NOISE_FLOOR_FILE = "noise_floor.json"
PROFILE_FILE = "profile/forward_profile.csv"  # in the study's results dir (rules/profile.smk)
STEPS_KEYS = ("speculative_num_steps", "speculative_num_draft_tokens")
METRIC_COLUMNS = {"aggregate_tok_s": "aggregate_tok_s_median", "per_request_tok_s": "per_request_tok_s_median"}

PARAM_COLUMNS = ["source", "parameter", "workload", "concurrency", "position", "value", "note"]
PREDICTION_COLUMNS = ["source", "workload", "concurrency", "steps", "setting", "measured", "tokens_per_verify",
                      "committed_per_verify", "step_cost", "predicted_speedup", "predicted_aggregate_tok_s",
                      "predicted_per_request_tok_s", "stated_error_pct", "profile_error_pct",
                      "measured_aggregate_tok_s", "measured_aggregate_ci_low", "measured_aggregate_ci_high", "note"]
VALIDATION_COLUMNS = ["source", "left_out", "steps", "workload", "concurrency", "measured_aggregate_tok_s",
                      "predicted_aggregate_tok_s", "aggregate_error_pct", "measured_per_request_tok_s",
                      "predicted_per_request_tok_s", "per_request_error_pct", "within_goal"]


# ---- the model --------------------------------------------------------------------------------------------------
def _reach(alphas: Sequence[float], steps: int) -> np.ndarray:
    """P(x > j), j = 0..k, for the tokens x one verify with k drafts commits: 1, α_1, α_1·α_2, ...; α past the
    list reuses its last."""
    alphas = list(alphas[:steps]) + [alphas[-1]] * max(0, steps - len(alphas)) if steps else []
    return np.concatenate([[1.0], np.cumprod(alphas)])


def expected_tokens(alphas: Sequence[float], steps: int) -> float:
    """E_k: tokens one verify commits with k drafts (the bonus token included); α past the list reuses its last."""
    return float(_reach(alphas, steps).sum())


def verifies_to_commit(alphas: Sequence[float], steps: int, max_tokens: int) -> np.ndarray:
    """V(n) for n = 0..max_tokens: the expected verifies a request needs to commit n tokens with k drafts, a
    renewal count over the tokens x one verify commits (P(x > j) = α_1·…·α_j): V(n) = 1 + Σ_x P(x)·V(n − x),
    V(≤ 0) = 0. Its last verify commits only what the length has left."""
    if steps == 0:
        return np.arange(max_tokens + 1, dtype="float64")
    reach = _reach(alphas, steps)
    pmf = reach - np.append(reach[1:], 0.0)  # P(x = j + 1)
    verifies = np.zeros(max_tokens + 1)
    for n in range(1, max_tokens + 1):
        verifies[n] = 1 + pmf @ verifies[np.maximum(n - np.arange(1, steps + 2), 0)]
    return verifies


def committed_per_verify(alphas: Sequence[float], steps: int, lengths: np.ndarray | None, gap: float) -> float:
    """E'_k: the tokens a row's verify adds to the cell's throughput, against the baseline's one per decode forward.

    Two losses grow with E_k. A request's last verify commits only what its length has left: the drafts past EOS or
    max_new_tokens are lost. And the slot of a finished request stays empty for ``gap`` decode forwards, until its
    successor is prefilled; a setting that commits more per verify finishes more requests per forward. With L̄ the
    mean of ``lengths`` (tokens decoded after the first, per request) and V̄_k the mean verifies they need,
    E'_k = (L̄ + g) ÷ (V̄_k + g): the baseline's slots idle g forwards per request too. Without lengths, E_k."""
    if steps == 0:
        return 1.0
    if lengths is None or not len(lengths):
        return expected_tokens(alphas, steps)
    verifies = verifies_to_commit(alphas, steps, int(lengths.max()))[lengths]
    return float((lengths.mean() + gap) / (verifies.mean() + gap))


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
    share, rho = cells["prefill_share"], 1.0 if prefill_ratio is None else prefill_ratio
    r_obs = cells["committed_per_verify"] * (1 / cells["speedup"] - share * rho) / (1 - share)
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


# ---- the study's data in the model's terms ----------------------------------------------------------------------
def speculative_family(cfg: StudyConfig, present: set[str]) -> tuple[list[str], list[str]]:
    """(the largest group of measured speculative settings that differ only in their steps, the others left out)."""
    groups: dict[str, list[str]] = {}
    for name, args in cfg.settings.items():
        if cfg.steps(name) > 0 and name in present:
            rest = {k: v for k, v in args.items() if k not in STEPS_KEYS}
            groups.setdefault(json.dumps(rest, sort_keys=True, default=str), []).append(name)
    if not groups:
        return [], []
    family = max(groups.values(), key=lambda names: len({cfg.steps(n) for n in names}))
    others = [name for names in groups.values() if names is not family for name in names]
    return sorted(family, key=cfg.steps), others


@dataclass
class SourceData:
    """One source's cells (baseline and family settings) and its acceptance, in the model's terms."""

    source: str
    cells: pd.DataFrame  # setting, steps, workload, concurrency, metrics, CIs, tokens_per_verify, speedup
    alphas: dict[str, dict[str, list[float]]]  # geometric sources: setting -> workload -> [the one α]
    counts: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]  # histograms: setting -> workload -> (accepted,
    # reached) per position
    geometric: bool  # α from accept_length under one α for all positions (external data), not from histograms
    shape: StepShape = field(default_factory=StepShape)  # profile_units
    lengths: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)  # decode_lengths

    def alphas_from(self, settings: Sequence[str], workload: str) -> list[float]:
        """α per position pooled over the given settings (counts summed; geometric sources: the mean α)."""
        if self.geometric:
            values = [self.alphas[s][workload][0] for s in settings if workload in self.alphas.get(s, {})]
            return [float(np.mean(values))] if values else []
        accepted: list[float] = []
        reached: list[float] = []
        for s in settings:
            if workload not in self.counts.get(s, {}):
                continue
            acc, rea = self.counts[s][workload]
            for p in range(len(acc)):
                if p == len(accepted):
                    accepted.append(0.0)
                    reached.append(0.0)
                accepted[p] += acc[p]
                reached[p] += rea[p]
        out = []
        for acc, rea in zip(accepted, reached):
            if rea <= 0:
                break
            out.append(acc / rea)
        return out


def _cells_frame(rows: pd.DataFrame, cfg: StudyConfig, **extra) -> pd.DataFrame:
    """Summary rows in the model's terms; numbers coerced to float (an empty external table makes them object)."""
    numbers = {metric: rows[col] for metric, col in METRIC_COLUMNS.items()} | extra
    return pd.DataFrame({
        "setting": rows["setting"], "steps": rows["setting"].map(cfg.steps).astype(int), "workload": rows["workload"],
        "concurrency": pd.to_numeric(rows["concurrency"]).astype(int),
        **{name: pd.to_numeric(pd.Series(values, index=rows.index), errors="coerce").astype("float64")
           for name, values in numbers.items()},
    })


def _with_speedup(cells: pd.DataFrame, baseline: str, rounds: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each cell's speedup over the baseline per metric, and the candidate's tok/s in the baseline's units
    (``paired_*`` = the baseline's median × the speedup: what the model predicts and is validated against).

    With per-round cells (``rounds``: metrics.cell_table rows), a speedup is the paired geometric mean of the
    within-round ratios (analysis/paired.py), so the fit sees the comparison the study's design measured, not two
    medians that machine drift between cohorts can move apart; without, the ratio of the medians."""
    base = cells[cells["setting"] == baseline][["workload", "concurrency", *METRIC_COLUMNS]]
    cells = cells.merge(base, on=["workload", "concurrency"], how="inner", suffixes=("", "_base"))
    paired = _paired_speedups(rounds, baseline) if rounds is not None else {}
    keys = list(cells[["setting", "workload", "concurrency"]].itertuples(index=False, name=None))
    for metric, name in (("aggregate_tok_s", "speedup"), ("per_request_tok_s", "speedup_per_request")):
        unpaired = (cells[metric] / cells[f"{metric}_base"]).to_numpy()
        cells[name] = [paired[(*key, metric)].ratio if (*key, metric) in paired else u
                       for key, u in zip(keys, unpaired)]
        cells[f"paired_{metric}"] = cells[f"{metric}_base"] * cells[name]
    # the paired CI of the aggregate, in the same units (where the rounds give one; else the median's CI stays)
    for bound in ("low", "high"):
        scale = [getattr(paired[(*key, "aggregate_tok_s")], bound) if (*key, "aggregate_tok_s") in paired else np.nan
                 for key in keys]
        cells[f"aggregate_ci_{bound}"] = np.where(np.isfinite(scale), cells["aggregate_tok_s_base"] * scale,
                                                  cells[f"aggregate_ci_{bound}"])
    return cells


@dataclass(frozen=True)
class PairedSpeedup:
    ratio: float  # geometric mean of candidate ÷ baseline over the shared rounds
    low: float  # its 95% CI, as ratios (NaN with one round)
    high: float


def _paired_speedups(rounds: pd.DataFrame, baseline: str) -> dict[tuple[str, str, int, str], PairedSpeedup]:
    """(setting, workload, concurrency, metric) -> the paired speedup over the rounds both were measured in: the
    improvement table's own pairing (analysis/improvement.py), as ratios."""
    others = sorted(set(rounds["setting"]) - {baseline})
    table = improvements(improvement_values(rounds), [("cost", baseline, s) for s in others], math.nan)
    return {(r.candidate, r.workload, int(r.concurrency), r.metric):
            PairedSpeedup(*(1 + pct / 100 for pct in (r.improvement_pct, r.ci_low_pct, r.ci_high_pct)))
            for r in table.itertuples(index=False) if np.isfinite(r.improvement_pct)}


def decode_lengths(requests: pd.DataFrame, baseline: str) -> dict[tuple[str, int], np.ndarray]:
    """(workload, C) -> the tokens each ok, measured request of the baseline decoded after its first
    (output_tokens − 1): what a speculative setting must commit there, the same in distribution for any lossless
    setting; {} where the records lack output_tokens."""
    if "output_tokens" not in requests.columns:
        return {}
    sel = requests[(requests["setting"] == baseline) & requests["ok"] & ~requests["warmup"].astype(bool)]
    sel = sel.dropna(subset=["output_tokens"])
    return {(str(w), int(c)): np.clip(g["output_tokens"].to_numpy(dtype="int64") - 1, 0, None)
            for (w, c), g in sel.groupby(["workload", "concurrency"])}


def _committed(cell: pd.DataFrame, concurrency: int, rows_per_forward: float,
               base_lengths: np.ndarray | None) -> tuple[float, float]:
    """(E', gap) of one measured cell (committed_per_verify), from its valid histograms (one verify per count) and
    output_tokens, the rows its decode forwards verified (forward_time) and the baseline's lengths: its
    tokens per decode forward, C·L̄ ÷ (V̄ + g), ÷ the baseline's, C·L̄_0 ÷ (L̄_0 + g), with the gap
    g = V̄·(C ÷ rows − 1) forwards per request (0 without the rows). (NaN, NaN) where the records lack
    output_tokens or the baseline's lengths are unknown."""
    lengths = cell["output_tokens"].to_numpy(dtype="float64") - 1
    if base_lengths is None or not len(base_lengths) or not np.isfinite(lengths).all():
        return float("nan"), float("nan")
    verifies = np.stack(cell["histogram"].to_numpy()).sum(axis=1)
    mean_v, mean_l, mean_base = verifies.mean(), lengths.mean(), base_lengths.mean()
    gap = max(mean_v * (concurrency / rows_per_forward - 1), 0.0) if np.isfinite(rows_per_forward) else 0.0
    return float(mean_l / (mean_v + gap) * (mean_base + gap) / mean_base), gap


def measured_data(summary: pd.DataFrame, hist: Histograms, cfg: StudyConfig, family: list[str],
                  rounds: pd.DataFrame | None = None, shares: pd.DataFrame | None = None,
                  profile: pd.DataFrame | None = None,
                  lengths: dict[tuple[str, int], np.ndarray] | None = None) -> SourceData:
    """The measured cells of the baseline and the family, with tokens per verify from the valid histograms
    (``tokens_per_verify``, E, and ``committed_per_verify``, E', with the cell's ``gap``: committed_per_verify),
    speedups paired by round when ``rounds`` (metrics.cell_table) is given, the prefill's share of the forward
    time and the measured step cost where ``shares`` (forward_time.forward_times) has them, the step cost's shape
    from the engine's forward ``profile`` (profiling/forward_profile.py) when the family drafts with a model, and
    the baseline's ``lengths`` (decode_lengths)."""
    rows = summary[(summary["source"] == MEASURED) & summary["setting"].isin([cfg.baseline, *family])]
    cells = _cells_frame(rows, cfg, aggregate_ci_low=rows["aggregate_tok_s_ci_low"],
                         aggregate_ci_high=rows["aggregate_tok_s_ci_high"])
    valid = hist.valid[hist.valid["setting"].isin(family)]
    per_cell = {key: 1 + sum(np.arange(len(h)) @ h for h in g["histogram"]) / sum(h.sum() for h in g["histogram"])
                for key, g in valid.groupby(["setting", "workload", "concurrency"])}
    cells["tokens_per_verify"] = [per_cell.get((s, w, c), 1.0 if k == 0 else np.nan)
                                  for s, w, c, k in cells[["setting", "workload", "concurrency", "steps"]].itertuples(
                                      index=False)]
    counts: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for (setting, workload), g in valid.groupby(["setting", "workload"]):
        acc, rea, _ = position_counts(np.stack(g["histogram"].to_numpy()))
        counts.setdefault(setting, {})[workload] = (acc.sum(axis=0), rea.sum(axis=0))
    cells = attach(_with_speedup(cells, cfg.baseline, rounds), shares, cfg.baseline)
    lengths = lengths or {}
    groups = dict(list(valid.groupby(["setting", "workload", "concurrency"])))
    committed = [_committed(groups[(s, w, c)], c, rows, lengths.get((w, c))) if (s, w, c) in groups
                 else (np.nan, np.nan)
                 for s, w, c, rows in cells[["setting", "workload", "concurrency",
                                             "rows_per_forward"]].itertuples(index=False)]
    # without lengths (or for the baseline, E = 1), the histograms' E
    cells["committed_per_verify"] = [e for e, _ in committed]
    cells["committed_per_verify"] = cells["committed_per_verify"].fillna(cells["tokens_per_verify"])
    cells["gap"] = [g for _, g in committed]
    algorithms = {str(cfg.settings[s].get("speculative_algorithm", "")).upper() for s in family}
    if profile is not None and algorithms != {"STANDALONE"}:
        shape = StepShape(text=f"linear in the drafts (the forward profile times a STANDALONE step; the family runs "
                               f"{', '.join(sorted(algorithms))})")
    else:
        shape = profile_units(profile, set(cells["concurrency"]))
    return SourceData(MEASURED, cells, {}, counts, geometric=False, shape=shape, lengths=lengths)


def geometric_alpha(accept_length: float, steps: int) -> float:
    """The one α with E_k(α) = accept_length (bisection: E_k grows with α from 1 to k + 1); NaN out of range."""
    if not 1 <= accept_length <= steps + 1:
        return float("nan")
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens([mid], steps) < accept_length else (low, mid)
    return (low + high) / 2


def external_data(summary: pd.DataFrame, source: str, cfg: StudyConfig, family: list[str]) -> SourceData:
    """An external source's cells; α from its accept_length column under one α for every position."""
    rows = summary[(summary["source"] == source) & summary["setting"].isin([cfg.baseline, *family])]
    cells = _cells_frame(rows, cfg, aggregate_ci_low=np.nan, aggregate_ci_high=np.nan,
                         tokens_per_verify=np.where(rows["setting"] == cfg.baseline, 1.0, rows["accept_length_mean"]))
    alphas: dict[str, dict[str, list[float]]] = {}
    spec = cells[cells["steps"] > 0].dropna(subset=["tokens_per_verify"])
    for (setting, workload), g in spec.groupby(["setting", "workload"]):
        k = int(g["steps"].iloc[0])
        values = [geometric_alpha(e, k) for e in g["tokens_per_verify"]]
        values = [v for v in values if np.isfinite(v)]
        if values:
            alphas.setdefault(setting, {})[workload] = [float(np.mean(values))]
    # an external table has no forward times nor request lengths: the model without the prefill's share, E' = E
    cells = attach(_with_speedup(cells, cfg.baseline), None, cfg.baseline)
    return SourceData(source, cells.assign(committed_per_verify=cells["tokens_per_verify"], gap=np.nan), alphas, {},
                      geometric=True)


# ---- fit, predict, validate -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Model:
    alphas: dict[str, list[float]]  # workload -> α per position
    costs: dict[str, CostFit]  # workload -> its step and prefill costs


NO_COSTS = CostFit(0.0, {})  # a workload without fitted cells: every step cost, and so every prediction, is NaN


def fit(data: SourceData, settings: Sequence[str]) -> Model:
    """α and the costs per workload, from the given settings' cells only."""
    train = data.cells[data.cells["setting"].isin(settings)]
    workloads = sorted(data.cells["workload"].unique())
    alphas = {w: data.alphas_from(settings, w) for w in workloads}
    costs = {w: fit_costs(train[train["workload"] == w], data.shape) for w in workloads}
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


def leave_one_out(data: SourceData, family: Sequence[str]) -> pd.DataFrame:
    """Each family setting predicted from the others (needs two settings with data)."""
    rows = []
    present = [s for s in family if s in set(data.cells["setting"])]
    if len(present) < 2:
        return pd.DataFrame(columns=VALIDATION_COLUMNS)
    for left_out in present:
        model = fit(data, [s for s in present if s != left_out])
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


# ---- the whole analysis -----------------------------------------------------------------------------------------
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


def floor_text(floor: dict) -> tuple[float | None, str]:
    """(noise floor in %, how it is known) from the contents of noise_floor.json (analysis/noise.py)."""
    if floor.get("noise_floor_pct") is None:
        return None, "unknown (no A/A twin measured)"
    pct = float(floor["noise_floor_pct"])
    return pct, f"{pct:.1f}% ({floor.get('schedule', '?')} schedule, {floor.get('rounds', '?')} rounds)"


def read_noise_floor(path: Path) -> tuple[float | None, str]:
    """floor_text of a study's noise_floor.json; None when absent or unreadable."""
    if not path.is_file():
        return None, f"unknown ({path.name} absent)"
    try:
        return floor_text(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as err:
        return None, f"unknown ({path}: {err})"


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
        data = (measured_data(summary, hist, cfg, family, rounds, forward_times(requests), profile,
                              decode_lengths(requests, cfg.baseline))
                if source == MEASURED
                else external_data(summary, source, cfg, family))
        model = fit(data, family)
        validation = leave_one_out(data, family)
        error_pct = stated_error(validation)
        pred = predictions(data, model, cfg.predict_max_steps, error_pct)
        params.append(parameter_table(source, model, cfg.predict_max_steps, data.cells))
        preds.append(pred)
        vals.append(validation)
        lines += _source_lines(source, data, family, others, validation, error_pct, pred, noise_floor_pct,
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


def _source_lines(source: str, data: SourceData, family: list[str], others: list[str], validation: pd.DataFrame,
                  error_pct: float, pred: pd.DataFrame, floor: float | None, floor_text: str,
                  rounds: pd.DataFrame | None) -> list[str]:
    lines = [f"- Cost model, {source}: fitted on {', '.join(f'`{s}`' for s in family)}"
             + (f" ({', '.join(f'`{s}`' for s in others)} left out: another drafter or other server args)" if others else "") + "."]
    lines.append(f"  - Step cost: {data.shape.text}.")
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


def read_profile(path: Path | None, required: bool = True) -> pd.DataFrame | None:
    """A forward profile (profiling/forward_profile.py's CSV); None where there is none and none was required."""
    if path is None or (not required and not path.is_file()):
        return None
    try:
        profile = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise ValueError(f"{path}: not a forward profile ({err})") from err
    if missing := [c for c in FORWARD_PROFILE_COLUMNS if c not in profile.columns]:
        raise ValueError(f"{path}: column(s) {', '.join(missing)} missing (a forward profile has "
                         f"{', '.join(FORWARD_PROFILE_COLUMNS)})")
    return profile


# ---- command line -----------------------------------------------------------------------------------------------
def _study_config(study: Path, config_json: str | None) -> StudyConfig:
    if config_json:
        return StudyConfig.from_json(config_json)
    meta = study / "metadata" / "study.json"
    if not meta.is_file():
        raise ValueError(f"{meta}: not found; pass --config-json with the study config (settings, workloads, analysis)")
    data = json.loads(meta.read_text())
    return StudyConfig.from_dict(data.get("config", data))


def main(argv: list[str] | None = None) -> int:
    from workflow_scripts.analysis.metrics import add_request_metrics, cell_table, load_requests
    from workflow_scripts.analysis.summarize import summarize_external, summarize_measured
    from workflow_scripts.analysis.tables import load_externals

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", type=Path, required=True, help="results/{study}: reads requests/*.parquet")
    parser.add_argument("--config-json", default=None, help="study config as JSON (default: metadata/study.json)")
    parser.add_argument("--predict-steps", type=int, nargs="*", default=None,
                        help="print these step counts (default: 1..analysis.predict_max_steps)")
    parser.add_argument("--out", type=Path, default=None, help="also write the predictions as CSV here")
    parser.add_argument("--forward-profile", type=Path, default=None,
                        help=f"the engine's forward profile (default: {PROFILE_FILE} in the study, where present)")
    parser.add_argument("--linear-step-cost", action="store_true",
                        help="fit the step cost linear in the drafts even where a forward profile exists (to compare)")
    parser.add_argument("--leave-out", nargs="+", default=[], metavar="SETTING",
                        help="fit and predict as if these settings had not been measured (a prediction to check "
                             "against them afterwards)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        cfg = _study_config(args.study, args.config_json)
        if unknown := sorted(set(args.leave_out) - set(cfg.settings)):
            raise ValueError(f"--leave-out: {', '.join(unknown)} not among the study's settings")
        cfg = dataclasses.replace(cfg, settings={k: v for k, v in cfg.settings.items() if k not in args.leave_out})
        if args.predict_steps:
            cfg = dataclasses.replace(cfg, predict_max_steps=max(cfg.predict_max_steps, *args.predict_steps))
        paths = sorted((args.study / "requests").glob("*.parquet"))
        requests = add_request_metrics(load_requests(paths))
        # the A/A twin is the control again; left-out settings were never measured, as far as the fit knows
        requests = requests[(requests["setting"] != cfg.twin) & ~requests["setting"].isin(args.leave_out)]
        rounds = cell_table(requests)
        summary = pd.concat([summarize_measured(requests, rounds, cfg.bootstrap),
                             summarize_external(load_externals(cfg))], ignore_index=True)
        profile = None if args.linear_step_cost else read_profile(args.forward_profile or args.study / PROFILE_FILE,
                                                                   required=bool(args.forward_profile))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    floor, floor_text = read_noise_floor(args.study / "tables" / NOISE_FLOOR_FILE)
    report = analyse(requests, summary, cfg, floor, floor_text, rounds, profile)
    print(report.markdown)
    pred = report.predictions
    if args.predict_steps:
        pred = pred[pred["steps"].isin(args.predict_steps)]
    if len(pred):
        shown = pred[["source", "workload", "concurrency", "steps", "predicted_aggregate_tok_s", "stated_error_pct",
                      "predicted_per_request_tok_s", "measured_aggregate_tok_s", "note"]]
        print(shown.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    if args.out:
        from workflow_scripts.analysis.output import write_csv

        write_csv(pred, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
