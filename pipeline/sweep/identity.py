"""What names a trial and a sweep: the trial code, the params their results depend on and the prepared data, hashed.

A trial's identity (``trial_key``) is exactly what determines its result: the variant's model config, its train
config with the trial's seed, the prepared data's content hash and the trial code's hash; not where it runs or which
other trials share its sweep, so a grown sweep finds its existing trials by this key (``pipeline.sweep.reuse``).
``TRIAL_CODE`` (``pipeline.trial.code_version``) declares the code that runs inside a Ray trial: the sweep's identity
hashes exactly these files and the tune stage's code ``deps`` in ``dvc.yaml`` are exactly these paths (a test keeps
them equal). Editing driver, measuring or analysis code never makes the next ``dvc repro`` retrain a sweep.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config import Params, params_hash
from pipeline.trial.code_version import PROJECT_ROOT, TRIAL_CODE, code_hash, trial_code_files

__all__ = [
    "PROJECT_ROOT",
    "TRIAL_CODE",
    "code_hash",
    "trial_code_files",
    "trial_key",
    "sweep_hash",
    "experiment_name",
    "prepared_data_hash",
]


def trial_key(params: Params, variant: str, seed: int, data_hash: str) -> str:
    """Identity of one trial: its model config, its train config (with its seed), the prepared data's content hash and
    the trial code. Two trials with the same key train to the same result, so a finished one is never trained twice."""
    train = params.train_for(variant).model_copy(update={"seed": seed}).model_dump(mode="json")
    if train["data_fraction"] == 1.0:
        # All the data is how every trial trained before the field existed: left out, its trials keep their keys
        # (and their finished runs) as long as the trial code is unchanged.
        del train["data_fraction"]
    identity = {
        "model": params.model_for(variant).model_dump(mode="json"),
        "train": train,
        "data": data_hash,
        "code": code_hash(),
    }
    return params_hash(identity)


def sweep_hash(params: Params, data_hash: str) -> str:
    """Identity of the sweep (its Ray experiment and MLflow parent run): every param of its trials and of how Tune
    runs them, the trial code and the prepared data's content hash; not where it runs, where data, results and
    runs are stored (``sweep.ray_address``, ``sweep.storage_path``, the ``data`` paths, ``tracking``), so a moved
    project or a cluster finds the same sweep."""
    identity = params.model_dump(mode="json")
    for where in ("ray_address", "storage_path"):
        identity["sweep"].pop(where)
    identity.pop("tracking")
    identity.pop("transform")  # what the transform stage builds from the sweep afterwards, not how it trains
    identity["code"] = code_hash()
    identity["data"] = data_hash  # the content, in place of the section (which names the paths)
    return params_hash(identity)


def experiment_name(params: Params, data_hash: str) -> str:
    """The Ray experiment's folder and the MLflow parent run's name: ``tune-<sweep hash>``."""
    return f"tune-{sweep_hash(params, data_hash)}"


def prepared_data_hash(params: Params, project_root: Path) -> str | None:
    """The content hash recorded in the prepared data's manifest (checked against the tensors when they are
    loaded), or None when the prepare stage has not run."""
    manifest = project_root / params.data.prepared_dir / "manifest.json"
    return json.loads(manifest.read_text())["content_sha256"] if manifest.is_file() else None
