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

Rounds repeat until the precision target: after `repeats` rounds (the minimum), a cell gets another round only
while the widest paired CI of its comparisons (every member against the control, both throughput metrics) is
wider than +-`precision_pct`, up to `max_repeats`. A time budget, when set, stops new rounds once spent (the
first round always runs, so every cell has data).
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field

from workflow_scripts.analysis.paired import paired_ratio

METRICS = ("aggregate_tok_s", "per_request_tok_s")


def seeded_order(items: list[str], *seed: object) -> list[str]:
    """A reproducible shuffle of `items`, seeded by the cohort, cell and round."""
    out = sorted(items)
    random.Random("/".join(map(str, seed))).shuffle(out)
    return out


def block_order(members: list[str], round_: int) -> list[str]:
    """Counterbalanced blocks: the members in a fixed order, reversed on odd rounds (ABC, CBA, ABC, ...)."""
    return list(members) if round_ % 2 == 0 else list(reversed(members))


@dataclass(frozen=True)
class RoundPolicy:
    repeats: int
    max_repeats: int
    precision_pct: float
    time_budget_s: float | None = None

    @classmethod
    def from_plan(cls, rounds: dict) -> RoundPolicy:
        budget = rounds.get("time_budget_min")
        return cls(rounds["repeats"], rounds["max_repeats"], rounds["precision_pct"],
                   None if budget is None else budget * 60)


@dataclass
class Ledger:
    """What a cohort has measured: per (cell, member, round) the cell's two throughput metrics."""

    control: str
    members_of: dict[str, list[str]]  # cell key -> members that measure it (the control among them)
    values: dict[tuple[str, str, int], dict[str, float]] = field(default_factory=dict)

    def add(self, cell: str, member: str, round_: int, metrics: dict[str, float]) -> None:
        self.values[(cell, member, round_)] = metrics

    def done(self, cell: str, member: str, round_: int) -> bool:
        return (cell, member, round_) in self.values

    def complete_rounds(self, cell: str) -> list[int]:
        """Rounds of the cell in which every member was measured."""
        by_round: dict[int, set[str]] = defaultdict(set)
        for (k, member, r) in self.values:
            if k == cell:
                by_round[r].add(member)
        return sorted(r for r, got in by_round.items() if got >= set(self.members_of[cell]))

    def half_width_pct(self, cell: str, before_round: int | None = None) -> float:
        """The widest paired-CI half-width (percent) of the cell's comparisons; inf when not yet computable."""
        rounds = [r for r in self.complete_rounds(cell) if before_round is None or r < before_round]
        widest = 0.0
        for member in self.members_of[cell]:
            if member == self.control:
                continue
            for metric in METRICS:
                ctrl = [self.values[(cell, self.control, r)][metric] for r in rounds]
                cand = [self.values[(cell, member, r)][metric] for r in rounds]
                half = paired_ratio(ctrl, cand).half_width_pct
                widest = max(widest, half if math.isfinite(half) else math.inf)
        return widest


@dataclass
class Planner:
    """Decides, round by round, which cells still need measuring, and watches the time budget."""

    policy: RoundPolicy
    ledger: Ledger
    started: float = field(default_factory=time.monotonic)
    budget_hit: bool = False

    def needs_round(self, cell: str, round_: int) -> bool:
        if round_ < self.policy.repeats:
            return True
        if round_ >= self.policy.max_repeats:
            return False
        return self.ledger.half_width_pct(cell, before_round=round_) > self.policy.precision_pct

    def active(self, round_: int, cells: list[str]) -> list[str]:
        return [cell for cell in cells if self.needs_round(cell, round_)]

    def over_budget(self, round_: int) -> bool:
        """True once the budget is spent; round 0 always runs. Remembered for the report."""
        budget = self.policy.time_budget_s
        if round_ == 0 or budget is None or time.monotonic() - self.started < budget:
            return False
        self.budget_hit = True
        return True
