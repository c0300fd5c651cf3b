"""The noise of a median time, from the spread of the repeats it is the median of, as records
keep it (``ms_n``, ``ms_iqr``, ``ms_mad``): one definition for the regression check, the same-job
A/B and the trend bands, and of the spread itself (:class:`Timing`) for a benchmark's repeats and
the run history's runs alike. Standard library only."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation of a normal distribution
IQR_TO_SIGMA = 1 / 1.349  # interquartile range -> standard deviation of a normal distribution
MEDIAN_SE = math.sqrt(math.pi / 2)  # se(median) = 1.2533 sigma / sqrt(n) for n normal samples


def spread_sigma(mad: float | None, iqr: float | None) -> float | None:
    """A standard deviation from a median absolute deviation, else an interquartile range; None
    without either (each non-negative or None)."""
    if mad is not None:
        return MAD_TO_SIGMA * mad
    return IQR_TO_SIGMA * iqr if iqr is not None else None


def median_se(sigma: float, n: float) -> float:
    """The standard error of the median of ``n`` samples of standard deviation ``sigma``."""
    return MEDIAN_SE * sigma / math.sqrt(n)


@dataclass(frozen=True)
class Timing:
    """The repeats of one timed call, in ms: how many, their median, the fastest, the
    interquartile range and the median absolute deviation from the median."""

    n: int
    median: float
    min: float
    iqr: float
    mad: float

    @classmethod
    def of(cls, samples: Iterable[float]) -> Timing:
        xs = sorted(float(x) for x in samples)
        if not xs:
            raise ValueError("a timing needs at least one sample")
        median = statistics.median(xs)
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0],) * 3
        return cls(len(xs), median, xs[0], q3 - q1, statistics.median(abs(x - median) for x in xs))

    def scaled(self, factor: float) -> Timing:
        """The same repeats in other units (per call of a pass over several calls, say)."""
        return Timing(self.n, self.median * factor, self.min * factor, self.iqr * factor, self.mad * factor)

    def plus(self, other: Timing) -> Timing:
        """Two calls made one after the other (a quantize, then its dequantize): medians and minima
        add; so do the spreads, as if the two varied together (at most that for independent parts)."""
        return Timing(min(self.n, other.n), self.median + other.median, self.min + other.min,
                      self.iqr + other.iqr, self.mad + other.mad)

    def metrics(self, name: str = "ms") -> dict:
        """The spread as record metrics beside the median ``name`` (``ms_n``, ``ms_min``, ...)."""
        return {f"{name}_n": self.n, f"{name}_min": self.min, f"{name}_iqr": self.iqr, f"{name}_mad": self.mad}
