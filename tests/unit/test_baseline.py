"""The committed baseline: the embedded default's reference metrics are in git, so that on a fresh clone, after
``make repro``, ``dvc metrics diff`` and ``dvc exp show`` compare the run against them.

Only dvc.yaml's metrics files are committed. Not ``dvc.lock``: it records the hash of every dependency, code
included (the analyze stage depends on all of ``pipeline/``), so it goes stale with nearly every commit, and neither
``dvc metrics diff`` nor ``dvc exp show`` needs it (they read the metrics files from git at each revision); without
it a fresh clone's ``dvc repro`` runs every stage, as it must, since the MLflow runs the stages name are not in
the clone. Not the manifests either: they name runs of one machine's MLflow store.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from pipeline.config import load_params

ROOT = Path(__file__).resolve().parents[2]
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def _metrics_files() -> list[str]:
    """Every metrics file dvc.yaml declares, in stage order."""
    return [
        path
        for stage in STAGES.values()
        for entry in stage.get("metrics", [])
        for path in (entry if isinstance(entry, dict) else {entry: None})
    ]


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def test_every_metrics_file_is_committed_and_the_lock_is_not() -> None:
    files = _metrics_files()
    assert files, "dvc.yaml declares no metrics"
    tracked = set(_git("ls-files", "--", *files, "dvc.lock").stdout.split())
    assert tracked == set(files), f"committed: {sorted(tracked)}; dvc.yaml's metrics files: {files}"


def test_make_baseline_stages_exactly_the_metrics_files() -> None:
    makefile = (ROOT / "Makefile").read_text()
    listed = re.search(r"^BASELINE := (.+)$", makefile, re.MULTILINE)
    assert listed and listed.group(1).split() == _metrics_files()
    assert re.search(r"^baseline: repro\b.*\n\tgit add \$\(BASELINE\)$", makefile, re.MULTILINE)


def test_the_committed_numbers_are_those_of_the_committed_params() -> None:
    """Every variant of the committed sweep has a reference accuracy (a renamed or added variant needs a refresh:
    ``make baseline`` on a fresh clone), and nothing else is there."""
    committed = {path: json.loads(_git("show", f"HEAD:{path}").stdout) for path in _metrics_files()}
    variants = set(load_params(ROOT / "params.yaml").sweep.variants)
    tune = committed["results/tune/metrics.json"]
    assert set(tune) == variants
    assert all(0.0 < entry["test_acc"] <= 1.0 for entry in tune.values())
    assert set(committed["results/analysis/metrics.json"]) >= variants
    transform = committed["results/transform/metrics.json"]
    assert set(transform) == set(load_params(ROOT / "params.yaml").transform.variants)
    assert all(0.0 < entry["test_acc_step0"] <= 1.0 and 0.0 < entry["test_acc"] <= 1.0 for entry in transform.values())
