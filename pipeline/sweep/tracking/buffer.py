"""MLflow writes that outlive a tracking-server outage: a write-ahead buffer on disk, replayed when the server answers.

Why: a server down for longer than the MLflow client's retries (about four minutes) made every write raise and the
sweep died while its trials trained fine. Here the writes use a short budget per request (``store.WRITE_BUDGET``), so
a dead server fails the first write within seconds; a write that fails because the server cannot be reached is
appended, fsync'd, to ``BUFFER_FILE`` (on the driver's disk: ``storage.driver_dir``), and every later write queues
behind it, in order; a refused request (4xx) still raises. While the server is down a ``/health`` probe at most every
``RETRY_EVERY_S`` decides when to replay. A write that was sent (its reply lost) skips on replay the epochs its run
already has; a queued checkpoint upload takes the trial's newest checkpoint that loads (Tune keeps only two).

With ``background`` (the sweep's callback) every write is made on one writer thread (``SerialWriter``) and Tune's
event loop only queues it (it had waited ~0.1 s per trial on the store, both trial slots idle); a run made there is
named meanwhile by a placeholder id (``buffered-<trial id>``), mapped in ``RUNS_FILE`` so Tune's saved state may hold
it. MLflow's own asynchronous logging is not used: it logs a failed batch and drops it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.entities import Metric, Param, RunTag

from pipeline.io import write_text_atomic
from pipeline.sweep.checkpoints import newest_loading_checkpoint
from pipeline.sweep.storage import StoragePath
from pipeline.sweep.tracking.logged_model import PreparedDataset, log_checkpoint
from pipeline.sweep.tracking.store import PROBE_TIMEOUT_S, is_outage, mlflow_client, server_answers

log = logging.getLogger(__name__)

BUFFER_FILE = "mlflow_buffer.jsonl"  # in the Ray experiment directory
RUNS_FILE = "mlflow_buffer_runs.json"  # beside it: run id handed out before its run existed -> the run it became
PLACEHOLDER = "buffered-"  # how such a run id starts (``buffered-<trial id>``)
RETRY_EVERY_S = 10.0  # while the server is down: at most one /health probe per this many seconds
FINAL_WAIT_S = 60.0  # at the end of a sweep: how long to wait for a server that is down before giving up
MAX_QUEUED = 32  # writes queued on the writer thread at once; one more blocks the caller (a slow store slows the sweep)


class SerialWriter:
    """Runs submitted callables one at a time, in order, on one thread; ``done()`` and ``drain()`` hand their errors
    back to the calling (driver) thread, so none is lost in the thread. Bounded: ``submit`` blocks while
    ``max_queued`` wait or run, so a slow store slows the sweep instead of piling up work and memory."""

    def __init__(self, max_queued: int = MAX_QUEUED) -> None:
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(1, "mlflow-writer", initializer=self._started)
        self._slots = threading.BoundedSemaphore(max_queued)
        self._futures: list[Future] = []
        self.lags: list[float] = []  # per write: seconds from its submit to its end on the thread

    def _started(self) -> None:
        self._thread = threading.current_thread()

    def is_current(self) -> bool:
        """Whether the caller runs on this writer's thread (its work writes inline, never queues behind itself)."""
        return threading.current_thread() is self._thread

    def submit(self, work: Callable[[], Any]) -> None:
        asked = time.monotonic()  # before a full queue blocks the caller: that wait is part of the lag
        self._slots.acquire()
        future = self._pool.submit(work)
        future.add_done_callback(lambda _: self._ended(asked))
        self._futures.append(future)

    def _ended(self, asked: float) -> None:
        self.lags.append(time.monotonic() - asked)
        self._slots.release()

    def done(self) -> None:
        """Forget the work finished so far; raises the first error it raised."""
        finished = [f for f in self._futures if f.done()]
        self._futures = [f for f in self._futures if not f.done()]
        for future in finished:
            future.result()

    def drain(self) -> None:
        """Wait for all submitted work; raises the first error it raised, after all of it ended."""
        futures, self._futures = self._futures, []
        errors = [e for e in (f.exception() for f in futures) if e is not None]  # waits for each
        if errors:
            raise errors[0]

    def shutdown(self) -> None:
        """Stop the thread; work still waiting is dropped (callers drain first)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class TrackingBuffer:
    """The driver's MLflow writes, made while the server answers and queued on disk while it does not; with
    ``background``, on a writer thread. Plain data (Tune pickles the callback that owns it); the client is lazy."""

    def __init__(
        self, path: Path | None, uri: str, client: Callable[[], Any] | None = None, background: bool = False
    ) -> None:
        self.path = path  # None: no buffer, an outage raises as any error
        self._writer = SerialWriter() if background else None
        self._flush_queued = False
        self.uri = uri
        self._client_factory = client
        self._client: Any = None
        self._pending: int | None = None  # entries in the file, counted once, then kept
        self.down = False  # a write or read failed for an outage and no probe has answered since
        self._next_probe = 0.0
        self._resolved: dict[str, str] | None = None
        # Run id -> artifact root of the runs this object made whose checkpoint is not uploaded yet (the upload needs
        # no read of the run); not pickled into Tune's snapshots.
        self.artifact_roots: dict[str, str] = {}
        self.appended = 0  # writes this object queued in the file (the load benchmark reports them)
        # How far the writer thread runs behind the trials' reports: per write made there, seconds from its queueing to
        # its end (benchmarks.sweep_concurrency reads it; a measurement, logged nowhere)
        self.write_lags_s: list[float] = self._writer.lags if self._writer is not None else []
        if background:  # counted and read before the writer thread can change the files
            _ = self.pending, self.resolved

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_client_factory": None, "_writer": None, "artifact_roots": {}}

    @property
    def client(self) -> Any:
        if self._client is None:
            factory = self._client_factory or (lambda: mlflow_client(self.uri, short_budget=True))
            self._client = factory()
        return self._client

    @property
    def pending(self) -> int:
        """Writes waiting in the file."""
        if self._pending is None:
            self._pending = len(self.entries())
        return self._pending

    @property
    def resolved(self) -> dict[str, str]:
        """Placeholder run id -> the run created for it when the buffer was replayed (kept in ``RUNS_FILE``, so a
        restored sweep's callback maps the ids Tune saved)."""
        if self._resolved is None:
            runs = self.path.with_name(RUNS_FILE) if self.path else None
            self._resolved = json.loads(runs.read_text()) if runs and runs.is_file() else {}
        return self._resolved

    def run_id(self, run_id: str) -> str:
        """The real id of ``run_id`` (itself unless it is a placeholder that has been created since)."""
        return self.resolved.get(run_id, run_id)

    # The writer thread

    def serially(self, work: Callable[[], Any]) -> None:
        """Run ``work`` after every write queued before it: on the writer thread when there is one (the caller does
        not wait), else now."""
        if self._writer is None or self._writer.is_current():
            work()
        else:
            self._writer.submit(work)

    def settle(self) -> None:
        """Between Tune's steps: raise the first error a write on the writer thread raised (a refused request, a bug),
        in the driver; and while the server is down, queue a replay (it probes at most every ``RETRY_EVERY_S``)."""
        if self._writer is not None:
            self._writer.done()
        if (self.down or self.pending) and not self._flush_queued:
            self._flush_queued = self._writer is not None
            self.serially(self.flush)

    def wait(self) -> None:
        """Wait for the writes queued so far (before a read of the store, which is behind them); raises the first
        error one of them raised."""
        if self._writer is not None and not self._writer.is_current():
            self._writer.drain()

    def stop_writer(self, raise_errors: bool = True) -> None:
        """Wait for the queued writes; later ones are made in the caller's thread (the wrap-up reads what it wrote). An
        error one raised is raised, or logged with ``raise_errors`` false (runs being closed anyway)."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            writer.drain()
        except Exception as err:
            if raise_errors:
                raise
            log.error("MLflow: a queued write failed: %s", err)
        finally:
            writer.shutdown()

    # The writes the driver makes, each one entry of the buffer.
    def create_run(self, placeholder: str, experiment_id: str, run_name: str, tags: dict[str, str]) -> str:
        """A new run, made as any write: ``placeholder`` stands for it in the writes queued behind it. Its id: the run's
        own when made now (no writer thread), else the placeholder (``run_id`` maps it once the run exists)."""
        entry = {"op": "create_run", "run_id": placeholder, "experiment_id": experiment_id, "run_name": run_name}
        self.write({**entry, "tags": tags})
        return self.run_id(placeholder)

    def log_batch(
        self, run_id: str, metrics: Sequence[Metric] = (), params: Sequence[Param] = (), tags: Sequence[RunTag] = ()
    ) -> None:
        self.write(
            {
                "op": "log_batch",
                "run_id": run_id,
                "metrics": [[m.key, m.value, m.timestamp, m.step] for m in metrics],
                "params": [[p.key, p.value] for p in params],
                "tags": [[t.key, t.value] for t in tags],
            }
        )

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        self.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def update_run(self, run_id: str, status: str) -> None:
        self.write({"op": "update_run", "run_id": run_id, "status": status})

    def set_terminated(self, run_id: str, status: str) -> None:
        self.write({"op": "set_terminated", "run_id": run_id, "status": status})

    def log_dict(self, run_id: str, payload: Any, name: str) -> None:
        self.write({"op": "log_dict", "run_id": run_id, "payload": payload, "name": name})

    def log_metrics(self, run_id: str, metrics: dict[str, float]) -> None:
        """Each metric once, at step 0 (a run's summary figures)."""
        now = int(time.time() * 1000)
        self.log_batch(run_id, metrics=[Metric(key, value, now, 0) for key, value in metrics.items()])

    def log_artifact(self, run_id: str, path: Path, folder: str) -> None:
        self.write({"op": "log_artifact", "run_id": run_id, "path": str(path), "folder": folder})

    def log_table(self, run_id: str, frame: pd.DataFrame, artifact_file: str) -> None:
        """``frame`` as a table the MLflow UI shows (``log_table``); kept as JSON while it waits."""
        self.write({"op": "log_table", "run_id": run_id, "table": frame.to_dict(orient="split"), "file": artifact_file})

    def upload_checkpoint(
        self, run_id: str, checkpoint: StoragePath, trial_dir: StoragePath, dataset: PreparedDataset | None
    ) -> None:
        """The trial's checkpoint folder as the run's ``checkpoint/`` artifact and its dataset as its input
        (``log_checkpoint``): the trial's newest checkpoint that loads when the write is applied (Tune may have deleted
        ``checkpoint``)."""
        dataset_fields = asdict(dataset) if dataset else None
        entry = {"op": "upload_checkpoint", "run_id": run_id, "checkpoint": str(checkpoint), "dataset": dataset_fields}
        self.write({**entry, "trial_dir": str(trial_dir)})

    def write(self, entry: dict[str, Any]) -> None:
        """Apply ``entry`` (on the writer thread, when there is one), or queue it behind earlier ones while the server
        is down (or was, and a probe has not answered since)."""
        self.serially(lambda: self._write(entry))

    def _write(self, entry: dict[str, Any]) -> None:
        if self.path is not None and (self.down or self.pending):
            self._append(entry)
            self.flush()
            return
        try:
            self._apply(entry)
        except Exception as err:
            if not is_outage(err) or self.path is None:
                raise
            self.went_down(err)
            self._append({**entry, "attempted": True})

    def went_down(self, err: BaseException) -> None:
        if not self.down:
            log.warning(
                "MLflow: the tracking server at %s does not answer (%s); training goes on, writes are "
                "buffered in %s and retried every %.0f s",
                self.uri,
                _first_line(err),
                self.path,
                RETRY_EVERY_S,
            )
        self.down = True
        self._next_probe = time.monotonic() + RETRY_EVERY_S

    def flush(self, *, force: bool = False) -> bool:
        """Replay the buffered writes in order if the server answers a probe (at most every ``RETRY_EVERY_S`` unless
        ``force``); True when nothing is left waiting."""
        self._flush_queued = False
        self.wait()
        if not self.down and not self.pending:
            return True
        now = time.monotonic()
        if not force and now < self._next_probe:
            return False
        self._next_probe = now + RETRY_EVERY_S
        if not server_answers(self.uri):
            self.down = True
            return False
        self.down = False
        entries = self.entries()
        for done, entry in enumerate(entries):
            try:
                self._apply(entry)
            except Exception as err:
                if not is_outage(err):  # refused (the run was deleted meanwhile...): it can never succeed
                    log.warning(
                        "MLflow: dropping buffered %s of run %s, refused by the server: %s",
                        entry["op"],
                        entry.get("run_id"),
                        _first_line(err),
                    )
                    continue
                self._rewrite([{**entry, "attempted": True}, *entries[done + 1 :]])
                self.went_down(err)
                return False
        self._rewrite([])
        if entries:
            log.info(
                "MLflow: the tracking server at %s answers again; %d buffered write(s) flushed", self.uri, len(entries)
            )
        return True

    def wait_flushed(self, seconds: float) -> bool:
        """Flush, waiting up to ``seconds`` for the server to answer (the end of a sweep: a short outage is over
        before the stage gives up)."""
        deadline = time.monotonic() + seconds
        while not self.flush(force=True):
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(PROBE_TIMEOUT_S * 2, max(0.0, deadline - time.monotonic())))
        return True

    def _apply(self, entry: dict[str, Any]) -> None:
        op, run_id = entry["op"], self.run_id(entry["run_id"])
        if op == "create_run":
            if run_id == entry["run_id"]:  # not created yet (a replay cut short after it keeps the mapping)
                run = self.client.create_run(entry["experiment_id"], run_name=entry["run_name"], tags=entry["tags"])
                self.artifact_roots[run.info.run_id] = run.info.artifact_uri
                self._resolve(run_id, run.info.run_id)
                trial = run_id.removeprefix(PLACEHOLDER)
                log.info("MLflow: trial %s -> run %s (%s)", trial, run.info.run_id, entry["run_name"])
        elif op == "log_batch":
            metrics = [Metric(*m) for m in entry["metrics"]]
            if entry.get("attempted") and metrics:  # sent once already: a timeout may hide that the server got it
                logged = {
                    (m.key, m.step)
                    for key in {m.key for m in metrics}
                    for m in self.client.get_metric_history(run_id, key)
                }
                metrics = [m for m in metrics if (m.key, m.step) not in logged]
            self.client.log_batch(
                run_id,
                metrics=metrics,
                params=[Param(*p) for p in entry["params"]],
                tags=[RunTag(*t) for t in entry["tags"]],
            )
        elif op == "update_run":
            self.client.update_run(run_id, status=entry["status"])
        elif op == "set_terminated":
            self.client.set_terminated(run_id, status=entry["status"])
        elif op == "log_dict":
            self.client.log_dict(run_id, entry["payload"], entry["name"])
        elif op == "upload_checkpoint":
            self._upload_checkpoint(run_id, entry)
        elif op == "log_artifact":
            self.client.log_artifact(run_id, entry["path"], artifact_path=entry["folder"])
        elif op == "log_table":
            self.client.log_table(run_id, data=pd.DataFrame(**entry["table"]), artifact_file=entry["file"])
        else:
            raise ValueError(f"{self.path}: unknown buffered write {op!r}")

    def _upload_checkpoint(self, run_id: str, entry: dict[str, Any]) -> None:
        dataset = PreparedDataset(**entry["dataset"]) if entry["dataset"] else None
        checkpoint = newest_loading_checkpoint(StoragePath(entry["checkpoint"]), StoragePath(entry["trial_dir"]))
        if checkpoint is None:
            log.warning("MLflow: run %s gets no checkpoint: no checkpoint in %s loads", run_id, entry["trial_dir"])
            return
        with checkpoint.as_local() as copy:
            root = self.artifact_roots.pop(run_id, None)
            log_checkpoint(self.client, run_id, copy, dataset, location=str(checkpoint), artifact_root=root)

    def _resolve(self, placeholder: str, run_id: str) -> None:
        """Kept on disk beside the buffer: Tune's saved state may name the placeholder (it was saved before the run
        was made), and a restored sweep maps it through this file. Without a buffer file, in memory only."""
        self.resolved[placeholder] = run_id
        if self.path is not None:
            write_text_atomic(self.path.with_name(RUNS_FILE), json.dumps(self.resolved))

    def knows(self, run_id: str) -> bool:
        """Whether ``run_id`` names a run: a real id, a placeholder made since, or one still queued in the file. A
        placeholder it does not know was never made (queued on the writer thread of a driver that was killed)."""
        if not run_id.startswith(PLACEHOLDER) or run_id in self.resolved:
            return True
        return any(e["op"] == "create_run" and e["run_id"] == run_id for e in self.entries())

    def entries(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.is_file():
            return []
        lines = [line for line in self.path.read_text().splitlines() if line.strip()]
        entries = []
        for number, line in enumerate(lines, start=1):
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                if number < len(lines):
                    raise ValueError(f"{self.path}: line {number} is not JSON; the buffer was edited?") from None
                log.warning(
                    "MLflow: %s ends in a half-written line (the driver died writing it); it is dropped", self.path
                )
        return entries

    def _append(self, entry: dict[str, Any]) -> None:
        assert self.path is not None, "an outage without a buffer file raises before this"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as file:
            file.write(json.dumps({**entry, "uri": self.uri}) + "\n")
            file.flush()
            os.fsync(file.fileno())
        self.appended += 1
        self._pending = self.pending + 1 if self._pending is not None else len(self.entries())

    def _rewrite(self, entries: list[dict[str, Any]]) -> None:
        """What is left after a replay, replacing the file at once (a crash mid-replay keeps the file as it was)."""
        assert self.path is not None, "nothing is replayed without a buffer file"
        self._pending = len(entries)
        if not entries:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as file:
            file.writelines(json.dumps({**entry, "run_id": self.run_id(entry["run_id"])}) + "\n" for entry in entries)
            file.flush()
            os.fsync(file.fileno())
        tmp.replace(self.path)


def park_buffer(buffer_file: Path, experiment: StoragePath) -> None:
    """With a bucket as storage, a stage that ends with writes still buffered leaves a copy of its buffer (and run
    map) beside its experiment in the bucket: the driver's disk may not outlive it (a Ray job's temporary folder),
    and the next run, on any machine, takes it back (``flush_buffers``)."""
    for name in (BUFFER_FILE, RUNS_FILE):
        local = buffer_file.with_name(name)
        if local.is_file():
            (experiment / name).write_text(local.read_text())


def flush_buffers(storage: StoragePath, local_root: Path) -> None:
    """Before a stage plans anything (reuse and restore read the runs): replay what earlier runs buffered under
    ``local_root``, first taking back the buffers parked in a bucket (``park_buffer``); a server still down warns."""
    if storage.remote:
        for experiment in storage.subdirs():
            if not (experiment / BUFFER_FILE).is_file():
                continue
            for name in (BUFFER_FILE, RUNS_FILE):  # this disk's copy, when it has one, is the same or newer
                parked, local = experiment / name, local_root / experiment.name / name
                if parked.is_file() and not local.is_file():
                    write_text_atomic(local, parked.read_text())
                parked.delete()
            log.info("MLflow: took back the writes a run left buffered in %s", experiment)
    for path in sorted(local_root.glob(f"*/{BUFFER_FILE}")):
        entries = TrackingBuffer(path, "").entries()
        buffer = TrackingBuffer(path, entries[0]["uri"] if entries else "")
        if entries and not buffer.flush(force=True):
            log.warning(
                "MLflow: %d write(s) for %s stay buffered in %s (the server does not answer); the next run tries again",
                buffer.pending,
                buffer.uri,
                path,
            )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__
