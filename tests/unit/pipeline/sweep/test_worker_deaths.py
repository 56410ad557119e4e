"""A trial task that fails because its worker was killed (Ray's memory monitor: ``OutOfMemoryError``) is the actor's
death to Tune's actor manager, as a SIGKILL is: one failed attempt of the trial, not "Caught unexpected exception"."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ray.air.execution import FixedResourceManager, ResourceRequest
from ray.air.execution._internal.actor_manager import RayActorManager
from ray.air.execution._internal.tracked_actor import TrackedActor
from ray.air.execution._internal.tracked_actor_task import TrackedActorTask
from ray.exceptions import OutOfMemoryError, RayActorError, RayTaskError

from pipeline.sweep.worker_deaths import LOST, as_actor_death, count_worker_deaths_as_failures

OOM = "1 worker(s) were killed due to the node running low on memory."


@pytest.fixture(scope="module", autouse=True)
def _small_ray() -> Iterator[None]:
    """Ray's ``FixedResourceManager`` reads the runtime context, which starts a local Ray when none is connected (with
    its dashboard, on the machine's address) and leaves it running: a later test's ``ray.init`` (the integration
    tests' session Ray) then fails. So one small Ray on 127.0.0.1 for this module when none runs, shut down after it."""
    import ray

    if ray.is_initialized():
        yield
        return
    ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _live_actor_task(events: list) -> tuple[RayActorManager, TrackedActorTask]:
    """Ray's own actor manager with one live actor (holding its CPU) and a task of it in flight."""
    resources = FixedResourceManager({"CPU": 1})
    manager = RayActorManager(resources)
    request = ResourceRequest([{"CPU": 1}])
    resources.request_resources(request)
    actor = TrackedActor(1, on_error=lambda _actor, error: events.append(("actor", error)))
    manager._live_actors_to_ray_actors_resources[actor] = (None, resources.acquire_resources(request))
    return manager, TrackedActorTask(actor, on_error=lambda _actor, error: events.append(("task", error)))


def test_ray_alone_ends_the_experiment_on_a_memory_monitor_kill() -> None:
    """What the patch is for (Ray Tune 2.60): when Ray handles it itself, this test fails and the patch can go."""
    unpatched = getattr(RayActorManager._actor_task_failed, "__wrapped__", RayActorManager._actor_task_failed)
    manager, task = _live_actor_task([])
    with pytest.raises(RuntimeError, match="Caught unexpected exception"):
        unpatched(manager, task, OutOfMemoryError(OOM))


def test_a_memory_monitor_kill_is_the_actors_death() -> None:
    count_worker_deaths_as_failures()
    count_worker_deaths_as_failures()  # once is enough: a second call does not wrap it twice
    assert not hasattr(RayActorManager._actor_task_failed.__wrapped__, "__wrapped__")
    events: list = []
    manager, task = _live_actor_task(events)
    manager._actor_task_failed(task, OutOfMemoryError(OOM))
    assert [who for who, _ in events] == ["actor", "task"]  # Tune: clean the actor up, count the trial's failure
    for _, error in events:
        assert isinstance(error, RayActorError) and str(error).startswith(f"{LOST} (OutOfMemoryError): {OOM}")
    assert manager.live_actors == []  # its CPU is back


def test_other_errors_pass_unchanged() -> None:
    died, raised = RayActorError(error_msg="died"), RayTaskError("train", "Traceback ...", ValueError("x"))
    assert as_actor_death(died) is died and as_actor_death(raised) is raised
    assert as_actor_death(KeyError("x")).__class__ is KeyError


def test_a_death_after_a_drain_checkpoint_and_a_sigterm_is_a_preemption(tmp_path) -> None:
    """Ray 2.60's SIGTERM handler drains the node, then stops its raylet: the trial's death reads "received SIGTERM"
    and is not ``preempted``. With the trial's drain marker newer than its last report it counts no failure; without
    the marker, with an older one or another death it counts as before."""
    import time

    import pyarrow.fs as pafs

    from pipeline.sweep.worker_deaths import SIGTERMED, drained_then_stopped
    from pipeline.trial.preemption import DRAIN_MARKER

    fs, trial = pafs.LocalFileSystem(), str(tmp_path)
    stopped = RayActorError(error_msg=f"The actor died because its node has died; terminated expectedly: {SIGTERMED}")
    before = time.time() - 5
    assert not drained_then_stopped(stopped, fs, trial, before)  # no drain checkpoint: a plain SIGTERM
    (tmp_path / DRAIN_MARKER).write_text("{}")
    assert drained_then_stopped(stopped, fs, trial, before)
    assert not drained_then_stopped(stopped, fs, trial, time.time() + 5)  # reported since: the marker is stale
    assert not drained_then_stopped(RayActorError(error_msg="died"), fs, trial, before)  # a crash, a SIGKILL


def test_the_drain_patch_wraps_trial_once() -> None:
    from ray.tune.experiment.trial import Trial

    from pipeline.sweep.worker_deaths import count_drained_sigterm_as_preemption

    count_drained_sigterm_as_preemption()
    count_drained_sigterm_as_preemption()
    assert Trial._handle_ray_actor_error.drain_aware
    assert not hasattr(Trial._handle_ray_actor_error.__wrapped__, "__wrapped__")


@pytest.mark.parametrize("patched", [False, True])
def test_a_reused_actor_that_dies_as_it_resets_costs_the_next_trial_one_attempt(tmp_path, monkeypatch, patched) -> None:
    """Two trials, one at a time, the second on the first's actor (actor reuse, as the sweep runs), unlimited retries;
    the worker dies while it resets for the second trial (its node lost at that moment: how the chaos test's trial
    failed). Ray Tune 2.60 alone hears that death twice and ends the second trial as failed after 0 iterations
    (``patched`` False: when this fails, Tune handles it itself and the patch can go); with
    ``count_a_reset_death_once`` the second trial is retried once and finishes."""
    import os

    from ray import tune
    from ray.tune.execution.tune_controller import TuneController

    from pipeline.sweep.worker_deaths import count_a_reset_death_once

    count_a_reset_death_once()
    count_a_reset_death_once()  # once is enough
    assert not hasattr(TuneController._process_trial_failure.__wrapped__, "__wrapped__")
    if not patched:
        monkeypatch.setattr(TuneController, "_process_trial_failure", TuneController._process_trial_failure.__wrapped__)
    marker = tmp_path / "died"

    class TwoSteps(tune.Trainable):  # local: Ray pickles it by value for its workers
        def setup(self, config: dict) -> None:
            self.steps = 0

        def step(self) -> dict:
            self.steps += 1
            return {"steps": self.steps, "done": self.steps >= 2}

        def reset_config(self, new_config: dict) -> bool:
            if not os.path.exists(new_config["marker"]):
                open(new_config["marker"], "w").close()
                os._exit(1)  # the worker dies while it resets for the next trial
            return True

        def save_checkpoint(self, checkpoint_dir: str) -> None:  # nothing to keep: Tune asks at each trial's end
            return None

        def load_checkpoint(self, checkpoint: object) -> None:
            pass

    tuner = tune.Tuner(
        tune.with_resources(TwoSteps, {"cpu": 1}),
        param_space={"marker": str(marker), "trial": tune.grid_search([1, 2])},
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=1),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "ray"), failure_config=tune.FailureConfig(max_failures=-1), verbose=0
        ),
    )
    grid = tuner.fit()
    assert marker.exists()  # the reset did die
    outcome = sorted(
        (r.error is None, r.metrics.get("steps")) for r in grid
    )  # a reused trial's config reads as the first's
    assert outcome == ([(True, 2), (True, 2)] if patched else [(False, None), (True, 2)])
