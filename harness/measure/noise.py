"""The noise of a median time, from the spread of the repeats it is the median of, as records
keep it (``ms_n``, ``ms_iqr``, ``ms_mad``): one definition for the regression check, the same-job
A/B and the trend bands. Standard library only."""

from __future__ import annotations

import math

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
