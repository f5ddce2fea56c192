"""The study's data in the model's terms: each source's cells (baseline and the speculative family), their paired
speedups, tokens per verify and acceptance, from the measured requests or from an external table."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from workflow_scripts.analysis.acceptance import Histograms, position_counts
from workflow_scripts.analysis.cost_model.speculation import geometric_alpha
from workflow_scripts.analysis.forward_time import attach
from workflow_scripts.analysis.improvement import improvements
from workflow_scripts.analysis.study_config import StudyConfig, is_calibration
from workflow_scripts.analysis.summarize import MEASURED, improvement_values

STEPS_KEYS = ("speculative_num_steps", "speculative_num_draft_tokens")
METRIC_COLUMNS = {"aggregate_tok_s": "aggregate_tok_s_median", "per_request_tok_s": "per_request_tok_s_median"}


def speculative_family(cfg: StudyConfig, present: set[str]) -> tuple[list[str], list[str]]:
    """(the largest group of measured speculative settings that differ only in their steps, the others left out).
    Fixed-acceptance calibration settings are neither: their acceptance is set, not measured (analysis/calibration.py
    fits their step cost)."""
    groups: dict[str, list[str]] = {}
    for name, args in cfg.settings.items():
        if cfg.steps(name) > 0 and name in present and not is_calibration(args):
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
                  lengths: dict[tuple[str, int], np.ndarray] | None = None) -> SourceData:
    """The measured cells of the baseline and the family, with tokens per verify from the valid histograms
    (``tokens_per_verify``, E, and ``committed_per_verify``, E', with the cell's ``gap``: committed_per_verify),
    speedups paired by round when ``rounds`` (metrics.cell_table) is given, the prefill's share of the forward
    time and the measured step cost where ``shares`` (forward_time.forward_times) has them, and the baseline's
    ``lengths`` (decode_lengths)."""
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
    return SourceData(MEASURED, cells, {}, counts, geometric=False, lengths=lengths)


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
