"""The whole pipeline (prepare, tune, prune, transform, analyze) as one Ray job on a cluster, submitted from a
workstation that is no Ray node; its outputs and dvc.lock brought back, so this checkout ends as after `dvc repro`.

Steps: the data prepared here (`dvc repro prepare`: nothing to do when it is current); refused, naming the key, what a
job cannot use (an sqlite or silent tracking.uri, a relative sweep.storage_path); the code (what git does not ignore,
minus .rayignore) and the prepared data zipped as the job's working_dir; `PYTHON -m stages.pipeline [TARGET ...]`
submitted (`dvc repro` on the head, every stage a driver there: stages.pipeline); its log followed here; when it
succeeded, dvc.lock and every output DVC does not cache (manifests, metrics, tables, figures, report, plots) written
here from the bundle the job left on the sweep's parent run. `dvc status` is then clean.
--python names the project's environment on the head (default `python`: the first on the head's PATH, right where
`ray start` ran in that environment, as in a KubeRay image); every stage then runs with it.
Ctrl-C stops the job as Ctrl-C stops a stage (the trials save their state; submit again to resume them). Exit code:
0 succeeded, 130 stopped, 1 failed (nothing is written here; what finished stays in MLflow and a resubmission reuses
it). --fetch ID: only that last step, for a job submitted otherwise (a RayJob). The address: --address URL, else
$RAY_API_SERVER_ADDRESS; the token as for attaching ($RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token).
Recipes per scheduler: docs/cluster.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

from pipeline.config import Params
from stages._cli import main_for, make_parser
from stages._job import BUNDLE, dvc, entrypoint, python_first, unpack_outputs

log = logging.getLogger("stages.submit")


def stage(args: argparse.Namespace, params: Params) -> int:
    if args.params != Path("params.yaml"):
        raise ValueError(f"--params: {args.params}: dvc.yaml's stages read params.yaml")
    root = Path.cwd()
    if args.fetch:
        return fetch(params, args.fetch, root)
    with tempfile.TemporaryDirectory(prefix="submit-python-") as folder:
        if dvc("repro", "prepare", env=python_first(Path(folder))) != 0:
            raise ValueError("dvc repro prepare failed (above): the job ships the prepared data")
    from pipeline.sweep.session import send_token_if_available

    send_token_if_available()  # before Ray is imported
    from pipeline.sweep.submit import (
        SubmittedJob,
        check_submittable,
        follow_job,
        job_address,
        job_client,
        package_job,
        submit,
    )
    from pipeline.sweep.tracking import tags

    address = job_address(args.address)
    prepared = check_submittable(params, root)
    job = SubmittedJob(f"pipeline-{time.strftime('%Y%m%d-%H%M%S')}", tags.git_commit(root))
    command = entrypoint(args.python, args.targets)
    with tempfile.TemporaryDirectory(prefix="pipeline-job-") as folder, job_client(address) as client:
        package = package_job(root, prepared, Path(folder))
        submit(client, package, job, command, "pipeline")
        log.info(
            "submitted job %s to %s: %s (commit %s); following its log",
            job.submission_id,
            address,
            command,
            job.git_commit,
        )
        status = follow_job(client, job.submission_id)
    log.info("job %s ended %s", job.submission_id, status)
    if status != "SUCCEEDED":
        log.error("nothing written here; see `ray job logs %s`, then submit again", job.submission_id)
        return 130 if status == "STOPPED" else 1
    return fetch(params, job.submission_id, root)


def fetch(params: Params, submission_id: str, root: Path) -> int:
    """The bundle the job ``submission_id`` left on its sweep run, unpacked here (also alone: ``--fetch``, after a
    RayJob)."""
    from pipeline.sweep.submit import fetch_outputs

    with tempfile.TemporaryDirectory(prefix="pipeline-outputs-") as folder:
        uri, experiment = str(params.tracking.uri), params.tracking.experiment
        parent = fetch_outputs(uri, experiment, submission_id, Path(folder), [BUNDLE])
        replaced = unpack_outputs(Path(folder, BUNDLE), root)
    log.info("wrote %s from job %s's sweep run %s", ", ".join(replaced), submission_id, parent)
    return 0


parser = make_parser(__doc__)
parser.add_argument(
    "targets", nargs="*", metavar="TARGET", help="dvc repro's targets in the job (default: every stage)"
)
parser.add_argument("--address", metavar="URL", help="the cluster's job server (dashboard), http://HEAD:8265")
parser.add_argument(
    "--python",
    default="python",
    help="the project environment's interpreter on the head (default: %(default)s, the first on the head's PATH)",
)
parser.add_argument(
    "--fetch",
    metavar="ID",
    help="submit nothing: write here the outputs and dvc.lock the finished job ID left (a RayJob's spec.jobId)",
)
main = main_for(stage, parser)

if __name__ == "__main__":
    sys.exit(main())
