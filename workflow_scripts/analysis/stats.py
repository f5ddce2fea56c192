"""Small, seeded statistics: bootstrap CIs over repeats and the robust score used for recommendations.

CIs need at least two repeats; with one, a bootstrap only returns the point itself, which would
pass for certainty, so the CI is NaN ("n/a") instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAD_TO_SIGMA = 1.4826  # scales the MAD to the standard deviation of a normal distribution


@dataclass(frozen=True)
class Bootstrap:
    """Bootstrap parameters (config ``analysis.bootstrap``)."""

    resamples: int = 2000
    ci: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if self.resamples < 1:
            raise ValueError(f"analysis.bootstrap.resamples must be >= 1, got {self.resamples}")
        if not 0 < self.ci < 1:
            raise ValueError(f"analysis.bootstrap.ci must be in (0, 1), got {self.ci}")

    def _medians(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        picks = rng.integers(0, len(values), size=(self.resamples, len(values)))
        return np.median(values[picks], axis=1)

    def _interval(self, samples: np.ndarray) -> tuple[float, float]:
        tail = (1 - self.ci) / 2 * 100
        low, high = np.nanpercentile(samples, [tail, 100 - tail])
        return float(low), float(high)

    def median_ci(self, values: np.ndarray) -> tuple[float, float, float]:
        """(median, ci_low, ci_high) of the values, NaNs dropped; CI NaN below two values."""
        values = _finite(values)
        if len(values) == 0:
            return np.nan, np.nan, np.nan
        median = float(np.median(values))
        if len(values) < 2:
            return median, np.nan, np.nan
        return (median, *self._interval(self._medians(values, np.random.default_rng(self.seed))))

    def ratio_ci(self, baseline: np.ndarray, candidate: np.ndarray) -> tuple[float, float, float]:
        """median(candidate)/median(baseline) − 1 with a CI from resampling each side independently."""
        baseline, candidate = _finite(baseline), _finite(candidate)
        if len(baseline) == 0 or len(candidate) == 0 or np.median(baseline) <= 0:
            return np.nan, np.nan, np.nan
        point = float(np.median(candidate) / np.median(baseline) - 1)
        if len(baseline) < 2 or len(candidate) < 2:
            return point, np.nan, np.nan
        rng = np.random.default_rng(self.seed)
        base_medians = self._medians(baseline, rng)
        cand_medians = self._medians(candidate, rng)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = np.where(base_medians > 0, cand_medians / base_medians - 1, np.nan)
        return (point, *self._interval(ratios))


def _finite(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype="float64")
    return values[np.isfinite(values)]


def robust_score(values: np.ndarray) -> tuple[float, float, float]:
    """(median − 1.4826·MAD, median, MAD): a high, steady value beats a high, erratic one."""
    values = _finite(values)
    if len(values) == 0:
        return np.nan, np.nan, np.nan
    median = float(np.median(values))
    mad = float(np.median(np.abs(values - median)))
    return median - MAD_TO_SIGMA * mad, median, mad


def within_noise(ci_low: float, ci_high: float) -> bool | None:
    """True when the CI includes 0; None when there is no CI (fewer than two repeats)."""
    if not (np.isfinite(ci_low) and np.isfinite(ci_high)):
        return None
    return bool(ci_low <= 0 <= ci_high)
