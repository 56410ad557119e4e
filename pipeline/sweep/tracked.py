"""One tracked run: what the tune, prune and transform stages share, from the MLflow parent run to the last write.

``run_tracked``: 1. replay what earlier runs left in the outage buffer (reuse and restore read the runs); 2. open the
parent run (``tune-<hash>`` / ``prune-<hash>``) or continue an interrupted one; 3. decide per trial (reuse, resume,
train: ``stage.decide``) unless a restore continues its decisions; 4. let the stage prepare what trains
(``stage.trials``); 5. fit the Tuner with the MLflow callback and read one record per trial back, leaving no run
RUNNING whatever stops it; 6. unless interrupted, list the trials on the parent, add the stage's own
(``stage.wrap_up``) and end the parent; 7. count the writes still buffered (the stages exit 75) and, with a bucket as
storage, park them beside the experiment. A stage keeps only what is its own in a ``TrackedStage``.
"""

from __future__ import annotations

import logging
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray import tune

from pipeline.config import Params
from pipeline.data.prepared import PreparedData
from pipeline.io import StorageFaultError, error_chain
from pipeline.sweep.manifest import EARLY_STOPPED, ERROR, FINISHED, INTERRUPTED, TrialRecord
from pipeline.sweep.reuse import REUSE, TrialDecision, read_decisions, write_decisions
from pipeline.sweep.session import ray_session
from pipeline.sweep.storage import StoragePath, driver_dir, storage_dir
from pipeline.sweep.tracking import (
    BUFFER_FILE,
    EPOCH_METRICS,
    FINAL_WAIT_S,
    MlflowTrialCallback,
    ParentRun,
    PreparedDataset,
    TrackingBuffer,
    TrialClaims,
    TrialInfo,
    close_interrupted,
    finish_parent,
    flush_buffers,
    open_parent_run,
    park_buffer,
    record_trials,
    tags,
    trial_outcome,
)
from pipeline.sweep.tuner import build_tuner, interrupted
from pipeline.trial.report import HEAD_HISTORY_FILE

log = logging.getLogger(__name__)


class TrackedStage(ABC):
    """What one stage puts into ``run_tracked``: names, tags and the steps that are its own.

    ``name`` is the Ray experiment's folder and the parent run's name; ``tags`` go on the parent and on every trial's
    run; ``tuner_params`` are the params the trials run with (the prune stage's fine-tuning schedule)."""

    name: str
    work: str  # what the log calls the run: "sweep", "fine-tuning"
    tracking_uri: str
    experiment: str  # the MLflow experiment
    tags: dict[str, str]
    parent_tags: dict[str, str]
    parent_params: dict[str, str]
    tuner_params: Params
    dataset: PreparedDataset | None = None  # logged as every trial's input
    run_name: str | None = None  # the parent run's name in the UI (``tags.parent_run_name``); None: ``name``

    @abstractmethod
    def decide(self, parent: ParentRun) -> list[TrialDecision]:
        """Per trial: reuse, resume or train, looked up in the parent's experiment."""

    @abstractmethod
    def trials(
        self, decisions: list[TrialDecision], path: StoragePath
    ) -> tuple[list[dict], Callable[[dict], TrialInfo]]:
        """The Tune configs of the trials to run (``path``: the Ray experiment folder), and the callback's
        ``run_info`` (picklable: Tune saves the callback) that names and describes a trial's run from its config."""

    @abstractmethod
    def wrap_up(
        self, parent: ParentRun, decisions: list[TrialDecision], records: list[TrialRecord], buffer: TrackingBuffer
    ) -> dict[str, str]:
        """After a run that was not interrupted, before its parent ends: write what this stage adds (through
        ``buffer``, which queues while the server is down) and return the parent's closing tags."""


@dataclass
class TrackedOutcome:
    name: str  # the Ray experiment and the parent run's name
    path: StoragePath  # the Ray experiment folder
    restored: bool  # this run continued an interrupted one (logged, not in the manifest: it flips on a restore)
    parent: ParentRun
    decisions: list[TrialDecision]  # per trial: reused, resumed or trained
    records: list[TrialRecord]  # one per trial Tune ran (the stage adds the reused ones it read)
    calls: dict[str, int] = field(default_factory=dict)  # MLflow client requests by method, this run
    epochs_logged: int = 0
    buffered: int = 0  # MLflow writes still waiting in buffer_file: the server did not answer by the end
    buffer_file: str | None = None
    write_lags_s: list[float] = field(default_factory=list)  # the writer thread's lag per write (``TrackingBuffer``)

    @property
    def trained(self) -> int:
        """Trials that went to Tune in this run (trained or resumed), as opposed to reused."""
        return sum(decision.action != REUSE for decision in self.decisions)

    @property
    def interrupted(self) -> bool:
        return any(record.status == INTERRUPTED for record in self.records)

    @property
    def failed(self) -> bool:
        return any(record.status == ERROR for record in self.records)


def run_tracked(stage: TrackedStage, params: Params, data: PreparedData, project_root: Path) -> TrackedOutcome:
    """Run the stage's trials as Tune trials under one MLflow parent run (the module docstring's seven steps).
    ``project_root``: where the stores resolve (``location.store_root``)."""
    storage = storage_dir(params, project_root)
    local = driver_dir(storage, project_root)  # what the driver keeps on its own disk (the outage buffer)
    flush_buffers(storage, local)  # reuse and restore read the runs: bring them up to date first
    path = storage / stage.name
    restored = interrupted(path, stage.tracking_uri)
    parent = open_parent_run(
        stage.tracking_uri,
        stage.experiment,
        path,
        run_name=stage.run_name or stage.name,
        tags={**stage.tags, **stage.parent_tags, "ray.experiment_path": str(path), "sweep.role": "parent"},
        params=stage.parent_params,
        project_root=project_root,
        default_store=params.tracking.uri is None,
    )
    buffer_file = local / stage.name / BUFFER_FILE
    # Another project sharing the store may train the same trials: claim them first (``claims``).
    where = f"{socket.gethostname()}:{project_root.resolve()}"
    claims = TrialClaims(
        parent.tracking_uri, stage.experiment, parent.parent_run_id, where, params.tracking.claim_timeout_s
    )
    try:
        # A restored run continues the decisions it was started with (its Tune experiment holds exactly those trials).
        saved = read_decisions(path) if restored else None
        decisions = claims.decide(lambda: saved if saved is not None else stage.decide(parent))
        if saved is None:
            write_decisions(path, decisions)
        log.info("%s: %s", stage.name, ", ".join(f"{d.variant} seed {d.seed}: {d.words()}" for d in decisions))
        trials, run_info = stage.trials(decisions, path)
    except BaseException:  # bad input found late, Ctrl-C: the parent is not left RUNNING
        claims.release("KILLED")
        TrackingBuffer(buffer_file, parent.tracking_uri).set_terminated(parent.parent_run_id, "KILLED")
        raise
    callback = MlflowTrialCallback(
        parent, run_info, stage.tags, stage.tuner_params.train.epochs, stage.dataset, buffer_file.parent, storage
    )
    if restored:
        callback.adopt_child_runs()
    try:
        records = (
            fit_tracked(stage.tuner_params, data, path, callback, restore=restored, trials=trials) if trials else []
        )
    except BaseException:
        claims.release("KILLED")
        raise
    callback.buffer.stop_writer()  # when Tune did not run (every trial reused): the wrap-up's writes in this thread
    for line in callback.failures.summary():  # a trial's lost attempts (a killed worker, an error) in one line each
        log.warning("%s", line)
    claims.release("KILLED" if any(r.status in (INTERRUPTED, ERROR) for r in records) else "FINISHED")
    outcome = TrackedOutcome(
        stage.name, path, restored, parent, decisions, records, dict(callback.calls), callback.epoch_writes.count
    )
    buffer = callback.buffer
    outcome.write_lags_s = buffer.write_lags_s
    if outcome.interrupted:
        closed = close_interrupted(callback)
        log.warning(
            "%s interrupted: %d trial run(s) marked KILLED; re-run to restore it from %s", stage.work, closed, path
        )
    else:
        record_trials(parent, [{**d.to_dict(), "run_id": run_of(d, records)} for d in decisions], buffer)
        closing = stage.wrap_up(parent, decisions, records, buffer)
        finish_parent(parent, "FAILED" if outcome.failed else "FINISHED", closing, buffer)
    outcome.buffered, outcome.buffer_file = buffer.pending, str(buffer.path)
    if buffer.pending and buffer.path is not None and path.remote:
        park_buffer(buffer.path, path)
    return outcome


def run_of(decision: TrialDecision, records: list[TrialRecord]) -> str | None:
    """The run of the trial ``decision`` names: the one Tune ran, else the run it reused."""
    found = (r.run_id for r in records if (r.variant, r.seed) == (decision.variant, decision.seed))
    return next(found, decision.run_id)


def fit_tracked(
    params: Params,
    data: PreparedData,
    path: StoragePath,
    callback: MlflowTrialCallback,
    *,
    restore: bool,
    trials: list[dict[str, Any]],
) -> list[TrialRecord]:
    """Run the Tuner in a Ray session and read back one record per trial; whatever stops it, no run stays RUNNING.
    MLflow writes buffered during an outage are flushed at the end, waiting up to ``FINAL_WAIT_S`` for the server."""
    try:
        with ray_session(params.sweep):
            results = build_tuner(params, data, path, callback, restore=restore, trials=trials).fit()
        callback.buffer.wait_flushed(FINAL_WAIT_S)
        return trial_records(results, callback)
    except BaseException as err:  # a lost cluster, a second Ctrl-C, a full storage: never leave runs RUNNING
        fault = storage_fault(err)
        close_interrupted(callback, str(fault) if fault else None)
        if fault is not None:  # raised by the callback, wrapped by Tune in a TuneError holding its traceback as text
            raise fault from None
        raise


def storage_fault(err: BaseException) -> StorageFaultError | None:
    """The ``StorageFaultError`` that ``err`` is or was raised while handling (Tune re-raises a callback's error as a
    ``TuneError`` inside its ``except``), None when there is none."""
    return next((e for e in error_chain(err) if isinstance(e, StorageFaultError)), None)


def trial_records(results: tune.ResultGrid, callback: MlflowTrialCallback) -> list[TrialRecord]:
    """One record per trial of ``results``, with its MLflow run: the callback's, else the parent's child run tagged with
    its trial id or variant and seed. While the store cannot be read, what the callback wrote stands for the run."""
    run_ids = callback.run_ids()
    runs = callback.stored_runs() if callback.buffer.flush(force=True) else None
    by_variant_seed = {(run.data.tags.get("variant"), run.data.tags.get("seed")): run for run in (runs or {}).values()}
    records = []
    for result in results:
        folder = Path(result.path).name
        trial_id = result.metrics.get("trial_id") or folder
        failed = callback.failures.failed_config(folder)  # Tune ended it as failed, retries spent
        config = result.config if result.config is not None else failed
        if config is None:  # still PENDING when the run stopped (Ctrl-C): never started, has no run
            records.append(TrialRecord(trial_id, None, None, "", -1, INTERRUPTED, 0, {}, None, None))
            continue
        if runs is None:
            name, run_tags = callback.written(trial_id) or (None, {})
            run = (run_ids[trial_id], name, run_tags) if trial_id in run_ids else None
            label = run_tags.get(tags.STATUS_TAG)
            outcome = label if label in (FINISHED, EARLY_STOPPED, ERROR) else INTERRUPTED
        else:
            # A trial that failed before its first report has no trial_id in its metrics; its run is still tagged.
            found = runs.get(trial_id) or by_variant_seed.get((config["variant"], str(config["seed"])))
            run = (found.info.run_id, found.info.run_name, found.data.tags) if found is not None else None
            outcome = trial_outcome(found)
        status = ERROR if result.error is not None or failed is not None else outcome
        checkpoint = str(callback.location_of(result.checkpoint.path)) if result.checkpoint is not None else None
        variant, seed = config["variant"], int(config["seed"])
        records.append(trial_record(trial_id, run, variant, seed, status, result.metrics, checkpoint))
    return records


def trial_record(
    trial_id: str,
    run: tuple[str, str | None, dict[str, str]] | None,
    variant: str,
    seed: int,
    status: str,
    metrics: dict[str, Any],
    checkpoint: str | None,
) -> TrialRecord:
    """A manifest record from a trial's last metrics and checkpoint and its MLflow run (id, name, tags)."""
    run_id, run_name, run_tags = run if run is not None else (None, None, {})
    history = StoragePath(checkpoint) / HEAD_HISTORY_FILE if checkpoint else None
    history = str(history) if history and history.is_file() else None
    artifacts = {}
    if run_id is not None and tags.CHECKPOINT_TAG in run_tags:  # set only once the upload succeeded
        base = f"runs:/{run_id}/checkpoint"
        artifacts = {"checkpoint": base} | ({"head_history": f"{base}/{HEAD_HISTORY_FILE}"} if history else {})
    values = {k: float(metrics[k]) for k in ("epoch", *EPOCH_METRICS) if k in metrics}
    return TrialRecord(
        trial_id,
        run_id,
        run_name,
        variant,
        seed,
        status,
        int(values.get("epoch", 0)),
        values,
        checkpoint,
        history,
        artifacts,
        trial_key=run_tags.get(tags.KEY_TAG),
        sweep_run_id=run_tags.get(tags.PARENT_TAG),
        failure_reason=run_tags.get(tags.FAILURE_REASON_TAG),
    )
