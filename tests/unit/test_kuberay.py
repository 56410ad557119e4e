"""examples/kuberay/rayjob.yaml runs what tests/cluster/test_pipeline_job.py submits: the same entrypoint (with the
image's interpreter named), stopped as that submission stops it, on a cluster with token authentication that goes
away when the job ends."""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.sweep.submit import STOP_LIKE_CTRL_C
from stages._job import entrypoint

ROOT = Path(__file__).resolve().parents[2]
IMAGE_PYTHON = "/home/ray/anaconda3/bin/python"  # Ray's images' interpreter (examples/kuberay/Dockerfile)


def test_the_rayjob_runs_the_tested_entrypoint() -> None:
    job = yaml.safe_load((ROOT / "examples/kuberay/rayjob.yaml").read_text())
    spec = job["spec"]
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert spec["entrypoint"] == entrypoint(IMAGE_PYTHON)
    assert IMAGE_PYTHON in (ROOT / "examples/kuberay/Dockerfile").read_text()
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert runtime_env["env_vars"] == STOP_LIKE_CTRL_C  # `ray job stop` as `stages.submit`'s Ctrl-C
    assert runtime_env["working_dir"].endswith(".zip")  # the commit's archive: the code is pulled
    assert "git_commit" in spec["metadata"]  # what the runs record (the working_dir has no .git)
    assert spec["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    assert spec["shutdownAfterJobFinishes"] is True
