"""A finished study retrains, under ``dvc repro``, exactly the trials whose code an edit changes.

One tiny study (each encoding and ResNet18, one seed, one epoch) finishes once; each test edits the project's code
as a researcher would, runs ``dvc repro tune`` (DVC re-runs the stage: its deps are the coarse trial code paths) and
reads from the stage's manifest which trials it trained and which it reused; the code and params are put back. An
edit of the training loop, which retrains all, is checked by its plan (``dvc status``, the stage's dry run).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Project

pytestmark = pytest.mark.slow

VARIANTS = {
    "id_quadratic": {"arch": "sa", "encoding": "quadratic", "heads": 1},
    "id_gpsa": {"arch": "sa", "encoding": "gpsa", "heads": 1},
    "id_generalized": {"arch": "sa", "encoding": "generalized_quadratic", "heads": 1},
    "id_learned": {"arch": "sa", "encoding": "learned", "heads": 1},
    "id_resnet18": {"arch": "resnet18"},
}

# docs/study.md's recipe: one module with one PositionalEncoding class, one registry entry, one variant.
FLAT_MODULE = '''"""A flat encoding: a learned scale per head times the shift's row plus column."""

import torch
from torch import Tensor, nn

from pipeline.models.positional import PositionalEncoding


class FlatEncoding(PositionalEncoding):
    def __init__(self, num_heads: int, max_grid: int, flat_scale: float = 0.1) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = nn.Parameter(torch.full((num_heads,), flat_scale))

    def scores(self, grid: tuple[int, int]) -> Tensor:
        return self.scale[:, None, None] * self._offsets(grid, self.scale).sum(-1)[None]
'''
FLAT_ENTRY = """    "flat": EncodingSpec(
        target="pipeline.models.flat:FlatEncoding",
        label="flat",
        summary="a learned scale per head times the shift's row plus column",
        fields={"flat_scale": (float, 0.1)},
    ),
}

DEFAULT_ENCODING"""


def repro(project: Project) -> dict:
    """``dvc repro tune``: the trials it trained and those it reused."""
    done = project.dvc("repro", "tune")
    assert "Running stage 'tune'" in done.stdout, done.stdout[-2000:]  # DVC saw the edit: its deps are coarse
    manifest = json.loads((project.path / "results/tune/manifest.json").read_text())
    trained = sorted(t["variant"] for t in manifest["trials"] if not t["reused"])
    reused = sorted(t["variant"] for t in manifest["trials"] if t["reused"])
    return {"trained": trained, "reused": reused}


def planned(project: Project) -> dict:
    """What ``dvc repro`` would do: whether DVC re-runs the tune stage, and the trials the stage plans to train (its
    dry run)."""
    status = project.dvc("status", "tune").stdout
    dry = project.run("python", "-m", "stages.tune", "--dry-run").stdout
    plans = [line.split() for line in dry.splitlines() if line.startswith("id_")]
    return {"reruns": "changed deps" in status, "train": sorted(p[0] for p in plans if p[-1] == "train")}


@contextmanager
def edited(project: Project, *changes: tuple[str, str, str]) -> Iterator[None]:
    """The project's files with ``(path, old, new)`` replacements of ``old``'s first occurrence (``old`` empty: the
    file is new), put back after."""
    kept: dict[Path, str | None] = {}
    try:
        for path, old, new in changes:
            file = project.path / path
            text = file.read_text() if file.exists() else None
            kept.setdefault(file, text)
            if not old:
                file.write_text(new)
                continue
            assert text is not None and old in text, (path, old)
            file.write_text(text.replace(old, new, 1))
        yield
    finally:
        for file, text in kept.items():
            if text is None:
                file.unlink(missing_ok=True)
            else:
                file.write_text(text)


@pytest.fixture(scope="module", autouse=True)
def finished(project: Project) -> Iterator[dict]:
    """The study, finished once: every variant trained (its own ``train.lr``: no other test's trial is reused). The
    project's params are put back at the end."""
    original = (project.path / "params.yaml").read_text()
    params = project.read_params()
    params["variants"] = VARIANTS
    params["grid"] = {}
    params["transform"]["variants"] = {}  # the tune stage alone runs here
    params["train"].update(lr=0.0613, epochs=1)
    params["sweep"].update(variants=list(VARIANTS), seeds=[0], fail_once_after_epoch=None)
    params["tracking"]["system_metrics"] = False
    project.write_params(params)
    try:
        project.dvc("repro", "prepare")  # the plan knows what it reuses once the data's content hash is known
        first = repro(project)
        assert first["trained"] == sorted(VARIANTS), first
        yield params
    finally:
        (project.path / "params.yaml").write_text(original)


def test_adding_an_encoding_trains_only_its_variant(project: Project, finished: dict) -> None:
    grown = {**finished, "variants": {**VARIANTS, "id_flat": {"arch": "sa", "encoding": "flat", "heads": 1}}}
    grown["sweep"] = {**finished["sweep"], "variants": [*VARIANTS, "id_flat"]}
    with edited(
        project,
        ("pipeline/models/flat.py", "", FLAT_MODULE),
        ("pipeline/encodings.py", "}\n\nDEFAULT_ENCODING", FLAT_ENTRY),
    ):
        project.write_params(grown)
        try:
            result = repro(project)
        finally:
            project.write_params(finished)
    assert result == {"trained": ["id_flat"], "reused": sorted(VARIANTS)}


def test_a_docstring_or_comment_edit_retrains_nothing(project: Project) -> None:
    # Anchors that survive other edits of these files: the first quotes (the module docstring), the first line.
    with edited(
        project,
        ("pipeline/models/quadratic.py", '"""The paper', '"""(Edited.) The paper'),
        ("pipeline/models/kinds.py", '"""Builds', '"""(Edited.) Builds'),
        ("pipeline/models/attention.py", '"""', '# an edited comment\n"""'),
    ):
        result = repro(project)
    assert result == {"trained": [], "reused": sorted(VARIANTS)}


def test_the_quadratic_encoding_s_scores_retrain_exactly_the_variants_built_on_it(project: Project) -> None:
    with edited(project, ("pipeline/models/quadratic.py", "return -0.5 * self.spreads", "return -0.4 * self.spreads")):
        result = repro(project)
    # GPSA starts from the quadratic encoding; the generalized one shares only the Gaussian heads' base class
    assert result["trained"] == ["id_gpsa", "id_quadratic"]
    assert result["reused"] == ["id_generalized", "id_learned", "id_resnet18"]


def test_an_edit_of_the_training_loop_retrains_everything(project: Project) -> None:
    # The plan only: a full `dvc repro` would train the whole study again, which the first repro already shows works.
    with edited(project, ("pipeline/trial/loop.py", "\nimport torch\n", "\nimport torch\n\nLOOP_EDITED = True\n")):
        plan = planned(project)
    assert plan == {"reruns": True, "train": sorted(VARIANTS)}
