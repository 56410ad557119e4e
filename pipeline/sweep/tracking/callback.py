"""The driver-side Tune callback that writes every trial's MLflow run: one child run per trial, continued on retry and
restore.

The driver writes everything, not the trials: one writer process, so a local sqlite store never sees concurrent
first writers, and trials need no tracking URI. The callback opens or continues the runs; each Tune hook hands the
rest to ``epochs.EpochWrites``, ``trial_end.TrialEnds`` or ``failures.FailedAttempts``, and every write goes through
its ``TrackingBuffer`` (one writer thread off Tune's event loop; on disk while the server is down). Runs left RUNNING
by an interrupted driver are closed as KILLED (``close_interrupted``) and reopened on restore.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from ray.tune import Callback

from pipeline.sweep.manifest import EARLY_STOPPED, ERROR, FINISHED, INTERRUPTED
from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracking.buffer import BUFFER_FILE, PLACEHOLDER, TrackingBuffer
from pipeline.sweep.tracking.epochs import EpochWrites
from pipeline.sweep.tracking.failures import FailedAttempts, stop_on_storage_fault, unretryable_reason
from pipeline.sweep.tracking.logged_model import PreparedDataset
from pipeline.sweep.tracking.parent import ParentRun
from pipeline.sweep.tracking.store import CountingClient, child_runs, is_outage, mlflow_client
from pipeline.sweep.tracking.tags import (
    FAILURE_REASON_TAG,
    LAST_EPOCH_TAG,
    NOTE_TAG,
    PARENT_TAG,
    STATUS_TAG,
    STOP_REASON_TAG,
    TRIAL_ID_TAG,
    TRIAL_PATH_TAG,
    context_tags,
)
from pipeline.sweep.tracking.trial_end import TrialEnds

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialInfo:
    """What the callback logs when a trial's run is created; built from the trial's config by the sweep."""

    run_name: str
    params: dict[str, str]
    tags: dict[str, str]
    # Logged once with the new run: metrics at step 0 (before any training, e.g. a pruned model's accuracy) and JSON
    # artifacts by file name (e.g. the pruning decisions).
    start_metrics: dict[str, float] = field(default_factory=dict)
    start_artifacts: dict[str, Any] = field(default_factory=dict)


def trial_outcome(run: Any | None) -> str:
    """How the trial of ``run`` (an MLflow ``Run``, read after ``fit()``) ended: the label its callback set when Tune
    ended it, or ``interrupted`` when Tune never did (the run is still open: Ctrl-C, SIGTERM, a lost driver)."""
    if run is None or run.info.status == "RUNNING":
        return INTERRUPTED
    label = run.data.tags.get(STATUS_TAG)
    return label if label in (FINISHED, EARLY_STOPPED, ERROR) else INTERRUPTED


def close_interrupted(callback: MlflowTrialCallback, reason: str | None = None) -> int:
    """Mark the trials' runs still RUNNING (the sweep's, and an earlier sweep's it continued) and the parent as KILLED;
    a restore reopens them. With the server down, those the callback opened and did not end are closed through the
    buffer. ``reason`` (a full storage) goes on each and on the parent as ``tune.stop_reason``."""
    parent, buffer = callback.parent, callback.buffer
    callback.epoch_writes.send()  # the epochs held for a later write
    buffer.stop_writer(raise_errors=False)  # the writes in flight (a trial's end among them) are made first
    runs = callback.stored_runs() if buffer.flush(force=True) else None
    if runs is None:
        open_ids = sorted(callback.open_runs())
    else:
        open_ids = [run.info.run_id for run in runs.values() if run.info.status == "RUNNING"]
    why = {STOP_REASON_TAG: reason} if reason else {}
    for run_id in open_ids:
        buffer.set_tags(run_id, {STATUS_TAG: INTERRUPTED, **why})
        buffer.set_terminated(run_id, "KILLED")
    if why:
        buffer.set_tags(parent.parent_run_id, why)
    buffer.set_terminated(parent.parent_run_id, "KILLED")
    return len(open_ids)


class MlflowTrialCallback(Callback):
    """One child run per trial, continued across retries and ``Tuner.restore``: the ``trial_id -> run_id`` map lives in
    Tune's own experiment state (``get_state``/``set_state``), the parent's id beside it (``parent.PARENT_FILE``).

    Why not Ray's ``MLflowLoggerCallback``: it has no parent run, keeps its trial -> run map in the driver's memory
    only (a restored sweep opens a second run per trial), logs every reported key at Tune's iteration rather than the
    trial's epoch (an epoch trained again after a restore is logged twice), and logs no model or dataset.

    Tune pickles this object (``tuner.pkl``, its snapshots): it holds plain data only, its client is made lazily, and
    ``run_info`` (a trial's config -> its run name, params and tags) is a module-level function.
    """

    def __init__(
        self,
        parent: ParentRun,
        run_info: Callable[[dict], TrialInfo],
        tags: dict[str, str],
        epochs: int,
        dataset: PreparedDataset | None = None,
        buffer_dir: Path | None = None,
        storage: StoragePath | None = None,
    ) -> None:
        self.parent = parent
        self.run_info = run_info
        self.tags = {**context_tags(), **tags}
        self.dataset = dataset  # logged as every trial's input when it ends
        self.epochs = epochs  # a trial that completes before this many epochs was stopped early (ASHA)
        self.buffer_file = buffer_dir / BUFFER_FILE if buffer_dir is not None else None  # None: outages raise
        self.storage = storage  # where Tune keeps the trials: their folders are recorded as locations to reopen
        self.runs: dict[str, str] = {}  # trial_id -> run_id: the state that survives restore
        self.last_epoch: dict[str, int] = {}
        self._open: set[str] = set()  # trial ids whose run this driver (re)opened and has not ended
        self._written: dict[str, dict[str, Any]] = {}  # trial_id -> run name and tags it wrote (read while down)
        self._client: CountingClient | None = None
        self._buffer: TrackingBuffer | None = None
        self.ends = TrialEnds(self)
        self.epoch_writes = EpochWrites(self)
        self.failures = FailedAttempts()  # the stage's summary of lost attempts

    @property
    def client(self) -> CountingClient:
        if self._client is None:
            self._client = CountingClient(mlflow_client(self.parent.tracking_uri, short_budget=True))
        return self._client

    @property
    def buffer(self) -> TrackingBuffer:
        if self._buffer is None:
            uri, client = self.parent.tracking_uri, lambda: self.client
            self._buffer = TrackingBuffer(self.buffer_file, uri, client, background=True)  # off Tune's event loop
        return self._buffer

    @property
    def calls(self) -> Counter:
        """MLflow client requests made so far, by method (the sweep-overhead benchmark reports them)."""
        return self._client.calls if self._client is not None else Counter()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_buffer": None}

    # Tune's hooks

    def get_state(self) -> dict | None:
        return {"runs": self.run_ids(), "last_epoch": dict(self.last_epoch)}

    def set_state(self, state: dict) -> None:
        runs = state.get("runs", {})
        never_made = sorted(trial_id for trial_id, run_id in runs.items() if not self.buffer.knows(run_id))
        if never_made:  # its run was queued on a killed driver's writer thread: found by its trial id, or made anew
            log.warning("MLflow: the run of trial(s) %s was never made; the restore looks for it", never_made)
        self.runs.update({trial_id: run_id for trial_id, run_id in runs.items() if trial_id not in never_made})
        self.last_epoch.update(state.get("last_epoch", {}))

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        if self._buffer is not None:
            self._buffer.settle()  # an error of a write made meanwhile raised here; replays once the server answers

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        from_earlier_sweep = trial.trial_id not in self.runs and trial.config.get("resume_run") is not None
        run_id = self._run(trial.trial_id) or trial.config.get("resume_run")
        self._open.add(trial.trial_id)
        if run_id is None:
            self._open_run(trial)
            return
        # a retry, a restored sweep or a trial resumed from an earlier sweep: continue its run
        self.runs[trial.trial_id] = run_id
        self.buffer.update_run(run_id, "RUNNING")
        tags = {STATUS_TAG: "running", TRIAL_ID_TAG: trial.trial_id, TRIAL_PATH_TAG: str(self.location_of(trial.path))}
        self.buffer.set_tags(run_id, tags)
        parent = {} if from_earlier_sweep else {PARENT_TAG: self.parent.parent_run_id}
        self._remember(trial, {**tags, **parent})
        self.epoch_writes.continued(trial, run_id, from_earlier_sweep)
        log.info("MLflow: trial %s continues run %s", trial.trial_id, run_id)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        run_id = self._run(trial.trial_id)
        if run_id is None or "epoch" not in result:
            return
        epoch = self.last_epoch[trial.trial_id] = int(result["epoch"])
        self.epoch_writes.write(trial.trial_id, run_id, epoch, result)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.failures.count(trial, final=False)
        stop_on_storage_fault(trial, self.storage)
        self.epoch_writes.send(trial.trial_id)  # the failed attempt's epochs, before the retry's
        run_id = self._run(trial.trial_id)
        if run_id is not None:  # tune.retries is set when the trial ends, as a final count that never goes stale
            self.buffer.set_tags(run_id, {STATUS_TAG: "retrying"})

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.failures.count(trial, final=True)
        stop_on_storage_fault(trial, self.storage)
        run_id = self._run(trial.trial_id)
        reason = unretryable_reason(trial)
        if run_id is not None and reason is not None:  # in the UI: why it failed, and that no retry was made
            note = f"Failed once, not retried (a retry cannot fix it): {reason}"
            tags = {FAILURE_REASON_TAG: reason, NOTE_TAG: note}
            self.buffer.set_tags(run_id, tags)
            self._remember(trial, tags)
        self._finish(trial, "FAILED", ERROR)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        stopped_early = self.last_epoch.get(trial.trial_id, 0) < self.epochs  # ASHA's stops complete trials too
        self._finish(trial, "FINISHED", EARLY_STOPPED if stopped_early else FINISHED)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.epoch_writes.send()
        self.buffer.stop_writer()  # the trials' ends logged before the sweep's results are read

    # The trial -> run map and the runs' lifecycle

    def _open_run(self, trial: Any) -> None:
        """A new child run of the parent for ``trial``, with its params and what it measured before training, made on
        the writer thread like every write (a placeholder id stands for it until then)."""
        described = self.run_info(trial.config)
        tags = {
            **self.tags,
            **described.tags,
            PARENT_TAG: self.parent.parent_run_id,
            TRIAL_ID_TAG: trial.trial_id,
            "ray.trial_name": str(trial),
            TRIAL_PATH_TAG: str(self.location_of(trial.path)),  # where a later sweep finds checkpoints to resume from
            STATUS_TAG: "running",
        }
        placeholder, experiment_id = f"{PLACEHOLDER}{trial.trial_id}", self.parent.experiment_id
        run_id = self.buffer.create_run(placeholder, experiment_id, described.run_name, tags)  # made off the loop
        self.epoch_writes.opened(trial.trial_id)
        self._remember(trial, tags, described.run_name)
        now = int(time.time() * 1000)
        self.buffer.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in described.start_metrics.items()],
            params=[Param(k, v) for k, v in described.params.items()],
        )
        for name, payload in described.start_artifacts.items():
            self.buffer.log_dict(run_id, payload, name)
        self.runs[trial.trial_id] = run_id

    def _finish(self, trial: Any, status: str, label: str) -> None:
        self.epoch_writes.send(trial.trial_id)  # its held epochs, before its end
        run_id = self._run(trial.trial_id)
        if run_id is None:
            return
        tags = {STATUS_TAG: label, LAST_EPOCH_TAG: str(self.last_epoch.get(trial.trial_id, 0))}
        retries = trial.num_failures - (status == "FAILED")  # a failed trial's last failure was not retried
        if retries:
            tags["tune.retries"] = str(retries)
        if label == EARLY_STOPPED:
            tags["tune.early_stopped"] = "true"
        self._remember(trial, tags)
        self.ends.end(run_id, trial, status, tags)
        self._open.discard(trial.trial_id)

    def adopt_child_runs(self) -> int:
        """On a restore, the parent's child runs by trial id for the trials Tune's saved state does not map (a driver
        stopped after a run was made but before Tune saved its state): no second run. How many it adopted."""
        parent = self.parent
        found = self.read(lambda: child_runs(parent.tracking_uri, parent.experiment_id, parent.parent_run_id), {})
        adopted = {
            trial_id: run.info.run_id
            for trial_id, run in found.items()
            if run.data.tags.get(TRIAL_ID_TAG) == trial_id and trial_id not in self.runs
        }
        self.runs.update(adopted)
        return len(adopted)

    def run_ids(self) -> dict[str, str]:
        """trial_id -> run_id, with the runs created by a replay of the buffer under their real ids."""
        self.runs = {trial_id: self.buffer.run_id(run_id) for trial_id, run_id in self.runs.items()}
        return dict(self.runs)

    def open_runs(self) -> set[str]:
        """The runs this driver (re)opened for a trial and has not ended."""
        runs = self.run_ids()
        return {runs[trial_id] for trial_id in self._open if trial_id in runs}

    def written(self, trial_id: str) -> tuple[str, dict[str, str]] | None:
        """The run name and tags this driver gave the trial's run: what is known of it while the store cannot be
        read (the server down, or writes still queued)."""
        known = self._written.get(trial_id)
        return (known["run_name"], dict(known["tags"])) if known else None

    def stored_runs(self) -> dict[str, Any] | None:
        """The parent's child runs and the runs this callback continued (an earlier sweep's), by trial id, as the
        store has them; None while it cannot be read."""

        def read() -> dict[str, Any]:
            parent = self.parent
            runs = child_runs(parent.tracking_uri, parent.experiment_id, parent.parent_run_id)
            known = {run.info.run_id for run in runs.values()}
            continued = {t: r for t, r in self.run_ids().items() if r not in known and t not in runs}
            client = mlflow_client(parent.tracking_uri)  # a read: MLflow's own retries, never counted as a write
            return runs | {trial_id: client.get_run(run_id) for trial_id, run_id in continued.items()}

        return self.read(read, None)

    def _run(self, trial_id: str) -> str | None:
        return self.run_ids().get(trial_id)

    def read(self, read: Callable[[], Any], fallback: Any) -> Any:
        """A read of the store, or ``fallback`` while it cannot be read: the server is down, or writes wait in the
        buffer (the store is behind them). Waits for the writes queued on the writer thread first."""
        self.buffer.wait()
        if self.buffer.down or self.buffer.pending:
            return fallback
        try:
            return read()
        except MlflowException as err:
            if not is_outage(err) or self.buffer_file is None:
                raise
            self.buffer.went_down(err)
            return fallback

    def read_run(self, run_id: str, read: Callable[[str], Any], fallback: Any) -> Any:
        """``self.read`` of one run: ``read`` gets its real id (a placeholder maps to the run the writer thread made
        for it, once the writes queued before the read are done)."""
        return self.read(lambda: read(self.buffer.run_id(run_id)), fallback)

    def _remember(self, trial: Any, tags: dict[str, str], run_name: str | None = None) -> None:
        known = self._written.setdefault(trial.trial_id, {"run_name": run_name, "tags": {}})
        if known["run_name"] is None:
            described = self.run_info(trial.config)
            known["run_name"] = described.run_name
            known["tags"] = {**described.tags, **known["tags"]}
        known["tags"].update(tags)

    def location_of(self, fs_path: str) -> StoragePath:
        """A trial's folder or checkpoint as a later sweep opens it: Tune names them by their path on the storage's
        file system, which for a bucket has no scheme (``bucket/ray/...``)."""
        return self.storage.child_of_fs_path(fs_path) if self.storage is not None else StoragePath(fs_path)
