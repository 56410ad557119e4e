"""How much of an accuracy is the test set's sampling noise: binomial 95 % intervals and differences within them.

A test accuracy is a count of right answers out of ``n`` test images, so with one seed it carries binomial noise:
on the embedded default's 360 images one image is 0.28 points and a 96 % accuracy is uncertain by about +-2 points.
A table that prints 96.39 beside 95.83 without that says more than the data does; these functions say how much.
Seeds add their own variance, which only several seeds measure (the table's ± std); this is the test set's part.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # two-sided 95 % quantile of the standard normal


def wilson_interval(accuracy: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion ``accuracy`` observed on ``n`` trials: (low, high).

    Wilson rather than the normal approximation because accuracies near 1 (ResNet18's 99.7 %) would get an interval
    past 100 % from the latter. NaN for a non-finite accuracy or no trials.
    """
    if not math.isfinite(accuracy) or n <= 0:
        return math.nan, math.nan
    denominator = 1 + z * z / n
    centre = (accuracy + z * z / (2 * n)) / denominator
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def difference_noise(a: float, b: float, n: int, z: float = Z95) -> float:
    """Half-width of the 95 % interval of ``a - b`` for two accuracies on ``n`` test images each (independent
    binomials, normal approximation; the same images make it conservative): a smaller difference is noise."""
    if not (math.isfinite(a) and math.isfinite(b)) or n <= 0:
        return math.nan
    return z * math.sqrt((a * (1 - a) + b * (1 - b)) / n)


def within_noise(a: float, b: float, n: int) -> bool:
    """True when ``|a - b|`` is smaller than ``difference_noise``: the test set cannot tell the two apart."""
    noise = difference_noise(a, b, n)
    return math.isfinite(noise) and abs(a - b) < noise
