"""A trial whose Ray worker dies at any moment of its life costs that trial one attempt, never the sweep.

Ray Tune 2.60's actor manager (``RayActorManager._actor_task_failed``) retries a trial whose task failed with
``RayActorError`` (the worker died) or ``RayTaskError`` (the trainable raised); any other error ends the whole
experiment ("Caught unexpected exception"). Ray's memory monitor is the common case: the worker it kills fails its task
with ``OutOfMemoryError``, neither kind. ``count_worker_deaths_as_failures`` makes the manager treat such an error as
the actor's death, which it is: one failed attempt, retried from the checkpoint or failed when ``max_failures`` are
spent; the original error stays in the message. Applied once per driver process; it never changes a result.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from ray.exceptions import RayActorError, RayError, RayTaskError

log = logging.getLogger(__name__)

LOST = "the trial's Ray worker was lost"


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
