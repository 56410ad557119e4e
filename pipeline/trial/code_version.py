"""The trial code, declared and hashed, and the trial's check that it trains the driver's code.

``TRIAL_CODE`` names the code that runs inside a Ray trial (the sweep's identity hashes it; ``dvc.yaml``'s tune deps
are exactly these paths). It lives here, in the trial package, so a trial hashes its own code without importing the
driver: on a cluster a node could import another copy of the project (an old install, another checkout) instead of
the code shipped with the job, and train something else under the sweep's name.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the folder holding pipeline/

# Paths relative to the project root: files, or folders whose every .py file counts.
TRIAL_CODE = (
    "pipeline/__init__.py",
    "pipeline/config.py",
    "pipeline/encodings.py",
    "pipeline/data/__init__.py",
    "pipeline/data/prepared.py",
    "pipeline/data/subset.py",
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


class TrialCodeMismatch(RuntimeError):
    """This worker imports other trial code than the driver that named the sweep."""


def check_trial_code(expected: str | None) -> None:
    """Raise when the trial code this worker imports hashes differently from the driver's (``expected``)."""
    if expected is None:
        return
    if (found := code_hash()) != expected:
        import ray

        raise TrialCodeMismatch(
            f"trial code {found} (from {Path(PROJECT_ROOT)}) on node {ray.util.get_node_ip_address()}, but the driver "
            f"runs {expected}: this node does not import the code shipped with the job (runtime_env working_dir); "
            "check its PYTHONPATH and installed packages"
        )
