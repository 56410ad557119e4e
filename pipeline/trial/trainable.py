"""The Ray Tune trainable: one trial of the sweep, run in a Ray worker.

Kept apart from ``pipeline.sweep`` (the driver) so that a trial's worker imports only what training needs (torch,
Ray Tune, the trainer) and not MLflow, the dataset sources or torchvision: a fresh worker starts training seconds
sooner. Everything it imports from this project is in its trial's code identity (``pipeline.trial.code_version``,
tested).
The trial reports every epoch, with a checkpoint at its end (at most every ``sweep.checkpoint_interval_s``, always
after the last epoch), and resumes from Tune's checkpoint after a failure; on a node being drained it checkpoints
mid-epoch and continues elsewhere from that batch (``pipeline.trial.preemption``).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import ray
from pyarrow.fs import FileSelector, FileType
from ray import tune

from pipeline.config import parse_params
from pipeline.trial.checkpoint import checkpoint_loads, load_checkpoint
from pipeline.trial.code_version import check_trial_code
from pipeline.trial.device import device_tags, gpu_tags, trial_train_config
from pipeline.trial.loop import DivergedError, run_trial
from pipeline.trial.node_check import NodeCheck, check_node
from pipeline.trial.preemption import DrainWatch, drained_checkpoint, save_drain_checkpoint
from pipeline.trial.report import ETA_KEY, UNRETRYABLE_FILE, WHERE_KEY, UnretryableTrialError

if TYPE_CHECKING:
    from pipeline.data.prepared import PreparedData

log = logging.getLogger(__name__)


class InjectedFailure(RuntimeError):
    """Raised by a trial when ``sweep.fail_once_after_epoch`` asks for it (tests of retries)."""


def train_trial(
    config: dict[str, Any],
    data: PreparedData,
    params_json: dict[str, Any],
    code_version: dict[str, str] | None = None,
    node_check: NodeCheck | None = None,
) -> None:
    """One Tune trial: typed config from the trial's dict, resume from Tune's checkpoint, report every epoch.

    ``config["resume_from"]`` (optional) names a checkpoint directory of an earlier sweep's unfinished run of the same
    trial identity: the trial continues from it (weights, optimiser, epoch, RNG) instead of starting over.
    ``config["init_from"]`` (optional) names a checkpoint directory whose weights and heads per layer start the trial,
    e.g. a pruned model to fine-tune. Both must be readable from every node: a shared path or a URI (a bucket). A
    retried or restored trial resumes from its own (Tune's) checkpoint instead. A failure a retry cannot fix
    (divergence, a config the trial cannot run) is recorded in the trial's storage folder and raised as
    ``UnretryableTrialError``; Tune's retries of the trial then raise it again at once instead of training to the
    same failure. ``code_version`` (per variant, the driver's ``trial_code`` of its model) fails a trial that would run
    other code; ``node_check`` one on a node that does not share the sweep's storage or tracking store (a node that
    joined after the driver's preflight: ``pipeline.trial.node_check``).
    """
    # Ray's storage module logs every checkpoint it persists at INFO, and the worker's log reaches the driver's
    # console: a line per trial per epoch that buries the progress table. Failures still log as warnings.
    logging.getLogger("ray.train._internal.storage").setLevel(logging.WARNING)
    storage = tune.get_context().get_storage()
    node = ray.get_runtime_context().get_node_id()
    try:
        check_node(
            node_check, storage.storage_filesystem, storage.experiment_fs_path, node, ray.util.get_node_ip_address()
        )
    except ValueError as err:  # not recorded as unretryable: the storage is what this node cannot use
        raise UnretryableTrialError(str(err)) from None
    marker = f"{storage.trial_fs_path}/{UNRETRYABLE_FILE}"
    if storage.storage_filesystem.get_file_info(marker).type == FileType.File:
        with storage.storage_filesystem.open_input_stream(marker) as stream:
            raise UnretryableTrialError(json.loads(stream.readall())["reason"])
    try:
        _train(config, data, params_json, code_version)
    except (DivergedError, ValueError) as err:  # ValueError: the config, a checkpoint or init_from it cannot use
        storage.storage_filesystem.create_dir(storage.trial_fs_path)
        with storage.storage_filesystem.open_output_stream(marker) as stream:
            stream.write(json.dumps({"reason": str(err)}).encode())
        raise UnretryableTrialError(str(err)) from err


def _train(
    config: dict[str, Any], data: PreparedData, params_json: dict[str, Any], code_version: dict[str, str] | None
) -> None:
    params = parse_params(params_json, "trial params")
    model_cfg = params.model_for(config["variant"])
    # The driver's identity of this trial's code (pipeline.sweep.identity.trial_codes): this node's must be the same.
    check_trial_code(code_version[config["variant"]] if code_version else None, model_cfg.arch, model_cfg.encoding)
    gpu_ids = ray.get_gpu_ids()
    train_cfg = params.train_for(config["variant"]).model_copy(update={"seed": config["seed"]})
    train_cfg = trial_train_config(train_cfg, gpu_ids, params.sweep.resources.cpu_fallback)
    # Where it runs goes with every report (the driver tags the run when it changes: a retry may run elsewhere, and a
    # first report can be the one a retry re-trains and skips); the progress table's chosen columns leave it out.
    node = ray.get_runtime_context().get_node_id()
    where = {WHERE_KEY: {"ray.node_id": node, **device_tags(train_cfg), **gpu_tags(gpu_ids)}}
    fail_after = params.sweep.fail_once_after_epoch  # from the params, so the hook stays out of Tune's trial config
    checkpoint = tune.get_checkpoint()
    saved_at = time.monotonic()  # the trial's start: a checkpoint comes sweep.checkpoint_interval_s after it

    def reporter(metrics: dict[str, float], checkpoint_dir: Path) -> None:
        nonlocal saved_at
        eta = (train_cfg.epochs - metrics["epoch"]) * metrics["epoch_time_s"]  # for the progress table
        report = {**metrics, ETA_KEY: eta, **where}
        due = time.monotonic() - saved_at >= params.sweep.checkpoint_interval_s or metrics["epoch"] >= train_cfg.epochs
        tune.report(report, checkpoint=tune.Checkpoint.from_directory(str(checkpoint_dir)) if due else None)
        if due:
            saved_at = time.monotonic()
        if checkpoint is None and fail_after is not None and metrics["epoch"] == fail_after:
            raise InjectedFailure(f"sweep.fail_once_after_epoch={fail_after}: failing once after epoch {fail_after}")

    storage = tune.get_context().get_storage()
    fs, trial_path = storage.storage_filesystem, storage.trial_fs_path
    with tempfile.TemporaryDirectory(prefix="tune-resume-") as tmp:
        resume_from = on_this_node(config.get("resume_from"), Path(tmp) / "resume_from")
        if checkpoint is not None:  # a copy: Tune may delete old checkpoints (num_to_keep) while we train
            resume_from = restorable_copy(checkpoint, Path(tmp))
        # A drain checkpoint (its node was taken mid-epoch) at or past that checkpoint's epoch goes further.
        epoch = load_checkpoint(resume_from)["epoch"] if resume_from is not None else 0
        resume_from = drained_checkpoint(fs, trial_path, epoch, Path(tmp) / "drained") or resume_from
        init_from = on_this_node(config.get("init_from"), Path(tmp) / "init_from") if resume_from is None else None
        stopped: list[dict] = []
        with DrainWatch(node) as watch:
            run_trial(
                model_cfg,
                train_cfg,
                data,
                reporter,
                resume_from=resume_from,
                init_from=init_from,
                stop=watch.noticed,
                stopped=lambda directory: stopped.append(save_drain_checkpoint(directory, fs, trial_path)),
            )
            if not stopped:
                return
            saved = stopped[0]
            log.warning(
                "drain checkpoint at epoch %d, batch %d; waiting for the node's end", saved["epoch"] + 1, saved["steps"]
            )
            watch.await_the_end()  # Tune retries the trial elsewhere, uncounted: the process ends with the node
        # The node outlived its notice: train on here from the drain checkpoint, no longer watching.
        resumed = drained_checkpoint(fs, trial_path, stopped[0]["epoch"], Path(tmp) / "outlived")
        run_trial(model_cfg, train_cfg, data, reporter, resume_from=resumed)


def on_this_node(location: str | None, into: Path) -> Path | None:
    """A checkpoint folder named by the driver, readable here: a path as it is (shared storage), a URI (a bucket,
    ``sweep.storage_path``) downloaded into ``into``."""
    if not location:
        return None
    if "://" not in location:
        return Path(location)
    return Path(tune.Checkpoint(location).to_directory(str(into)))


def restorable_copy(checkpoint: tune.Checkpoint, into: Path) -> Path | None:
    """A local copy (under ``into``) of the newest checkpoint of this trial that loads: Tune's latest, else the older
    ones Tune kept beside it (``num_to_keep``), newest first. A truncated file (full disk, killed copy) is skipped
    with a warning naming it, instead of failing every retry the same way; None when none loads (start over)."""
    latest = PurePosixPath(checkpoint.path)
    listed = checkpoint.filesystem.get_file_info(FileSelector(str(latest.parent)))
    names = [info.base_name for info in listed if info.type == FileType.Directory]
    older = sorted((name for name in names if name.startswith("checkpoint_") and name < latest.name), reverse=True)
    for name in [latest.name, *older]:
        candidate = tune.Checkpoint(str(latest.parent / name), filesystem=checkpoint.filesystem)
        local = Path(candidate.to_directory(str(into / name)))
        if checkpoint_loads(local):
            if name != latest.name:
                log.warning("resuming from the older checkpoint %s instead", candidate.path)
            return local
        log.warning("checkpoint %s/checkpoint.pt does not load (truncated?); not resuming from it", candidate.path)
    log.warning("no checkpoint of this trial loads; it starts over from epoch 1")
    return None
