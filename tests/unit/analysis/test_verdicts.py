"""Every verdict rule on synthetic results that must come out holds, does not hold and cannot tell."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import verdicts as v


def interval(low: float, high: float) -> v.Interval:
    return v.Interval((low + high) / 2, low, high, "synthetic")


@pytest.mark.parametrize(
    ("rule", "holds", "fails", "unsure"),
    [
        (lambda d: v.equivalent(d, 0.01), interval(-0.005, 0.008), interval(-0.05, -0.02), interval(-0.02, 0.005)),
        (lambda d: v.not_better(d, 0.01), interval(-0.03, 0.004), interval(0.002, 0.03), interval(-0.01, 0.02)),
        (lambda d: v.lower_by_about(d, 0.02), interval(0.01, 0.04), interval(-0.01, 0.005), interval(-0.01, 0.03)),
        (v.positive, interval(0.1, 0.9), interval(-0.5, -0.1), interval(-0.1, 0.4)),
        (lambda d: v.at_least(d, 3), interval(3, 6), interval(0, 2), interval(2, 4)),
    ],
    ids=["equivalent", "not_better", "lower_by_about", "positive", "at_least"],
)
def test_interval_rules_give_all_three_verdicts(rule, holds, fails, unsure) -> None:
    assert rule(holds) == v.HOLDS
    assert rule(fails) == v.FAILS
    assert rule(unsure) == v.CANNOT_TELL
    assert rule(v.NOT_MEASURED) == v.CANNOT_TELL  # a missing measure is never a verdict


def test_exact_rule() -> None:
    assert v.exact(1e-7, 1e-4) == v.HOLDS
    assert v.exact(0.3, 1e-4) == v.FAILS
    assert v.exact(math.nan, 1e-4) == v.CANNOT_TELL


def test_order_rule_on_spearman_and_mann_whitney() -> None:
    assert v.significant_order(v.spearman([0, 0, 1, 1, 2, 3])) == v.HOLDS
    assert v.significant_order(v.spearman([3, 2, 2, 1, 0, 0])) == v.FAILS
    assert v.significant_order(v.spearman([0, 2, 1, 0, 2, 1])) == v.CANNOT_TELL
    assert v.significant_order(v.mann_whitney_less([1.0, 1.1, 1.2, 1.3, 0.9], [3.0, 3.1, 2.9, 3.2, 2.8])) == v.HOLDS
    assert v.significant_order(v.mann_whitney_less([3.0, 3.1, 2.9], [1.0, 1.1, 1.2])) == v.FAILS
    assert v.significant_order(v.mann_whitney_less([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])) == v.CANNOT_TELL


def test_all_of() -> None:
    assert v.all_of(v.HOLDS, v.HOLDS) == v.HOLDS
    assert v.all_of(v.HOLDS, v.FAILS, v.CANNOT_TELL) == v.FAILS
    assert v.all_of(v.HOLDS, v.CANNOT_TELL) == v.CANNOT_TELL


def test_paired_seeds_interval_is_students() -> None:
    diff = v.paired_seeds([0.95, 0.96, 0.97], [0.94, 0.94, 0.94])  # differences 0.01, 0.02, 0.03
    assert diff.estimate == pytest.approx(0.02)
    assert diff.high - diff.estimate == pytest.approx(4.302653 * 0.01 / math.sqrt(3), rel=1e-5)  # t(0.975, 2)
    assert v.paired_seeds([0.9], [0.8]) is v.NOT_MEASURED  # one pair: no spread to interval


def test_paired_images_counts_the_discordant_images() -> None:
    a = np.array([True] * 90 + [True] * 8 + [False] * 2)
    b = np.array([True] * 90 + [False] * 8 + [True] * 2)
    diff = v.paired_images(a, b)
    assert diff.estimate == pytest.approx(0.06)
    assert "8 vs 2" in diff.test
    assert diff.p_value == pytest.approx(0.109375)  # two-sided binomial, 2 of 10 at 0.5
    assert diff.low < diff.estimate < diff.high
    same = v.paired_images(a, a)
    assert same.estimate == 0 and same.p_value == 1.0 and v.equivalent(same, 0.1) == v.HOLDS


def test_seeds_needed_grows_with_the_spread() -> None:
    assert v.seeds_needed(0.003, 0.003) == 9  # (1.96 + 0.84)^2 = 7.85 -> 8, plus one
    assert v.seeds_needed(0.006, 0.003) > v.seeds_needed(0.003, 0.003)
    assert v.seeds_needed(math.nan, 0.003) is None
