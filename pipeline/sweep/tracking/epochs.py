"""A trial's per-epoch writes to its run: its epochs at ``step=epoch``, each epoch once, at most ``SEND_EVERY_S`` late.

Only the keys ``report.epoch_metrics`` picks go out, with the first epoch those measured before training at step 0,
so each locality curve starts at the initialisation. An epoch longer than ``SEND_EVERY_S`` goes out alone as it ends
(a paper-size epoch takes minutes: the UI shows it live); shorter ones are held and go out together, in one
``log_batch``, once that long has passed since the run's last write, and when the trial ends, fails, is retried or
the sweep stops: 1000 five-epoch trials of a second each cost the server one request per trial for their epochs, not
five. An epoch already in the run is never logged again (Tune resumes from a saved state that can lag behind the
log); a run continued from an earlier sweep, or by a restored driver (which may have lost what the stopped one held),
gets the epochs its checkpoint holds but the run misses (``catch_up``). The node and device a report came from are
tagged when they change.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from mlflow.entities import Metric, RunTag

from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracking.buffer import PLACEHOLDER
from pipeline.sweep.tracking.callback_view import CallbackView
from pipeline.sweep.tracking.tags import NODES_TAG
from pipeline.trial.checkpoint import CorruptCheckpointError, load_checkpoint
from pipeline.trial.report import METRIC_KEYS, WHERE_KEY, epoch_metrics, initial_metrics

log = logging.getLogger(__name__)

SEND_EVERY_S = 5.0  # how late a run's epochs may reach MLflow: a longer epoch goes out alone, as it ends
# Keys of run_trial's per-epoch report that every run has as MLflow metrics (``epoch`` is the step, not a metric); a
# self-attention trial's report adds its locality/layer<l>/<metric> values (``report.epoch_metrics`` selects both).
EPOCH_METRICS = tuple(key for key in METRIC_KEYS if key != "epoch")


def epoch_batch(report: dict, epoch: int, now: int) -> list[Metric]:
    """An epoch's MLflow metrics at ``step=epoch``; with the first epoch, those measured before training at step 0."""
    metrics = [Metric(k, v, now, epoch) for k, v in epoch_metrics(report).items()]
    return metrics + [Metric(k, v, now, 0) for k, v in initial_metrics(report).items()]


class EpochWrites:
    """The callback's per-epoch writes. Plain data (Tune pickles it with the callback): per trial the last epoch
    already in its run and the node and device of its last report, per run the nodes it ran on."""

    def __init__(self, callback: CallbackView) -> None:
        self.callback = callback
        self.logged_through: dict[str, int] = {}  # trial_id -> last epoch already in its run (continued runs)
        self.nodes: dict[str, list[str]] = {}  # trial_id -> the nodes its run ran on (the ray.node_ids tag)
        self.seen_where: dict[str, dict[str, str]] = {}  # trial_id -> node and device of its last report
        self.count = 0  # epochs logged by this driver (the benchmarks' rate)
        self.held: dict[str, tuple[str, list[Metric], dict[str, str]]] = {}  # trial_id -> run, metrics, tags unsent
        self.sent_at: dict[str, float] = {}  # trial_id -> time.monotonic() of its run's last write by this driver

    def __getstate__(self) -> dict[str, Any]:
        """Tune pickles the callback: what this process holds and when it wrote are its own (a restored driver catches
        up from the checkpoints instead)."""
        return {**self.__dict__, "held": {}, "sent_at": {}}

    def opened(self, trial_id: str) -> None:
        """The trial's run is one this driver just created: it has run on no node yet, so its first report's
        ``ray.node_ids`` needs no read of the run (one request fewer per trial)."""
        self.nodes[trial_id] = []
        self.sent_at[trial_id] = time.monotonic()

    def continued(self, trial: Any, run_id: str, from_earlier_sweep: bool) -> None:
        """A run continued by a retry, a restore or a trial resumed from an earlier sweep: which epochs it has, and
        those its checkpoint holds that it misses (an earlier sweep's, or a stopped driver's held epochs)."""
        callback, restored = self.callback, trial.trial_id not in self.sent_at  # a retry's were sent when it failed
        self.sent_at[trial.trial_id] = time.monotonic()
        history = callback.read_run(run_id, lambda run: callback.client.get_metric_history(run, EPOCH_METRICS[0]), None)
        if history is not None:
            self.logged_through[trial.trial_id] = max((m.step for m in history), default=0)
            if from_earlier_sweep:
                self.catch_up(trial.trial_id, run_id, StoragePath(trial.config["resume_from"]))
            elif restored and trial.checkpoint is not None:
                try:
                    self.catch_up(trial.trial_id, run_id, callback.location_of(trial.checkpoint.path))
                except (FileNotFoundError, CorruptCheckpointError) as err:  # the trial resumes from an older one
                    log.info("MLflow: trial %s: no epoch caught up (%s)", trial.trial_id, err)
        elif from_earlier_sweep:  # unreadable: the checkpoint's epochs are in the run (none logged twice)
            with StoragePath(trial.config["resume_from"]).as_local() as resumed:
                self.logged_through[trial.trial_id] = int(load_checkpoint(resumed)["epoch"])
        else:  # unreadable: what this driver reported is what the run has (logged, or queued in the buffer)
            self.logged_through[trial.trial_id] = callback.last_epoch.get(trial.trial_id, 0)

    def catch_up(self, trial_id: str, run_id: str, checkpoint_dir: StoragePath) -> None:
        """A checkpoint can be ahead of its run (the driver stopped after the trial saved epoch k but before it
        logged it): log the epochs the run misses from the checkpoint's own metrics history, so a run resumed in a
        later sweep has every epoch once."""
        logged = self.logged_through[trial_id]
        with checkpoint_dir.as_local() as local:
            history = load_checkpoint(local).get("metrics_history", [])
        missing = [m for m in history if int(m["epoch"]) > logged]
        now = int(time.time() * 1000)
        for report in missing:
            epoch = int(report["epoch"])
            self.callback.buffer.log_batch(run_id, metrics=epoch_batch(report, epoch, now))
            self.logged_through[trial_id] = epoch
        if missing:
            log.info("MLflow: run %s gets epochs %s from its checkpoint", run_id, [int(m["epoch"]) for m in missing])

    def write(self, trial_id: str, run_id: str, epoch: int, result: dict) -> None:
        """One epoch's report: its metrics unless the run has them already, and where it ran when that changed; sent
        now when ``SEND_EVERY_S`` passed since the run's last write, else held for the next."""
        where = self._where_tags(trial_id, run_id, result)  # a retry may run elsewhere
        if epoch <= self.logged_through.get(trial_id, 0):
            log.info("MLflow: trial %s epoch %d is already in run %s; not logged again", trial_id, epoch, run_id)
            metrics = []
        else:
            metrics = epoch_batch(result, epoch, int(time.time() * 1000))
            self.count += 1
        _, held_metrics, held_tags = self.held.setdefault(trial_id, (run_id, [], {}))
        held_metrics += metrics
        held_tags.update((tag.key, tag.value) for tag in where)
        if time.monotonic() - self.sent_at.get(trial_id, 0.0) >= SEND_EVERY_S:
            self.send(trial_id)

    def send(self, trial_id: str | None = None) -> None:
        """What is held for ``trial_id`` (every trial's when None), in one ``log_batch`` per run: before the trial's
        end, a retry, or the end of the sweep."""
        for held_id in [trial_id] if trial_id is not None else list(self.held):
            if (held := self.held.pop(held_id, None)) is None:
                continue
            run_id, metrics, tags = held
            if metrics or tags:
                self.callback.buffer.log_batch(run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()])
            self.sent_at[held_id] = time.monotonic()

    def _where_tags(self, trial_id: str, run_id: str, result: dict) -> list[RunTag]:
        """The node and device a report came from when they differ from the trial's previous report (none when they do
        not), with ``ray.node_ids`` extended when the node is new."""
        where = {k: str(v) for k, v in (result.get(WHERE_KEY) or {}).items()}
        if where == self.seen_where.get(trial_id):
            return []
        self.seen_where[trial_id] = where
        if node := where.get("ray.node_id"):
            where |= self._nodes_tag(trial_id, run_id, node)
        return [RunTag(k, v) for k, v in where.items()]

    def _nodes_tag(self, trial_id: str, run_id: str, node: str) -> dict[str, str]:
        """``ray.node_ids``: every node the trial ran on, in order (a retried trial can move; ``ray.node_id`` is the
        last one). Read back from the run once per driver process, so a restored sweep extends the list."""
        nodes = self.nodes.get(trial_id)
        if nodes is None:
            callback = self.callback
            recorded = "" if run_id.startswith(PLACEHOLDER) else None  # a run created while down has none yet
            recorded = callback.read_run(
                run_id, lambda run: callback.client.get_run(run).data.tags.get(NODES_TAG, ""), recorded
            )
            if recorded is None:  # unreadable now: leave the tag as it is rather than drop the nodes it lists
                return {}
            nodes = self.nodes[trial_id] = [n for n in recorded.split(",") if n]
        if node in nodes:
            return {}
        nodes.append(node)
        return {NODES_TAG: ",".join(nodes)}
