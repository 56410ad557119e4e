"""The claims' pairing (per test image with one seed, across seeds with several) and the compute totals."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch import nn

from analysis.claims import Evidence, accuracy_difference, claims_table
from analysis.compute import compute_frame, total
from analysis.runs import LoadedRun, LoadedStudy


class Fixed(nn.Module):
    """Answers image i (its only value is i) with ``predictions[i]``."""

    def __init__(self, predictions: torch.Tensor) -> None:
        super().__init__()
        self.predictions = predictions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(self.predictions[x[:, 0].long()], 10).float()


N = 100
LABELS = torch.zeros(N, dtype=torch.long)
IMAGES = torch.arange(N, dtype=torch.float32).view(N, 1)


def run(variant: str, seed: int, wrong: list[int], test_acc: float | None = None, wall_s: float = 10.0) -> LoadedRun:
    predictions = torch.zeros(N, dtype=torch.long)
    predictions[wrong] = 1
    record = LoadedRun(f"{variant}-{seed}", variant, seed, "finished", "tune", model=Fixed(predictions))
    record.test_acc = 1 - len(wrong) / N if test_acc is None else test_acc
    record.epochs, record.wall_s, record.train_s = 3.0, wall_s, wall_s / 2
    return record


def evidence(runs: list[LoadedRun]) -> Evidence:
    study = LoadedStudy(runs, "sqlite:///x.db", "1", "parent", None)
    return Evidence(study, [], {"dataset": "digits", "image size": "8x8", "test images": N}, IMAGES, LABELS)


def test_one_seed_pairs_the_two_models_on_each_test_image() -> None:
    ev = evidence([run("sa_quadratic_9", 0, [0, 1, 2]), run("resnet18", 0, [3, 4, 5, 6, 7, 8, 9, 0])])
    diff, used = accuracy_difference(ev, "sa_quadratic_9", "resnet18")
    assert diff.estimate == pytest.approx(0.05)  # 97 % vs 92 %
    assert "McNemar exact: 7 vs 2 discordant" in diff.test  # image 0 both got wrong: not discordant
    assert [r.variant for r in used] == ["sa_quadratic_9", "resnet18"] and not ev.notes


def test_a_checkpoint_that_disagrees_with_its_logged_accuracy_is_named() -> None:
    ev = evidence([run("sa_quadratic_9", 0, [0], test_acc=0.5), run("resnet18", 0, [])])
    accuracy_difference(ev, "sa_quadratic_9", "resnet18")
    assert len(ev.notes) == 1 and "sa_quadratic_9 seed 0" in ev.notes[0] and "logged 0.5000" in ev.notes[0]


def test_several_seeds_pair_across_seeds() -> None:
    runs = [run("sa_quadratic_9", s, list(range(s + 1))) for s in range(3)]
    runs += [run("resnet18", s, list(range(s + 3))) for s in range(3)]
    diff, used = accuracy_difference(evidence(runs), "sa_quadratic_9", "resnet18")
    assert diff.estimate == pytest.approx(0.02) and diff.test == "paired t over 3 seeds" and len(used) == 6


def test_a_variant_not_run_cannot_be_paired() -> None:
    diff, used = accuracy_difference(evidence([run("resnet18", 0, [])]), "sa_quadratic_9", "resnet18")
    assert not diff.finite and diff.test == "no finished run of sa_quadratic_9" and used == []


def test_compute_counts_every_run_and_names_those_without_an_end() -> None:
    runs = [run("sa_quadratic_9", 0, [], wall_s=30.0), run("resnet18", 0, [], wall_s=math.nan)]
    runs[1].status = "error"
    frame = compute_frame(runs)
    assert total(frame) == (30.0, 1)
    assert total(frame, ["resnet18-0"]) == (0.0, 1)
    table = claims_table([], frame, lambda ids: "")
    assert isinstance(table, pd.DataFrame) and table.empty
