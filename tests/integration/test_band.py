"""The seed band runs as one DVC experiment (``python -m stages.band``: ``dvc exp run -S`` with params/band.yaml's
keys), here at the test project's tiny size on two fresh seeds of two variants, and its report pairs by seed."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pandas as pd
import pytest

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow
SEEDS = [61, 62]  # no other test trains them: nothing here is reused by another test's sweep, or reuses one


def test_the_band_runs_through_dvc_exp_run_and_pairs_by_seed(project: Project, project_params: dict) -> None:
    project_params["sweep"]["fail_once_after_epoch"] = None
    project_params["transform"]["variants"] = {}  # the rebuilt ResNet18 is not the band's: kept out, cheaper
    project.write_params(project_params)
    dry = project.run("python", "-m", "stages.band", "--dry-run").stdout
    assert "dvc exp run --name band -S" in dry and "sweep.seeds=[0,1,2,3,4]" in dry  # the committed overlay
    variants = "sweep.variants=[sa_quadratic_9,resnet18]"
    project.run("python", "-m", "stages.band", "--set", variants, "--set", f"sweep.seeds={SEEDS}", timeout=900)

    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    assert sorted((t["variant"], t["seed"]) for t in manifest["trials"]) == sorted(
        (v, s) for v in ("sa_quadratic_9", "resnet18") for s in SEEDS
    )
    shown = project.dvc("exp", "show", "--csv").stdout
    assert "band" in shown
    report = (project.path / "results/report.md").read_text()
    band = report.split("## Seed band")[1].split("\n## ")[0]
    assert "sa_quadratic_9 - resnet18: paired differences spread" in band and "seeds needed" in band
    claims = pd.read_csv(project.path / "results/tables/claims.csv").set_index("claim")
    accurate = claims.filter(like="as accurate as ResNet18", axis=0).iloc[0]
    assert accurate["test"].startswith("paired t over 2 seeds")
    assert accurate["verdict"].strip("*") in {"holds", "does not hold", "cannot tell at this scale"}
    compute = pd.read_csv(project.path / "results/tables/compute.csv")
    assert len(compute) == 4 and (compute["device_s"] > 0).all() and (compute["train_s"] > 0).all()
