"""The whole pipeline as one Ray job, without a cluster (stages/_job.py, stages/pipeline.py): the entrypoint, the
interpreter DVC's stage commands start, which outputs travel back, and the bundle that carries them."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from stages._job import LISTING, entrypoint, pack_outputs, pipeline_outputs, python_first, unpack_outputs
from stages.pipeline import JOB_CONFIG_ENV, job_metadata

ROOT = Path(__file__).resolve().parents[3]


def test_the_entrypoint_names_the_interpreter() -> None:
    assert entrypoint("/opt/env/bin/python") == "/opt/env/bin/python -m stages.pipeline"
    assert entrypoint("/my env/python", ["tune", "prune"]) == "'/my env/python' -m stages.pipeline tune prune"


def test_dvcs_python_is_this_interpreter_whatever_path_finds_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "python").write_text("#!/bin/sh\necho other\n")
    (other / "python").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}:{Path(sys.executable).parent}:/usr/bin:/bin")  # an image's python first
    (tmp_path / "wrapper").mkdir()
    env = python_first(tmp_path / "wrapper")
    # DVC starts `python -m stages.X` through the shell: so does this.
    done = subprocess.run(
        "python -c 'import sys; print(sys.executable, sys.prefix)'",
        shell=True,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == [sys.executable, sys.prefix]  # the environment, not only its base interpreter


def test_the_job_brings_back_every_uncached_output_and_records_the_cached_ones() -> None:
    outputs = pipeline_outputs(ROOT)
    assert outputs.cached_stages == ["prepare"]  # its data is shipped, or prepared in the job
    assert "data/prepared" not in outputs.uncached
    for path in ("results/tune/manifest.json", "results/prune/test_acc.json", "results/figures", "results/report.md"):
        assert path in outputs.uncached
    assert "results/plots/accuracy.csv" in outputs.uncached  # plots and metrics are outputs too


def test_the_bundle_replaces_outputs_whole_and_the_lock_last(tmp_path: Path) -> None:
    job, here = tmp_path / "job", tmp_path / "here"
    for root in (job, here):
        (root / "results/figures").mkdir(parents=True)
    (job / "dvc.lock").write_text("new lock\n")
    (job / "results/report.md").write_text("report\n")
    (job / "results/figures/fig.png").write_bytes(b"\x89PNG\x00")
    (job / "results/empty").mkdir()
    (here / "dvc.lock").write_text("old lock\n")
    (here / "results/figures/stale.png").write_bytes(b"old")  # a figure an older run made: DVC hashes the folder
    archive = tmp_path / "bundle.zip"
    paths = ["results/report.md", "results/figures", "results/empty", "results/never_written.json"]
    packed = pack_outputs(job, paths, archive)
    assert packed == ["results/report.md", "results/figures", "results/empty", "dvc.lock"]
    assert unpack_outputs(archive, here) == packed
    assert (here / "dvc.lock").read_text() == "new lock\n"
    assert sorted(p.name for p in (here / "results/figures").iterdir()) == ["fig.png"]
    assert (here / "results/figures/fig.png").read_bytes() == b"\x89PNG\x00"
    assert (here / "results/empty").is_dir() and (here / "results/report.md").read_text() == "report\n"
    assert [p.name for p in here.iterdir() if p.name.startswith(".")] == []  # no temporary folder left


def test_a_bundle_naming_paths_outside_the_project_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr(LISTING, json.dumps(["../outside"]))
    with pytest.raises(ValueError, match=r"paths outside the project: \['\.\./outside'\]"):
        unpack_outputs(archive, tmp_path / "project")


def test_the_jobs_metadata_from_rays_job_supervisor() -> None:
    config = {"runtime_env": {}, "metadata": {"job_submission_id": "pipeline-1", "git_commit": "abc"}}
    assert job_metadata({JOB_CONFIG_ENV: json.dumps(config)}) == config["metadata"]
    assert job_metadata({}) == {}  # not a Ray job: nothing to publish


def test_a_checkout_without_git_records_the_commit_the_job_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.sweep.tracking.tags import GIT_COMMIT_ENV, git_commit

    monkeypatch.delenv(GIT_COMMIT_ENV, raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no repository above tmp_path counts
    assert git_commit(tmp_path) == "unknown"
    monkeypatch.setenv(GIT_COMMIT_ENV, "abc123-dirty")
    assert git_commit(tmp_path) == "abc123-dirty"
    assert git_commit(ROOT) not in ("unknown", "abc123-dirty")  # a checkout's own commit comes first
