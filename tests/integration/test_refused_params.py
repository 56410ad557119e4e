"""A value a stage refuses, set the way users set values (``dvc exp run -S``), costs no output: DVC would delete a
stage's outputs before running its command, so every output in dvc.yaml is ``persist: true`` and each stage refuses
bad input before it touches anything. What the refused run leaves: its value in params.yaml (DVC writes ``-S``
values there before it runs anything) and nothing else; the next valid run redoes no stage."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow

OUTPUTS = ("data/prepared", "results")


def _outputs(project: Project) -> dict[str, str]:
    """Every file under the stages' output folders, by its content's hash."""
    files = (path for folder in OUTPUTS for path in (project.path / folder).rglob("*") if path.is_file())
    return {str(path.relative_to(project.path)): hashlib.sha256(path.read_bytes()).hexdigest() for path in files}


def _refused(project: Project, *assignments: str) -> str:
    """``dvc exp run -S ...`` that must fail; its output."""
    command = ["dvc", "exp", "run", *(arg for value in assignments for arg in ("-S", value))]
    done = subprocess.run(command, cwd=project.path, env=project.env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stdout[-3000:]
    return done.stdout + done.stderr


@pytest.mark.parametrize(
    ("assignments", "stage", "named"),
    [
        (("train.epochs=-1",), "tune", "train.epochs: Input should be greater than 0"),
        (("data.dataset=cifar10", "data.cifar10_path=missing/cifar-10-python.tar.gz"), "prepare", "data.cifar10_path"),
        # 0.1 % of ~144 training digits per class rounds to no validation image for every class
        (("data.validation_fraction=0.001",), "prepare", "data.validation_fraction: 0.001 leaves a class"),
    ],
    ids=["tune-refuses-epochs", "prepare-finds-no-archive", "prepare-refuses-an-empty-validation-class"],
)
def test_a_refused_value_costs_no_output(
    project: Project, project_params: dict, assignments: tuple[str, ...], stage: str, named: str
) -> None:
    project.dvc("repro", "prepare")  # the prepared data exist, and the metrics files (committed, or an earlier run's)
    before, committed = _outputs(project), (project.path / "params.yaml").read_text()
    assert "data/prepared/train.pt" in before and "results/tune/metrics.json" in before
    status = ("git", "status", "--porcelain", "--untracked-files=no")
    changed_before = set(project.run(*status).stdout.splitlines())  # other tests' runs may have changed metrics files

    output = _refused(project, *assignments)
    assert f"failed to reproduce '{stage}'" in output and named in output, output[-3000:]
    assert _outputs(project) == before  # nothing deleted, nothing half-written
    changed = set(project.run(*status).stdout.splitlines()) - changed_before
    assert changed <= {" M params.yaml"}, changed  # only DVC's own -S edit

    Path(project.path / "params.yaml").write_text(committed)
    again = project.dvc("repro", "prepare").stdout
    assert "didn't change, skipping" in again, again  # the prepared data are still the ones dvc.lock records
    assert _outputs(project) == before
