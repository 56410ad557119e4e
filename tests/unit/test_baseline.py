"""The committed baseline: the embedded default's reference is in git, so that on a fresh clone, after
``make repro``, ``dvc metrics diff`` and ``dvc exp show`` compare the run against it.

Committed (the Makefile's ``BASELINE``, which ``make baseline`` stages): dvc.yaml's metrics files (each training
stage's ``test_acc.json``, one accuracy per variant: what ``dvc exp show`` shows), the detailed ``metrics.json``
files beside them, and ``dvc.lock`` (from the next ``make baseline`` on: ``LOCK_PENDING``). The lock is there so
that a dependency a run did not change compares equal against the baseline: without it every dependency (23 paths)
counts as changed and ``dvc exp show --only-changed`` cannot fit a screen. It goes stale where later commits change
code or params (those dependencies then show as changed until the next ``make baseline``); its manifests' hashes
differ on every run, since they name its MLflow runs. Not the manifests themselves: they name runs of one machine's
MLflow store.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from pipeline.config import load_params
from tests.project_copy import baseline_files, baseline_mismatches

ROOT = Path(__file__).resolve().parents[2]
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
TRAINING_STAGES = ("tune", "prune", "transform")


def _declared(kind: str) -> list[str]:
    """Every path of dvc.yaml's ``kind`` (metrics, outs) entries, in stage order."""
    return [
        path
        for stage in STAGES.values()
        for entry in stage.get(kind, [])
        for path in (entry if isinstance(entry, dict) else {entry: None})
    ]


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _committed_json(path: str) -> dict:
    return json.loads(_git("show", f"HEAD:{path}").stdout)


def test_the_metrics_dvc_compares_are_one_accuracy_per_variant() -> None:
    assert _declared("metrics") == [f"results/{stage}/test_acc.json" for stage in TRAINING_STAGES]


def test_make_baseline_stages_the_metrics_the_detailed_metrics_and_the_lock() -> None:
    details = [path for path in _declared("outs") if path.endswith("/metrics.json")]
    assert details == [f"results/{stage}/metrics.json" for stage in (*TRAINING_STAGES, "analysis")]
    assert baseline_files() == [*_declared("metrics"), *details, "dvc.lock"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^baseline: repro\b.*\n\tgit add \$\(BASELINE\)$", makefile, re.MULTILINE)


def test_every_metrics_file_is_committed() -> None:
    files = [path for path in baseline_files() if path != "dvc.lock"]
    tracked = set(_git("ls-files", "--", *files).stdout.split())
    assert tracked == set(files), f"committed: {sorted(tracked)}; make baseline's metrics files: {files}"


def test_the_committed_numbers_are_those_of_the_committed_params() -> None:
    """Every variant of the committed sweep has a reference accuracy (a renamed or added variant needs a refresh:
    ``make baseline`` on a fresh clone), and nothing else is there; each headline is its detailed file's."""
    params = load_params(ROOT / "params.yaml")
    for stage, names in (("tune", set(params.sweep.variants)), ("transform", set(params.transform.variants))):
        headline = _committed_json(f"results/{stage}/test_acc.json")
        assert set(headline) == names, stage
        assert all(0.0 < acc <= 1.0 for acc in headline.values()), headline
        details = _committed_json(f"results/{stage}/metrics.json")
        assert {name: entry["test_acc"] for name, entry in details.items()} == headline, stage
    assert set(_committed_json("results/analysis/metrics.json")) >= set(params.sweep.variants)


def test_the_committed_lock_is_the_committed_reference_run() -> None:
    """One run wrote the lock and the metrics files, on the committed params: tests/integration/test_tune_pipeline.py
    checks the same of a reference a real ``dvc repro`` made."""
    mismatches = baseline_mismatches(ROOT)
    assert not mismatches, "\n".join(mismatches)
