"""A trial's checkpoint and dataset, logged by the driver when the trial ends, and its final model as an MLflow model,
logged only where one is used: when the registry registers the run.

Every run gets its checkpoint folder as artifact ``checkpoint/`` and the prepared dataset as its input: trials never
talk to MLflow. An MLflow model is logged for the runs the registry registers only (``log_run_model``: the best seed
per variant), from that checkpoint: for every trial it cost 21 of a trial's 33 HTTP requests (the model's files, its
own records, a read-back of every metric's history to link them) and most of the driver's and the server's CPU per
trial, for models nobody loads (the analysis reads the checkpoints). The model is pickled (``mlflow.pytorch``'s
``pickle`` format, ~1 s per model; ``pt2`` took ~8 s), so loading it needs this project importable. It carries its
signature but no input example: with one, ``log_model`` loads the model back to predict, 0.74 s of driver CPU per
paper-size model.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import mlflow
import mlflow.artifacts
import mlflow.pytorch
import torch
from mlflow.entities import Dataset, DatasetInput, InputTag, Run, RunTag
from mlflow.models import infer_signature
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.tracking import MlflowClient

from pipeline.config import DataConfig
from pipeline.sweep.storage import StoragePath, found_file
from pipeline.sweep.tracking.tags import CHECKPOINT_TAG, MODEL_URI_TAG
from pipeline.trial.checkpoint import CorruptCheckpointError, load_checkpoint, model_from_payload
from pipeline.trial.report import CHECKPOINT_FILE

log = logging.getLogger(__name__)

MODEL_NAME = "model"  # a run without variant and seed tags (not a trial's)
EXAMPLE_BATCH = 2  # images the signature is inferred from; not 1, so it keeps the batch size free


@dataclass(frozen=True)
class PreparedDataset:
    """The prepared data a sweep trains on, as MLflow names a dataset: its digest is the data's content hash."""

    name: str  # e.g. digits-16px
    digest: str  # sha256 over every tensor (``pipeline.data.prepared.content_hash``), hex
    source: str  # the prepared data folder

    @classmethod
    def of(cls, cfg: DataConfig, digest: str, project_root: Path) -> PreparedDataset:
        folder = Path(cfg.prepared_dir)
        source = folder if folder.is_absolute() else project_root / folder
        return cls(f"{cfg.dataset}-{cfg.image_size}px", digest, str(source.resolve()))


@contextmanager
def using_tracking_uri(tracking_uri: str) -> Iterator[None]:
    """MLflow's ``log_model`` and the registry's ``models:/`` lookups read the global tracking URI, which the driver
    otherwise never sets (its clients name theirs): set it for the block only."""
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)


def log_trial_model(
    client: MlflowClient,
    tracking_uri: str,
    run_id: str,
    checkpoint_dir: Path,
    dataset: PreparedDataset | None,
    payload: dict | None = None,
    run: Run | None = None,
) -> str:
    """Log the checkpoint's model (with its signature) and ``dataset`` as the input of run
    ``run_id``; return the model's URI (``models:/<id>``). ``payload``: the checkpoint, already loaded; ``run``: the
    run, already read (its tags name the model, its params are the model's)."""
    payload = payload if payload is not None else load_checkpoint(checkpoint_dir)
    model = model_from_payload(payload)
    example = torch.zeros(EXAMPLE_BATCH, *payload["image_shape"])
    with torch.no_grad():
        logits = model(example)
    signature = infer_signature(example.numpy(), logits.numpy())
    if dataset is not None:
        client.log_inputs(run_id, datasets=[dataset_input(dataset)])
    run = run if run is not None else client.get_run(run_id)
    pytorch_log = logging.getLogger("mlflow.pytorch")
    level = pytorch_log.level
    # Its pickle-format warning (once per model, on every trial's end) is the choice the module docstring explains.
    pytorch_log.setLevel(logging.ERROR)
    try:
        # For run ``run_id``, not as the fluent active run: entering and leaving one cost three requests per trial
        # (read the run, mark it RUNNING, then FINISHED) and printed two lines to the driver's log. Without an active
        # run, a model ``log_model`` creates itself goes to the default experiment: created here, in the run's.
        with using_tracking_uri(tracking_uri):
            pending = mlflow.initialize_logged_model(
                name=model_name(run.data.tags),
                source_run_id=run_id,
                params=run.data.params,
                experiment_id=run.info.experiment_id,
            )
            info = mlflow.pytorch.log_model(
                model,
                name=pending.name,
                model_id=pending.model_id,
                signature=signature,
                serialization_format="pickle",
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
                step=int(payload.get("epoch", 0)),
                run_id=run_id,  # passed on to ``mlflow.models.Model.log``: the run's output, its metrics linked
            )
    finally:
        pytorch_log.setLevel(level)
    return info.model_uri


def model_name(tags: dict[str, str]) -> str:
    """A logged model's name from its run's tags: ``sa_quadratic_9-seed0`` (``-pruned`` for a pruned model's
    fine-tuning), so the UI's models list tells the models apart."""
    if "variant" not in tags or "seed" not in tags:
        return MODEL_NAME
    pruned = "-pruned" if "prune.pruned_heads" in tags else ""
    return f"{tags['variant']}-seed{tags['seed']}{pruned}"


def log_run_model(client: MlflowClient, tracking_uri: str, run: Run) -> str:
    """The final model of ``run`` (a trial's run, ended) logged from its checkpoint and tagged ``model_uri``, unless it
    has one already; the model's URI. The checkpoint is read where ``tune.checkpoint`` names it while that copy loads
    (no download where Ray's copy is on this disk), else from the run's ``checkpoint/`` artifact."""
    if known := run.data.tags.get(MODEL_URI_TAG):
        return known
    run_id = run.info.run_id
    with ExitStack() as stack:
        folder, payload = _checkpoint_of(run, tracking_uri, stack)
        model_uri = log_trial_model(client, tracking_uri, run_id, folder, None, payload, run)
    client.log_batch(run_id, tags=[RunTag(MODEL_URI_TAG, model_uri)])
    return model_uri


def _checkpoint_of(run: Run, tracking_uri: str, stack: ExitStack) -> tuple[Path, dict]:
    """The run's checkpoint folder on this disk (kept open by ``stack``) and its loaded ``checkpoint.pt``."""
    location = run.data.tags.get(CHECKPOINT_TAG)
    if location and found_file(StoragePath(location) / CHECKPOINT_FILE):
        local = stack.enter_context(StoragePath(location).as_local())
        try:
            return local, load_checkpoint(local)
        except (FileNotFoundError, CorruptCheckpointError) as err:  # deleted or rewritten since: the run's own copy
            log.info("MLflow: %s does not load (%s); reading run %s's artifact", location, err, run.info.run_id)
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="run-checkpoint-")))
    local = Path(download_checkpoint(tracking_uri, f"runs:/{run.info.run_id}/checkpoint", tmp))
    return local, load_checkpoint(local)


def log_checkpoint(
    client: MlflowClient,
    run_id: str,
    checkpoint_dir: Path,
    dataset: PreparedDataset | None,
    location: str | None = None,
    tags: dict[str, str] | None = None,
    artifact_root: str | None = None,
) -> None:
    """A trial's checkpoint folder as artifact ``checkpoint/`` of run ``run_id`` and ``dataset`` as its input, then
    the tag ``tune.checkpoint`` (``location``: where a downloaded copy is kept) with ``tags``, in one request. No model:
    ``log_run_model`` logs one from this artifact for a run the registry registers. ``artifact_root``: the run's
    (``run.info.artifact_uri``), when known."""
    if artifact_root is None:
        client.log_artifacts(run_id, str(checkpoint_dir), artifact_path="checkpoint")
    else:  # MLflow's client would read the run back to find its artifact root: one request per trial for nothing
        repository = get_artifact_repository(artifact_root, tracking_uri=client.tracking_uri)
        repository.log_artifacts(str(checkpoint_dir), "checkpoint")
        count = getattr(client, "count", None)
        if count is not None:  # the request counter (CountingClient) counts the upload as the client's would be
            count("log_artifacts")
    if dataset is not None:
        client.log_inputs(run_id, datasets=[dataset_input(dataset)])
    # The tag last, once the upload is made: a failed upload leaves none, so the run does not count as complete
    # (``reuse.is_complete`` needs the checkpoint tag) and a later sweep does not reuse it.
    written = {**(tags or {}), CHECKPOINT_TAG: location or str(checkpoint_dir)}
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in written.items()])


def download_checkpoint(tracking_uri: str, artifact_uri: str, destination: Path) -> str:
    """The checkpoint folder a run uploaded (``artifact_uri``: ``runs:/<id>/checkpoint``) downloaded into
    ``destination``, for a later stage whose Ray copy is gone; the local folder's path."""
    return mlflow.artifacts.download_artifacts(
        artifact_uri=artifact_uri, dst_path=str(destination), tracking_uri=tracking_uri
    )


def dataset_input(dataset: PreparedDataset) -> DatasetInput:
    """``dataset`` as a run's training input: MLflow's local-file source (``source_type`` ``local``)."""
    # MLflow caps a digest at 36 characters: the first 12, as `stages.prepare` logs it; all of it as a tag.
    named = Dataset(
        name=dataset.name,
        digest=dataset.digest[:12],
        source_type="local",
        source=json.dumps({"uri": Path(dataset.source).as_uri()}),
    )
    # ``mlflow.data.context``: the tag MLflow's ``log_input(context=...)`` writes and its UI shows beside the dataset
    tags = [InputTag("content_sha256", dataset.digest), InputTag("mlflow.data.context", "train")]
    return DatasetInput(named, tags)
