"""A trial's end-of-run MLflow work (how it ended, checkpoint, dataset input, run closed), on the buffer's writer.

Why: at paper size a trial's end reads a 92 MiB checkpoint and uploads it: seconds during which Tune's event loop would
start no trial. On the callback's writer thread (``TrackingBuffer.serially``), behind the run's epochs, the next trial
starts meanwhile; its errors are raised in the driver (``settle``, ``stop_writer``). The checkpoint is read once (a
file that does not load is not uploaded), uploaded, and tagged with the end tags in one request; with the server down,
what is left goes to the outage buffer in order. No MLflow model is logged here: the registry logs one for the runs it
registers (``logged_model.log_run_model``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException

from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracking.callback_view import CallbackView
from pipeline.sweep.tracking.logged_model import log_checkpoint
from pipeline.sweep.tracking.store import is_outage
from pipeline.trial.checkpoint import CorruptCheckpointError, load_checkpoint
from pipeline.trial.report import CHECKPOINT_FILE

log = logging.getLogger(__name__)


@dataclass
class TrialEnd:
    """A trial's end as the callback saw it on Tune's event loop, for the writer thread: what it uploads, from where,
    the tags and the status it closes the run with."""

    run_id: str
    trial_id: str
    checkpoint: Any  # ray.tune.Checkpoint (the trial's last), or None
    location: str  # the checkpoint as a later sweep opens it
    trial_location: str
    status: str
    tags: dict[str, str]  # how it ended, written with the checkpoint's tags in one request
    tagged: bool = False
    uploaded: bool = False
    artifact_root: str | None = None  # the run's, when this driver made it (the upload then reads no run)


def _not_loading(trial_id: str, checkpoint: Any) -> None:
    log.warning(
        "MLflow: not uploading the checkpoint of trial %s: %s/%s does not load",
        trial_id,
        checkpoint.path,
        CHECKPOINT_FILE,
    )


class TrialEnds:
    """The callback's trial ends: how each ended, its checkpoint and dataset logged, its run closed. Holds no state
    Tune must keep."""

    def __init__(self, callback: CallbackView) -> None:
        self.callback = callback

    def end(self, run_id: str, trial: Any, status: str, tags: dict[str, str]) -> None:
        """Tag the trial's run with how it ended (``tags``), log its last checkpoint, close it with
        ``status``: on the writer thread, after the run's earlier writes."""
        callback, checkpoint = self.callback, trial.checkpoint
        location = str(callback.location_of(checkpoint.path)) if checkpoint is not None else ""
        trial_location = str(callback.location_of(trial.path))
        end = TrialEnd(run_id, trial.trial_id, checkpoint, location, trial_location, status, tags)
        callback.buffer.serially(lambda: self.end_trial(end))

    def end_trial(self, end: TrialEnd) -> None:
        """Upload the checkpoint directly while the server answers; then (or else) the writes left,
        through the buffer, which queues them while the server is down."""
        buffer = self.callback.buffer
        end.run_id = buffer.run_id(end.run_id)  # made by now, unless the server is down (then the replay maps it)
        end.artifact_root = buffer.artifact_roots.pop(end.run_id, None)
        if end.checkpoint is None:
            end.uploaded = True
        elif not (buffer.down or buffer.pending):
            self._upload(end)
        if not end.tagged:
            buffer.set_tags(end.run_id, end.tags)
        if not end.uploaded:  # the replay uploads the trial's newest checkpoint that loads then
            location, trial_location = StoragePath(end.location), StoragePath(end.trial_location)
            buffer.upload_checkpoint(end.run_id, location, trial_location, self.callback.dataset)
        buffer.set_terminated(end.run_id, end.status)

    def _upload(self, end: TrialEnd) -> None:
        """The checkpoint read once (a truncated file must not become the run's checkpoint), uploaded with the end
        tags; an outage leaves ``end.uploaded`` false for the buffer."""
        callback = self.callback
        try:
            with end.checkpoint.as_directory() as local:  # a download when the storage is a bucket
                try:
                    load_checkpoint(Path(local))
                except (FileNotFoundError, CorruptCheckpointError):
                    _not_loading(end.trial_id, end.checkpoint)
                else:
                    client, dataset, root = callback.client, callback.dataset, end.artifact_root
                    log_checkpoint(client, end.run_id, Path(local), dataset, end.location, end.tags, root)
                    end.tagged = True
        except Exception as err:
            if callback.buffer_file is not None and is_outage(err):  # as TrackingBuffer.write decides
                callback.buffer.went_down(err)
                return
            if not isinstance(err, (OSError, MlflowException)):
                raise
            # the run's metrics are still worth keeping
            log.warning("MLflow: could not log the checkpoint of trial %s: %s", end.trial_id, err)
        end.uploaded = True  # nothing (more) to upload
