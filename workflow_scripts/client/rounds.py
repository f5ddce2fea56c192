"""The measurement design of a cohort: which cell of which member is measured when, and when to stop.

- sliced (the embedded engine): every member's server is up; a round of a cell measures that cell on every member
  at once, each server running only in its turn of a few tens of milliseconds (client/slicing.py), so the members
  of a round see the same phases of the machine to within one turn of the conductor.
- interleaved: every member's server is up; a round of a cell measures that cell on every member, in a seeded
  random order, one after another.
- blocked: one server at a time (SGLang settings that together need more GPUs than the node has); each round
  visits the members in an order reversed every round (ABC, CBA, ...), restarting a server per block, so a
  linear drift cancels over two rounds.
- sequential: each member's server measures all its rounds, one member after another (the design the study had
  before; kept to show what it costs, and for a single-server comparison).

After `repeats` rounds (the minimum), up to `max_repeats`, the allocation says what a round measures:
- racing (analysis/decisions.py): a round measures only the members still in the cell's race (a member beaten for
  real on both metrics is eliminated; the control and its twin never are), a cell decided or out of reach of
  `max_repeats` rounds gets no more rounds, and the cells of a round go narrowest CI first, so a time budget that
  runs out mid-round cuts the cells furthest from a decision, not those one round away from it;
- even: every member in every round while the widest paired CI of the cell's comparisons (every member against
  the control, both throughput metrics) is wider than +-`precision_pct`.
A time budget, when set, stops new rounds beyond the minimum once spent: the first `repeats` rounds always run, so
every cell has a paired CI and both launches of a counterbalanced pair (a cell cut at one round decides nothing).

Launch and turn order: the members' servers start in an order shuffled from `benchmark.seed` per cohort, and start
again after the first round in the reverse order (`benchmark.counterbalance_launches`; with restart_each_round every
pair of rounds takes a fresh order, then its reverse), because a server's start position changes its speed; a
sliced cell's turns follow an order shuffled per cell and round, so no member is always first to run.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field

import pandas as pd

from workflow_scripts.analysis import launch_position
from workflow_scripts.analysis.decisions import Race, RaceRule, Series, aligned, pair, race
from workflow_scripts.analysis.improvement import Priors
from workflow_scripts.analysis.paired import VariancePrior, noise_floor_pct, round_logs
from workflow_scripts.client.cohorts import twin_name

METRICS = ("aggregate_tok_s", "per_request_tok_s")
log = logging.getLogger(__name__)


def seeded_order(items: list[str], *seed: object) -> list[str]:
    """A reproducible shuffle of `items`, seeded by the cohort, cell and round."""
    out = sorted(items)
    random.Random("/".join(map(str, seed))).shuffle(out)
    return out


def launch_index(round_: int, restart_each_round: bool, counterbalance: bool) -> int:
    """Which launch of a cohort's servers measures a round: a launch per round with restart_each_round; else the
    first launch for round 0 and, counterbalanced, a second one from round 1 on."""
    if restart_each_round:
        return round_
    return min(round_, 1) if counterbalance else 0


def launch_order(members: list[str], seed: int, cohort: str, launch: int = 0) -> list[str]:
    """The order in which a cohort's servers start: a pair of launches shares one order shuffled from the study seed
    (per cohort and pair), the odd launch reversed. Reversed, each member's mean position over the pair is the middle
    one (of two servers of one setting, the second started ran 1.5-6.4% faster; docs/measurements/launch_order.md);
    a fresh shuffle per pair (restart_each_round) makes what reversal cannot cancel, a curved position effect, a
    draw per pair that the rounds' spread sees. Recorded in the cohort's meta."""
    pair = launch // 2
    order = seeded_order(members, "launch", seed, cohort, *([pair] if pair else []))  # pair 0: the cohort's own
    return order[::-1] if launch % 2 else order


def block_order(members: list[str], round_: int) -> list[str]:
    """Counterbalanced blocks: the members in a fixed order, reversed on odd rounds (ABC, CBA, ABC, ...)."""
    return list(members) if round_ % 2 == 0 else list(reversed(members))


@dataclass(frozen=True)
class RoundPolicy:
    repeats: int
    max_repeats: int
    precision_pct: float
    time_budget_s: float | None = None
    allocation: str = "even"
    equivalence_pct: float = 4.0

    @classmethod
    def from_plan(cls, rounds: dict) -> RoundPolicy:
        budget = rounds.get("time_budget_min")
        return cls(rounds["repeats"], rounds["max_repeats"], rounds["precision_pct"],
                   None if budget is None else budget * 60, rounds["allocation"], rounds["equivalence_pct"])


@dataclass
class Ledger:
    """What a cohort has measured: per (cell, member, round) the cell's two throughput metrics."""

    control: str
    members_of: dict[str, list[str]]  # cell key -> members that measure it (the control among them)
    values: dict[tuple[str, str, int], dict[str, float]] = field(default_factory=dict)
    # cell key -> member -> the first round it is no longer measured in (racing)
    eliminated: dict[str, dict[str, int]] = field(default_factory=dict)
    # the round a launch of the servers started at -> members in start order (the cohort meta's launch_order)
    launches: dict[int, list[str]] = field(default_factory=dict)
    # measured every round, never racing: fixed-acceptance calibration settings (decisions.race)
    bystanders: frozenset[str] = frozenset()
    # measured every round, judged against the race's best: adaptive settings and deployed schedules
    challengers: frozenset[str] = frozenset()
    _adjusted: dict = field(default_factory=dict, repr=False)

    def add(self, cell: str, member: str, round_: int, metrics: dict[str, float]) -> None:
        self.values[(cell, member, round_)] = metrics

    def done(self, cell: str, member: str, round_: int) -> bool:
        return (cell, member, round_) in self.values

    @property
    def twin(self) -> str | None:
        twin = twin_name(self.control)
        return twin if any(twin in members for members in self.members_of.values()) else None

    def due(self, cell: str, round_: int) -> list[str]:
        """The members a round of the cell measures: all but those eliminated by then."""
        out = self.eliminated.get(cell, {})
        return [m for m in self.members_of[cell] if m not in out or round_ < out[m]]

    def complete_rounds(self, cell: str) -> list[int]:
        """Rounds of the cell in which every member due in it was measured."""
        by_round: dict[int, set[str]] = defaultdict(set)
        for (k, member, r) in self.values:
            if k == cell:
                by_round[r].add(member)
        return sorted(r for r, got in by_round.items() if got >= set(self.due(cell, r)))

    def adjusted(self, before_round: int | None = None) -> dict[tuple[str, str, int], dict[str, float]]:
        """The values of the rounds before `before_round`, freed of the servers' start position as the tables free
        them (analysis/launch_position.py: fitted on those rounds alone, identified once two launches measured)."""
        key = (before_round, len(self.values), len(self.launches))
        if key not in self._adjusted:
            rows = [{"cohort": "", "workload": cell, "concurrency": 0, "setting": member, "repeat": r, **metrics}
                    for (cell, member, r), metrics in self.values.items()
                    if before_round is None or r < before_round]
            frame = pd.DataFrame(rows, columns=["cohort", "workload", "concurrency", "setting", "repeat", *METRICS])
            launches = {"": self.launches}
            effects = launch_position.fit(frame, launches, self.control)
            frame = launch_position.adjust(frame, launches, effects)
            self._adjusted = {key: {(row.workload, row.setting, int(row.repeat)): {m: getattr(row, m) for m in METRICS}
                                    for row in frame.itertuples()}}
        return self._adjusted[key]

    def series(self, cell: str, metric: str, before_round: int | None = None) -> Series:
        """member -> round -> value of one metric of the cell, from the rounds before `before_round`, freed of the
        start position."""
        out: Series = defaultdict(dict)
        for (k, member, r), metrics in self.adjusted(before_round).items():
            if k == cell:
                out[member][r] = metrics[metric]
        return dict(out)

    def priors(self, before_round: int | None = None) -> Priors:
        """Per metric, the pooled spread of every member's round ratios against the control over all cells, from
        the rounds before `before_round` (paired.VariancePrior): what the tables pool at the end, so far."""
        found: dict[str, list] = {metric: [] for metric in METRICS}
        for cell, members in self.members_of.items():
            for metric in METRICS:
                series = self.series(cell, metric, before_round)
                found[metric] += [round_logs(*aligned(series, self.control, member, before_round))
                                  for member in members if member != self.control]
        return {metric: VariancePrior.fit(logs) for metric, logs in found.items()}

    def half_width_pct(self, cell: str, before_round: int | None = None, priors: Priors | None = None) -> float:
        """The widest paired-CI half-width (percent) of the comparisons of the members still measured against the
        control, paired on the rounds both have (their spread pooled with `priors`); inf when not yet computable."""
        widest = 0.0
        for metric in METRICS:
            series = self.series(cell, metric, before_round)
            prior = (priors or {}).get(metric)
            for member in self.due(cell, before_round if before_round is not None else 1 << 30):
                if member == self.control:
                    continue
                half = pair(series, self.control, member, before_round, prior=prior).half_width_pct
                widest = max(widest, half if math.isfinite(half) else math.inf)
        return widest

    def floor_pct(self, before_round: int) -> float:
        """The A/A noise floor so far: 95th percentile of |twin / control - 1| over the cells x metrics with two
        rounds or more; NaN without a twin (the CI alone then decides)."""
        if self.twin is None:
            return math.nan
        diffs = [p.diff_pct for cell in self.members_of for metric in METRICS
                 if (p := pair(self.series(cell, metric, before_round), self.control, self.twin,
                                 before_round)).rounds >= 2]
        return noise_floor_pct(diffs)


@dataclass
class Planner:
    """Decides, round by round, which cells and members still need measuring, and watches the time budget."""

    policy: RoundPolicy
    ledger: Ledger
    started: float = field(default_factory=time.monotonic)
    budget_hit: bool = False
    out_of_reach: dict[str, int] = field(default_factory=dict)  # racing: cell -> the round it was not given

    @property
    def racing(self) -> bool:
        return self.policy.allocation == "racing"

    def race(self, cell: str, round_: int, priors: Priors | None = None) -> Race:
        """The cell's race judged on the rounds before `round_` (`priors`: Ledger.priors(round_), fitted here when
        not given); its eliminations set what the round measures."""
        rule = RaceRule(self.policy.equivalence_pct, self.ledger.floor_pct(round_))
        metrics = {metric: self.ledger.series(cell, metric, round_) for metric in METRICS}
        result = race(metrics, self.ledger.control, self.ledger.twin, rule, self.policy.repeats, round_,
                      self.ledger.priors(round_) if priors is None else priors, self.ledger.bystanders,
                      self.policy.max_repeats, self.ledger.challengers)
        self.ledger.eliminated[cell] = dict(result.eliminated)
        return result

    def needs_round(self, cell: str, round_: int, priors: Priors | None = None) -> bool:
        if round_ < self.policy.repeats:
            return True
        if round_ >= self.policy.max_repeats:
            return False
        priors = self.ledger.priors(round_) if priors is None else priors
        if self.racing:
            result = self.race(cell, round_, priors)
            if not result.settled or result.decided:  # within reach again, or decided: no longer out of reach
                self.out_of_reach.pop(cell, None)
            elif cell not in self.out_of_reach:
                self.out_of_reach[cell] = round_
                leads = "; ".join([*(f"{metric}: {v.best} over {v.runner_up} {v.lead.diff_pct:+.1f}% "
                                     f"±{v.lead.half_width_pct:.1f}" for metric, v in result.verdicts.items()
                                     if v.out_of_reach),
                                   *(f"{metric}: {name} against {result.verdicts[metric].best} "
                                     f"{c.lead.diff_pct:+.1f}% ±{c.lead.half_width_pct:.1f}"
                                     for metric, by_name in result.challenges.items()
                                     for name, c in by_name.items() if c.out_of_reach)])
                log.info("cell %s: out of reach of %d rounds after %d (%s); no more rounds", cell,
                         self.policy.max_repeats, round_, leads)
            return not result.settled
        return self.ledger.half_width_pct(cell, round_, priors) > self.policy.precision_pct

    def active(self, round_: int, cells: list[str]) -> list[str]:
        """The cells the round measures; racing: narrowest CI first, so a budget that ends mid-round has spent
        itself on the undecided cells nearest a decision rather than on those that a round more cannot decide."""
        priors = self.ledger.priors(round_)  # the rounds before this one: the same for every cell
        active = [cell for cell in cells if self.needs_round(cell, round_, priors)]
        if self.racing and round_ >= self.policy.repeats:
            active.sort(key=lambda cell: self.ledger.half_width_pct(cell, round_, priors))
        return active

    def cell_order(self, round_: int, active: list[str], cohort: str) -> list[str]:
        """The order a round measures its cells in: racing's narrowest CI first after the minimum rounds, else a
        seeded shuffle."""
        if self.racing and round_ >= self.policy.repeats:
            return active
        return seeded_order(active, cohort, round_)

    def over_budget(self, round_: int) -> bool:
        """True once the budget is spent, from round `repeats` on: the minimum rounds always run (on a slow machine
        the study then takes longer, rather than deciding nothing). Remembered for the report."""
        budget = self.policy.time_budget_s
        if round_ < self.policy.repeats or budget is None or time.monotonic() - self.started < budget:
            return False
        self.budget_hit = True
        return True
