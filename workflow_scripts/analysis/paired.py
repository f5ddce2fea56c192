"""Paired comparisons of two settings measured in the same rounds, and the A/A noise floor.

Why paired: on a shared machine the throughput of one cell drifts by more than the effects the study reports
(a load phase of another tenant, thermal state, memory placement). Two settings measured in the same round see
the same phase, so the ratio of their cells cancels most of it; two settings measured minutes apart do not.

The statistic (one comparison of one cell, i.e. workload x concurrency x metric):
- per round r, the ratio candidate_r / control_r of the metric;
- the improvement is the geometric mean of those ratios, minus 1;
- its 95% CI is a Student t interval on the logarithms of the ratios, exponentiated.

Why a t interval on logs and not a bootstrap over rounds: a study has 3 to 8 rounds per cell. With n=3 a
bootstrap has only 10 distinct resamples and its percentile interval is far too narrow (it cannot reach past the
extreme observed ratios); the t interval accounts for estimating the spread from n values. Throughput ratios are
multiplicative, so their logarithms are the symmetric scale. A round where either side has no value (an empty or
errored cell) gives no ratio: it is dropped, never counted as 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

CI_LEVEL = 0.95
TOST_CI = 0.90  # an equivalence test: two one-sided tests at 5% each
# verdicts of an improvement (the `verdict` column of tables/improvement.csv)
REAL, EQUIVALENT, WITHIN_NOISE, NO_DATA = "real", "equivalent", "within noise", "no data"


@dataclass(frozen=True)
class Paired:
    """One paired comparison: improvement and CI in percent, the half-width of the CI, and the rounds used."""

    diff_pct: float
    ci_low_pct: float
    ci_high_pct: float
    rounds: int

    @property
    def half_width_pct(self) -> float:
        """Half the CI width, in percent of the control: the precision reached."""
        return (self.ci_high_pct - self.ci_low_pct) / 2


NO_PAIRS = Paired(math.nan, math.nan, math.nan, 0)


def paired_ratio(control: np.ndarray, candidate: np.ndarray, ci: float = CI_LEVEL) -> Paired:
    """Geometric-mean improvement of candidate over control from values aligned by round; see the module doc."""
    control = np.asarray(control, dtype="float64")
    candidate = np.asarray(candidate, dtype="float64")
    if control.shape != candidate.shape:
        raise ValueError(f"paired values must align by round: {control.shape} vs {candidate.shape}")
    usable = np.isfinite(control) & np.isfinite(candidate) & (control > 0) & (candidate > 0)
    logs = np.log(candidate[usable] / control[usable])
    n = len(logs)
    if n == 0:
        return NO_PAIRS
    point = math.expm1(float(logs.mean())) * 100
    if n < 2:
        return Paired(point, math.nan, math.nan, n)
    half = float(stats.t.ppf((1 + ci) / 2, n - 1) * logs.std(ddof=1) / math.sqrt(n))
    low, high = (math.expm1(float(logs.mean()) + sign * half) * 100 for sign in (-1, 1))
    return Paired(point, low, high, n)


def noise_floor_pct(aa_diffs_pct: np.ndarray) -> float:
    """The 95th percentile of |A/A difference| over cells: how far apart two identical settings land."""
    values = np.abs(np.asarray(aa_diffs_pct, dtype="float64"))
    values = values[np.isfinite(values)]
    return float(np.percentile(values, 95)) if len(values) else math.nan


def equivalent(tost: Paired, margin_pct: float) -> bool:
    """TOST: a tie is shown when the 90% paired CI (TOST_CI) lies wholly inside +-margin_pct; NaN margin: never."""
    return (math.isfinite(tost.ci_low_pct) and math.isfinite(tost.ci_high_pct)
            and -margin_pct < tost.ci_low_pct and tost.ci_high_pct < margin_pct)


def verdict(paired: Paired, floor_pct: float, tost: Paired = NO_PAIRS, margin_pct: float = math.nan) -> str:
    """`real` only when the paired CI excludes 0 and the effect is larger than the A/A noise floor; `equivalent`
    when not real and the TOST CI (`tost`, the same pairs at TOST_CI) lies inside +-margin_pct; else within noise.

    Without an A/A floor (no twin measured) the CI alone decides; without a CI (one round) nothing is real."""
    if paired.rounds == 0 or not math.isfinite(paired.diff_pct):
        return NO_DATA
    if not (math.isfinite(paired.ci_low_pct) and math.isfinite(paired.ci_high_pct)):
        return WITHIN_NOISE
    excludes_zero = paired.ci_low_pct > 0 or paired.ci_high_pct < 0
    beyond_floor = not math.isfinite(floor_pct) or abs(paired.diff_pct) > floor_pct
    if excludes_zero and beyond_floor:
        return REAL
    return EQUIVALENT if equivalent(tost, margin_pct) else WITHIN_NOISE
