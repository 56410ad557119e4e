"""The worker / driver boundary: the trial code is declared once, DVC depends on exactly it, and nothing else
changes a sweep's identity. Also: every module a stage imports is one of its DVC deps."""

from __future__ import annotations

import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from pipeline.config import EncodingName
from pipeline.encodings import ENCODINGS
from pipeline.sweep import identity
from pipeline.sweep.identity import TRIAL_CODE, code_hash
from tests.project_copy import project_files

ROOT = Path(__file__).resolve().parents[2]
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def _project_modules_imported_by(*modules: str) -> set[str]:
    """Project files (relative paths) loaded by a fresh interpreter after importing ``modules``."""
    code = (
        "import sys, importlib\n"
        f"for name in {list(modules)!r}: importlib.import_module(name)\n"
        "for m in list(sys.modules.values()):\n"
        "    f = getattr(m, '__file__', None)\n"
        "    if f: print(f)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    files = {Path(line).resolve() for line in done.stdout.split() if Path(line).is_absolute()}
    return {f.relative_to(ROOT).as_posix() for f in files if f.is_relative_to(ROOT) and ".venv" not in f.parts}


def _covered(path: str, deps: typing.Iterable[str]) -> bool:
    return any(path == dep or path.startswith(dep.rstrip("/") + "/") for dep in deps)


def test_tune_stage_depends_on_exactly_the_trial_code() -> None:
    code_deps = [d for d in STAGES["tune"]["deps"] if not d.startswith(("stages/", "${"))]
    assert sorted(code_deps) == sorted(TRIAL_CODE)


def test_prune_stage_depends_on_the_trial_code_and_the_tune_manifest() -> None:
    code_deps = [d for d in STAGES["prune"]["deps"] if d.startswith("pipeline/")]
    assert sorted(code_deps) == sorted(TRIAL_CODE)
    assert "results/tune/manifest.json" in STAGES["prune"]["deps"]


def test_transform_stage_depends_on_the_trial_code_and_the_tune_manifest() -> None:
    code_deps = [d for d in STAGES["transform"]["deps"] if d.startswith("pipeline/")]
    assert sorted(code_deps) == sorted(TRIAL_CODE)
    assert "results/tune/manifest.json" in STAGES["transform"]["deps"]
    assert "results/transform/manifest.json" in STAGES["analyze"]["deps"]


def test_everything_a_trial_imports_is_trial_code() -> None:
    # A worker imports the trainable and unpickles the prepared data; nothing else of the project.
    imported = _project_modules_imported_by("pipeline.trial.trainable", "pipeline.data.prepared")
    assert "pipeline/trial/loop.py" in imported  # the check sees the project's modules at all
    outside = sorted(path for path in imported if not _covered(path, TRIAL_CODE))
    assert not outside, f"imported by a trial but not declared in TRIAL_CODE: {outside}"


def test_every_module_the_prepare_stage_imports_is_a_dvc_dep() -> None:
    # (The tune stage depends on the trial code only, by design: its driver code cannot change a trained result.)
    imported = _project_modules_imported_by("stages.prepare")
    imported -= {"stages/__init__.py"}  # an empty package marker
    assert "pipeline/data/sources.py" in imported
    missing = sorted(path for path in imported if not _covered(path, STAGES["prepare"]["deps"]))
    assert not missing, f"stages.prepare imports modules its dvc.yaml deps miss: {missing}"


def _copy_of_the_code(tmp_path: Path) -> Path:
    for folder in ("pipeline", "analysis", "benchmarks", "stages"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@pytest.mark.parametrize(
    "edited",
    [
        "pipeline/sweep/tracking/callback.py",
        "pipeline/measure/tables.py",
        "pipeline/io.py",
        "pipeline/data/sources.py",
        "analysis/__init__.py",
        "benchmarks/train_speed.py",
        "stages/tune.py",
    ],
)
def test_editing_driver_or_measuring_code_keeps_the_sweep_identity(tmp_path: Path, edited: str) -> None:
    root = _copy_of_the_code(tmp_path)
    before = code_hash(root)
    with (root / edited).open("a") as handle:
        handle.write("\n# an edited log line\n")
    assert code_hash(root) == before


@pytest.mark.parametrize(
    "edited",
    ["pipeline/trial/loop.py", "pipeline/models/attention.py", "pipeline/config.py", "pipeline/data/prepared.py"],
)
def test_editing_trial_code_changes_the_sweep_identity(tmp_path: Path, edited: str) -> None:
    root = _copy_of_the_code(tmp_path)
    before = code_hash(root)
    with (root / edited).open("a") as handle:
        handle.write("\n# a change to what trains\n")
    assert code_hash(root) != before


def test_a_new_trial_module_changes_the_sweep_identity(tmp_path: Path) -> None:
    root = _copy_of_the_code(tmp_path)
    before = code_hash(root)
    (root / "pipeline/trial/extra.py").write_text("X = 1\n")
    assert code_hash(root) != before


def test_code_hash_of_this_checkout_is_the_identity_used() -> None:
    assert identity.PROJECT_ROOT == ROOT and code_hash() == code_hash(ROOT)


def test_encoding_names_in_config_are_the_registry_entries() -> None:
    assert set(typing.get_args(EncodingName)) == set(ENCODINGS)


def test_no_project_file_cites_documents_outside_the_repository() -> None:
    listed = project_files(ROOT)
    this_file = Path(__file__).resolve().relative_to(ROOT).as_posix()
    needles = ("shared/docs", "../shared", "ecosystem.md", "DESIGN.md", "STYLE.md", "ROADMAP.md", "paper.md")
    cited = [
        f"{name}: {needle}"
        for name in listed
        if name != this_file and (ROOT / name).is_file() and name.endswith((".py", ".md", ".yaml", ".toml", "ignore"))
        for needle in needles
        if needle in (ROOT / name).read_text(errors="replace")
    ]
    assert not cited, cited
