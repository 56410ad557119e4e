"""What ``python -m stages.tune --dry-run`` prints: per trial what the sweep would do, and where it would run.

Read without creating anything (no store, no experiment, no Ray): the decisions come from the interrupted sweep's own
record when it would be restored, else from a look-up in the tracking store, as the sweep itself makes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs

from pipeline.config import Params
from pipeline.sweep.estimate import estimate_trials
from pipeline.sweep.grid import sweep_decisions, trial_grid
from pipeline.sweep.identity import experiment_name, prepared_data_hash
from pipeline.sweep.manifest import METRIC, MODE
from pipeline.sweep.reuse import TRAIN, TrialDecision, read_decisions
from pipeline.sweep.session import ray_address
from pipeline.sweep.storage import StoragePath, storage_dir
from pipeline.sweep.tracking import Store, tracking_uri
from pipeline.sweep.tuner import restorable, saved_by_tune


def dry_run_decisions(
    params: Params, project_root: Path, data_hash: str | None
) -> tuple[list[TrialDecision] | None, str]:
    """What the sweep would do with each trial and the sweep's state: an interrupted sweep's own decisions (a restore
    continues them), else a look-up in the tracking store, as a finished sweep's (None when it cannot answer)."""
    path = storage_dir(params, project_root) / experiment_name(params, data_hash or "missing")
    uri = tracking_uri(params.tracking, project_root)
    if data_hash is None:
        return None, "new"
    try:
        restore = restorable(path)
    except OSError as err:  # a bucket that does not answer: the preflight after the plan says so, naming the key
        return None, f"unknown: cannot read it ({str(err).splitlines()[0][:200]})"
    state = "new"
    if not restore and saved_by_tune(path):
        state = "saved by an earlier driver, not restorable by this one: its trials are looked up in MLflow"
    if restore:
        if not Store(uri).parent_finished(path):
            return read_decisions(path), "interrupted: would restore it"
        state = "finished: nothing to train (its trials' runs are reused; nothing is restored)"
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None, state  # no store yet, so no earlier runs (and a dry run creates none)
    try:
        Store(uri).check_answers("tracking.uri")
        experiment_id = Store(uri).experiment_id(params.tracking.experiment)
    except ValueError as err:
        return None, f"{state} (cannot look up earlier runs: {err})"
    return sweep_decisions(params, data_hash, uri, experiment_id), state


def saved_trials(path: StoragePath) -> dict[tuple[str, int], tuple[str, int]]:
    """(variant, seed) -> (Tune status, last reported epoch) of each trial in the newest experiment state Tune saved at
    ``path`` (empty when there is none or it cannot be read): what a restore finds."""
    try:
        listed = path.filesystem.get_file_info(pafs.FileSelector(path.fs_path, allow_not_found=True))
        states = sorted(i.base_name for i in listed if i.base_name.startswith("experiment_state-"))
        if not states:
            return {}
        state = json.loads((path / states[-1]).read_text())
        trials = {}
        for trial_json, runtime_json in state["trial_data"]:
            trial, runtime = json.loads(trial_json), json.loads(runtime_json)
            config = trial.get("config") or {}
            epoch = int((runtime.get("last_result") or {}).get("epoch") or 0)
            trials[(config["variant"], int(config["seed"]))] = (trial["status"], epoch)
        return trials
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def restore_words(decision: TrialDecision, saved: tuple[str, int] | None, epochs: int) -> str:
    """What restoring the interrupted sweep does with one trial it started with: ``reuse`` a trial that finished
    before the interrupt (Tune keeps it), ``restore: resume`` one that trained some epochs (from its newest
    checkpoint), ``restore: start`` one Tune had not started (``restore: resume run ...`` when it continues a run
    of an earlier sweep)."""
    if saved is None:
        return f"restore: {decision.words()}"
    status, epoch = saved
    if status == "TERMINATED":
        early = "" if epoch >= epochs else ", stopped early by ASHA"
        return f"reuse (finished before the interrupt: epoch {epoch}{early})"
    if epoch > 0:
        return f"restore: resume after epoch {epoch} (its newest checkpoint)" + (
            " after an error" if status == "ERROR" else ""
        )
    return f"restore: {decision.words()}" if decision.action != TRAIN else "restore: start (not started before)"


def stale_data(params: Params, project_root: Path) -> list[str]:
    """How the prepared data on disk differs from what ``params.data`` asks for (empty when it matches or is missing):
    a dry run must not present, say, the digits prepared for the smoke profile as the paper's CIFAR-10."""
    path = project_root / params.data.prepared_dir / "manifest.json"
    if not path.is_file():
        return []
    prepared = json.loads(path.read_text())
    found = {**prepared, "image_size": (prepared.get("image_shape") or [None])[-1]}
    return [
        f"data.{key} is {getattr(params.data, key)!r} but the prepared data has {found.get(key)!r}"
        for key in ("dataset", "image_size", "test_fraction")
        if found.get(key) is not None and found.get(key) != getattr(params.data, key)
    ]


def dry_run_text(params: Params, project_root: Path) -> str:
    """The dry run, human-readable: per trial what would happen (reuse a run, resume it, train), resources, and where
    it would run and be recorded."""
    data = project_root / params.data.prepared_dir
    data_hash = prepared_data_hash(params, project_root)
    path = storage_dir(params, project_root) / experiment_name(params, data_hash or "missing")
    address = ray_address(params.sweep)
    decisions, state = dry_run_decisions(params, project_root, data_hash)
    action = {(d.variant, d.seed): d.words() for d in decisions or []}
    if state.startswith("interrupted"):  # Tune's saved state says how far each trial got
        saved = saved_trials(path)
        action = {
            (d.variant, d.seed): restore_words(d, saved.get((d.variant, d.seed)), params.train.epochs)
            for d in decisions or []
        }
    grid = trial_grid(params)
    lines = [f"{'variant':<20} {'seed':>4} {'cpu':>5} {'gpu':>5}  plan"]
    # Without the prepared data its content hash, part of every trial's identity, is unknown: so is whether a finished
    # run (a queued experiment's, say) would be reused. `dvc repro` prepares it first (or checks it out of the cache).
    unknown = "train or reuse: unknown until the data is prepared (its hash is part of each trial's identity)"
    for t in grid:
        what = action.get((t["variant"], t["seed"]), "train" if data_hash else unknown)
        lines.append(f"{t['variant']:<20} {t['seed']:>4} {t['cpu']:>5g} {t['gpu']:>5g}  {what}")
    asha = params.sweep.asha
    scheduler = f"ASHA (grace {asha.grace_period}, reduction {asha.reduction_factor})" if asha.enabled else "none"
    to_train = sum(not words.startswith("reuse") for words in action.values()) if decisions is not None else len(grid)
    if not data_hash:
        to_train = "?"
    lines += [
        "",
        f"trials: {len(grid)} ({to_train} to train or resume), {params.train.epochs} epochs each, "
        f"at most {params.sweep.max_concurrent_trials} at a time, {params.sweep.max_failures} retries each",
        f"scheduler: {scheduler}, on {METRIC} ({MODE})",
        f"ray: {'attach to the cluster at ' + address if address else 'start a local Ray on this machine'}",
        f"ray results: {path} ({state})",
        f"mlflow: {tracking_uri(params.tracking, project_root)}, experiment {params.tracking.experiment!r}",
        f"data: {data} ({'content ' + data_hash[:12] if data_hash else 'MISSING: run the prepare stage'})",
    ]
    lines += ["", "estimate per trial (parameters; memory: weights, gradients, momentum and activations):"]
    lines += [f"  {trial.words()}" for trial in estimate_trials(params, project_root)]
    if stale := stale_data(params, project_root):
        lines.append(
            f"data is STALE: {'; '.join(stale)}; `dvc repro` re-prepares it before the sweep (the plan above "
            "is for the data on disk)"
        )
    return "\n".join(lines)
