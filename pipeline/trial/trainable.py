"""The Ray Tune trainable: one trial of the sweep, run in a Ray worker.

Kept apart from ``pipeline.sweep`` (the driver) so that a trial's worker imports only what training needs (torch,
Ray Tune, the trainer) and not MLflow, the dataset sources or torchvision: a fresh worker starts training seconds
sooner. Everything it imports from this project is trial code (``pipeline.sweep.identity.TRIAL_CODE``, tested).
The trial reports every epoch with a checkpoint and resumes from Tune's checkpoint after a failure.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray import tune

from pipeline.config import parse_params
from pipeline.trial.code_version import check_trial_code
from pipeline.trial.device import device_tags
from pipeline.trial.loop import run_trial
from pipeline.trial.report import WHERE_KEY

if TYPE_CHECKING:
    from pipeline.data.prepared import PreparedData


class InjectedFailure(RuntimeError):
    """Raised by a trial when ``sweep.fail_once_after_epoch`` asks for it (tests of retries)."""


def train_trial(
    config: dict[str, Any], data: PreparedData, params_json: dict[str, Any], code_version: str | None = None
) -> None:
    """One Tune trial: typed config from the trial's dict, resume from Tune's checkpoint, report every epoch.

    ``config["resume_from"]`` (optional) names a checkpoint directory of an earlier sweep's unfinished run of the same
    trial identity: the trial continues from it (weights, optimiser, epoch, RNG) instead of starting over.
    ``config["init_from"]`` (optional) names a checkpoint directory whose weights and heads per layer start the trial,
    e.g. a pruned model to fine-tune. Both must be readable from every node (shared storage). A retried or restored
    trial resumes from its own (Tune's) checkpoint instead. ``code_version`` (the driver's trial code hash) fails a
    trial that imports other code.
    """
    check_trial_code(code_version)  # the driver's pipeline.sweep.identity.code_hash()
    params = parse_params(params_json, "trial params")
    model_cfg = params.model_for(config["variant"])
    train_cfg = params.train.model_copy(update={"seed": config["seed"]})
    if not ray.get_gpu_ids():  # use the GPU Ray assigned, or none at all
        if train_cfg.device == "cuda":
            raise ValueError("train.device is 'cuda' but Ray assigned this trial no GPU (sweep.resources.gpu)")
        train_cfg = train_cfg.model_copy(update={"device": "cpu"})
    where = {"ray.node_id": ray.get_runtime_context().get_node_id(), **device_tags(train_cfg)}
    fail_after = config.get("fail_once_after_epoch")
    checkpoint = tune.get_checkpoint()

    def reporter(metrics: dict[str, float], checkpoint_dir: Path) -> None:
        tune.report({**metrics, WHERE_KEY: where}, checkpoint=tune.Checkpoint.from_directory(str(checkpoint_dir)))
        if checkpoint is None and fail_after is not None and metrics["epoch"] == fail_after:
            raise InjectedFailure(f"sweep.fail_once_after_epoch={fail_after}: failing once after epoch {fail_after}")

    with tempfile.TemporaryDirectory(prefix="tune-resume-") as tmp:
        resume_from = Path(config["resume_from"]) if config.get("resume_from") else None
        if checkpoint is not None:  # a copy: Tune may delete old checkpoints (num_to_keep) while we train
            resume_from = Path(checkpoint.to_directory(tmp))
        init_from = Path(config["init_from"]) if config.get("init_from") and resume_from is None else None
        run_trial(model_cfg, train_cfg, data, reporter, resume_from=resume_from, init_from=init_from)
