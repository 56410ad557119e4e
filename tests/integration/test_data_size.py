"""A data-size grid through the real stages (Ray, a real MLflow server): each trial trains on its class-balanced
fraction of the prepared training set, its run logs the fraction and the image count, and the report draws accuracy
and layer-1 locality against the fraction."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from mlflow.tracking import MlflowClient

from pipeline.data.prepared import load_prepared
from pipeline.data.subset import subset_size

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow


def test_a_data_fraction_grid_trains_balanced_subsets_and_the_report_draws_them(
    project: Project, project_params: dict
) -> None:
    params = project_params
    params["train"].update(lr=0.045, epochs=2)  # an lr of its own: trial identities no other test trains
    axes = {"train.data_fraction": [0.25, 1.0]}
    params["grid"] = {"size": {"arch": "sa", "encoding": "quadratic", "heads": 9, "axes": axes}}
    params["sweep"].update(variants=["size"], seeds=[0], fail_once_after_epoch=None)
    project.write_params(params)
    project.dvc("repro", "prepare")
    project.run("python", "-m", "stages.tune")

    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    client = MlflowClient(manifest["tracking_uri"])
    labels = load_prepared(project.path / "data/prepared").train_labels
    logged = {}
    for trial in manifest["trials"]:
        run = client.get_run(trial["run_id"])
        logged[trial["variant"]] = (run.data.params["train.data_fraction"], run.data.params["train_images"])
        assert [m.step for m in client.get_metric_history(trial["run_id"], "test_acc")] == [1, 2]
    assert logged == {
        "size_data_fraction0.25": ("0.25", str(subset_size(labels, 0.25))),
        "size_data_fraction1": ("1.0", str(len(labels))),
    }

    # The other stages' manifests may be another test's: the analysis reads this sweep's alone.
    absent = str(project.path / "results/none.json")
    project.run(
        "python", "-m", "stages.analyze", "--no-mlflow", "--prune-manifest", absent, "--transform-manifest", absent
    )
    report = (project.path / "results/report.md").read_text()
    assert "## Beyond the paper: data size" in report and "](figures/data_size.png)" in report
    assert (project.path / "results/figures/data_size.png").is_file()
    rows = (project.path / "results/tables/data_size.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("variant,seed,encoding,data_fraction,train_images")
