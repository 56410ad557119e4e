"""The tune stage as a Ray job: submitted from a workstation that is no Ray node, outputs brought back for DVC.

Why not ``ray job submit --working-dir . -- python -m stages.tune`` alone: Ray's upload leaves out what ``.gitignore``
lists (the DVC-tracked prepared data), the job's outputs land in Ray's temporary folder on the head, and the head has
no ``.git`` (commit ``unknown``). Here the workstation checks what a job cannot use (``check_submittable``), zips what
Ray would upload plus the prepared data (``package_job``), submits ``python -m stages.tune --as-job ID --git-commit
SHA`` and follows its log (Ctrl-C stops the job with SIGINT, the stage's own Ctrl-C); the job logs its manifest and
metrics on its parent run (``publish_outputs``) and the workstation writes them into ``results/tune``
(``fetch_outputs``). The sweep's identity is the same as run locally: it never depends on where things live.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pathspec

from pipeline.config import Params
from pipeline.sweep.identity import experiment_name, prepared_data_hash
from pipeline.sweep.session import TOKEN_HELP
from pipeline.sweep.tracking import Store, tags

log = logging.getLogger(__name__)

ADDRESS_ENV = "RAY_API_SERVER_ADDRESS"  # the variable `ray job submit` reads for the dashboard's address
OUTPUTS_DIR = "dvc_outs"  # artifact folder of the parent run holding the stage's DVC outputs
SUBMISSION_TAG = "ray.job_submission_id"
MAX_PACKAGE_BYTES = 500 * 1024**2  # Ray refuses a working_dir over its 512 MiB gRPC limit, late and obscurely
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
# `ray job stop` sends SIGTERM and SIGKILLs 3 s later by default: too soon for Tune to save its state and the stage to
# close its MLflow runs. The job's supervisor reads these from the job's env_vars: SIGINT (the stage's Ctrl-C), 2 min.
STOP_LIKE_CTRL_C = {"RAY_JOB_STOP_SIGNAL": "SIGINT", "RAY_JOB_STOP_WAIT_TIME_S": "120"}


@dataclass(frozen=True)
class SubmittedJob:
    """What the job knows of its submission: its id and the workstation's commit (the head has no ``.git``)."""

    submission_id: str
    git_commit: str

    def tags(self) -> dict[str, str]:
        return {
            SUBMISSION_TAG: self.submission_id,
            "git_commit": self.git_commit,
            "mlflow.source.git.commit": self.git_commit,
        }


def job_address(given: str | None) -> str:
    """The cluster's job server (its dashboard, ``http://HEAD:8265``): ``--submit URL``, else
    ``$RAY_API_SERVER_ADDRESS``."""
    address = given or os.environ.get(ADDRESS_ENV)
    if not address:
        raise ValueError(f"--submit: give the cluster's dashboard (--submit http://HEAD:8265) or set ${ADDRESS_ENV}")
    return address if "://" in address else f"http://{address}"


def check_submittable(params: Params, project_root: Path) -> Path | None:
    """Refuse, naming the key, what a job on the cluster cannot use; return the prepared data folder to upload (None
    when it lies outside the project: the head must see it at the same path)."""
    uri = params.tracking.uri
    if uri is None or uri.startswith("sqlite:"):
        raise ValueError(
            f"tracking.uri: {uri or 'the default sqlite store'} is a file on this machine, which a job on the "
            "cluster cannot write; run an `mlflow server` that this machine and the cluster reach (docs/cluster.md, "
            '"One MLflow server") and set tracking.uri to its http:// address'
        )
    Store(uri).check_answers("tracking.uri")
    storage = params.sweep.storage_path
    if "://" not in storage and not Path(storage).expanduser().is_absolute():
        raise ValueError(
            f"sweep.storage_path: {storage!r} is relative; a job would resolve it inside its temporary folder on "
            "the head, which Ray deletes (nothing could resume); give a path every node shares, e.g. /mnt/shared/ray, "
            "or a bucket, e.g. s3://bucket/ray"
        )
    prepared = (project_root / params.data.prepared_dir).resolve()
    if not prepared.is_relative_to(project_root.resolve()):
        return None
    if not (prepared / "manifest.json").is_file():
        raise FileNotFoundError(f"data.prepared_dir: {prepared} holds no prepared dataset; run `dvc repro prepare`")
    return prepared


def packaged_files(project_root: Path, prepared: Path | None) -> list[Path]:
    """Project-relative paths of what the job needs: what git does not ignore (tracked or new), minus what
    ``.rayignore`` lists (as Ray's own upload does), plus the prepared data."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=project_root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        why = f"{project_root} is not a git checkout ({err})"
        raise ValueError(f"--submit: {why}; the job ships the files git tracks") from None
    rayignore = project_root / ".rayignore"
    ignored = pathspec.GitIgnoreSpec.from_lines(rayignore.read_text().splitlines() if rayignore.is_file() else [])
    files = [Path(name) for name in listed.split("\0") if name and not ignored.match_file(name)]
    files = [name for name in files if (project_root / name).is_file()]  # deleted but still in the index
    if prepared is not None:
        root = project_root.resolve()
        files += sorted(p.relative_to(root) for p in prepared.rglob("*") if p.is_file())
    return files


def package_job(project_root: Path, prepared: Path | None, dest: Path) -> Path:
    """A zip of ``packaged_files`` at its root: Ray unpacks an uploaded ``working_dir`` zip as it is."""
    archive, names = dest / "job.zip", packaged_files(project_root, prepared)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zipped:
        for name in names:
            zipped.write(project_root / name, name.as_posix())
    size = archive.stat().st_size
    if size > MAX_PACKAGE_BYTES:
        raise ValueError(
            f"--submit: the job's package is {size / 1024**2:.0f} MiB, over Ray's limit; put "
            "data.prepared_dir on storage the cluster shares, outside the project"
        )
    log.info("job package: %s, %.1f MiB", archive.name, size / 1024**2)
    return archive


@contextmanager
def job_client(address: str) -> Iterator[object]:
    """Ray's job client (it sends the auth token in token mode: ``session.send_token_if_available`` before Ray is
    imported); a refusal or no answer is one line."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    try:
        yield JobSubmissionClient(address)
    except AuthenticationError:
        raise ValueError(f"--submit: the Ray cluster at {address} refused this machine's token: {TOKEN_HELP}") from None
    except ConnectionError as err:
        raise ValueError(
            f"--submit: no Ray job server answers at {address} ({str(err).splitlines()[0]}); "
            "give the head's dashboard address (port 8265)"
        ) from None


def submit(client: object, package: Path, job: SubmittedJob, entrypoint: str, stage: str) -> str:
    """The package as the job's ``working_dir``; the commit in the job's metadata (``stages.pipeline`` reads it)."""
    return client.submit_job(  # type: ignore[attr-defined]
        entrypoint=entrypoint,
        submission_id=job.submission_id,
        runtime_env={"working_dir": str(package), "env_vars": STOP_LIKE_CTRL_C},
        metadata={"git_commit": job.git_commit, "stage": stage},
    )


def follow_job(client: object, submission_id: str) -> str:
    """Print the job's log as it comes, until the job ends; return its final status. Ctrl-C stops the job (Tune in
    it saves its state; a re-submission resumes) and still waits for it to end."""

    async def tail() -> None:
        async for lines in client.tail_job_logs(submission_id):  # type: ignore[attr-defined]
            print(lines, end="", flush=True)

    try:
        asyncio.run(tail())
    except KeyboardInterrupt:
        log.warning("stopping job %s (its trials save their state; submit again to resume)", submission_id)
        client.stop_job(submission_id)  # type: ignore[attr-defined]
    while (status := str(client.get_job_status(submission_id))) not in TERMINAL:  # type: ignore[attr-defined]
        time.sleep(1)
    return status.rsplit(".", 1)[-1]


def publish_outputs(uri: str, parent_run_id: str, files: list[Path], job: SubmittedJob) -> None:
    """In the job: the stage's DVC outputs as artifacts of the sweep's parent run, tagged with the submission id, so
    the workstation finds and downloads them."""
    Store(uri).publish_files(parent_run_id, files, OUTPUTS_DIR, {SUBMISSION_TAG: job.submission_id})


def fetch_outputs(uri: str, experiment: str, submission_id: str, out_dir: Path, names: list[str]) -> str:
    """On the workstation: the outputs the job published, written atomically into ``out_dir``; the parent run id."""
    store = Store(uri)
    parent = store.tagged_run(experiment, SUBMISSION_TAG, submission_id)
    if parent is None:
        raise FileNotFoundError(
            f"job {submission_id} published no outputs to {uri} (experiment {experiment!r}); "
            f"see `ray job logs {submission_id}`"
        )
    published = set(store.artifact_names(parent, OUTPUTS_DIR))
    if missing := [name for name in names if name not in published]:
        raise FileNotFoundError(
            f"job {submission_id} did not publish {', '.join(missing)} to its sweep run {parent}; "
            f"see `ray job logs {submission_id}`"
        )
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            local = store.download(parent, f"{OUTPUTS_DIR}/{name}", Path(tmp))
            partial = out_dir / f".{name}.tmp"  # then renamed: a reader never sees half a file (any bytes: a zip)
            out_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, partial)
            partial.replace(out_dir / name)
    return parent


def submit_sweep(
    params: Params,
    project_root: Path,
    address: str,
    params_file: Path,
    out_dir: Path,
    outputs: list[str],
    *,
    verbose: bool = False,
) -> str:
    """Check, package, submit, follow; bring the outputs back into ``out_dir`` when the job wrote them. Returns the
    job's final status (SUCCEEDED, FAILED, STOPPED). ``verbose``: the job logs at debug level too."""
    prepared = check_submittable(params, project_root)
    if params_file.is_absolute() or ".." in params_file.parts:
        raise ValueError(f"--params: {params_file} must lie inside the project to go with the job")
    data_hash = prepared_data_hash(params, project_root)  # None when the data is only on the cluster's storage
    name = experiment_name(params, data_hash) if data_hash else "tune"
    job = SubmittedJob(f"{name}-{time.strftime('%Y%m%d-%H%M%S')}", tags.git_commit(project_root))
    with tempfile.TemporaryDirectory(prefix="tune-job-") as tmp, job_client(address) as client:
        package = package_job(project_root, prepared, Path(tmp))
        entrypoint = (
            f"python -m stages.tune --params {params_file.as_posix()} --as-job {job.submission_id} "
            f"--git-commit {job.git_commit}{' -v' if verbose else ''}"
        )
        submit(client, package, job, entrypoint, "tune")
        log.info(
            "submitted job %s to %s (commit %s); following its log (Ctrl-C stops the job)",
            job.submission_id,
            address,
            job.git_commit,
        )
        status = follow_job(client, job.submission_id)
    log.info("job %s ended %s", job.submission_id, status)
    if status == "STOPPED":
        return status
    try:
        parent = fetch_outputs(
            str(params.tracking.uri), params.tracking.experiment, job.submission_id, out_dir, outputs
        )
    except FileNotFoundError:
        if status == "SUCCEEDED":
            raise
        log.error(
            "job %s failed before writing its outputs; see `ray job logs %s`", job.submission_id, job.submission_id
        )
        return status
    log.info("wrote %s from the job's sweep run %s", ", ".join(str(out_dir / n) for n in outputs), parent)
    return status
