"""What a run holds: the names the driver writes and reads back, the context tags, params flattened as MLflow's strings.

A trial's run holds its full config as params (``flatten``), its per-epoch metrics at ``step = epoch``, the tags
below (with the sweep's ``dvc_stage``, ``params_hash``, ``git_commit`` and MLflow's ``mlflow.user`` /
``mlflow.source.*``) and, when it ends, its checkpoint and dataset (``logged_model``); the best seed of a variant also
its final model, logged when it is registered (``registry``). A parent run holds
the stage's params, ``sweep_trials.json`` and, once finished, a description and summary metrics (``registry``).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.tracking.context.registry import resolve_tags
from ray.tune.utils import flatten_dict

if TYPE_CHECKING:
    from pipeline.config import Params

KEY_TAG = "trial_key"  # a trial's identity (``identity.trial_key``; a pruned model's ``prune_key``)
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: the sweep (or prune run) that started the run
TRIAL_ID_TAG = "ray.trial_id"  # the Tune trial that trains the run now
TRIAL_PATH_TAG = "ray.trial_path"  # the Ray trial folder of a run, whose checkpoint_* dirs a resume starts from
NODES_TAG = "ray.node_ids"  # comma-separated, in order: every node a trial's run trained on
STATUS_TAG = "tune.status"  # how Tune ended the trial: running, retrying, finished, early_stopped, error, interrupted
LAST_EPOCH_TAG = "tune.last_epoch"
FAILURE_REASON_TAG = "tune.failure_reason"  # why a trial failed without retries (UnretryableTrialError)
STOP_REASON_TAG = "tune.stop_reason"  # why the driver last stopped a run it closed as KILLED (a full storage)
CHECKPOINT_TAG = "tune.checkpoint"  # the checkpoint folder uploaded as the run's artifact ``checkpoint/``
MODEL_URI_TAG = "model_uri"  # ``models:/<model id>`` of the run's final model: only on a registered run's
NOTE_TAG = "mlflow.note.content"  # the run's description in the MLflow UI
DVC_EXP_TAG = "dvc.exp_name"
GIT_COMMIT_ENV = "PIPELINE_GIT_COMMIT"  # a checkout without .git (a Ray job's working_dir): the commit it was made from
BASELINE_PARAMS = "params.yaml"  # the committed params a run's name is compared with
LABEL_CHARS = 90  # a parent run's label beyond this is cut (the runs table shows ~40 characters of a name)


def flatten(tree: dict[str, Any]) -> dict[str, str]:
    """``{"model": {"hidden": 32}}`` -> ``{"model.hidden": "32"}``: Tune's ``flatten_dict``, values as MLflow's
    strings (lists as JSON)."""
    flat = flatten_dict(tree, delimiter=".")
    return {key: json.dumps(value) if isinstance(value, list | tuple) else str(value) for key, value in flat.items()}


def context_tags() -> dict[str, str]:
    """The tags ``mlflow.start_run`` would add and ``MlflowClient.create_run`` does not (user, source, git commit), and
    the DVC experiment under ``dvc exp run`` (``DVC_EXP_NAME``)."""
    tags = resolve_tags()
    experiment = os.environ.get("DVC_EXP_NAME")
    return {**tags, DVC_EXP_TAG: experiment} if experiment else tags


def git_commit(project_root: Path) -> str:
    """HEAD's sha, suffixed ``-dirty`` when tracked files differ from it; outside git, ``$PIPELINE_GIT_COMMIT`` (the
    whole pipeline as a Ray job: the submitting checkout's commit, ``stages.pipeline``), else ``unknown``."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=project_root, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get(GIT_COMMIT_ENV) or "unknown"
    return f"{sha}-dirty" if dirty else sha


def committed_params(project_root: Path) -> Params | None:
    """``params.yaml`` as committed at HEAD, validated; None outside git, without a committed file, or when it no
    longer validates."""
    from pipeline.config import ConfigError, load_params  # the driver's config module; tags.py stays light

    try:
        done = subprocess.run(
            ["git", "show", f"HEAD:{BASELINE_PARAMS}"], cwd=project_root, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    with tempfile.TemporaryDirectory() as folder:
        committed = Path(folder, BASELINE_PARAMS)
        committed.write_text(done.stdout, encoding="utf-8")
        try:
            return load_params(committed)
        except ConfigError:
            return None


def run_label(params: Params, project_root: Path) -> str:
    """What a parent run's name says after its stage: the DVC experiment's name under ``dvc exp run``, else the
    params that differ from the committed ``params.yaml`` (``train.epochs=1, sweep.variants=["resnet18"]``), else
    ``committed params``; empty when there is nothing to compare with (no git: a submitted job's copy)."""
    experiment = os.environ.get("DVC_EXP_NAME")
    if experiment:
        return experiment
    baseline = committed_params(project_root)
    if baseline is None:
        return ""
    before = flatten(baseline.model_dump(mode="json"))
    after = flatten(params.model_dump(mode="json"))
    changed = [f"{key}={value}" for key, value in sorted(after.items()) if before.get(key) != value]
    changed += [f"{key} removed" for key in sorted(before.keys() - after.keys())]
    if not changed:
        return "committed params"
    label = ", ".join(changed)
    return label if len(label) <= LABEL_CHARS else f"{label[: LABEL_CHARS - 3]}..."


def parent_run_name(stage: str, params: Params, project_root: Path, fallback: str) -> str:
    """``tune sunny-bass``, ``tune train.epochs=1``, ``prune committed params``; ``fallback`` (``tune-<hash>``)
    when there is no label."""
    label = run_label(params, project_root)
    return f"{stage} {label}" if label else fallback
