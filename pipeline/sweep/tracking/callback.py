"""The driver-side Tune callback that writes every trial's MLflow run: one child run per trial, continued on retry and
restore.

The custom callback stays because Ray's ``MLflowLoggerCallback`` loses its trial -> run map on restore (a second run per
trial), logs at Tune's iteration instead of the trial's epoch and has no parent run (see ``MlflowTrialCallback``).

Why the driver writes everything instead of the trials:
- one writer process, so a local sqlite store never sees concurrent first writers or ``set_experiment`` races, and
  the trials need no tracking URI at all (nothing depends on a trial's working directory or node);
- ``MlflowTrialCallback`` keeps the ``trial_id -> run_id`` map in Tune's own experiment state (``get_state`` /
  ``set_state``), so a retried trial (``FailureConfig``) and a restored sweep (``Tuner.restore``) continue the run
  they started instead of opening a duplicate; the parent run id is kept next to that state (``parent.PARENT_FILE``);
- metrics go out as one ``log_batch`` per epoch (``step=epoch``), only those ``epoch_metrics`` picks from the report
  (with the first epoch, what was measured before training at step 0: ``initial_metrics``),
  not Ray's bookkeeping keys; the final checkpoint and head-centre history are uploaded once, when the trial ends,
  with the final model (an MLflow model) and the prepared dataset as the run's input, on a background thread
  (``trial_end``) so that Tune's event loop starts the next trial meanwhile; the checkpoint is read once there.
Runs left RUNNING by an interrupted driver are closed as KILLED by ``close_interrupted`` and reopened on restore.
Every write to a run goes through the callback's ``TrackingBuffer`` (``buffer``): a tracking server that stays down
queues the writes on disk instead of stopping the sweep, and they are replayed when it answers again.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from ray import cloudpickle
from ray.tune import Callback

from pipeline.io import StorageFaultError, lasting_os_error
from pipeline.sweep.manifest import EARLY_STOPPED, ERROR, FINISHED, INTERRUPTED
from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracking.buffer import BUFFER_FILE, PLACEHOLDER, TrackingBuffer
from pipeline.sweep.tracking.logged_model import PreparedDataset, log_checkpoint
from pipeline.sweep.tracking.parent import ParentRun
from pipeline.sweep.tracking.store import CountingClient, child_runs, is_outage, mlflow_client
from pipeline.sweep.tracking.tags import (
    FAILURE_REASON_TAG,
    LAST_EPOCH_TAG,
    NODES_TAG,
    NOTE_TAG,
    PARENT_TAG,
    STATUS_TAG,
    STOP_REASON_TAG,
    TRIAL_ID_TAG,
    TRIAL_PATH_TAG,
    context_tags,
)
from pipeline.sweep.tracking.trial_end import TrialEndWorker
from pipeline.trial.checkpoint import CorruptCheckpointError, checkpoint_loads, load_checkpoint
from pipeline.trial.report import (
    CHECKPOINT_FILE,
    METRIC_KEYS,
    WHERE_KEY,
    UnretryableTrialError,
    epoch_metrics,
    initial_metrics,
)

log = logging.getLogger(__name__)

# Keys of run_trial's per-epoch report that every run has as MLflow metrics (``epoch`` is the step, not a metric); a
# self-attention trial's report adds its locality/layer<l>/<metric> values (``report.epoch_metrics`` selects both).
EPOCH_METRICS = tuple(key for key in METRIC_KEYS if key != "epoch")


def _metrics(report: dict, epoch: int, now: int) -> list[Metric]:
    """An epoch's MLflow metrics at ``step=epoch``, and with the first epoch those measured before training at step 0
    (``report.initial_metrics``), so each locality curve starts at the initialisation."""
    metrics = [Metric(k, v, now, epoch) for k, v in epoch_metrics(report).items()]
    return metrics + [Metric(k, v, now, 0) for k, v in initial_metrics(report).items()]


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
    uploaded: bool = False
    error: BaseException | None = None


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
    """Mark the trials' runs still RUNNING (driver interrupted) and the parent as KILLED; a restore reopens them.
    Besides the sweep's children, the runs of an earlier sweep that this one continued. With the server down (or
    writes still queued) the store cannot say which runs are open: those the callback opened and did not end are
    closed through the buffer. ``reason`` (why the run stopped: a full storage) goes on each and on the parent as
    ``tune.stop_reason`` (kept when a re-run continues the run: it is what stopped it last)."""
    parent, buffer = callback.parent, callback.buffer
    callback.finish_trial_ends(raise_errors=False)  # the uploads in flight end their runs first
    open_ids = sorted(callback.open_runs())
    if buffer.flush(force=True):
        try:
            client = mlflow_client(parent.tracking_uri)
            runs = child_runs(parent.tracking_uri, parent.experiment_id, parent.parent_run_id)
            known = {run.info.run_id for run in runs.values()}
            runs |= {run_id: client.get_run(run_id) for run_id in set(callback.run_ids().values()) - known}
            open_ids = [run.info.run_id for run in runs.values() if run.info.status == "RUNNING"]
        except MlflowException as err:
            if not is_outage(err) or buffer.path is None:
                raise
            buffer.went_down(err)
    why = {STOP_REASON_TAG: reason} if reason else {}
    for run_id in open_ids:
        buffer.set_tags(run_id, {STATUS_TAG: INTERRUPTED, **why})
        buffer.set_terminated(run_id, "KILLED")
    if why:
        buffer.set_tags(parent.parent_run_id, why)
    buffer.set_terminated(parent.parent_run_id, "KILLED")
    return len(open_ids)


def trial_error(trial: Any) -> BaseException | None:
    """The trial's last error as Tune pickled it (None when there is none or it cannot be read)."""
    try:
        # Tune writes the error into the trial's local folder just before on_trial_error and copies it to the storage
        # (where get_pickled_error reads) only at a later sync: a trial failing before its first report had none there.
        local = trial.pickled_error_file
        if local and Path(local).is_file():
            return cloudpickle.loads(Path(local).read_bytes())
        return trial.get_pickled_error()
    except Exception:  # noqa: BLE001 - an unreadable error file only loses the reason, never the run's end
        return None


def unretryable_reason(trial: Any) -> str | None:
    """The reason of the trial's last error when it is an ``UnretryableTrialError`` (divergence, bad config), read from
    the error Tune pickled; None for any other error (or none)."""
    error = trial_error(trial)
    while error is not None:  # Ray wraps the trial's exception (RayTaskError, TuneError): walk to the cause
        if isinstance(error, UnretryableTrialError):
            return error.reason
        error = getattr(error, "cause", None) or error.__cause__
    return None


def last_failure(trial: Any) -> str:
    """One line on the trial's latest failure, from the error file Tune has just appended it to (``Failure # n
    (occurred at ...)`` and the error: a trainable's traceback ends with its exception, a lost worker's message starts
    with what happened); "" when the file cannot be read."""
    try:
        text = Path(getattr(trial, "error_file", None)).read_text()
    except (OSError, TypeError):
        return ""
    lines = [line.strip() for line in text.rsplit("Failure # ", 1)[-1].splitlines()[1:] if line.strip()]
    if not lines:
        return ""
    return (lines[-1] if lines[0].startswith("ray::") else lines[0])[:300]


class MlflowTrialCallback(Callback):
    """Driver-side Tune callback: one child run per trial, continued across retries and ``Tuner.restore``.

    Why not Ray's ``MLflowLoggerCallback``: it opens top-level runs (a parent run for the sweep, with the sweep's
    params and summary, is not its concept), keeps its trial -> run map in the driver's memory only, so a restored
    sweep opens a second run for every trial instead of continuing its own, logs every reported key (Ray's
    bookkeeping too) at Tune's iteration rather than the trial's epoch, so an epoch trained again after a restore is
    logged twice, and logs no model or dataset. This one creates child runs of the sweep's parent run, keeps the run
    map in Tune's experiment state (``get_state``/``set_state``), logs the training metrics at ``step=epoch`` once
    each, and when a trial ends uploads its checkpoint and logs its final model and dataset (``logged_model``).

    Writes go through ``buffer`` (a ``TrackingBuffer`` in ``buffer_dir``, the Ray experiment directory): while the
    tracking server is down they queue on disk, a run created meanwhile gets a placeholder id, and ``on_step_end``
    replays them once a probe finds the server back; reads fall back to what this driver knows.

    Tune pickles this object into ``tuner.pkl`` and restores ``get_state()`` from its experiment snapshots, so it
    holds only plain data; the client is created lazily. ``run_info`` is a module-level function (picklable by
    reference) that turns a trial's config into its run name, params and tags.
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
        background_ends: bool = True,
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
        self._logged_through: dict[str, int] = {}  # trial_id -> last epoch already in its run (continued runs)
        self._nodes: dict[str, list[str]] = {}  # run_id -> the nodes it ran on (the ray.node_ids tag)
        self._seen_where: dict[str, dict[str, str]] = {}  # trial_id -> node and device of its last report
        self._open: set[str] = set()  # trial ids whose run this driver (re)opened and has not ended
        self._written: dict[str, dict[str, Any]] = {}  # trial_id -> run name and tags it wrote (read while down)
        self._client: CountingClient | None = None
        self._buffer: TrackingBuffer | None = None
        self.epochs_logged = 0
        self.background_ends = background_ends  # False: a trial's end is logged on Tune's event loop (benchmarks)
        self._trial_ends: TrialEndWorker | None = None
        # trial_id -> its name and one line per failed attempt, and whether it failed for good (the stage's summary)
        self.failed_attempts: dict[str, dict[str, Any]] = {}

    @property
    def client(self) -> CountingClient:
        if self._client is None:
            self._client = CountingClient(mlflow_client(self.parent.tracking_uri, short_budget=True))
        return self._client

    @property
    def buffer(self) -> TrackingBuffer:
        if self._buffer is None:
            self._buffer = TrackingBuffer(self.buffer_file, self.parent.tracking_uri, lambda: self.client)
        return self._buffer

    @property
    def calls(self) -> Counter:
        """MLflow client requests made so far, by method (the sweep-overhead benchmark reports them)."""
        return self._client.calls if self._client is not None else Counter()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_buffer": None, "_trial_ends": None}

    def get_state(self) -> dict | None:
        return {"runs": self.run_ids(), "last_epoch": dict(self.last_epoch)}

    def set_state(self, state: dict) -> None:
        self.runs.update(state.get("runs", {}))
        self.last_epoch.update(state.get("last_epoch", {}))

    def adopt_child_runs(self) -> int:
        """On a restore, the parent's child runs by their trial id, for the trials Tune's saved state does not map:
        a storage that filled up (or a driver killed) before Tune saved its state after a trial's run was created would
        otherwise give that trial a second run. One search for the sweep; none while the store cannot be read (the
        restore then goes by Tune's state alone). How many runs it adopted."""
        parent = self.parent
        found = self._read(lambda: child_runs(parent.tracking_uri, parent.experiment_id, parent.parent_run_id), {})
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

    def _run(self, trial_id: str) -> str | None:
        return self.run_ids().get(trial_id)

    def _read(self, read: Callable[[], Any], fallback: Any) -> Any:
        """A read of the store, or ``fallback`` while it cannot be read: the server is down, or writes wait in the
        buffer (the store is behind them)."""
        if self.buffer.down or self.buffer.pending:
            return fallback
        try:
            return read()
        except MlflowException as err:
            if not is_outage(err) or self.buffer_file is None:
                raise
            self.buffer.went_down(err)
            return fallback

    def _remember(self, trial: Any, tags: dict[str, str], run_name: str | None = None) -> None:
        known = self._written.setdefault(trial.trial_id, {"run_name": run_name, "tags": {}})
        if known["run_name"] is None:
            described = self.run_info(trial.config)
            known["run_name"] = described.run_name
            known["tags"] = {**described.tags, **known["tags"]}
        known["tags"].update(tags)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        if self._trial_ends is not None:
            self._settle(self._trial_ends.done())
        if self._buffer is not None and (self._buffer.down or self._buffer.pending):
            self._buffer.flush()  # at most one probe every RETRY_EVERY_S; replays in order once the server answers

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        from_earlier_sweep = trial.trial_id not in self.runs and trial.config.get("resume_run") is not None
        run_id = self._run(trial.trial_id) or trial.config.get("resume_run")
        self._open.add(trial.trial_id)
        if run_id is not None:  # a retry, a restored sweep or a trial resumed from an earlier sweep: continue its run
            self.runs[trial.trial_id] = run_id
            self.buffer.update_run(run_id, "RUNNING")
            tags = {
                STATUS_TAG: "running",
                TRIAL_ID_TAG: trial.trial_id,
                TRIAL_PATH_TAG: str(self.location_of(trial.path)),
            }
            self.buffer.set_tags(run_id, tags)
            parent = {} if from_earlier_sweep else {PARENT_TAG: self.parent.parent_run_id}
            self._remember(trial, {**tags, **parent})
            # Tune resumes from its last saved state, which can lag behind what was logged (Ctrl-C between a report
            # and the next snapshot): epochs already in the run are trained again but not logged twice.
            history = self._read(lambda: self.client.get_metric_history(run_id, EPOCH_METRICS[0]), None)
            if history is not None:
                self._logged_through[trial.trial_id] = max((m.step for m in history), default=0)
                if from_earlier_sweep:
                    self._log_checkpoint_history(trial, run_id, StoragePath(trial.config["resume_from"]))
            elif from_earlier_sweep:  # unreadable: the checkpoint's epochs are in the run (none logged twice)
                with StoragePath(trial.config["resume_from"]).as_local() as resumed:
                    self._logged_through[trial.trial_id] = int(load_checkpoint(resumed)["epoch"])
            else:  # unreadable: what this driver reported is what the run has (logged, or queued in the buffer)
                self._logged_through[trial.trial_id] = self.last_epoch.get(trial.trial_id, 0)
            log.info("MLflow: trial %s continues run %s", trial.trial_id, run_id)
            return
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
        run_id = self._create_run(trial.trial_id, described.run_name, tags)
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
        log.info("MLflow: trial %s -> run %s (%s)", trial.trial_id, run_id, described.run_name)

    def location_of(self, fs_path: str) -> StoragePath:
        """A trial's folder or checkpoint as a later sweep opens it: Tune names them by their path on the storage's
        file system, which for a bucket has no scheme (``bucket/ray/...``)."""
        return self.storage.child_of_fs_path(fs_path) if self.storage is not None else StoragePath(fs_path)

    def _create_run(self, trial_id: str, run_name: str, tags: dict[str, str]) -> str:
        """The new run's id; while the server is down a placeholder that the buffer's replay creates the run for."""
        buffer = self.buffer
        if not (buffer.down or buffer.pending):
            try:
                return self.client.create_run(self.parent.experiment_id, run_name=run_name, tags=tags).info.run_id
            except MlflowException as err:
                if not is_outage(err) or self.buffer_file is None:
                    raise
                buffer.went_down(err)
        return buffer.create_run(f"{PLACEHOLDER}{trial_id}", self.parent.experiment_id, run_name, tags)

    def _log_checkpoint_history(self, trial: Any, run_id: str, checkpoint_dir: StoragePath) -> None:
        """A checkpoint can be ahead of its run (the driver stopped after the trial saved epoch k but before it
        logged it): log the epochs the run misses from the checkpoint's own metrics history, so a run resumed in a
        later sweep has every epoch once."""
        logged = self._logged_through[trial.trial_id]
        with checkpoint_dir.as_local() as local:
            history = load_checkpoint(local).get("metrics_history", [])
        missing = [m for m in history if int(m["epoch"]) > logged]
        now = int(time.time() * 1000)
        for report in missing:
            epoch = int(report["epoch"])
            metrics = _metrics(report, epoch, now)
            self.buffer.log_batch(run_id, metrics=metrics)
            self._logged_through[trial.trial_id] = epoch
        if missing:
            log.info("MLflow: run %s gets epochs %s from its checkpoint", run_id, [int(m["epoch"]) for m in missing])

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        run_id = self._run(trial.trial_id)
        if run_id is None or "epoch" not in result:
            return
        epoch = int(result["epoch"])
        self.last_epoch[trial.trial_id] = epoch
        # Node and device come with every report: tagged when they change (a retry may run elsewhere).
        where = self._where_tags(trial.trial_id, run_id, result)
        if epoch <= self._logged_through.get(trial.trial_id, 0):
            log.info("MLflow: trial %s epoch %d is already in run %s; not logged again", trial.trial_id, epoch, run_id)
            if where:
                self.buffer.log_batch(run_id, tags=where)
            return
        now = int(time.time() * 1000)
        metrics = _metrics(result, epoch, now)  # locality/... too, and epoch 0's with the first epoch
        self.buffer.log_batch(run_id, metrics=metrics, tags=where)
        self.epochs_logged += 1

    def _where_tags(self, trial_id: str, run_id: str, result: dict) -> list[RunTag]:
        """The node and device a report came from when they differ from the trial's previous report (none when they do
        not), with ``ray.node_ids`` extended when the node is new."""
        where = {k: str(v) for k, v in (result.get(WHERE_KEY) or {}).items()}
        if where == self._seen_where.get(trial_id):
            return []
        self._seen_where[trial_id] = where
        if node := where.get("ray.node_id"):
            where |= self._nodes_tag(run_id, node)
        return [RunTag(k, v) for k, v in where.items()]

    def _nodes_tag(self, run_id: str, node: str) -> dict[str, str]:
        """``ray.node_ids``: every node the trial ran on, in order (a retried trial can move; ``ray.node_id`` is the
        last one). Read back from the run once per driver process, so a restored sweep extends the list."""
        nodes = self._nodes.get(run_id)
        if nodes is None:
            recorded = "" if run_id.startswith(PLACEHOLDER) else None  # a run created while down has none yet
            recorded = self._read(lambda: self.client.get_run(run_id).data.tags.get(NODES_TAG, ""), recorded)
            if recorded is None:  # unreadable now: leave the tag as it is rather than drop the nodes it lists
                return {}
            nodes = self._nodes[run_id] = [n for n in recorded.split(",") if n]
        if node in nodes:
            return {}
        nodes.append(node)
        return {NODES_TAG: ",".join(nodes)}

    def _count_failure(self, trial: Any, final: bool) -> None:
        variant, seed = trial.config.get("variant"), trial.config.get("seed")
        blank = {
            "trial": f"{variant} seed {seed}",
            "config": dict(trial.config),
            "folder": PurePosixPath(str(trial.path)).name,  # the trial's folder, as its result names it
            "failures": [],
            "final": False,
        }
        known = self.failed_attempts.setdefault(trial.trial_id, blank)
        known["failures"].append(last_failure(trial))
        known["final"] = final

    def failed_config(self, folder: str) -> dict[str, Any] | None:
        """The config of the trial in ``folder`` (its storage folder's name) if Tune ended it as failed, its retries
        spent; None otherwise. Also for a trial whose every attempt died before its first report: its error is not in
        Tune's results (no error file in its storage folder) and its result has no config (every attempt killed before
        the trial wrote one, e.g. by Ray's memory monitor while its actor was constructed): a failed trial, not one
        still pending when the sweep stopped."""
        found = (k["config"] for k in self.failed_attempts.values() if k["final"] and k["folder"] == folder)
        return next(found, None)

    def failure_summary(self) -> list[str]:
        """One line per trial that lost attempts in this run: how many, whether it was retried, the last reason."""
        lines = []
        for known in self.failed_attempts.values():
            count = len(known["failures"])
            outcome = "no retry left" if known["final"] else "retried"
            last = next((line for line in reversed(known["failures"]) if line), "see the trial's error.txt")
            lines.append(f"{known['trial']}: {count} failed attempt{'s' * (count > 1)}, {outcome} (last: {last})")
        return lines

    def stop_on_storage_fault(self, trial: Any) -> None:
        """A trial that failed writing to a full (read-only, over-quota...) disk: every retry, and every other trial,
        would fail the same way, so the sweep stops here, raising ``StorageFaultError`` out of ``Tuner.fit`` (Tune
        stops its trials); ``fit_tracked`` closes the runs with the reason and the stage says it in one line."""
        fault = lasting_os_error(trial_error(trial))
        if fault is None:
            return
        where = fault.filename or (str(self.storage) if self.storage is not None else trial.path)
        raise StorageFaultError(str(where), fault, what=f"trial {trial.trial_id} wrote to it")

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._count_failure(trial, final=False)
        self.stop_on_storage_fault(trial)
        run_id = self._run(trial.trial_id)
        if run_id is not None:  # tune.retries is set when the trial ends, as a final count that never goes stale
            self.buffer.set_tags(run_id, {STATUS_TAG: "retrying"})

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._count_failure(trial, final=True)
        self.stop_on_storage_fault(trial)
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

    def _finish(self, trial: Any, status: str, label: str) -> None:
        run_id = self._run(trial.trial_id)
        if run_id is None:
            return
        tags = {STATUS_TAG: label, LAST_EPOCH_TAG: str(self.last_epoch.get(trial.trial_id, 0))}
        retries = trial.num_failures - (status == "FAILED")  # a failed trial's last failure was not retried
        if retries:
            tags["tune.retries"] = str(retries)
        if label == EARLY_STOPPED:
            tags["tune.early_stopped"] = "true"
        self.buffer.set_tags(run_id, tags)
        self._remember(trial, tags)
        status = RunStatus.to_string(RunStatus.from_string(status))
        checkpoint = trial.checkpoint
        if checkpoint is not None and self.background_ends and not (self.buffer.down or self.buffer.pending):
            location, trial_location = self.location_of(checkpoint.path), self.location_of(trial.path)
            end = TrialEnd(run_id, trial.trial_id, checkpoint, str(location), str(trial_location), status)
            if self._trial_ends is None:
                self._trial_ends = TrialEndWorker()
            self._trial_ends.submit(lambda: self._end_trial(end))  # the run is closed there, after its model
        else:
            self._log_checkpoint(run_id, trial)
            self.buffer.set_terminated(run_id, status)
        self._open.discard(trial.trial_id)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.finish_trial_ends()

    def finish_trial_ends(self, raise_errors: bool = True) -> None:
        """Wait for the trial ends still uploading (before the sweep's runs are read or closed); an error one raised
        is raised here (or, with ``raise_errors`` false, while runs are being closed anyway, logged)."""
        if self._trial_ends is None or not self._trial_ends.outstanding:
            return
        log.info("MLflow: waiting for %d trial end(s) still logging their model", self._trial_ends.pending)
        try:
            self._settle(self._trial_ends.drain())
        except Exception as err:
            if raise_errors:
                raise
            log.error("MLflow: a trial's end could not be logged: %s", err)

    def _end_trial(self, end: TrialEnd) -> TrialEnd | None:
        """On the background thread: upload the trial's checkpoint (read once: verified and rebuilt into its model
        from the same payload), log its model, close its run. Returns ``end`` when the server could not be reached,
        for the driver thread to queue in the buffer (``_settle``)."""
        try:
            with end.checkpoint.as_directory() as local:  # a download when the storage is a bucket
                try:
                    payload = load_checkpoint(Path(local))  # a truncated file must not become the run's checkpoint
                except (FileNotFoundError, CorruptCheckpointError):
                    log.warning(
                        "MLflow: not uploading the checkpoint of trial %s: %s/%s does not load",
                        end.trial_id,
                        end.checkpoint.path,
                        CHECKPOINT_FILE,
                    )
                else:
                    uri, dataset = self.parent.tracking_uri, self.dataset
                    log_checkpoint(self.client, uri, end.run_id, Path(local), dataset, end.location, payload)
                    end.uploaded = True
        except Exception as err:
            if self.buffer_file is not None and is_outage(err):  # as TrackingBuffer.write decides
                end.error = err
                return end
            if not isinstance(err, (OSError, MlflowException)):
                raise
            # the run's metrics are still worth keeping
            log.warning("MLflow: could not log the checkpoint or model of trial %s: %s", end.trial_id, err)
        end.uploaded = True  # nothing (more) to upload
        try:
            self.client.set_terminated(end.run_id, status=end.status)
        except Exception as err:
            if self.buffer_file is None or not is_outage(err):
                raise
            end.error = err
            return end
        return None

    def _settle(self, ended: list[TrialEnd | None]) -> None:
        """In the driver thread: the trial ends the server did not answer go to the buffer, in order."""
        for end in (e for e in ended if e is not None):
            self.buffer.went_down(end.error)
            if not end.uploaded:
                location, trial_location = StoragePath(end.location), StoragePath(end.trial_location)
                self.buffer.upload_checkpoint(end.run_id, location, trial_location, self.dataset)
            self.buffer.set_terminated(end.run_id, end.status)

    def _log_checkpoint(self, run_id: str, trial: Any) -> None:
        """Upload the trial's latest checkpoint dir (checkpoint.pt, head_history.json) as artifact ``checkpoint/``.

        Read from Tune's storage in the driver: on a multi-node cluster ``storage_path`` must be shared (it must be
        anyway for retries and restore). Queued while the server is down: the replay uploads the trial's newest
        checkpoint that loads then.
        """
        checkpoint = trial.checkpoint
        if checkpoint is None:
            return
        try:
            with checkpoint.as_directory() as local:  # a download when the storage is a bucket
                if not checkpoint_loads(Path(local)):  # a truncated file must not become the run's checkpoint
                    log.warning(
                        "MLflow: not uploading the checkpoint of trial %s: %s/%s does not load",
                        trial.trial_id,
                        checkpoint.path,
                        CHECKPOINT_FILE,
                    )
                    return
                self.buffer.upload_checkpoint(
                    run_id,
                    self.location_of(checkpoint.path),
                    self.location_of(trial.path),
                    self.dataset,
                    local=Path(local),
                )
        except (OSError, MlflowException) as err:  # the run's metrics are still worth keeping
            log.warning("MLflow: could not log the checkpoint or model of trial %s: %s", trial.trial_id, err)
