"""The verdict rules: a claim's numbers in, ``holds`` / ``does not hold`` / ``cannot tell at this scale`` out.

Why rules and not sentences: a verdict worded by hand per result drifts from its numbers; each rule here is a pure
function of an interval (or a p-value, or an exact error) and a stated margin, unit-tested on synthetic results that
must come out each way. The statistics are the usual ones, with scipy's distributions:

- several seeds: the paired difference across seeds (same seed, two variants) with its Student-t 95 % interval;
- one seed: the paired difference on the test images (each image answered by both models) with the Agresti-Min
  95 % interval, and McNemar's exact test (a binomial test on the discordant images);
- within one run: two groups of heads compared by a one-sided Mann-Whitney U test; an order by Spearman's rho;
- ``seeds_needed``: how many paired seeds the observed spread needs to tell a given difference (80 % power).
A measure that is missing (NaN) is never a verdict either way: it reads ``cannot tell``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

HOLDS = "holds"
FAILS = "does not hold"
CANNOT_TELL = "cannot tell at this scale"
ALPHA = 0.05  # two-sided 95 % intervals; one-sided tests at 5 %


@dataclass(frozen=True)
class Interval:
    """An estimate with its 95 % interval and the test it came from (for the report's column)."""

    estimate: float
    low: float
    high: float
    test: str
    p_value: float = math.nan

    @property
    def finite(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


NOT_MEASURED = Interval(math.nan, math.nan, math.nan, "not measured")


def paired_seeds(a: Sequence[float], b: Sequence[float]) -> Interval:
    """``mean(a - b)`` over seeds paired by position, with its Student-t 95 % interval (needs two pairs or more)."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    diff = diff[np.isfinite(diff)]
    if len(diff) < 2:
        return NOT_MEASURED
    mean, sem = float(diff.mean()), float(diff.std(ddof=1) / math.sqrt(len(diff)))
    half = float(stats.t.ppf(1 - ALPHA / 2, len(diff) - 1)) * sem
    p = float(stats.ttest_1samp(diff, 0.0).pvalue) if sem > 0 else (0.0 if mean != 0 else 1.0)
    return Interval(mean, mean - half, mean + half, f"paired t over {len(diff)} seeds", p)


def paired_images(a_correct: Sequence[bool], b_correct: Sequence[bool]) -> Interval:
    """Accuracy of a minus accuracy of b on the same images: the Agresti-Min 95 % interval (a Wald interval with half
    an image added to each cell) and McNemar's exact p-value (binomial test on the images only one model got right)."""
    a, b = np.asarray(a_correct, dtype=bool), np.asarray(b_correct, dtype=bool)
    if len(a) == 0 or len(a) != len(b):
        return NOT_MEASURED
    n = len(a)
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    estimate = (only_a - only_b) / n
    ca, cb, m = only_a + 0.5, only_b + 0.5, n + 2
    centre = (ca - cb) / m
    half = stats.norm.ppf(1 - ALPHA / 2) * math.sqrt(max((ca + cb) - (ca - cb) ** 2 / m, 0.0)) / m
    discordant = only_a + only_b
    p = float(stats.binomtest(only_a, discordant, 0.5).pvalue) if discordant else 1.0
    test = f"paired on {n} test images, one seed (McNemar exact: {only_a} vs {only_b} discordant)"
    return Interval(estimate, centre - half, centre + half, test, p)


def mann_whitney_less(smaller: Sequence[float], larger: Sequence[float]) -> Interval:
    """Is ``smaller`` below ``larger``? The difference of their medians (larger - smaller) and the one-sided
    Mann-Whitney U p-value; no interval (``low``/``high`` are the estimate)."""
    x, y = np.asarray(smaller, dtype=float), np.asarray(larger, dtype=float)
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if len(x) < 2 or len(y) < 2:
        return NOT_MEASURED
    p = float(stats.mannwhitneyu(x, y, alternative="less").pvalue)
    estimate = float(np.median(y) - np.median(x))
    return Interval(estimate, estimate, estimate, f"one-sided Mann-Whitney U, {len(x)} vs {len(y)} heads", p)


def spearman(values: Sequence[float]) -> Interval:
    """Spearman's rho of ``values`` against their position (1, 2, ...) and its one-sided p-value for a rising order."""
    v = np.asarray(values, dtype=float)
    if len(v) < 3 or not np.isfinite(v).all() or len(set(v.tolist())) < 2:
        return Interval(math.nan, math.nan, math.nan, f"Spearman rho over {len(v)} positions (constant or too few)")
    result = stats.spearmanr(np.arange(len(v)), v, alternative="greater")
    rho = float(result.statistic)
    return Interval(rho, rho, rho, f"Spearman rho over {len(v)} layers, one-sided", float(result.pvalue))


def mean_interval(values: Sequence[float]) -> Interval:
    """The mean across seeds with its Student-t 95 % interval; one seed: the value itself, no interval."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return NOT_MEASURED
    if len(v) == 1:
        return Interval(float(v[0]), float(v[0]), float(v[0]), "one seed: the run's value, no interval")
    mean, sem = float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v)))
    half = float(stats.t.ppf(1 - ALPHA / 2, len(v) - 1)) * sem
    return Interval(mean, mean - half, mean + half, f"mean over {len(v)} seeds, Student-t interval")


# ---------------------------------------------------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------------------------------------------------


def equivalent(diff: Interval, margin: float) -> str:
    """ "As accurate as" within ``margin``: holds when the whole interval lies inside (-margin, margin) (two one-sided
    tests at 5 % each, read off the 95 % interval: conservative); does not hold when it lies wholly outside."""
    if not diff.finite:
        return CANNOT_TELL
    if -margin < diff.low and diff.high < margin:
        return HOLDS
    if diff.low >= margin or diff.high <= -margin:
        return FAILS
    return CANNOT_TELL


def not_better(diff: Interval, margin: float) -> str:
    """ "No better than": ``diff`` = candidate - reference. Holds when the interval excludes a gain of ``margin`` or
    more; does not hold when the candidate is significantly better (the interval lies above 0)."""
    if not diff.finite:
        return CANNOT_TELL
    if diff.low > 0:
        return FAILS
    if diff.high < margin:
        return HOLDS
    return CANNOT_TELL


def lower_by_about(diff: Interval, gap: float) -> str:
    """ "About ``gap`` lower": ``diff`` = reference - candidate. Does not hold when the interval excludes a gap of even
    half ``gap``; holds when it excludes no gap (lies above 0) and does not exclude half the gap; else cannot tell."""
    if not diff.finite:
        return CANNOT_TELL
    if diff.high < gap / 2:
        return FAILS
    if diff.low > 0:
        return HOLDS
    return CANNOT_TELL


def positive(diff: Interval) -> str:
    """A difference claimed above 0: holds when the whole interval is, does not hold when the whole interval lies at
    or below 0, cannot tell when it straddles 0."""
    if not diff.finite:
        return CANNOT_TELL
    if diff.low > 0:
        return HOLDS
    return FAILS if diff.high <= 0 else CANNOT_TELL


def at_least(measure: Interval, threshold: float) -> str:
    """A measure (a count, a ratio) that must reach ``threshold``: holds when the interval lies at or above it, does
    not hold when it lies below it, cannot tell when it straddles it (or was not measured)."""
    if not measure.finite:
        return CANNOT_TELL
    if measure.low >= threshold:
        return HOLDS
    if measure.high < threshold:
        return FAILS
    return CANNOT_TELL


def exact(error: float, tolerance: float) -> str:
    """An exact construction: holds when its largest error is within ``tolerance``, does not hold beyond it."""
    if not math.isfinite(error):
        return CANNOT_TELL
    return HOLDS if error <= tolerance else FAILS


def significant_order(test: Interval) -> str:
    """An ordering claim tested one-sided (``spearman``, ``mann_whitney_less``): holds when p < 5 % in the claimed
    direction, does not hold when the estimate points the other way (or is flat), cannot tell otherwise."""
    if not math.isfinite(test.estimate):
        return CANNOT_TELL
    if test.estimate <= 0:
        return FAILS
    return HOLDS if test.p_value < ALPHA else CANNOT_TELL


def all_of(*verdicts: str) -> str:
    """A claim with several parts: does not hold when one part does not, holds when all do, else cannot tell."""
    if FAILS in verdicts:
        return FAILS
    return HOLDS if verdicts and all(v == HOLDS for v in verdicts) else CANNOT_TELL


def seeds_needed(spread: float, difference: float, power: float = 0.8) -> int | None:
    """Paired seeds needed to tell ``difference`` from 0 at 5 % (two-sided) with ``power``, given the standard
    deviation ``spread`` of the per-seed paired differences (normal approximation, plus one seed for the t's heavier
    tails). None when the spread is unknown (fewer than two seeds)."""
    if not (math.isfinite(spread) and spread > 0 and difference > 0):
        return None
    z = stats.norm.ppf(1 - ALPHA / 2) + stats.norm.ppf(power)
    return max(2, math.ceil((z * spread / difference) ** 2) + 1)
