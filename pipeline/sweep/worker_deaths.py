"""A trial whose Ray worker dies at any moment of its life costs that trial one attempt, never the sweep.

Ray Tune 2.60's actor manager (``RayActorManager._actor_task_failed``) retries a trial whose task failed with
``RayActorError`` (the worker died) or ``RayTaskError`` (the trainable raised); any other error ends the whole
experiment ("Caught unexpected exception"). Ray's memory monitor is the common case: the worker it kills fails its task
with ``OutOfMemoryError``, neither kind. ``count_worker_deaths_as_failures`` makes the manager treat such an error as
the actor's death, which it is: one failed attempt, retried from the checkpoint or failed when ``max_failures`` are
spent; the original error stays in the message. Applied once per driver process; it never changes a result.

``count_drained_sigterm_as_preemption`` covers the other side: a node whose ``ray start --block`` gets SIGTERM
(Kubernetes deleting its pod) is drained for preemption by Ray's own handler, and its trials write their drain
checkpoints, but Ray 2.60 then stops the raylet with SIGTERM and reports the trials' deaths as an expected
termination ("received SIGTERM"), not ``preempted``, so Tune would count a failure for a death that lost no
training. A trial whose worker died that way after it wrote a drain checkpoint (newer than its last report) is not
counted, as a preempted one is not.

``count_a_reset_death_once`` covers actor reuse: a trial that takes over a finished trial's actor waits (pending)
while the actor resets for it. If the worker dies then (its node lost at that moment), Tune 2.60 hears the death
twice, from the actor (it retries the trial, pending again) and from the ``reset`` task; the second ends the pending
trial as failed whatever ``max_failures`` (seen in the chaos test: a trial failed after 0 iterations with unlimited
retries). The second hearing is dropped: one death, one attempt.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from ray.exceptions import RayActorError, RayError, RayTaskError

log = logging.getLogger(__name__)

LOST = "the trial's Ray worker was lost"
SIGTERMED = "received SIGTERM"  # in the death of an actor whose node's raylet was stopped by SIGTERM (Ray 2.60)


def as_actor_death(exception: BaseException) -> BaseException:
    """The error an actor task failed with, as Tune's actor manager must see it: a ``RayError`` of neither kind
    (``OutOfMemoryError``, ``NodeDiedError``...) is the worker's death; anything else as it is."""
    if isinstance(exception, RayError) and not isinstance(exception, (RayActorError, RayTaskError)):
        return RayActorError(error_msg=f"{LOST} ({type(exception).__name__}): {exception}")
    return exception


def count_worker_deaths_as_failures() -> None:
    """Patch Ray Tune's actor manager (once) so a trial task's ``OutOfMemoryError`` and the like count as the trial's
    failed attempt (the module docstring)."""
    from ray.air.execution._internal.actor_manager import RayActorManager

    original = RayActorManager._actor_task_failed
    if getattr(original, "counts_worker_deaths", False):
        return

    @functools.wraps(original)
    def _actor_task_failed(self: RayActorManager, tracked_actor_task: Any, exception: Exception) -> None:
        return original(self, tracked_actor_task, as_actor_death(exception))

    _actor_task_failed.counts_worker_deaths = True  # type: ignore[attr-defined]
    RayActorManager._actor_task_failed = _actor_task_failed


def drained_then_stopped(error: RayActorError, fs: Any, trial_fs_path: str, last_report: float) -> bool:
    """Whether the actor died with its node stopped by SIGTERM after the trial wrote a drain checkpoint: the drain
    marker in its storage folder ``trial_fs_path`` (on ``fs``) is newer than its last report (``time.time()``)."""
    import pyarrow.fs as pafs

    from pipeline.trial.preemption import DRAIN_MARKER

    if error.preempted or SIGTERMED not in str(error):
        return False
    try:
        info = fs.get_file_info(f"{trial_fs_path}/{DRAIN_MARKER}")
    except OSError:
        return False
    return info.type == pafs.FileType.File and info.mtime is not None and info.mtime.timestamp() >= last_report


def count_drained_sigterm_as_preemption() -> None:
    """Patch Ray Tune's ``Trial`` (once) so a death ``drained_then_stopped`` counts as no failure (module docstring)."""
    from ray.tune.experiment.trial import Trial

    original = Trial._handle_ray_actor_error
    if getattr(original, "drain_aware", False):
        return

    @functools.wraps(original)
    def _handle_ray_actor_error(self: Trial, exc: RayActorError) -> None:
        last_report = float((self.last_result or {}).get("timestamp", 0))
        if drained_then_stopped(exc, self.storage.storage_filesystem, self.storage.trial_fs_path, last_report):
            log.info("%s: its node was drained, then stopped by SIGTERM: a preemption, not a failure", self)
            return
        original(self, exc)

    _handle_ray_actor_error.drain_aware = True  # type: ignore[attr-defined]
    Trial._handle_ray_actor_error = _handle_ray_actor_error


def count_a_reset_death_once() -> None:
    """Patch Tune's controller (once) so a reused actor that dies while it resets for a pending trial costs that trial
    one attempt (the module docstring). The dropped second hearing also takes the trial out of Tune's resetting
    trials: otherwise its retry would wait for that reset's end and never get an actor."""
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment.trial import Trial

    original = TuneController._process_trial_failure
    if getattr(original, "counts_a_reset_death_once", False):
        return

    @functools.wraps(original)
    def _process_trial_failure(self: TuneController, trial: Trial, exception: Exception) -> None:
        if trial.status == Trial.PENDING and isinstance(exception, RayActorError):  # its actor already retried it
            self._resetting_trials.discard(trial)
            log.debug("trial %s: the death its retry came from, heard again from a task: not counted twice", trial)
            return None
        return original(self, trial, exception)

    _process_trial_failure.counts_a_reset_death_once = True  # type: ignore[attr-defined]
    TuneController._process_trial_failure = _process_trial_failure
