"""Statistics of a same-job A/B: is the head's time of a case different from the base's?

Each round times a case once on each side (a median of many calls, the record's ``ms``), so a
case has one (base, head) pair per round. The ratio head/base is estimated on the log scale:

- two or more paired rounds: the mean of the rounds' log ratios with a Student t interval
  (``n - 1`` degrees of freedom); the point estimate is the geometric mean of the paired
  ratios. The rounds alternate which side runs first, so a drift of the GPU over the job
  cancels out of the pairs;
- one paired round: a normal interval from the spread of the repeats inside each run, when
  the records carry it (``ms_n`` with ``ms_mad`` or ``ms_iqr``), else no interval.

A change is *significant* when the interval excludes 1.0 and the estimated ratio differs from
1.0 by at least :data:`MIN_EFFECT` (1%): within one job on one GPU the noise is a fraction of
a percent, and a smaller change is not one worth acting on, however sure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from .noise import median_se, spread_sigma

CONFIDENCE = 0.95
MIN_EFFECT = 0.01  # smallest |ratio - 1| called a change

PAIRED_T = "paired rounds, t interval"
REPEAT_SPREAD = "one round, repeat spread"
TOO_FEW = "too few rounds"


@dataclass(frozen=True)
class Verdict:
    """What the A/B says about one case: medians over the rounds, head/base ratio and its interval."""

    base_median: float | None
    head_median: float | None
    ratio: float | None
    low: float | None
    high: float | None
    rounds: int
    method: str
    significant: bool

    @property
    def change(self) -> str:
        """``slower``, ``faster``, ``within noise`` or ``no interval``."""
        if self.low is None or self.ratio is None:
            return "no interval"
        if not self.significant:
            return "within noise"
        return "slower" if self.ratio > 1 else "faster"


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"df must be positive, got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


def normal_quantile(p: float) -> float:
    return statistics.NormalDist().inv_cdf(p)


def median_relative_se(ms: float, n: float | None, *, mad: float | None = None,
                       iqr: float | None = None) -> float | None:
    """The relative standard error of a run's median time from the spread of its ``n`` repeats
    (median absolute deviation or interquartile range, in ms); None without them."""
    if not ms or ms <= 0 or not n or n < 2:
        return None
    sigma = spread_sigma(mad if mad is not None and mad >= 0 else None, iqr if iqr is not None and iqr >= 0 else None)
    return None if sigma is None else median_se(sigma, n) / ms


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _significant(ratio: float, low: float, high: float, min_effect: float) -> bool:
    return (high < 1.0 or low > 1.0) and abs(ratio - 1.0) >= min_effect


def compare(
    base: Sequence[float | None],
    head: Sequence[float | None],
    *,
    repeat_se: tuple[float | None, float | None] | None = None,
    confidence: float = CONFIDENCE,
    min_effect: float = MIN_EFFECT,
) -> Verdict:
    """The A/B verdict of one case from its per-round times (``base[i]`` and ``head[i]`` of round
    i; None where that side has no time in that round). ``repeat_se``: the relative standard
    errors of the base's and the head's medians from their repeats, used when only one round
    pairs up (:func:`median_relative_se`)."""
    if len(base) != len(head):
        raise ValueError(f"base and head need one entry per round: {len(base)} != {len(head)}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    valid = [(b, h) for b, h in zip(base, head, strict=True) if b and h and b > 0 and h > 0]
    base_median = _median([b for b in base if b and b > 0])
    head_median = _median([h for h in head if h and h > 0])
    logs = [math.log(h / b) for b, h in valid]
    n = len(logs)
    if n == 0:
        return Verdict(base_median, head_median, None, None, None, 0, TOO_FEW, False)
    mean = statistics.fmean(logs)
    ratio = math.exp(mean)
    if n >= 2:
        half = t_quantile(0.5 + confidence / 2, n - 1) * statistics.stdev(logs) / math.sqrt(n)
        method = PAIRED_T
    elif repeat_se and None not in repeat_se:
        half = normal_quantile(0.5 + confidence / 2) * math.hypot(*repeat_se)
        method = REPEAT_SPREAD
    else:
        return Verdict(base_median, head_median, ratio, None, None, n, TOO_FEW, False)
    low, high = math.exp(mean - half), math.exp(mean + half)
    return Verdict(base_median, head_median, ratio, low, high, n, method,
                   _significant(ratio, low, high, min_effect))
