"""A params overlay becomes ``dvc exp run -S`` overrides, checked against the project's params before DVC runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.config import ConfigError
from pipeline.overlay import overlay_overrides

ROOT = Path(__file__).resolve().parents[3]


def test_the_band_overlay_sets_five_paired_seeds_of_the_papers_variants() -> None:
    overrides, params = overlay_overrides(ROOT / "params/band.yaml", ROOT / "params.yaml")
    assert overrides == [
        'sweep.variants=["sa_quadratic_9","sa_quadratic_16","sa_generalized_9","sa_learned_9","resnet18"]',
        "sweep.seeds=[0,1,2,3,4]",
    ]
    assert params.sweep.seeds == [0, 1, 2, 3, 4] and params.train.epochs == 40  # the rest is params.yaml's
    assert params.data.dataset == "digits"


def test_a_later_key_replaces_the_overlays_and_nested_keys_flatten(tmp_path: Path) -> None:
    overlay = tmp_path / "band.yaml"
    overlay.write_text(yaml.safe_dump({"sweep": {"seeds": [0, 1]}, "train": {"epochs": 3, "lr": 0.05}}))
    overrides, params = overlay_overrides(overlay, ROOT / "params.yaml", ["sweep.seeds=[7, 8]"])
    assert overrides == ["sweep.seeds=[7,8]", "train.epochs=3", "train.lr=0.05"]
    assert params.sweep.seeds == [7, 8] and params.train.lr == 0.05


@pytest.mark.parametrize(
    ("overlay", "extra", "named"),
    [
        ({"sweep": {"seed": [1]}}, [], "sweep.seed"),  # a misspelt key
        ({"train": {"epochs": -1}}, [], "train.epochs"),  # a value the stages refuse
        ({"sweep": {"seeds": [1]}}, ["sweep.seeds"], "expected key=value"),
        ({"nosuch": {"x": 1}}, [], "nosuch is not a section"),
    ],
)
def test_a_wrong_key_or_value_is_named_before_dvc_runs(tmp_path: Path, overlay, extra, named) -> None:
    path = tmp_path / "band.yaml"
    path.write_text(yaml.safe_dump(overlay))
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        overlay_overrides(path, ROOT / "params.yaml", extra)
