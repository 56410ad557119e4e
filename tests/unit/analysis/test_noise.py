"""The test set's sampling noise: Wilson intervals, differences within it, and the pruning rule's words."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.noise import difference_noise, wilson_interval, within_noise
from analysis.prune_rule import describe_rule, is_papers_rule, not_comparable_note
from analysis.study import noise_note
from analysis.table import accuracy_table, format_table, mark_not_comparable

N = 360  # the embedded default's test images


def test_wilson_interval_brackets_the_accuracy_and_stays_in_0_1() -> None:
    low, high = wilson_interval(0.9639, N)
    assert low < 0.9639 < high and high - low == pytest.approx(0.039, abs=0.003)  # about +-2 points
    low, high = wilson_interval(1.0, N)
    assert high == pytest.approx(1.0) and 0.98 < low < 1.0  # the normal approximation would give a zero-width interval
    assert all(math.isnan(v) for v in wilson_interval(0.5, 0)) and math.isnan(wilson_interval(math.nan, N)[0])
    wide, narrow = wilson_interval(0.9, 100), wilson_interval(0.9, 10_000)
    assert wide[1] - wide[0] > narrow[1] - narrow[0]


def test_a_difference_of_a_few_images_is_within_the_noise() -> None:
    assert within_noise(0.9639, 0.9583, N)  # two images apart on 360
    assert not within_noise(0.9972, 0.9194, N)  # ResNet18 against SA learned: 28 images
    assert difference_noise(0.96, 0.96, N) == pytest.approx(1.96 * math.sqrt(2 * 0.96 * 0.04 / N), rel=1e-3)
    assert not within_noise(math.nan, 0.9, N)


def _runs() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"variant": v, "seed": 0, "status": "finished", "test_acc": acc, "epochs": 4}
            for v, acc in (("resnet18", 0.9972), ("sa_quadratic_9", 0.9639), ("sa_generalized_9_pruned", 0.9583))
        ]
    )


def test_the_table_shows_intervals_and_never_sets_another_rule_beside_the_papers_pruned_number() -> None:
    table = accuracy_table(_runs(), test_images=N)
    shown = format_table(table).set_index("model")
    assert shown.iloc[1, 0].startswith("96.39 (n=1) [") and shown.iloc[1, 0].endswith("]")
    rule = {"mode": "fraction", "fraction": 0.34, "min_eigenvalue": 1e-5, "max_condition": 1000}
    assert not is_papers_rule(rule) and "fraction mode (ours" in describe_rule(rule)
    marked = mark_not_comparable(table, ["sa_generalized_9_pruned"], not_comparable_note(rule))
    row = marked.set_index("variant").loc["sa_generalized_9_pruned"]
    assert not row["comparable"] and math.isnan(row["paper_acc"]) and "not the paper's experiment" in row["note"]
    assert format_table(marked).iloc[2]["paper test acc %"] == "not comparable (note)"
    assert format_table(table).iloc[2]["paper test acc %"] == "93.40"  # the paper's rule: beside it, as before
    papers = {"mode": "threshold", "min_eigenvalue": 1e-5, "max_condition": 1000.0}
    assert is_papers_rule(papers) and not_comparable_note(papers) == ""
    assert "condition number above 1000" in describe_rule(papers)


def test_the_noise_note_names_the_pairs_the_test_set_cannot_order() -> None:
    note = noise_note(accuracy_table(_runs(), test_images=N), N)
    assert f"Test set: {N} images" in note and "0.28 points" in note
    assert "SA quadratic / SA quadratic generalized, pruned (0.56 points" in note
    assert "ResNet18 / SA quadratic (" not in note  # 3.3 points: more than the noise
    assert "not known" in noise_note(accuracy_table(_runs()), None)
