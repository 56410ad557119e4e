"""A trial's end-of-run MLflow work (checkpoint upload, final model, run closed) on one background thread.

Why: the driver's Tune callback runs on Tune's event loop. At paper size a trial's end reads a 92 MiB checkpoint,
uploads it, rebuilds the model and logs it: seconds per trial during which Tune starts no trial and handles no
report. Handed to this worker, the callback returns at once and the next trial starts while the model is logged.

- one thread: MLflow's fluent API (``log_model``) is used with the process's global tracking URI, and one writer at a
  time keeps a local sqlite store free of lock contention;
- bounded: at most ``max_pending`` trial ends wait or run; one more blocks the callback until a slot frees, so a
  slow store slows the sweep instead of piling up work (and memory) without limit;
- drained before the sweep's results are read (``drain``, from the callback's ``on_experiment_end``, and before
  runs are closed as interrupted); an error the work raised is raised there, in the driver, not lost in a thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

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
