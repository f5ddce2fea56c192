"""Search strategies over a kernel-config space: exhaustive (SGLang's) and successive halving.

Both see the same candidates through one `measure(i) -> seconds` callback, so their costs compare
directly: one evaluation = one timing sample. Samples are taken round-robin over the candidates still
in play, so slow drift in a shared machine's speed hits them all alike, and a candidate is scored by
its fastest sample: on a shared machine noise only ever adds time, so the minimum is the steadiest
estimate of what the kernel itself costs (timeit's advice too).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

Measure = Callable[[int], float]

SEARCHES = ("exhaustive", "halving")


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


def _sample(samples: dict[int, list[float]], alive: list[int], until: int, measure: Measure) -> int:
    """Bring every alive candidate up to `until` samples, round-robin; returns the samples taken."""
    taken = 0
    for _ in range(until - min(len(samples[i]) for i in alive)):
        for i in alive:
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


def successive_halving(n: int, measure: Measure, eta: int = 3, growth: int = 2, final_samples: int = 7) -> SearchResult:
    """Keep the best 1/eta of the candidates each round, giving survivors `growth` x more samples.

    One sample each for all, then 2 for the best third, and so on; once no more than eta candidates are
    left, they get `final_samples` each, so the last, closest call is not made on a lucky sample or two.
    For 18 candidates: 18 + 6 + 2*6 = 36 samples would be 20% of an exhaustive search at 10 repeats;
    with the defaults it is 18 + 6 + 2*5 = 34 (19%).
    """
    if n < 1 or eta < 2 or growth < 1:
        raise ValueError(f"successive halving needs n >= 1, eta >= 2, growth >= 1 (got {n}, {eta}, {growth})")
    samples: dict[int, list[float]] = {i: [] for i in range(n)}
    alive = list(range(n))
    used = 0
    target = 1
    while True:
        used += _sample(samples, alive, target, measure)
        alive.sort(key=lambda i: min(samples[i]))
        alive = alive[: math.ceil(len(alive) / eta)]
        if len(alive) == 1:
            break
        target *= growth
        if len(alive) <= eta:
            target = max(target, final_samples)
    best = alive[0]
    return SearchResult(best, min(samples[best]), used, samples)


def run_search(name: str, n: int, measure: Measure, repeats: int) -> SearchResult:
    """Dispatch on the config's `moe.search` value."""
    if name == "exhaustive":
        return exhaustive(n, measure, repeats)
    if name == "halving":
        return successive_halving(n, measure)
    raise ValueError(f"moe.search: unknown search {name!r}; allowed: {', '.join(SEARCHES)}")
