"""What the whole pipeline as one Ray job (``stages.pipeline``) and its submitter (``stages.submit``) share: the
Python that DVC's stage commands start, DVC itself, and the bundle of outputs the job publishes and the workstation
unpacks.

Why a bundle: the job's working_dir is a temporary folder on the head, which the workstation cannot read; the job
logs one zip of ``dvc.lock`` and every output DVC does not cache (manifests, metrics, tables, figures, report, plots)
on the sweep's parent run, and the workstation puts them in place, so its checkout ends as after a local ``dvc repro``.
Cached outputs (the prepared data) are the workstation's already: it prepared and shipped them.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

LOCK = "dvc.lock"
BUNDLE = "pipeline_outputs.zip"  # the artifact (in the parent run's ``dvc_outs/``) the job publishes
LISTING = ".outputs.json"  # in the bundle: the paths it replaces, each a file or a whole folder
ENTRYPOINT = "-m stages.pipeline"  # what a Ray job runs, after the environment's interpreter (``entrypoint``)


def entrypoint(python: str, targets: list[str] | tuple[str, ...] = ()) -> str:
    """The job's entrypoint: ``PYTHON -m stages.pipeline [TARGET ...]``. Named, the interpreter is the environment's
    whatever the head's PATH says; ``python`` alone is the first on the head's PATH (a KubeRay image's own)."""
    return " ".join([shlex.quote(python), ENTRYPOINT, *map(shlex.quote, targets)])


def python_first(directory: Path, python: str = sys.executable) -> dict[str, str]:
    """This environment with ``python`` the first ``python`` on PATH: dvc.yaml's commands say ``python -m stages.X``
    and DVC starts them through the shell, so a stage would otherwise run whatever ``python`` the machine's PATH
    finds first (a cluster image's system Python). A wrapper script in ``directory``, not a symlink: a link to a
    virtual environment's interpreter from outside its ``bin/`` starts the base Python, without the environment."""
    wrapper = directory / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(python)} "$@"\n')
    wrapper.chmod(0o755)
    return {**os.environ, "PATH": f"{directory}{os.pathsep}{os.environ.get('PATH', '')}"}


def dvc(*args: str, env: dict[str, str], cwd: Path | None = None) -> int:
    """DVC of this environment (``python -m dvc``), its output in this process's; the exit code."""
    return subprocess.run([sys.executable, "-m", "dvc", *args], env=env, cwd=cwd, check=False).returncode


@dataclass(frozen=True)
class Outputs:
    """dvc.yaml's outputs, split by DVC's ``cache`` flag (metrics and plots included)."""

    cached_stages: list[str]  # the stages with an output DVC caches (the prepared data's)
    uncached: list[str]  # project-relative paths of the outputs it does not: what the job brings back


def pipeline_outputs(root: Path) -> Outputs:
    """Read from DVC's own index of ``root`` (params interpolated as DVC does)."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        stages = list(repo.index.stages)
        cached = [stage.addressing for stage in stages if any(out.use_cache for out in stage.outs)]
        uncached = sorted({out.def_path for stage in stages for out in stage.outs if not out.use_cache})
    return Outputs(cached, uncached)


def pack_outputs(root: Path, paths: list[str], archive: Path) -> list[str]:
    """Zip ``dvc.lock`` and those of ``paths`` that exist under ``root`` (folders whole) into ``archive``, with their
    listing; the paths packed."""
    packed = [path for path in [*paths, LOCK] if (root / path).exists()]
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        zipped.writestr(LISTING, json.dumps(packed))
        for path in packed:
            folder = (root / path).is_dir()
            if folder:
                zipped.mkdir(path)  # an empty folder comes back too
            for file in sorted(p for p in (root / path).rglob("*") if p.is_file()) if folder else [root / path]:
                zipped.write(file, file.relative_to(root).as_posix())
    return packed


def unpack_outputs(archive: Path, root: Path) -> list[str]:
    """Replace each path the bundle lists under ``root`` by the bundle's (a folder whole: no file of an older run stays
    in it, as DVC hashes the folder), ``dvc.lock`` last, so an interruption never leaves a lock newer than its outputs.
    The paths replaced."""
    with zipfile.ZipFile(archive) as zipped:
        listed = json.loads(zipped.read(LISTING))
        bad = [p for p in listed if Path(p).is_absolute() or ".." in Path(p).parts]
        if bad:
            raise ValueError(f"{archive}: the bundle lists paths outside the project: {bad}")
        with tempfile.TemporaryDirectory(dir=root, prefix=".outputs-") as tmp:
            zipped.extractall(tmp, [name for name in zipped.namelist() if name != LISTING])
            for path in sorted(listed, key=lambda p: p == LOCK):
                target, new = root / path, Path(tmp, path)
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                target.parent.mkdir(parents=True, exist_ok=True)
                new.replace(target)
    return listed
