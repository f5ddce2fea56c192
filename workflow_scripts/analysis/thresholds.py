"""A deployed schedule at its switching thresholds: on both sides of each breakpoint, the schedule against the
static setting whose steps it runs there, in the same rounds.

Why: a server at concurrency C decodes batches of C and, each time a request ends and its successor waits for its
prefill, of a few fewer. At a C on a breakpoint those dips cross it, so the schedule switches tiers within the
cell; vLLM users report throughput collapsing at such a threshold. A schedule that holds the throughput of the
static setting it runs, on both sides, shows no such cost. Measure concurrencies on the breakpoints (for the
default bands, batch 2 and 23: C = 1, 2, 22, 23) to probe the switching itself; with the study's own grid the
rows are the nearest cells on either side.

tables/thresholds.csv has one row per schedule x workload x breakpoint x side x metric: the nearest measured
concurrency below the breakpoint (`below`) and the nearest at or above it (`above`), the steps the schedule runs
there, the static setting with those steps (the control for 0 steps; else one of the schedule's algorithm), and
the race's verdict of the schedule against it (decisions.challenge). Only a schedule (one tier per batch-size
entry) has fixed steps per band: SGLang's tiered configs adapt within a band and get no rows.
"""

from __future__ import annotations

import pandas as pd

from workflow_scripts.analysis.adaptive_check import adaptive_settings
from workflow_scripts.analysis.decisions import BETTER, UNDECIDED, WORSE, RaceRule, cell_series, challenge
from workflow_scripts.analysis.improvement import METRICS, Priors
from workflow_scripts.analysis.paired import EQUIVALENT
from workflow_scripts.analysis.schedule import static_speculative
from workflow_scripts.analysis.study_config import StudyConfig
from workflow_scripts.analysis.summarize import MEASURED
from workflow_scripts.engine.adaptive import batch_entries, load_adaptive_config, route

THRESHOLD_COLUMNS = ["setting", "workload", "breakpoint", "side", "concurrency", "steps", "metric", "static",
                     "verdict", "diff_pct", "ci_low_pct", "ci_high_pct", "rounds"]


def fixed_tiers(adaptive_config: dict) -> dict[int, int] | None:
    """Batch-size key -> its one tier, for a schedule's config; None when an entry has several (SGLang's tiers)."""
    entries = batch_entries(adaptive_config)
    if any(len(set(entry["candidate_steps"])) != 1 for entry in entries.values()):
        return None
    return {size: entries[size]["candidate_steps"][0] for size in sorted(entries)}


def schedule_tiers(setting: dict) -> dict[int, int] | None:
    """fixed_tiers of a setting's adaptive config; None without one (SGLang's default tiers)."""
    path = setting.get("speculative_adaptive_config")
    return None if path is None else fixed_tiers(load_adaptive_config(path))


def steps_at(tiers: dict[int, int], batch: int) -> int:
    """The tier a batch of `batch` runs, routed as the engine routes it (engine/adaptive.route)."""
    return tiers[route(sorted(tiers), batch)]


def static_with_steps(cfg: StudyConfig, setting: dict, steps: int) -> str | None:
    """The static setting that runs `steps` the way the schedule does: the control for 0, else the first (by name)
    of the schedule's algorithm with that many steps; None when the study has none."""
    if steps == 0:
        return cfg.baseline
    algorithm = setting.get("speculative_algorithm")
    names = sorted(name for name, s in static_speculative(cfg).items()
                   if s["speculative_algorithm"] == algorithm and cfg.steps(name) == steps)
    return names[0] if names else None


def threshold_table(values: pd.DataFrame, cfg: StudyConfig, rule: RaceRule, priors: Priors | None = None
                    ) -> pd.DataFrame:
    """tables/thresholds.csv (module doc) from one row per setting and round (summarize.improvement_values)."""
    rows = []
    measured = values[values["source"] == MEASURED]
    for name in adaptive_settings(cfg):
        setting = cfg.settings[name]
        tiers = schedule_tiers(setting)
        if not tiers:
            continue
        for workload, frame in measured.groupby("workload", sort=True):
            concurrencies = sorted(int(c) for c in frame["concurrency"].unique())
            for breakpoint_ in list(tiers)[1:]:
                sides = (("below", [c for c in concurrencies if c < breakpoint_][-1:]),
                         ("above", [c for c in concurrencies if c >= breakpoint_][:1]))
                for side, nearest in sides:
                    for concurrency in nearest:
                        steps = steps_at(tiers, concurrency)
                        static = static_with_steps(cfg, setting, steps)
                        series, _ = cell_series(frame[frame["concurrency"] == concurrency])
                        for metric in METRICS:
                            if static is None or not {name, static} <= series[metric].keys():
                                continue
                            result = challenge(series[metric], static, name, rule, prior=(priors or {}).get(metric))
                            rows.append({"setting": name, "workload": workload, "breakpoint": breakpoint_,
                                         "side": side, "concurrency": concurrency, "steps": steps, "metric": metric,
                                         "static": static, "verdict": result.verdict,
                                         "diff_pct": result.lead.diff_pct, "ci_low_pct": result.lead.ci_low_pct,
                                         "ci_high_pct": result.lead.ci_high_pct, "rounds": result.lead.rounds})
    return pd.DataFrame(rows, columns=THRESHOLD_COLUMNS)


def threshold_lines(thresholds: pd.DataFrame) -> list[str]:
    """The summary's lines: per schedule and metric, on how many sides of its breakpoints it held the static
    setting it runs there, and where it fell behind."""
    lines = []
    for (name, metric), group in thresholds.groupby(["setting", "metric"], sort=True):
        counts = group["verdict"].value_counts()
        ok = int(counts.get(BETTER, 0) + counts.get(EQUIVALENT, 0))
        behind = "; ".join(f"{r.workload} C = {r.concurrency} ({r.side} batch {r.breakpoint}) "
                           f"{r.diff_pct:+.1f}% against {r.static}"
                           for r in group[group["verdict"] == WORSE].itertuples())
        breakpoints = ", ".join(str(b) for b in sorted(group["breakpoint"].unique()))
        lines.append(f"- `{name}` at its breakpoints (batch {breakpoints}) against the static setting it runs on "
                     f"each side, {METRICS[metric]}: equivalent or better on **{ok} of {len(group)}** sides, "
                     f"worse on {int(counts.get(WORSE, 0))}{f' ({behind})' if behind else ''}, undecided on "
                     f"{int(counts.get(UNDECIDED, 0))}.")
    return [*lines, ""] if lines else []
