"""The speculation maths: tokens a verify commits (E_k), tokens it adds to a cell (E'_k), and the renewal count
of verifies a request of a given length needs (Leviathan et al. 2023, with one α per draft position)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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


def geometric_alpha(accept_length: float, steps: int) -> float:
    """The one α with E_k(α) = accept_length (bisection: E_k grows with α from 1 to k + 1); NaN out of range."""
    if not 1 <= accept_length <= steps + 1:
        return float("nan")
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens([mid], steps) < accept_length else (low, mid)
    return (low + high) / 2
