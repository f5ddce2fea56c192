"""Adaptive speculation and deployed schedules against the best static setting of each cell, in the same rounds.

A setting with `speculative_adaptive` (SGLang's default tiers, or a schedule from deploy/{workload}/) is measured
beside the static settings, so each of its cells can be judged against the static setting that did best there:
the survivor the race (analysis/decisions.py) ranks first among the static settings, the control included (0
steps), the calibration settings left out. One row per adaptive setting x cell x metric in tables/adaptive.csv:

- `better`: its paired lead over the best static is real (95% CI above 0, beyond the A/A noise floor);
- `worse`: the best static's lead over it is real;
- `equivalent`: neither, and the TOST shows the tie (90% CI inside +-benchmark.equivalence_pct);
- `undecided`: none of these on the rounds measured.

`diff_pct` and its 95% CI are adaptive / best static - 1, paired by round with the study's pooled spread. The
verdict is the race's own challenge (decisions.challenge): the benchmark's round loop judged the same way when it
chose which cells got more rounds.
"""

from __future__ import annotations

import pandas as pd

from workflow_scripts.analysis.decisions import BETTER, UNDECIDED, WORSE, RaceRule, cell_series, race
from workflow_scripts.analysis.improvement import METRICS, Priors
from workflow_scripts.analysis.paired import EQUIVALENT
from workflow_scripts.analysis.study_config import StudyConfig, is_adaptive, is_calibration
from workflow_scripts.analysis.summarize import MEASURED

ADAPTIVE_COLUMNS = ["setting", "workload", "concurrency", "metric", "best_static", "verdict", "diff_pct",
                    "ci_low_pct", "ci_high_pct", "rounds"]


def adaptive_settings(cfg: StudyConfig) -> list[str]:
    return [name for name, args in cfg.settings.items() if is_adaptive(args)]


def static_settings(cfg: StudyConfig) -> list[str]:
    return [name for name, args in cfg.settings.items()
            if not is_adaptive(args) and not is_calibration(args)]


def adaptive_table(values: pd.DataFrame, cfg: StudyConfig, rule: RaceRule, priors: Priors | None = None
                   ) -> pd.DataFrame:
    """tables/adaptive.csv (module doc) from one row per setting and round (summarize.improvement_values): each
    cell's race replayed on its rounds, the adaptive settings its challengers, so the best static setting is the
    race's best among the settings it still measured."""
    adaptive, static = adaptive_settings(cfg), static_settings(cfg)
    rows = []
    measured = values[(values["source"] == MEASURED) & values["setting"].isin([*adaptive, *static])]
    for (workload, concurrency), cell in measured.groupby(["workload", "concurrency"], sort=True):
        series, n_rounds = cell_series(cell)
        result = race(series, cfg.baseline, None, rule, cfg.repeats, n_rounds, priors, challengers=adaptive)
        for metric, by_name in result.challenges.items():
            for name, c in by_name.items():
                rows.append({"setting": name, "workload": workload, "concurrency": int(concurrency),
                             "metric": metric, "best_static": result.verdicts[metric].best, "verdict": c.verdict,
                             "diff_pct": c.lead.diff_pct, "ci_low_pct": c.lead.ci_low_pct,
                             "ci_high_pct": c.lead.ci_high_pct, "rounds": c.lead.rounds})
    return pd.DataFrame(rows, columns=ADAPTIVE_COLUMNS)


def adaptive_lines(adaptive: pd.DataFrame) -> list[str]:
    """The summary's lines: per adaptive setting and metric, the cells where it is equivalent or better than the
    best static setting, and those where it is worse."""
    lines = []
    for (name, metric), group in adaptive.groupby(["setting", "metric"], sort=True):
        counts = group["verdict"].value_counts()
        ok = int(counts.get(BETTER, 0) + counts.get(EQUIVALENT, 0))
        lines.append(f"- `{name}` against the best static setting, {METRICS[metric]}: equivalent or better in "
                     f"**{ok} of {len(group)}** cells ({int(counts.get(BETTER, 0))} better), worse in "
                     f"{int(counts.get(WORSE, 0))}, undecided in {int(counts.get(UNDECIDED, 0))}.")
    return [*lines, ""] if lines else []
