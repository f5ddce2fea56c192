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

Pooled spread (a VariancePrior): with 2 or 3 rounds a comparison's own standard deviation rests on 1 or 2 degrees
of freedom, and t(0.975, 1) = 12.7 makes its CI several times wider than the noise it measures. A cohort holds dozens
of comparisons (every setting against the control, per cell) measured by the same design on the same machine, whose
round-to-round spreads differ mostly by chance. `VariancePrior.fit` estimates, empirical-Bayes, how alike they are
(limma's moderated t: Smyth 2004, Stat. Appl. Genet. Mol. Biol. 3:3): a prior variance s0² with d0 degrees of
freedom, and each comparison's variance becomes (d0·s0² + d·s²) / (d0 + d) with d0 + d degrees of freedom. Spreads
that differ beyond chance give a small d0, and each comparison keeps mostly its own; spreads alike give a large d0.
The A/A twin is one of the comparisons, so tables/aa.csv shows whether the pooled CIs still cover 0 (docs/method.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

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
    ci: float = CI_LEVEL
    var: float = math.nan  # the (pooled) variance of a round's log ratio the CI rests on
    df: float = math.nan  # and its degrees of freedom

    @property
    def half_width_pct(self) -> float:
        """Half the CI width, in percent of the control: the precision reached."""
        return (self.ci_high_pct - self.ci_low_pct) / 2

    def projected(self, rounds: int) -> Paired:
        """The same comparison after `rounds` rounds, were its mean and spread what they are now: the CI narrowed by
        the rounds and by the degrees of freedom they add (what a round more can buy; NaN CI without a spread)."""
        if not (math.isfinite(self.var) and math.isfinite(self.diff_pct)) or rounds < 1:
            return Paired(self.diff_pct, math.nan, math.nan, rounds, self.ci)
        return _interval(math.log1p(self.diff_pct / 100), self.var, self.df + rounds - self.rounds, rounds, self.ci)


NO_PAIRS = Paired(math.nan, math.nan, math.nan, 0)


@dataclass(frozen=True)
class VariancePrior:
    """The pooled spread of a round's log ratio over a cohort's comparisons of one metric (module doc)."""

    df: float  # d0; inf when the comparisons' spreads differ by no more than chance (one shared variance)
    var: float  # s0², of the natural log of a round's ratio

    @classmethod
    def fit(cls, log_ratios: list[np.ndarray]) -> VariancePrior | None:
        """Smyth's moment estimate from the comparisons with two rounds or more; None below three of them (too few
        to say how alike they are) or when none varies."""
        spreads = [(float(np.var(x, ddof=1)), len(x) - 1) for x in log_ratios if len(x) >= 2]
        spreads = [(s2, d) for s2, d in spreads if s2 > 0]
        if len(spreads) < 3:
            return None
        s2, d = (np.array(v, dtype="float64") for v in zip(*spreads))
        e = np.log(s2) - special.digamma(d / 2) + np.log(d / 2)
        excess = float(np.var(e, ddof=1) - np.mean(special.polygamma(1, d / 2)))
        if excess <= 0:
            return cls(math.inf, float(np.exp(e.mean())))
        half_d0 = optimize.brentq(lambda x: special.polygamma(1, x) - excess, 1e-8, 1e8)
        return cls(2 * half_d0, float(np.exp(e.mean() + special.digamma(half_d0) - math.log(half_d0))))

    def moderate(self, var: float, df: int) -> tuple[float, float]:
        """(variance, degrees of freedom) of one comparison with sample variance `var` on `df` degrees."""
        if math.isinf(self.df):
            return self.var, math.inf
        return (self.df * self.var + df * var) / (self.df + df), self.df + df


def round_logs(control: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """log(candidate / control) of the rounds where both have a positive value."""
    control = np.asarray(control, dtype="float64")
    candidate = np.asarray(candidate, dtype="float64")
    if control.shape != candidate.shape:
        raise ValueError(f"paired values must align by round: {control.shape} vs {candidate.shape}")
    usable = np.isfinite(control) & np.isfinite(candidate) & (control > 0) & (candidate > 0)
    return np.log(candidate[usable] / control[usable])


def paired_ratio(control: np.ndarray, candidate: np.ndarray, ci: float = CI_LEVEL,
                 prior: VariancePrior | None = None) -> Paired:
    """Geometric-mean improvement of candidate over control from values aligned by round; see the module doc.
    With a prior, the CI uses the pooled spread (VariancePrior.moderate) instead of the comparison's own alone."""
    logs = round_logs(control, candidate)
    n = len(logs)
    if n == 0:
        return NO_PAIRS
    point = math.expm1(float(logs.mean())) * 100
    if n < 2:
        return Paired(point, math.nan, math.nan, n)
    var, df = float(logs.var(ddof=1)), n - 1
    if prior is not None:
        var, df = prior.moderate(var, df)
    return _interval(float(logs.mean()), var, df, n, ci)


def _interval(mean_log: float, var: float, df: float, n: int, ci: float) -> Paired:
    """The t interval of a mean log ratio over n rounds, exponentiated to percent."""
    half = float(stats.t.ppf((1 + ci) / 2, df) * math.sqrt(var / n))
    low, high = (math.expm1(mean_log + sign * half) * 100 for sign in (-1, 1))
    return Paired(math.expm1(mean_log) * 100, low, high, n, ci, var, df)


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
