"""Racing: which settings of a cell are still worth measuring, and when a cell is decided.

One rule serves the benchmark's round loop (which settings the next round measures) and the tables
(tables/decisions.csv), so a design is judged by what it measured, never by a second reading of the data.
The anchors are F-race / irace and successive elimination; every comparison is paired within rounds
(analysis/paired.py), and one metric of one cell (workload x concurrency) is judged at a time:

- the *best* is the survivor with the highest geometric-mean ratio against the control over the rounds so far;
- another survivor is *beaten* when the best's lead over it is real: the paired 95% CI of best / other lies wholly
  above 0 and the lead exceeds the A/A noise floor (the test `verdict` applies to every improvement);
- it is *equivalent* to the best when a TOST at 5% per side shows the tie: the paired 90% CI lies wholly inside
  +-`equivalence_pct` (a margin below the noise floor could only be shown by luck, hence the default of 4%);
- a metric is *decided* once every other survivor is beaten (`winner`) or beaten or equivalent, at least one
  equivalent (`equivalent`); otherwise it is `undecided`.

A setting beaten on both metrics at a round boundary is *eliminated* from the cell: the rounds from then on do not
measure it, and it keeps the rounds it has. The control and its A/A twin are never eliminated: they carry the floor,
and the twin is never a contender (it is the control again). A cell whose metrics are all decided gets no more
rounds. The rule starts after `repeats` rounds; before that nothing is judged.

A metric is *out of reach* when `max_repeats` rounds could not decide it were the leads and their spread what they
are now: for some survivor neither beaten nor tied, the CIs at that many rounds (narrowed by the rounds and by the
degrees of freedom they add) would still show neither a real lead nor a tie. A cell whose metrics are each decided
or out of reach gets no more rounds either (a futility stop): the rounds it would take go to cells a round can
still decide, and the study ends sooner. Its verdict stays `undecided`.

The same projection says what an undecided metric would cost to decide (`rounds_needed` in tables/decisions.csv):
the fewest rounds at which, at the present leads and spread, every survivor would be beaten or shown tied; inf
beyond ROUNDS_CAP (a lead that sits on a margin: about the noise floor, or about the equivalence margin), NaN
while unknown (a comparison with fewer than two rounds). The summary turns it into the budget of a rerun.

*Challengers* (adaptive speculation and deployed schedules) are measured every round but never race: each is
judged against the best of the race, `better`, `worse`, `equivalent` or `undecided` by the same tests
(`challenge`), and a cell is decided only once every challenger is, settled once each is decided or out of reach.
So a schedule check can race: beaten static settings drop out, and the rounds go to the cells whose schedules'
verdicts are still open.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from workflow_scripts.analysis.improvement import METRICS, Priors
from workflow_scripts.analysis.paired import (EQUIVALENT, NO_PAIRS, TOST_CI, Paired, VariancePrior, equivalent,
                                              paired_ratio)

WINNER, UNDECIDED = "winner", "undecided"
BETTER, WORSE = "better", "worse"  # a challenger against the best of the race
DECISION_COLUMNS = ["workload", "concurrency", "metric", "decision", "best", "runner_up", "lead_pct", "ci_low_pct",
                    "ci_high_pct", "rounds", "eliminated", "rounds_needed", "round_s"]
ROUNDS_CAP = 64  # rounds_needed looks no further: a lead this hard to tell from a margin is not worth a budget

# one metric of one cell: member -> round -> value
Series = dict[str, dict[int, float]]


@dataclass(frozen=True)
class RaceRule:
    """The margins of the race: the equivalence margin and the A/A noise floor (NaN: the CI alone decides)."""

    equivalence_pct: float
    floor_pct: float = math.nan

    def __post_init__(self) -> None:
        if not self.equivalence_pct > 0:
            raise ValueError(f"benchmark.equivalence_pct: must be > 0, got {self.equivalence_pct}")

    def beaten(self, lead: Paired) -> bool:
        """The best's lead over another setting (best / other, paired) is real: CI above 0, beyond the floor."""
        return (math.isfinite(lead.ci_low_pct) and lead.ci_low_pct > 0
                and (not math.isfinite(self.floor_pct) or lead.diff_pct > self.floor_pct))

    def equivalent(self, tost: Paired) -> bool:
        """TOST: the 90% paired CI lies wholly inside +-equivalence_pct."""
        return equivalent(tost, self.equivalence_pct)


def aligned(series: Series, base: str, cand: str, before: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The values of base and cand over the rounds both have (before round `before`, when given), by round."""
    rounds = sorted(r for r in series.get(base, {}).keys() & series.get(cand, {}).keys()
                    if before is None or r < before)
    return (np.array([series[base][r] for r in rounds], dtype="float64"),
            np.array([series[cand][r] for r in rounds], dtype="float64"))


def pair(series: Series, base: str, cand: str, before: int | None = None, ci: float = 0.95,
         prior: VariancePrior | None = None) -> Paired:
    """cand / base over the rounds both have (before round `before`, when given), its CI pooled with `prior`."""
    return paired_ratio(*aligned(series, base, cand, before), ci, prior)


@dataclass(frozen=True)
class Verdict:
    """One metric of one cell: the decision, the best and runner-up survivors, and the best's lead over the latter."""

    decision: str
    best: str | None
    runner_up: str | None
    lead: Paired
    beaten: frozenset[str]
    out_of_reach: bool = False  # undecided, and max_rounds could not decide it at the present leads
    rounds_needed: float = math.nan  # undecided: the rounds that would decide it at the present leads (module doc)


def rounds_needed(lead: Paired, tost: Paired, rule: RaceRule, cap: int = ROUNDS_CAP) -> float:
    """The fewest rounds (at least those measured) at which the best would be decided against one survivor, were
    the lead (best / other) and its spread what they are now (Paired.projected): a real lead, or a shown tie. inf
    beyond `cap`; NaN while unknown (fewer than two rounds, or no spread yet). A projected CI only narrows as rounds
    are added, so the first round that decides is found by bisection."""
    if lead.rounds < 2 or not (math.isfinite(lead.var) and math.isfinite(tost.var)):
        return math.nan

    def decides(rounds: int) -> bool:
        return rule.beaten(lead.projected(rounds)) or rule.equivalent(tost.projected(rounds))

    low, high = lead.rounds, max(cap, lead.rounds)
    if decides(low):
        return float(low)
    if not decides(high):
        return math.inf
    while high - low > 1:  # decides(high) and not decides(low)
        mid = (low + high) // 2
        low, high = (low, mid) if decides(mid) else (mid, high)
    return float(high)


def judge(series: Series, control: str, survivors: list[str], rule: RaceRule, before: int | None = None,
          prior: VariancePrior | None = None, max_rounds: int | None = None) -> Verdict:
    """The verdict of one metric over the survivors (the control among them), from the rounds before `before`,
    every CI pooled with `prior` (paired.VariancePrior); undecided and given `max_rounds`, whether it is out of
    reach and the rounds it needs (module doc)."""
    def score(member: str) -> float:
        diff = 0.0 if member == control else pair(series, control, member, before).diff_pct
        return diff if math.isfinite(diff) else -math.inf

    ranked = sorted(survivors, key=lambda m: (-score(m), m))
    if not ranked or not math.isfinite(score(ranked[0])):
        return Verdict(UNDECIDED, None, None, NO_PAIRS, frozenset())
    best, others = ranked[0], ranked[1:]
    leads = {o: pair(series, o, best, before, prior=prior) for o in others}
    beaten = frozenset(o for o in others if rule.beaten(leads[o]))
    tosts = {o: pair(series, o, best, before, TOST_CI, prior) for o in others if o not in beaten}
    tied = [o for o, tost in tosts.items() if rule.equivalent(tost)]
    out_of_reach, needed = False, math.nan
    if len(beaten) + len(tied) < len(others) or any(leads[o].rounds < 2 for o in others):
        decision = UNDECIDED
        if max_rounds is not None:
            needs = [rounds_needed(leads[o], tost, rule, max(ROUNDS_CAP, max_rounds))
                     for o, tost in tosts.items() if o not in tied]
            out_of_reach = any(n > max_rounds for n in needs)  # NaN (unknown): within reach
            needed = max(needs) if needs and not any(math.isnan(n) for n in needs) else math.nan
    else:
        decision = EQUIVALENT if tied else WINNER
    runner = others[0] if others else None
    return Verdict(decision, best, runner, leads[runner] if runner else NO_PAIRS, beaten, out_of_reach, needed)


@dataclass(frozen=True)
class Challenge:
    """A challenger against the best of the race on one metric of a cell (module doc)."""

    verdict: str  # BETTER | WORSE | EQUIVALENT | UNDECIDED
    lead: Paired  # challenger / best, paired by round
    out_of_reach: bool = False  # undecided, and max_rounds could not decide it at the present lead


def challenge(series: Series, best: str, name: str, rule: RaceRule, before: int | None = None,
              prior: VariancePrior | None = None, max_rounds: int | None = None) -> Challenge:
    """`name` against `best` by the race's tests: a real lead either way, else a shown tie, else undecided (and
    given `max_rounds`, whether that many rounds could decide it)."""
    lead, behind = pair(series, best, name, before, prior=prior), pair(series, name, best, before, prior=prior)
    tost = pair(series, best, name, before, TOST_CI, prior)
    if rule.beaten(lead):
        return Challenge(BETTER, lead)
    if rule.beaten(behind):
        return Challenge(WORSE, lead)
    if rule.equivalent(tost):
        return Challenge(EQUIVALENT, lead)
    ahead = lead if lead.diff_pct > 0 else behind  # the direction a real lead could still come from
    out_of_reach = max_rounds is not None and rounds_needed(ahead, tost, rule, max(ROUNDS_CAP, max_rounds)) > max_rounds
    return Challenge(UNDECIDED, lead, out_of_reach)


@dataclass
class Race:
    """A cell's race so far: who was eliminated at which round, the verdict per metric and, per metric, each
    challenger's against its best."""

    eliminated: dict[str, int] = field(default_factory=dict)  # member -> first round it was not measured in
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    challenges: dict[str, dict[str, Challenge]] = field(default_factory=dict)  # metric -> challenger -> challenge

    @property
    def decided(self) -> bool:
        return (bool(self.verdicts) and all(v.decision != UNDECIDED for v in self.verdicts.values())
                and all(c.verdict != UNDECIDED for c in self._challenges()))

    @property
    def settled(self) -> bool:
        """No round more is worth it: every metric and every challenge decided or out of reach."""
        return (bool(self.verdicts) and all(v.decision != UNDECIDED or v.out_of_reach for v in self.verdicts.values())
                and all(c.verdict != UNDECIDED or c.out_of_reach for c in self._challenges()))

    def _challenges(self) -> list[Challenge]:
        return [c for by_name in self.challenges.values() for c in by_name.values()]

    def eliminated_text(self, before: int) -> str:
        """`setting@round;...` in the order they went, of the eliminations before round `before`."""
        gone = sorted((r, m) for m, r in self.eliminated.items() if r < before)
        return ";".join(f"{m}@{r}" for r, m in gone)


def race(metrics: dict[str, Series], control: str, twin: str | None, rule: RaceRule, start: int,
         upto: int, priors: Priors | None = None, bystanders: Collection[str] = (),
         max_rounds: int | None = None, challengers: Collection[str] = ()) -> Race:
    """Replay the race of one cell: at each round boundary r in [start, upto], judged on the rounds before r,
    eliminate what is beaten on every metric from round r on; the verdicts are those at `upto`, before its own
    eliminations. Deterministic in the data, so a resumed benchmark job and the tables reach the same ones.
    `priors` (per metric) pool the CIs' spread; the benchmark's round loop fits them on the rounds before `upto`.
    `bystanders` are measured every round but never race: fixed-acceptance calibration settings, which no deployment
    can run. `challengers` are measured every round too, and judged against each metric's best at `upto` (module
    doc). With `max_rounds`, the verdicts at `upto` say which undecided metrics and challenges are out of reach."""
    members = sorted({m for series in metrics.values() for m in series} - {twin} - set(bystanders) - set(challengers))
    out = Race()
    for boundary in range(min(max(start, 2), upto), upto + 1):
        survivors = [m for m in members if m not in out.eliminated]
        verdicts = {metric: judge(series, control, survivors, rule, boundary, (priors or {}).get(metric),
                                  max_rounds if boundary == upto else None)
                    for metric, series in metrics.items()}
        if boundary == upto:
            out.verdicts = verdicts
            out.challenges = {metric: {c: challenge(metrics[metric], v.best, c, rule, upto, (priors or {}).get(metric),
                                                    max_rounds) for c in sorted(challengers) if c in metrics[metric]}
                              for metric, v in verdicts.items() if v.best is not None}
        for m in survivors:
            if m != control and all(m in v.beaten for v in verdicts.values()):
                out.eliminated[m] = boundary
    return out


def cell_series(cell: pd.DataFrame) -> tuple[dict[str, Series], int]:
    """One cell's rows (a setting x round each) as metric -> Series, and its number of rounds. Rounds are counted
    over the cell's cohorts in order (cohort, repeat), so a cell measured in two cohorts races over both."""
    keys = sorted(set(zip(cell["cohort"], cell["repeat"])))
    index = {key: i for i, key in enumerate(keys)}
    cell = cell.assign(round=[index[k] for k in zip(cell["cohort"], cell["repeat"])])
    series = {metric: {setting: {int(r): float(v) for r, v in zip(g["round"], g[metric]) if np.isfinite(v)}
                       for setting, g in cell.groupby("setting")} for metric in METRICS}
    return series, len(keys)


def round_seconds(requests: pd.DataFrame) -> dict[tuple[str, int], float]:
    """(workload, concurrency) -> the wall seconds of the cell's last round over all its members (the A/A twin's
    too): from the first member's start to the last one's end, or the sum of their cells where that is shorter
    (a blocked design measures other cells between them). Records without cell timing give none."""
    if not {"cell_start_ts", "cell_wall_s"} <= set(requests.columns):
        return {}
    keys = ["workload", "concurrency", "cohort", "repeat"]
    timing = requests.groupby([*keys, "setting"])[["cell_start_ts", "cell_wall_s"]].first().dropna().reset_index()
    out = {}
    for (workload, concurrency), cell in timing.groupby(["workload", "concurrency"]):
        last = cell[(cell["cohort"] == cell["cohort"].max())]
        last = last[last["repeat"] == last["repeat"].max()]
        span = float((last["cell_start_ts"] + last["cell_wall_s"]).max() - last["cell_start_ts"].min())
        out[(str(workload), int(concurrency))] = min(span, float(last["cell_wall_s"].sum()))
    return out


def decision_table(values: pd.DataFrame, control: str, twin: str | None, rule: RaceRule, start: int,
                   priors: Priors | None = None, bystanders: Collection[str] = (), max_rounds: int | None = None,
                   round_s: dict[tuple[str, int], float] | None = None, challengers: Collection[str] = ()
                   ) -> pd.DataFrame:
    """tables/decisions.csv: the race of every measured cell replayed on its rounds, one row per metric, with the
    rounds an undecided metric needs (module doc; out of reach beyond `max_rounds`) and the seconds its cell's last
    round took (`round_s`: round_seconds).

    ``values`` has one row per setting and round (columns setting, workload, concurrency, cohort, repeat and the
    metrics, as analysis/summarize.improvement_values gives), its rounds counted as cell_series counts them."""
    rows = []
    for (workload, concurrency), cell in values.groupby(["workload", "concurrency"], sort=True):
        series, n_rounds = cell_series(cell)
        result = race(series, control, twin, rule, start, n_rounds, priors, bystanders,
                      ROUNDS_CAP if max_rounds is None else max_rounds, challengers)
        for metric in METRICS:
            v = result.verdicts[metric]
            rows.append({"workload": workload, "concurrency": int(concurrency), "metric": metric,
                         "decision": v.decision, "best": v.best or "", "runner_up": v.runner_up or "",
                         "lead_pct": v.lead.diff_pct, "ci_low_pct": v.lead.ci_low_pct,
                         "ci_high_pct": v.lead.ci_high_pct, "rounds": n_rounds,
                         "eliminated": result.eliminated_text(n_rounds), "rounds_needed": v.rounds_needed,
                         "round_s": (round_s or {}).get((str(workload), int(concurrency)), math.nan)})
    return pd.DataFrame(rows, columns=DECISION_COLUMNS)


def twin_faster_share(aa: pd.DataFrame) -> float:
    """The share of cells x metrics where the A/A twin ran faster than the control: about half when nothing but
    noise separates them, near 0 or 1 when something systematic does (turn position, or the one offset between the
    two server instances that a study without restarts draws)."""
    diffs = aa["diff_pct"].dropna()
    return float((diffs > 0).mean()) if len(diffs) else math.nan


def decision_lines(decisions: pd.DataFrame, aa: pd.DataFrame, cells: pd.DataFrame, max_rounds: int) -> list[str]:
    """The summary's opening block: cells decided of the total per metric, what deciding the rest would cost
    (rerun_lines), the rounds, eliminations and measured requests of each cell (``cells``: tables/cells.csv; a
    time-boxed cell completes as many as its time allows), and how often the A/A twin ran faster (far from one
    half: the instances' offset, or a bias)."""
    if decisions.empty:
        return ["## Decisions", "", "No cell was measured.", ""]
    lines = ["## Decisions", ""]
    for metric, group in decisions.groupby("metric", sort=False):
        counts = group["decision"].value_counts()
        lines.append(f"- **{METRICS.get(metric, metric)}: {int((group['decision'] != UNDECIDED).sum())} of "
                     f"{len(group)} cells decided** ({int(counts.get(WINNER, 0))} with a real winner, "
                     f"{int(counts.get(EQUIVALENT, 0))} equivalent, {int(counts.get(UNDECIDED, 0))} undecided).")
    share = twin_faster_share(aa)
    if math.isfinite(share):
        lines.append(f"- The A/A twin ran faster than the control in {share:.0%} of "
                     f"{int(aa['diff_pct'].notna().sum())} cells × metrics (near one half when nothing favours "
                     "either). A server's start position changes its speed (docs/measurements/launch_order.md): "
                     "launch and turn order are shuffled from `benchmark.seed`, and the servers start again in "
                     "the reverse order after the first round (`counterbalance_launches`), so a pair of rounds "
                     "averages the positions out; the noise floor bounds what is left.")
    lines += rerun_lines(decisions, max_rounds)
    rows = []
    for (workload, conc), cell in decisions.groupby(["workload", "concurrency"], sort=True):
        by_metric = {r.metric: r for r in cell.itertuples()}
        at = (cells["workload"] == workload) & (cells["concurrency"] == conc)
        sent = cells.loc[at, ["n_ok", "n_err"]].sum(axis=1)
        rows.append({"workload": workload, "C": conc, "rounds": int(cell["rounds"].max()),
                     "requests per setting-round": f"{int(sent.min())}–{int(sent.max())}" if len(sent) else "—",
                     **{METRICS[m]: _decision_text(by_metric[m]) for m in METRICS if m in by_metric},
                     "eliminated (setting@round)": cell["eliminated"].fillna("").iloc[0] or "—"})
    return [*lines, "", pd.DataFrame(rows).to_markdown(index=False), ""]


def rerun_lines(decisions: pd.DataFrame, max_rounds: int) -> list[str]:
    """What deciding the undecided metrics would cost: the rounds each needs at its present leads and spread
    (`rounds_needed`), within `max_rounds` (benchmark.max_repeats) or beyond, and the minutes of measuring those
    rounds take at the time each cell's last round took; a rerun adds them to the rounds it keeps. None when
    nothing is undecided."""
    open_ = decisions[decisions["decision"] == UNDECIDED]
    if open_.empty or "rounds_needed" not in open_.columns:
        return []
    open_ = open_.assign(rounds_needed=pd.to_numeric(open_["rounds_needed"], errors="coerce"))
    needed = open_["rounds_needed"]
    soon, later = open_[needed <= max_rounds], open_[(needed > max_rounds) & np.isfinite(needed)]
    parts = [f"{len(soon)} of the {len(open_)} undecided cells × metrics would be decided within "
             f"`benchmark.max_repeats` ({max_rounds} rounds)"
             + (f", about {m:.0f} min more measuring" if len(soon) and math.isfinite(m := _minutes(soon)) else "")]
    if len(later):
        low, high = int(later["rounds_needed"].min()), int(later["rounds_needed"].max())
        span = str(low) if low == high else f"{low}–{high}"
        total = _minutes(pd.concat([soon, later]))
        parts.append(f"{len(later)} by {span} rounds"
                     + (f" ({total:.0f} min for all {len(soon) + len(later)})" if math.isfinite(total) else ""))
    if beyond := int(np.isinf(needed).sum()):
        parts.append(f"{beyond} by no number up to {ROUNDS_CAP} (a lead about the size of the noise floor or of the "
                     "equivalence margin)")
    return [f"- **To decide the rest**: at their present leads and spread, {'; '.join(parts)}. The minutes take "
            "each cell's last round as its cost; a rerun keeps every round measured and adds to them: raise "
            "`benchmark.time_budget_min` (and `max_repeats`), then run `snakemake --cores 4 --forcerun benchmark`."]


def _minutes(rows: pd.DataFrame) -> float:
    """Minutes of measuring that bring each cell of `rows` to the most rounds one of its metrics needs."""
    per_cell = rows.groupby(["workload", "concurrency"]).agg(
        need=("rounds_needed", "max"), have=("rounds", "max"), round_s=("round_s", "first"))
    extra_s = (per_cell["need"] - per_cell["have"]).clip(lower=0) * per_cell["round_s"]
    return float(extra_s.sum()) / 60 if extra_s.notna().all() else math.nan


def _decision_text(row) -> str:
    """`winner steps2 (+6% [+3%, +9%] over steps1)`, `equivalent: steps1 ≡ steps2`, or `undecided (~12 rounds)`
    (the rounds it needs, where known)."""
    if row.decision == UNDECIDED:
        needed = getattr(row, "rounds_needed", math.nan)
        if isinstance(needed, (int, float)) and math.isinf(needed):
            return f"{UNDECIDED} (> {ROUNDS_CAP} rounds)"
        if isinstance(needed, (int, float)) and math.isfinite(needed):
            return f"{UNDECIDED} (~{int(needed)} rounds)"
        return UNDECIDED
    if row.decision == EQUIVALENT:
        return f"equivalent: {row.best} ≡ {row.runner_up}"
    if not isinstance(row.runner_up, str) or not row.runner_up:
        return f"winner {row.best}"
    return (f"winner {row.best} ({row.lead_pct:+.0f}% [{row.ci_low_pct:+.0f}%, {row.ci_high_pct:+.0f}%] over "
            f"{row.runner_up})")
