"""What names a sweep: the trial code, the params its trials depend on and the prepared data, hashed.

``TRIAL_CODE`` is the one declaration of the code that runs inside a Ray trial and so may change a trained result:
the sweep's identity hashes exactly these files, and the tune stage's code ``deps`` in ``dvc.yaml`` are exactly
these paths (a test keeps the two equal, and checks that everything the trainable imports lies inside them). Driver
code (tracking, planning, manifests), measuring code, the analysis and the benchmarks are outside it: editing them
never makes the next ``dvc repro`` retrain a sweep.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline.config import Params, params_hash

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the folder holding pipeline/

# Paths relative to the project root: files, or folders whose every .py file counts.
TRIAL_CODE = (
    "pipeline/__init__.py",
    "pipeline/config.py",
    "pipeline/data/__init__.py",
    "pipeline/data/prepared.py",
    "pipeline/models",
    "pipeline/trial",
)


def trial_code_files(root: Path = PROJECT_ROOT) -> list[Path]:
    """Every source file of ``TRIAL_CODE`` under ``root``, sorted."""
    files: set[Path] = set()
    for entry in TRIAL_CODE:
        path = root / entry
        files.update(path.rglob("*.py") if path.is_dir() else [path])
    return sorted(files)


def code_hash(root: Path = PROJECT_ROOT) -> str:
    """Hash of the trial code's source (file names relative to ``root``, and contents)."""
    digest = hashlib.sha256()
    for path in trial_code_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def sweep_hash(params: Params, data_hash: str) -> str:
    """Identity of the sweep: every param the trials' results depend on (not where it runs or is stored), the
    trial code and the prepared data's content hash (a re-prepared dataset is a new sweep)."""
    identity = params.model_dump(mode="json")
    for where in ("ray_address", "storage_path"):
        identity["sweep"].pop(where)
    identity["code"] = code_hash()
    identity["data"] = data_hash
    return params_hash(identity)


def experiment_name(params: Params, data_hash: str) -> str:
    """The Ray experiment's folder and the MLflow parent run's name: ``tune-<sweep hash>``."""
    return f"tune-{sweep_hash(params, data_hash)}"


def prepared_data_hash(params: Params, project_root: Path) -> str | None:
    """The content hash recorded in the prepared data's manifest (checked against the tensors when they are
    loaded), or None when the prepare stage has not run."""
    manifest = project_root / params.data.prepared_dir / "manifest.json"
    return json.loads(manifest.read_text())["content_sha256"] if manifest.is_file() else None
