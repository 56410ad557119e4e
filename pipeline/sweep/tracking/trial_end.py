"""A trial's end-of-run MLflow work (checkpoint upload, final model, run closed), on one background thread.

Why: the driver's Tune callback runs on Tune's event loop. At paper size a trial's end reads a 92 MiB checkpoint,
uploads it, rebuilds the model and logs it: seconds per trial during which Tune starts no trial and handles no
report. Handed to this worker, the callback returns at once and the next trial starts while the model is logged.

- one thread: MLflow's fluent API (``log_model``) is used with the process's global tracking URI, and one writer at a
  time keeps a local sqlite store free of lock contention;
- bounded: at most ``max_pending`` trial ends wait or run; one more blocks the callback until a slot frees, so a
  slow store slows the sweep instead of piling up work (and memory) without limit;
- drained before the sweep's results are read (``drain``, from the callback's ``on_experiment_end``, and before
  runs are closed as interrupted); an error the work raised is raised there, in the driver, not lost in a thread.

``TrialEnds`` is the callback's part that does this work: a trial's end goes to the worker when the server answers
(``TrialEnd``), and comes back to the driver thread (``settle``) to be queued in the outage buffer when it stopped
answering meanwhile; while the server is down, or without the worker, the checkpoint is queued or uploaded at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.entities import RunTag
from mlflow.exceptions import MlflowException

from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracking.logged_model import log_checkpoint
from pipeline.sweep.tracking.store import is_outage
from pipeline.trial.checkpoint import CorruptCheckpointError, checkpoint_loads, load_checkpoint
from pipeline.trial.report import CHECKPOINT_FILE

if TYPE_CHECKING:
    from pipeline.sweep.tracking.callback import MlflowTrialCallback

log = logging.getLogger(__name__)

MAX_PENDING = 2  # trial ends queued or running at once; a third waits (each holds a checkpoint's payload at most)


class TrialEndWorker:
    """Runs submitted callables one at a time on a daemon thread; ``done()`` and ``drain()`` hand back their results
    in the calling (driver) thread and raise the first error one of them raised."""

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-trial-end")
        self._slots = threading.BoundedSemaphore(max_pending)
        self._futures: list[Future] = []

    def submit(self, work: Callable[[], Any]) -> None:
        """Queue ``work``; blocks while ``max_pending`` are queued or running."""
        self._slots.acquire()
        future = self._pool.submit(work)
        future.add_done_callback(lambda _: self._slots.release())
        self._futures.append(future)

    @property
    def pending(self) -> int:
        """Submitted work not finished yet."""
        return sum(not f.done() for f in self._futures)

    @property
    def outstanding(self) -> int:
        """Submitted work whose result was not handed back yet (finished or not)."""
        return len(self._futures)

    def done(self) -> list[Any]:
        """The results of the work finished so far (each returned once); raises the first error among them."""
        finished = [f for f in self._futures if f.done()]
        self._futures = [f for f in self._futures if not f.done()]
        return [f.result() for f in finished]

    def drain(self) -> list[Any]:
        """Wait for all submitted work; its results (each returned once); raises the first error among them, after
        all of it ended."""
        futures, self._futures = self._futures, []
        errors = [f.exception() for f in futures]  # waits for each
        if any(errors):
            raise next(e for e in errors if e is not None)
        return [f.result() for f in futures]


@dataclass
class TrialEnd:
    """A trial's end handed to the background thread: what it uploads, from where, and the status it closes the run
    with. Handed back to the driver thread when the server could not be reached (``uploaded``: what was done)."""

    run_id: str
    trial_id: str
    checkpoint: Any  # ray.tune.Checkpoint (the trial's last)
    location: str  # the checkpoint as a later sweep opens it
    trial_location: str
    status: str
    tags: dict[str, str]  # how it ended, written with the checkpoint's tags in one request
    tagged: bool = False
    uploaded: bool = False
    error: BaseException | None = None


def _not_loading(trial_id: str, checkpoint: Any) -> None:
    log.warning(
        "MLflow: not uploading the checkpoint of trial %s: %s/%s does not load",
        trial_id,
        checkpoint.path,
        CHECKPOINT_FILE,
    )


class TrialEnds:
    """The callback's trial ends: checkpoint, model and dataset logged, the run closed; on the worker thread when the
    server answers (``background``), else through the callback's buffer. Holds no state Tune must keep."""

    def __init__(self, callback: MlflowTrialCallback, background: bool) -> None:
        self.callback, self.background = callback, background
        self._worker: TrialEndWorker | None = None

    def end(self, run_id: str, trial: Any, status: str, tags: dict[str, str]) -> None:
        """Tag the trial's run with how it ended (``tags``), log its last checkpoint and model, close it with
        ``status``. On the worker the tags go with the checkpoint's: one request fewer on Tune's event loop."""
        callback, buffer, checkpoint = self.callback, self.callback.buffer, trial.checkpoint
        if checkpoint is not None and self.background and not (buffer.down or buffer.pending):
            location, trial_location = callback.location_of(checkpoint.path), callback.location_of(trial.path)
            end = TrialEnd(run_id, trial.trial_id, checkpoint, str(location), str(trial_location), status, tags)
            if self._worker is None:
                self._worker = TrialEndWorker()
            self._worker.submit(lambda: self.end_trial(end))  # the run is closed there, after its model
        else:
            buffer.set_tags(run_id, tags)
            self._log_checkpoint(run_id, trial)
            buffer.set_terminated(run_id, status)

    def settle_done(self) -> None:
        """In the driver thread, between Tune's steps: the ends the worker finished, settled."""
        if self._worker is not None:
            self.settle(self._worker.done())

    def finish(self, raise_errors: bool = True) -> None:
        """Wait for the trial ends still uploading (before the sweep's runs are read or closed); an error one raised
        is raised here (or, with ``raise_errors`` false, while runs are being closed anyway, logged)."""
        if self._worker is None or not self._worker.outstanding:
            return
        log.info("MLflow: waiting for %d trial end(s) still logging their model", self._worker.pending)
        try:
            self.settle(self._worker.drain())
        except Exception as err:
            if raise_errors:
                raise
            log.error("MLflow: a trial's end could not be logged: %s", err)

    def end_trial(self, end: TrialEnd) -> TrialEnd | None:
        """On the background thread: upload the trial's checkpoint (read once: verified and rebuilt into its model
        from the same payload), log its model, close its run. Returns ``end`` when the server could not be reached,
        for the driver thread to queue in the buffer (``settle``)."""
        callback = self.callback
        buffered = callback.buffer_file is not None
        try:
            with end.checkpoint.as_directory() as local:  # a download when the storage is a bucket
                try:
                    payload = load_checkpoint(Path(local))  # a truncated file must not become the run's checkpoint
                except (FileNotFoundError, CorruptCheckpointError):
                    _not_loading(end.trial_id, end.checkpoint)
                else:
                    uri, dataset = callback.parent.tracking_uri, callback.dataset
                    log_checkpoint(
                        callback.client, uri, end.run_id, Path(local), dataset, end.location, payload, end.tags
                    )
                    end.uploaded = end.tagged = True
        except Exception as err:
            if buffered and is_outage(err):  # as TrackingBuffer.write decides
                end.error = err
                return end
            if not isinstance(err, (OSError, MlflowException)):
                raise
            # the run's metrics are still worth keeping
            log.warning("MLflow: could not log the checkpoint or model of trial %s: %s", end.trial_id, err)
        end.uploaded = True  # nothing (more) to upload
        try:
            if not end.tagged:
                callback.client.log_batch(end.run_id, tags=[RunTag(k, v) for k, v in end.tags.items()])
                end.tagged = True
            callback.client.set_terminated(end.run_id, status=end.status)
        except Exception as err:
            if not buffered or not is_outage(err):
                raise
            end.error = err
            return end
        return None

    def settle(self, ended: list[TrialEnd | None]) -> None:
        """In the driver thread: the trial ends the server did not answer go to the buffer, in order."""
        buffer, dataset = self.callback.buffer, self.callback.dataset
        for end in (e for e in ended if e is not None):
            buffer.went_down(end.error)
            if not end.tagged:
                buffer.set_tags(end.run_id, end.tags)
            if not end.uploaded:
                location, trial_location = StoragePath(end.location), StoragePath(end.trial_location)
                buffer.upload_checkpoint(end.run_id, location, trial_location, dataset)
            buffer.set_terminated(end.run_id, end.status)

    def _log_checkpoint(self, run_id: str, trial: Any) -> None:
        """Upload the trial's latest checkpoint dir (checkpoint.pt, head_history.json) as artifact ``checkpoint/``.

        Read from Tune's storage in the driver: on a multi-node cluster ``storage_path`` must be shared (it must be
        anyway for retries and restore). Queued while the server is down: the replay uploads the trial's newest
        checkpoint that loads then.
        """
        checkpoint, callback = trial.checkpoint, self.callback
        if checkpoint is None:
            return
        try:
            with checkpoint.as_directory() as local:  # a download when the storage is a bucket
                if not checkpoint_loads(Path(local)):  # a truncated file must not become the run's checkpoint
                    _not_loading(trial.trial_id, checkpoint)
                    return
                where, trial_where = callback.location_of(checkpoint.path), callback.location_of(trial.path)
                callback.buffer.upload_checkpoint(run_id, where, trial_where, callback.dataset, local=Path(local))
        except (OSError, MlflowException) as err:  # the run's metrics are still worth keeping
            log.warning("MLflow: could not log the checkpoint or model of trial %s: %s", trial.trial_id, err)
