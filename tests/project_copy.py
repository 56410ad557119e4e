"""The project as a user's checkout holds it: the working tree's git-tracked and not-ignored files, and of those the
reference ``make baseline`` commits.

One definition for the tests that need it: the integration and cluster tests copy it into a temporary git repository
where the real ``dvc`` and stages run; the layout test reads every file of it; the baseline tests read the Makefile's
list of the reference files.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import yaml
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]


def project_files(root: Path = ROOT) -> list[str]:
    """Tracked and untracked-but-not-ignored files under ``root`` (relative paths): a new file counts before it is
    committed, an ignored output (``.venv``, ``results/``, ``mlflow.db``) never does."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [name for name in listed if (root / name).is_file()]  # a deleted but still tracked file is not there


def copy_project(destination: Path, root: Path = ROOT, leave_out: Iterable[str] = ("dvc.lock",)) -> Path:
    """Copy ``project_files(root)`` into ``destination`` (created if needed), without ``leave_out``: ``dvc.lock``
    by default (a committed one records the default's run, not the copy's), so the copy's first ``dvc repro`` runs
    its stages."""
    skipped = set(leave_out)
    for name in project_files(root):
        if name not in skipped:
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, destination / name)
    return destination


def baseline_files(root: Path = ROOT) -> list[str]:
    """The files ``make baseline`` commits as the reference runs are compared against: the Makefile's ``BASELINE``
    (its continued lines joined), in its order."""
    makefile = (root / "Makefile").read_text().replace("\\\n", " ")
    listed = re.search(r"^BASELINE := (.+)$", makefile, re.MULTILINE)
    if listed is None:
        raise ValueError(f"{root / 'Makefile'}: no 'BASELINE := ...' line")
    return listed.group(1).split()


def baseline_mismatches(root: Path = ROOT) -> list[str]:
    """What makes the reference committed at ``root``'s HEAD other than one run on its committed params: a stage of
    dvc.yaml the lock lacks, a stage whose params in the lock are not params.yaml's, a metrics file whose md5 is not
    the one the lock records (a lock of another run, or of older params, makes unchanged params and dependencies
    compare as changed)."""

    def committed(path: str) -> str:
        shown = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=root, capture_output=True, text=True, check=True)
        return shown.stdout

    dvc_yaml = YAML(typ="safe", pure=True)  # YAML 1.2, as DVC reads params and writes the lock (1e-4 is a float)
    stages = yaml.safe_load(committed("dvc.yaml"))["stages"]
    lock = dvc_yaml.load(committed("dvc.lock"))["stages"]
    params = dvc_yaml.load(committed("params.yaml"))
    found = [f"dvc.lock: no stage {name!r}" for name in stages.keys() - lock.keys()]
    recorded = {}
    for name, stage in lock.items():
        ran = stage.get("params", {}).get("params.yaml", {})
        for key in stages[name].get("params", []):
            if ran.get(key) != params[key]:
                found.append(f"dvc.lock: stage {name!r} ran on {key}={ran.get(key)!r}; params.yaml: {params[key]!r}")
        recorded.update({out["path"]: out.get("md5") for out in stage.get("outs", [])})
    for path in baseline_files(root):
        if path != "dvc.lock" and recorded.get(path) != hashlib.md5(committed(path).encode()).hexdigest():
            found.append(f"{path}: not the file dvc.lock records")
    return found
