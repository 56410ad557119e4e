"""The whole pipeline as one Ray job: `dvc repro` on the cluster's head, each stage a driver there, its outputs
published for the workstation that submitted it.

What a job runs: `ray job submit --working-dir DIR -- PYTHON -m stages.pipeline [TARGET ...]` (`python -m
stages.submit` submits it with the code and prepared data; KubeRay's RayJob runs the same entrypoint:
examples/kuberay/). PYTHON is the project's environment, named: every stage runs with this interpreter, whatever
`python` the head's PATH finds first (dvc.yaml's commands say `python`; a wrapper put first on PATH makes it this one).
Steps: DVC without git (a job's working_dir has no .git: `core.no_scm` in .dvc/config.local); the shipped outputs of
cached stages (the prepared data) recorded with `dvc commit STAGE` when they are exactly what dvc.lock says (never
forced: otherwise `dvc repro` runs the stage here); `dvc repro [TARGET ...]`; then, in a submitted job, dvc.lock and
every output DVC does not cache zipped onto the sweep's parent run (`dvc_outs/`, tagged with the submission id), which
`stages.submit` unpacks into the workstation's checkout. The runs record the commit the job's metadata names
(`git_commit`, set by `stages.submit`; a RayJob's spec.metadata) instead of `unknown`.
Ctrl-C / `ray job stop` reach the stages, which stop as on Ctrl-C; this process and DVC wait for them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pipeline.config import Params
from pipeline.sweep.session import JOB_CONFIG_ENV  # Ray's job supervisor: the job's runtime_env and metadata, as JSON
from stages._cli import main_for, make_parser
from stages._job import BUNDLE, dvc, pack_outputs, pipeline_outputs, python_first

log = logging.getLogger("stages.pipeline")
TUNE_MANIFEST = Path("results/tune/manifest.json")  # names the sweep's parent run, which carries the bundle


def job_metadata(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The metadata of the Ray job this process is the entrypoint of (``job_submission_id``, and what the submitter
    added: ``git_commit``); empty outside a job."""
    return json.loads(environ.get(JOB_CONFIG_ENV) or "{}").get("metadata") or {}


@contextmanager
def waiting_for_children() -> Iterator[None]:
    """SIGINT and SIGTERM ignored here (and by DVC, which inherits it): a job's stop signals every process of the job
    at once, and the stage then stops as on Ctrl-C (``stages._cli`` sets its own handlers) while this process waits."""
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def stage(args: argparse.Namespace, params: Params) -> int:
    if args.params != Path("params.yaml"):
        raise ValueError(f"--params: {args.params}: dvc.yaml's stages read params.yaml")
    root, metadata = Path.cwd(), job_metadata()
    with tempfile.TemporaryDirectory(prefix="job-python-") as folder:
        first = shutil.which("python")
        env = python_first(Path(folder))
        log.info("every stage runs with %s (the first python on PATH was %s)", sys.executable, first)
        if metadata.get("git_commit"):
            from pipeline.sweep.tracking import tags

            env[tags.GIT_COMMIT_ENV] = metadata["git_commit"]
        if not (root / ".git").exists() and dvc("config", "--local", "core.no_scm", "true", env=env) != 0:
            return 1
        outputs = pipeline_outputs(root)
        for name in outputs.cached_stages:
            if dvc("commit", name, env=env) != 0:
                log.info("stage %s: its shipped outputs are not what dvc.lock records; dvc repro runs it", name)
        with waiting_for_children():
            code = dvc("repro", *args.targets, env=env)
    if code != 0:
        log.error("dvc repro failed (exit code %d); what finished stays in MLflow and a re-run reuses it", code)
        return 1
    submission = metadata.get("job_submission_id")
    if submission and TUNE_MANIFEST.is_file():
        publish(root, outputs.uncached, submission, metadata.get("git_commit") or "unknown")
    return 0


def publish(root: Path, paths: list[str], submission_id: str, commit: str) -> None:
    """dvc.lock and the uncached outputs, zipped onto the sweep's parent run for ``stages.submit`` to fetch."""
    from pipeline.sweep.manifest import read_tune_manifest
    from pipeline.sweep.submit import SubmittedJob, publish_outputs

    manifest = read_tune_manifest(TUNE_MANIFEST, root)
    with tempfile.TemporaryDirectory(prefix="job-outputs-") as folder:
        archive = Path(folder, BUNDLE)
        packed = pack_outputs(root, paths, archive)
        job = SubmittedJob(submission_id, commit)
        publish_outputs(manifest.tracking_uri, manifest.parent_run_id, [archive], job)
    log.info("published %s on the sweep run %s: %s", BUNDLE, manifest.parent_run_id, ", ".join(packed))


parser = make_parser(__doc__)
parser.add_argument("targets", nargs="*", metavar="TARGET", help="dvc repro's targets (default: every stage)")
main = main_for(stage, parser)

if __name__ == "__main__":
    sys.exit(main())
