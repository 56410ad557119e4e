"""Fine-tuning schedules (prune, transform): the sweep's train section, scaled, for every variant."""

from __future__ import annotations

import pytest

from pipeline.config import parse_params
from pipeline.finetune.plan import schedule_params


def test_a_variant_with_its_own_lr_fine_tunes_at_that_lr_scaled() -> None:
    """A variant's train.lr replaces the section's for its trials, so fine-tuning must scale it too, or a pruned GPSA
    model (its own lr 0.01) would fine-tune at 0.01 instead of 0.001."""
    gpsa = {"arch": "sa", "encoding": "gpsa", "heads": 9, "train.lr": 0.01}
    variants = {"g": gpsa, "r": {"arch": "resnet18"}}
    params = parse_params({"train": {"lr": 0.1}, "variants": variants, "sweep": {"variants": ["g", "r"]}})
    tuned = schedule_params(params, lr_factor=0.1, epochs=2)
    assert tuned.train_for("g").lr == pytest.approx(0.001) and tuned.train_for("r").lr == pytest.approx(0.01)
    assert tuned.train_for("g").epochs == tuned.train_for("r").epochs == 2
    assert params.train_for("g").lr == 0.01  # the sweep's own params are untouched
