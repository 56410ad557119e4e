"""A trial whose Ray worker dies at any moment of its life costs that trial one attempt, never the sweep.

Ray Tune 2.60's actor manager (``ray.air.execution._internal.actor_manager.RayActorManager._actor_task_failed``)
knows two ways a trial's task can fail: ``RayActorError`` (the worker died: the trial is retried, ``FailureConfig``)
and ``RayTaskError`` (the trainable raised). Any other error ends the whole experiment with
``RuntimeError: Caught unexpected exception``. Ray's memory monitor is the common case: the worker it kills fails the
task it was running (``train``, ``save``, ``restore``, ``reset``) with ``OutOfMemoryError``, a ``RayError`` of neither
kind. (Its report names the worker's lease, ``ImplicitFunc.__init__``, whatever the worker was doing; a kill while the
actor is still being constructed fails its ``__ray_ready__`` instead, which Tune already counts as a failed attempt.)

``count_worker_deaths_as_failures`` makes the manager treat such an error as the actor's death, which it is: Tune then
cleans the actor up, counts one failure of the trial and retries it from its checkpoint, or marks it failed when its
``max_failures`` are spent, as for any other failure. The original error stays in the message (the trial's
``error.txt``, the stage's summary). Applied once per driver process, before the Tuner runs; it changes how a failure
is handled, never a result.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from ray.exceptions import RayActorError, RayError, RayTaskError

log = logging.getLogger(__name__)

LOST = "the trial's Ray worker was lost"


def as_actor_death(exception: BaseException) -> BaseException:
    """The error an actor task failed with, as Tune's actor manager must see it: a ``RayError`` that says neither
    that the actor died nor that the trainable raised (``OutOfMemoryError``, ``NodeDiedError``, ``ObjectLostError``...)
    is the worker's death; anything else is returned as it is."""
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
