"""Search strategies over a kernel-config space: exhaustive (SGLang's) and successive halving.

Both see the same candidates through one `measure(i) -> seconds` callback, so their costs compare
directly: one evaluation = one timing sample. Samples are taken in passes over the candidates still in
play, so a change in a shared machine's speed hits them all alike. Exhaustive scores a candidate by its
fastest sample (timeit's advice: noise only ever adds time). Halving, which must decide on a few
samples, compares candidates within each pass instead (`_ranked`), since on a shared machine the
load comes in phases that outlast a sample.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

Measure = Callable[[int], float]
# key(i) -> what candidate i computes; candidates with equal keys do identical work, so one stands for all.
Key = Callable[[int], Hashable]

SEARCHES = ("exhaustive", "halving")
# Halving's whole budget, in samples per candidate of the space: a fifth of exhaustive's 10 repeats.
HALVING_SAMPLES_PER_CANDIDATE = 2


@dataclass
class SearchResult:
    """The winner, its score (fastest sample), and what the search cost."""

    best: int
    best_s: float
    evaluations: int
    samples: dict[int, list[float]] = field(default_factory=dict)

    def scores(self) -> dict[int, float]:
        """Fastest sample, in seconds, of every candidate that was measured."""
        return {i: min(s) for i, s in self.samples.items()}


def _sample(
    samples: dict[int, list[float]], alive: list[int], until: int, measure: Measure, rng: random.Random | None = None
) -> int:
    """Bring every alive candidate up to `until` samples, round-robin; returns the samples taken.

    With `rng`, each pass visits the candidates in a fresh order: a burst of load lasting a few samples
    then hits a random few, not the same neighbours (in a strategy-major space: one strategy) every
    pass, and no candidate always runs right after the same other one (whose cache and heap it inherits).
    """
    taken = 0
    for _ in range(until - min(len(samples[i]) for i in alive)):
        order = rng.sample(alive, len(alive)) if rng else alive
        for i in order:
            if len(samples[i]) < until:
                samples[i].append(measure(i))
                taken += 1
    return taken


def exhaustive(n: int, measure: Measure, repeats: int) -> SearchResult:
    """Every candidate `repeats` times; the winner has the fastest sample."""
    if n < 1 or repeats < 1:
        raise ValueError(f"exhaustive search needs candidates and repeats >= 1 (got n={n}, repeats={repeats})")
    samples: dict[int, list[float]] = {i: [] for i in range(n)}
    used = _sample(samples, list(range(n)), repeats, measure)
    scores = {i: min(s) for i, s in samples.items()}
    best = min(scores, key=scores.get)
    return SearchResult(best, scores[best], used, samples)


def distinct(n: int, key: Key | None) -> list[int]:
    """One candidate per distinct computation (the last of those sharing a key), in candidate order."""
    if key is None:
        return list(range(n))
    last = {key(i): i for i in range(n)}
    return sorted(last.values())


def _rounds(alive: int, eta: int) -> int:
    """Rounds of keeping the best 1/eta until one candidate is left."""
    rounds = 0
    while alive > 1:
        alive, rounds = math.ceil(alive / eta), rounds + 1
    return rounds


def _min_cost(alive: int, eta: int) -> int:
    """Samples the cheapest schedule takes: one per alive candidate per round."""
    cost = 0
    while alive > 1:
        cost, alive = cost + alive, math.ceil(alive / eta)
    return cost


def _ranked(samples: dict[int, list[float]], alive: list[int]) -> list[int]:
    """The alive candidates, best first: by their time relative to the pass's fastest, over the passes so far.

    Every alive candidate was in every pass so far (sample p of each comes from pass p, taken back to
    back), so load that lasts a pass slows them alike and cancels in the ratio. On a shared machine load
    comes in phases of tens to hundreds of milliseconds, and comparing fastest samples taken in different
    phases let a lighter phase pick the winner. The low median over passes shrugs off
    a burst on one candidate (with two passes it is the better one); ties go to the fastest sample.
    """
    passes = range(len(samples[alive[0]]))

    def relative(i: int) -> float:
        return statistics.median_low([samples[i][p] / min(samples[j][p] for j in alive) for p in passes])

    return sorted(alive, key=lambda i: (relative(i), min(samples[i])))


def successive_halving(
    n: int, measure: Measure, key: Key | None = None, eta: int = 3, budget: int | None = None, seed: int = 0
) -> SearchResult:
    """Keep the best 1/eta of the candidates each round, on a fixed budget of samples.

    Candidates that compute the same thing (equal `key`) are measured as one, so copies of a single
    computation cannot crowd the others out of the survivors. Each round gets an equal share of what is
    left of the budget (2 samples per candidate of the space by default: 20% of an exhaustive search at
    10 repeats), spread evenly over its candidates, so whatever the first rounds do not need goes to
    the finalists: with 3 distinct computations (small M) all of it, 12 samples each. Passes visit the
    candidates in a seeded random order. The samples taken depend only on n, the keys, eta and budget.
    """
    alive = distinct(n, key)
    budget = HALVING_SAMPLES_PER_CANDIDATE * n if budget is None else budget
    if n < 1 or eta < 2:
        raise ValueError(f"successive halving needs n >= 1 and eta >= 2 (got n={n}, eta={eta})")
    if budget < max(1, _min_cost(len(alive), eta)):
        raise ValueError(f"successive halving: budget {budget} is below the {_min_cost(len(alive), eta)} samples "
                         f"that {len(alive)} distinct candidates need (one each per round)")
    rng = random.Random(seed)
    samples: dict[int, list[float]] = {i: [] for i in alive}
    used = taken = 0
    while len(alive) > 1:
        rounds_left = _rounds(len(alive), eta)
        # an equal share of what is left for each round to come; it always leaves later rounds one sample each
        taken += max(1, (budget - used) // (rounds_left * len(alive)))
        used += _sample(samples, alive, taken, measure, rng)
        alive = _ranked(samples, alive)[: math.ceil(len(alive) / eta)]
    best = alive[0]
    if not samples[best]:  # a single computation: nothing to choose, one sample for its time
        used += _sample(samples, alive, 1, measure)
    return SearchResult(best, min(samples[best]), used, samples)


def run_search(name: str, n: int, measure: Measure, repeats: int, key: Key | None = None) -> SearchResult:
    """Dispatch on the config's `moe.search` value; `key` (halving only) names equivalent candidates."""
    if name == "exhaustive":
        return exhaustive(n, measure, repeats)
    if name == "halving":
        return successive_halving(n, measure, key)
    raise ValueError(f"moe.search: unknown search {name!r}; allowed: {', '.join(SEARCHES)}")
