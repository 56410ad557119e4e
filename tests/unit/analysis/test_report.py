"""The report's pieces that are not figures: the scale note, sections with their own figures, the accuracy gap."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from analysis.report import PAPER_SETTING, FigureEntry, Section, render_report, scale_note
from analysis.runs import LoadedRun
from analysis.study import REPORTED_SEEDS, accuracy_gaps, baseline_of, reported_runs, seed_ranges
from analysis.variants import describe_variants

CONFIGS = {
    "sa_quadratic_9": {"arch": "sa", "encoding": "quadratic", "heads": 9},
    "sa_learned_9": {"arch": "sa", "encoding": "learned", "heads": 9},
    "sa_generalized_9_pruned": {"arch": "sa", "encoding": "generalized_quadratic", "heads": 9},
    "resnet18": {"arch": "resnet18"},
    "resnet18_wide": {"arch": "resnet18", "resnet_width": 16},
}


def test_scale_note_names_what_differs_and_never_calls_a_full_run_smoke() -> None:
    note = scale_note({"dataset": "digits", "image size": "8x8", "epochs": 40, "hidden": 32, "layers": 6})
    assert note.startswith("smaller than the paper's setting: dataset digits (paper: cifar10)")
    assert "epochs 40 (paper: 300)" in note and "layers" not in note and "smoke" not in note
    assert scale_note(PAPER_SETTING) == "the paper's scale"


def test_a_section_carries_its_figures_and_the_figure_list_keeps_the_rest() -> None:
    beside = FigureEntry("figures/fig2_trajectories.png", "Fig. 2: head centres", "Layer 1 moved 1.77 tokens.")
    other = FigureEntry("figures/fig4_accuracy.png", "Figs. 4/8: accuracy", "Curves.")
    section = Section("The paper's finding, measured", "| layer | displacement |\n|---|---|\n| 1 | 1.77 |", [beside])
    report = render_report({"dataset": "digits"}, "| table |", [other], sections=[section])
    finding, rest = report.split("## Figures")
    assert finding.index("## The paper's finding, measured") < finding.index("| 1 | 1.77 |")
    assert finding.index("| 1 | 1.77 |") < finding.index("](figures/fig2_trajectories.png)")  # numbers, then picture
    assert "Layer 1 moved 1.77 tokens." in finding
    assert "](figures/fig4_accuracy.png)" in rest and "fig2_trajectories" not in rest  # drawn once, beside its numbers


def test_accuracy_gap_of_every_attention_variant_to_resnet18() -> None:
    variants = describe_variants(CONFIGS)
    summary = {
        "sa_quadratic_9": {"test_acc_mean": 0.9639},
        "sa_learned_9": {"test_acc_mean": None},  # no completed run
        "sa_generalized_9_pruned": {"test_acc_mean": 0.9472},
        "resnet18": {"test_acc_mean": 0.9972},
        "resnet18_wide": {"test_acc_mean": 0.5},  # another ResNet is no attention variant, nor the baseline
    }
    baseline, gaps = accuracy_gaps(summary, variants)
    assert baseline == "resnet18"
    assert gaps.keys() == {"sa_quadratic_9", "sa_learned_9", "sa_generalized_9_pruned"}
    assert gaps["sa_quadratic_9"] == pytest.approx(3.33) and gaps["sa_generalized_9_pruned"] == pytest.approx(5.0)
    assert math.isnan(gaps["sa_learned_9"])
    failed = accuracy_gaps({**summary, "resnet18": {"test_acc_mean": None}}, variants)[1]
    assert all(math.isnan(gap) for gap in failed.values())


def test_the_baseline_is_resnet18_else_the_first_resnet_else_none() -> None:
    assert baseline_of(describe_variants(CONFIGS)) == "resnet18"
    grid = {name: c for name, c in CONFIGS.items() if name != "resnet18"}
    assert baseline_of(describe_variants(grid)) == "resnet18_wide"
    assert baseline_of(describe_variants({"sa_quadratic_9": CONFIGS["sa_quadratic_9"]})) is None
    assert accuracy_gaps({"sa_quadratic_9": {"test_acc_mean": 0.9}}, describe_variants(grid))[0] == "resnet18_wide"


def test_the_finding_table_lists_each_variants_first_seeds_in_the_studys_order() -> None:
    """A thousand seeds would make the report's finding table thousands of rows: each variant's REPORTED_SEEDS lowest
    seeds with a head summary are listed, in the study's variant order, the rest left to the CSV."""
    runs = [LoadedRun(f"q{seed}", "sa_quadratic_9", seed, "finished", "tune") for seed in reversed(range(7))]
    runs += [LoadedRun(f"g{seed}", "sa_generalized_9", seed, "finished", "tune") for seed in range(3)]
    summary = pd.DataFrame({"layer": [1]})
    summaries = {r.run_id: summary for r in runs if r.run_id != "g1"}  # g1 kept no head history
    fx = SimpleNamespace(variants={"sa_generalized_9": None, "sa_quadratic_9": None}, study=SimpleNamespace(runs=runs))
    listed = [r.run_id for r in reported_runs(fx, summaries)]  # type: ignore[arg-type]
    assert listed == ["g0", "g2", *(f"q{seed}" for seed in range(REPORTED_SEEDS))]


@pytest.mark.parametrize(
    ("seeds", "shown"),
    [([0], "0"), ([0, 1], "0, 1"), ([2, 0, 1], "0-2"), ([*range(167), 200, 201], "0-166, 200, 201"), ([], "")],
)
def test_the_settings_seeds_read_as_ranges(seeds: list[int], shown: str) -> None:
    assert seed_ranges(seeds) == shown
