"""The driver-side callback on a real sqlite store: how a trial ended (read back from its run, the label the callback
set), epochs logged once across restores and later sweeps, checkpoints uploaded only when they load, retries, nodes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from pipeline.sweep.manifest import INTERRUPTED
from pipeline.sweep.tracking.callback import MlflowTrialCallback, TrialInfo, trial_outcome
from pipeline.sweep.tracking.epochs import EPOCH_METRICS
from pipeline.sweep.tracking.parent import ParentRun
from pipeline.sweep.tracking.store import ensure_experiment
from pipeline.sweep.tracking.tags import NODES_TAG
from pipeline.trial.report import INITIAL_PREFIX, WHERE_KEY, locality_key

LOCALITY = locality_key(1, "mean_distance")  # one of a self-attention trial's per-epoch locality metrics


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> tuple[MlflowClient, str]:
    store = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    mlflow = MlflowClient(f"sqlite:///{store}")
    return mlflow, ensure_experiment(mlflow, "outcomes", Path(store.parent, "artifacts").as_uri())


@pytest.mark.parametrize(
    ("run_status", "label", "outcome"),
    [
        ("FINISHED", "finished", "finished"),
        ("FINISHED", "early_stopped", "early_stopped"),
        ("FAILED", "error", "error"),
        ("RUNNING", "running", "interrupted"),  # Tune never ended it: Ctrl-C, SIGTERM
        ("RUNNING", "finished", "interrupted"),  # tagged, but the driver died before closing it
        ("KILLED", "interrupted", "interrupted"),  # closed by close_interrupted
        ("FINISHED", None, "interrupted"),  # no label: not ended by the callback
    ],
)
def test_trial_outcome_is_the_callbacks_label(client, run_status: str, label: str | None, outcome: str) -> None:
    mlflow, experiment_id = client
    run = mlflow.create_run(experiment_id, tags={"tune.status": label} if label else {})
    if run_status != "RUNNING":
        mlflow.set_terminated(run.info.run_id, status=run_status)
    assert trial_outcome(mlflow.get_run(run.info.run_id)) == outcome


def test_a_trial_without_a_run_was_interrupted() -> None:
    assert trial_outcome(None) == INTERRUPTED


class _Trial:
    """The attributes of a Tune trial the callback reads."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id, self.config, self.checkpoint, self.num_failures = trial_id, {"variant": "x"}, None, 0
        self.path = f"/ray/experiment/{trial_id}"

    def __str__(self) -> str:
        return f"trial_{self.trial_id}"


def _describe(config: dict) -> TrialInfo:
    return TrialInfo(f"{config['variant']}-run", {"variant": config["variant"]}, {})


def _report(callback: MlflowTrialCallback, trial: _Trial, epoch: int) -> None:
    result = {key: 0.5 for key in EPOCH_METRICS} | {"epoch": epoch, LOCALITY: 1.5 + epoch}
    if epoch == 1:  # a fresh trial's first report carries what was measured before training
        result[INITIAL_PREFIX + LOCALITY] = 1.5
    callback.on_trial_result(iteration=epoch, trials=[trial], trial=trial, result=result)


def test_a_resumed_trial_does_not_log_an_epoch_twice(client, tmp_path: Path) -> None:
    """Tune restores from its last snapshot, which can lag behind the last report (Ctrl-C in between): the epoch
    trained again after the restore is already in the run and must not be logged a second time. The snapshot names
    the run by the placeholder it had before the writer thread made it; the restore maps it through the buffer's
    run file."""
    mlflow, experiment_id = client
    parent = mlflow.create_run(experiment_id).info.run_id
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, parent)
    trial = _Trial("t1")
    first = MlflowTrialCallback(sweep, _describe, {}, epochs=4, buffer_dir=tmp_path)
    first.buffer.serially(lambda: time.sleep(0.5))  # the run is made after Tune saved its state
    first.on_trial_start(iteration=0, trials=[trial], trial=trial)
    for epoch in (1, 2):
        _report(first, trial, epoch)
    snapshot = {"runs": dict(first.runs), "last_epoch": {"t1": 1}}  # Tune saved its state after epoch 1 only
    assert snapshot["runs"] == {"t1": "buffered-t1"}
    first.epoch_writes.send()  # that driver's held and queued writes are made before it ends (close_interrupted)
    first.buffer.stop_writer()

    restored = MlflowTrialCallback(sweep, _describe, {}, epochs=4, buffer_dir=tmp_path)
    restored.set_state(snapshot)
    restored.on_trial_start(iteration=0, trials=[trial], trial=trial)
    for epoch in (2, 3, 4):  # the trial resumes from epoch 1's checkpoint
        _report(restored, trial, epoch)
    restored.on_trial_complete(iteration=4, trials=[trial], trial=trial)
    restored.on_experiment_end(trials=[trial])

    run = mlflow.get_run(first.run_ids()["t1"])
    for key in ("test_acc", LOCALITY):  # the locality metrics a self-attention trial reports go with the others
        steps = [m.step for m in mlflow.get_metric_history(run.info.run_id, key)]
        assert sorted(steps) == ([0] if key == LOCALITY else []) + [1, 2, 3, 4], key  # locality from its init
    assert {m.step: m.value for m in mlflow.get_metric_history(run.info.run_id, LOCALITY)}[0] == 1.5
    assert not [k for k in run.data.metrics if k.startswith(INITIAL_PREFIX)]  # the prefix is the report's only
    assert run.data.tags["tune.status"] == "finished" and run.info.status == "FINISHED"


def test_a_restore_continues_the_run_tunes_saved_state_does_not_name(client) -> None:
    """A full storage (or a killed driver) can stop the sweep after a trial's run was created and before Tune saved
    its state: the restored callback finds the run among the parent's children by its trial id, and continues it
    instead of opening a second run for the trial."""
    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    trial, other = _Trial("unsaved"), _Trial("never-started")
    first = MlflowTrialCallback(sweep, _describe, {}, epochs=2)
    first.on_trial_start(iteration=0, trials=[trial], trial=trial)
    first.buffer.wait()  # the run made
    mlflow.set_terminated(first.run_ids()["unsaved"], "KILLED")  # closed by close_interrupted; Tune saved no state

    restored = MlflowTrialCallback(sweep, _describe, {}, epochs=2)
    assert restored.adopt_child_runs() == 1
    for started in (trial, other):
        restored.on_trial_start(iteration=0, trials=[trial, other], trial=started)
    restored.buffer.wait()
    assert restored.run_ids()["unsaved"] == first.run_ids()["unsaved"]  # continued: one run per trial
    assert restored.run_ids()["never-started"] != first.run_ids()["unsaved"]
    assert mlflow.get_run(first.run_ids()["unsaved"]).info.status == "RUNNING"
    children = mlflow.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{sweep.parent_run_id}'")
    assert len(children) == 2


def test_a_run_a_killed_driver_never_made_is_made_once_by_the_restore(client, tmp_path: Path, caplog) -> None:
    """Tune saved its state naming the trial's run by its placeholder, and the driver was killed before its writer
    thread made the run: the restore drops the placeholder (nothing maps it, no buffered write makes it) and opens
    one run for the trial, instead of writing to a run that does not exist."""
    import threading

    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    trial, gate = _Trial("lost"), threading.Event()
    first = MlflowTrialCallback(sweep, _describe, {}, epochs=2, buffer_dir=tmp_path)
    first.buffer.serially(gate.wait)  # a slow store: the writer is busy
    first.on_trial_start(iteration=0, trials=[trial], trial=trial)
    snapshot = first.get_state()
    first.buffer._writer.shutdown()  # the driver is killed: nothing it queued is made
    gate.set()

    restored = MlflowTrialCallback(sweep, _describe, {}, epochs=2, buffer_dir=tmp_path)
    assert restored.adopt_child_runs() == 0
    restored.set_state(snapshot)
    assert "the run of trial(s) ['lost'] was never made" in caplog.text
    restored.on_trial_start(iteration=0, trials=[trial], trial=trial)
    for epoch in (1, 2):
        _report(restored, trial, epoch)
    restored.on_trial_complete(iteration=2, trials=[trial], trial=trial)
    restored.on_experiment_end(trials=[trial])
    (child,) = mlflow.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{sweep.parent_run_id}'")
    assert child.info.run_id == restored.run_ids()["lost"] and child.info.status == "FINISHED"
    assert [m.step for m in mlflow.get_metric_history(child.info.run_id, "test_acc")] == [1, 2]


def _checkpoint_through(folder: Path, epoch: int) -> Path:
    """A trial's checkpoint folder at ``epoch`` whose metrics history holds epochs 1..``epoch`` (test_acc 0.1 per
    epoch, the locality 1.5 + epoch), epoch 1 with what was measured before training (1.5, logged at step 0)."""
    history = [{"epoch": e, "train_loss": 1.0 / e, "test_acc": 0.1 * e, LOCALITY: 1.5 + e} for e in range(1, epoch + 1)]
    history[0][INITIAL_PREFIX + LOCALITY] = 1.5
    folder.mkdir()
    torch.save({"epoch": epoch, "metrics_history": history}, folder / "checkpoint.pt")
    return folder


def test_a_run_resumed_in_a_later_sweep_gets_the_epochs_its_checkpoint_is_ahead_by(client, tmp_path: Path) -> None:
    """The first sweep stopped after the trial saved epoch 3 but before the driver logged it: the later sweep resumes
    from that checkpoint (epoch 4 on) and logs epoch 3 from the checkpoint's own history, so no epoch is missing."""
    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    first_trial = _Trial("old")
    first = MlflowTrialCallback(sweep, _describe, {}, epochs=4)
    first.on_trial_start(iteration=0, trials=[first_trial], trial=first_trial)
    for epoch in (1, 2):
        _report(first, first_trial, epoch)
    first.buffer.stop_writer()
    run_id = first.run_ids()["old"]
    _checkpoint_through(tmp_path / "checkpoint_000002", 3)

    later = MlflowTrialCallback(ParentRun(mlflow.tracking_uri, experiment_id, "p2"), _describe, {}, 4)
    resumed = _Trial("new")
    resumed.config = {"variant": "x", "resume_run": run_id, "resume_from": str(tmp_path / "checkpoint_000002")}
    later.on_trial_start(iteration=0, trials=[resumed], trial=resumed)
    _report(later, resumed, 4)
    later.on_trial_complete(iteration=1, trials=[resumed], trial=resumed)
    later.on_experiment_end(trials=[resumed])

    assert later.runs == {"new": run_id}  # the same run continued, under the later sweep's trial id
    points = {m.step: m.value for m in mlflow.get_metric_history(run_id, "test_acc")}
    assert sorted(points) == [1, 2, 3, 4] and points[3] == pytest.approx(0.3)
    locality = {m.step: m.value for m in mlflow.get_metric_history(run_id, LOCALITY)}
    assert sorted(locality) == [0, 1, 2, 3, 4] and locality[3] == pytest.approx(4.5)
    run = mlflow.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ray.trial_id"] == "new"
    assert run.data.tags["ray.trial_path"] == "/ray/experiment/new"


@pytest.mark.parametrize("truncated", [False, True])
def test_only_a_checkpoint_that_loads_is_uploaded(client, tmp_path: Path, truncated: bool) -> None:
    from ray import tune

    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    from pipeline.config import ModelConfig
    from pipeline.models import build_model
    from pipeline.trial.checkpoint import save_model_checkpoint

    directory = tmp_path / "checkpoint_000000"
    cfg = ModelConfig(hidden=8, layers=1, ffn=16, heads=4, downsample=2)
    model = build_model(cfg, image_size=8, in_channels=3, num_classes=10)
    save_model_checkpoint(directory, model, cfg, image_shape=(3, 8, 8), num_classes=10)
    if truncated:
        (directory / "checkpoint.pt").write_bytes((directory / "checkpoint.pt").read_bytes()[:100])
    trial = _Trial("t-upload")
    trial.checkpoint = tune.Checkpoint.from_directory(str(directory))
    callback = MlflowTrialCallback(sweep, _describe, {}, epochs=1)
    callback.on_trial_start(iteration=0, trials=[trial], trial=trial)
    _report(callback, trial, 1)
    callback.on_trial_complete(iteration=1, trials=[trial], trial=trial)
    callback.on_experiment_end(trials=[trial])  # as Tune does when fit() ends: the trial ends logging are done
    run = mlflow.get_run(callback.run_ids()["t-upload"])
    uploaded = [a.path for a in mlflow.list_artifacts(run.info.run_id, "checkpoint")]
    assert uploaded == ([] if truncated else ["checkpoint/checkpoint.pt"])
    assert "model_uri" not in run.data.tags  # a trial's end logs no model: the registry logs those it registers
    assert ("tune.checkpoint" in run.data.tags) is not truncated  # the manifest links only an uploaded checkpoint
    assert run.info.status == "FINISHED"


def test_retries_are_a_final_count_not_a_stale_tag(client) -> None:
    """A retried trial is tagged ``retrying`` meanwhile; the count is written once, when Tune ends the trial."""
    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    callback = MlflowTrialCallback(sweep, _describe, {}, epochs=2)
    finished, failed = _Trial("t-retried"), _Trial("t-failed")
    for trial in (finished, failed):
        callback.on_trial_start(iteration=0, trials=[trial], trial=trial)
        _report(callback, trial, 1)
        trial.num_failures = 1
        callback.on_trial_recover(iteration=1, trials=[trial], trial=trial)
    callback.buffer.wait()  # the writes queued on the writer thread so far
    retrying = mlflow.get_run(callback.run_ids()["t-retried"]).data.tags
    assert retrying["tune.status"] == "retrying" and "tune.retries" not in retrying
    _report(callback, finished, 2)
    callback.on_trial_complete(iteration=2, trials=[finished], trial=finished)
    failed.num_failures = 2  # failed again, past max_failures=1
    callback.on_trial_error(iteration=2, trials=[failed], trial=failed)
    callback.on_experiment_end(trials=[finished, failed])
    assert mlflow.get_run(callback.run_ids()["t-retried"]).data.tags["tune.retries"] == "1"
    ended = mlflow.get_run(callback.run_ids()["t-failed"])
    assert ended.data.tags["tune.retries"] == "1" and ended.info.status == "FAILED"
    assert "tune.failure_reason" not in ended.data.tags  # an ordinary error: no reason recorded, retried as usual


def test_every_node_a_trial_ran_on_is_recorded_across_a_restore(client) -> None:
    """A retried trial can move to another node, a restored sweep continues the run: ``ray.node_ids`` lists every
    node in order, once each; ``ray.node_id`` is the last."""
    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    trial = _Trial("t2")

    def report(callback: MlflowTrialCallback, epoch: int, node: str) -> None:
        result = {key: 0.5 for key in EPOCH_METRICS} | {"epoch": epoch, WHERE_KEY: {"ray.node_id": node}}
        callback.on_trial_result(iteration=epoch, trials=[trial], trial=trial, result=result)

    first = MlflowTrialCallback(sweep, _describe, {}, epochs=4)
    first.on_trial_start(iteration=0, trials=[trial], trial=trial)
    report(first, 1, "node-a")
    report(first, 2, "node-b")  # retried on another node
    first.epoch_writes.send()  # as the driver's end sends what it held (close_interrupted)
    first.buffer.stop_writer()
    restored = MlflowTrialCallback(sweep, _describe, {}, epochs=4)
    restored.set_state({"runs": first.run_ids(), "last_epoch": {"t2": 2}})
    restored.on_trial_start(iteration=0, trials=[trial], trial=trial)
    report(restored, 3, "node-a")  # back on the first node after the restore
    report(restored, 4, "node-c")
    restored.epoch_writes.send()
    restored.buffer.wait()
    tags = mlflow.get_run(first.run_ids()["t2"]).data.tags
    assert tags[NODES_TAG] == "node-a,node-b,node-c" and tags["ray.node_id"] == "node-c"


@pytest.mark.parametrize(("send_every_s", "epoch_writes"), [(60.0, 1), (0.0, 3)])
def test_short_epochs_reach_the_run_together_and_long_ones_alone(
    client, monkeypatch: pytest.MonkeyPatch, send_every_s: float, epoch_writes: int
) -> None:
    """Epochs shorter than SEND_EVERY_S are held and go out in one log_batch when the trial ends; an epoch that took
    longer goes out as it ends. Either way the run has every epoch once."""
    from pipeline.sweep.tracking import epochs

    monkeypatch.setattr(epochs, "SEND_EVERY_S", send_every_s)
    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    callback, trial = MlflowTrialCallback(sweep, _describe, {}, epochs=3), _Trial(f"t-send-{send_every_s}")
    callback.on_trial_start(iteration=0, trials=[trial], trial=trial)
    for epoch in (1, 2, 3):
        _report(callback, trial, epoch)
    callback.buffer.wait()
    assert callback.calls["log_batch"] == 1 + (0 if send_every_s else 3)  # the params; the epochs sent so far
    callback.on_trial_complete(iteration=3, trials=[trial], trial=trial)
    callback.on_experiment_end(trials=[trial])
    assert callback.calls["log_batch"] == 1 + epoch_writes + 1  # the params, the epochs, the end's tags
    run_id = callback.run_ids()[trial.trial_id]
    assert [m.step for m in mlflow.get_metric_history(run_id, "test_acc")] == [1, 2, 3]
    assert sorted(m.step for m in mlflow.get_metric_history(run_id, LOCALITY)) == [0, 1, 2, 3]


def test_a_restored_driver_logs_the_epochs_a_killed_one_held_from_the_trials_checkpoint(client, tmp_path: Path) -> None:
    """The driver was killed while it held epochs 1 and 2 (shorter than SEND_EVERY_S) and the trial had saved epoch
    2: the restored driver logs them from the checkpoint's own history, then the epochs the trial trains on."""
    from ray import tune

    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    trial = _Trial("t-held")
    first = MlflowTrialCallback(sweep, _describe, {}, epochs=3)
    first.on_trial_start(iteration=0, trials=[trial], trial=trial)
    for epoch in (1, 2):
        _report(first, trial, epoch)
    first.buffer.wait()  # its run made: Tune's saved state names it
    snapshot = first.get_state()
    first.buffer.stop_writer()  # killed: what it held is lost with it
    run_id = first.run_ids()["t-held"]
    assert mlflow.get_metric_history(run_id, "test_acc") == []
    trial.checkpoint = tune.Checkpoint.from_directory(str(_checkpoint_through(tmp_path / "checkpoint_000001", 2)))

    restored = MlflowTrialCallback(sweep, _describe, {}, epochs=3)
    restored.set_state(snapshot)
    restored.on_trial_start(iteration=0, trials=[trial], trial=trial)
    _report(restored, trial, 3)
    restored.on_trial_complete(iteration=3, trials=[trial], trial=trial)
    restored.on_experiment_end(trials=[trial])
    points = {m.step: m.value for m in mlflow.get_metric_history(run_id, "test_acc")}
    assert sorted(points) == [1, 2, 3] and points[2] == pytest.approx(0.2)
    assert sorted(m.step for m in mlflow.get_metric_history(run_id, LOCALITY)) == [0, 1, 2, 3]


def _checkpointed_trial(tmp_path: Path, trial_id: str) -> _Trial:
    from ray import tune

    from pipeline.config import ModelConfig
    from pipeline.models import build_model
    from pipeline.trial.checkpoint import save_model_checkpoint

    directory = tmp_path / trial_id / "checkpoint_000000"
    cfg = ModelConfig(hidden=8, layers=1, ffn=16, heads=4, downsample=2)
    model = build_model(cfg, image_size=8, in_channels=3, num_classes=10)
    save_model_checkpoint(directory, model, cfg, image_shape=(3, 8, 8), num_classes=10)
    trial = _Trial(trial_id)
    trial.checkpoint = tune.Checkpoint.from_directory(str(directory))
    return trial


def test_a_trials_end_is_logged_off_tunes_event_loop_and_drained_at_the_end(
    client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """on_trial_complete returns while the checkpoint is still being uploaded (Tune starts the next trial meanwhile);
    the run is labelled and closed after its upload, and on_experiment_end waits for it."""
    import threading

    from pipeline.sweep.tracking import trial_end as module

    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    entered, release, real = threading.Event(), threading.Event(), module.log_checkpoint

    def held(*args, **kwargs) -> None:
        entered.set()
        assert release.wait(60), "never released"
        real(*args, **kwargs)

    monkeypatch.setattr(module, "log_checkpoint", held)
    trial = _checkpointed_trial(tmp_path, "t-background")
    callback = MlflowTrialCallback(sweep, _describe, {}, epochs=1)
    callback.on_trial_start(iteration=0, trials=[trial], trial=trial)
    _report(callback, trial, 1)
    callback.on_trial_complete(iteration=1, trials=[trial], trial=trial)  # returns; the writer thread uploads
    assert entered.wait(60)
    run_id = callback.run_ids()["t-background"]
    during = mlflow.get_run(run_id)
    assert during.info.status == "RUNNING" and "tune.checkpoint" not in during.data.tags
    assert during.data.tags["tune.status"] == "running"  # labelled with the checkpoint's tags, in one request
    release.set()
    callback.on_experiment_end(trials=[trial])
    after = mlflow.get_run(run_id)
    assert after.info.status == "FINISHED" and "tune.checkpoint" in after.data.tags
    assert after.data.tags["tune.status"] == "finished" and after.data.tags["tune.last_epoch"] == "1"
    assert [a.path for a in mlflow.list_artifacts(run_id, "checkpoint")] == ["checkpoint/checkpoint.pt"]


def test_a_trials_run_params_and_epochs_are_written_off_tunes_event_loop(client) -> None:
    """With the store slow (the writer thread held), Tune's event loop makes no request: the trial's run, its params
    and epochs queue behind the writes before them and reach the store in order."""
    import threading

    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    callback, trial, release = (
        MlflowTrialCallback(sweep, _describe, {}, epochs=2),
        _Trial("t-queued"),
        threading.Event(),
    )
    callback.buffer.serially(lambda: release.wait(60))  # a slow store: the writer is busy
    callback.on_trial_start(iteration=0, trials=[trial], trial=trial)
    for epoch in (1, 2):
        _report(callback, trial, epoch)
    callback.on_step_end(iteration=2, trials=[trial])
    callback.on_trial_complete(iteration=2, trials=[trial], trial=trial)
    assert dict(callback.calls) == {}  # Tune's loop waited for nothing
    assert callback.run_ids() == {"t-queued": "buffered-t-queued"}  # the run is not made yet
    release.set()
    callback.on_experiment_end(trials=[trial])
    run = mlflow.get_run(callback.run_ids()["t-queued"])
    assert [m.step for m in mlflow.get_metric_history(run.info.run_id, "test_acc")] == [1, 2]
    assert run.data.params == {"variant": "x"} and run.info.status == "FINISHED"
    assert run.data.tags["tune.status"] == "finished"


def test_a_write_the_store_refuses_on_the_writer_thread_is_raised_in_the_driver(client) -> None:
    """Not lost in the thread: a refused write (the run deleted meanwhile) stops the sweep as it did on the loop."""
    from mlflow.exceptions import MlflowException

    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    callback, trial = MlflowTrialCallback(sweep, _describe, {}, epochs=2), _Trial("t-refused")
    callback.on_trial_start(iteration=0, trials=[trial], trial=trial)
    callback.buffer.wait()
    mlflow.delete_run(callback.run_ids()["t-refused"])
    _report(callback, trial, 1)
    with pytest.raises(MlflowException, match="deleted"):
        callback.on_experiment_end(trials=[trial])


def test_a_trials_checkpoint_is_read_once_at_its_end(client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Verified, then uploaded, from one read of checkpoint.pt."""
    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    trial = _checkpointed_trial(tmp_path, "t-read-once")
    callback = MlflowTrialCallback(sweep, _describe, {}, epochs=1)
    callback.on_trial_start(iteration=0, trials=[trial], trial=trial)
    _report(callback, trial, 1)
    reads, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda path, *a, **k: reads.append(str(path)) or load(path, *a, **k))
    callback.on_trial_complete(iteration=1, trials=[trial], trial=trial)
    callback.on_experiment_end(trials=[trial])
    assert [Path(p).name for p in reads if Path(p).name == "checkpoint.pt"] == ["checkpoint.pt"]
    assert "tune.checkpoint" in mlflow.get_run(callback.run_ids()["t-read-once"]).data.tags


def test_a_trial_whose_checkpoint_does_not_load_still_ends_labelled(client, tmp_path: Path) -> None:
    """No checkpoint to log (truncated): the worker still writes how the trial ended before closing its run."""
    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    trial = _checkpointed_trial(tmp_path, "t-truncated")
    saved = tmp_path / "t-truncated" / "checkpoint_000000" / "checkpoint.pt"
    saved.write_bytes(saved.read_bytes()[:100])
    callback = MlflowTrialCallback(sweep, _describe, {}, epochs=2)
    callback.on_trial_start(iteration=0, trials=[trial], trial=trial)
    _report(callback, trial, 1)
    callback.on_trial_complete(iteration=1, trials=[trial], trial=trial)
    callback.on_experiment_end(trials=[trial])
    run = mlflow.get_run(callback.run_ids()["t-truncated"])
    assert run.info.status == "FINISHED" and "tune.checkpoint" not in run.data.tags
    assert run.data.tags["tune.status"] == "early_stopped" and run.data.tags["tune.last_epoch"] == "1"


def test_an_error_at_a_trials_end_is_raised_in_the_driver_when_the_sweep_ends(
    client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.sweep.tracking import trial_end as module

    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)

    def broken(*args, **kwargs) -> None:
        raise RuntimeError("a bug in the checkpoint upload")

    monkeypatch.setattr(module, "log_checkpoint", broken)
    trial = _checkpointed_trial(tmp_path, "t-broken")
    callback = MlflowTrialCallback(sweep, _describe, {}, epochs=1)
    callback.on_trial_start(iteration=0, trials=[trial], trial=trial)
    _report(callback, trial, 1)
    callback.on_trial_complete(iteration=1, trials=[trial], trial=trial)
    with pytest.raises(RuntimeError, match="a bug in the checkpoint upload"):
        callback.on_experiment_end(trials=[trial])


def test_an_outage_during_a_background_trial_end_goes_to_the_buffer_and_is_replayed(
    client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stops answering while the worker uploads: the trial's end is handed back to the driver thread,
    queued in the buffer behind the run's earlier writes, and the replay uploads it and closes the run."""
    import requests

    from pipeline.sweep.tracking import trial_end as module

    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)

    def unreachable(*args, **kwargs) -> None:
        raise requests.exceptions.ConnectionError("connection refused")

    monkeypatch.setattr(module, "log_checkpoint", unreachable)
    trial = _checkpointed_trial(tmp_path, "t-outage")
    trial.path = str(tmp_path / "t-outage")
    saved = tmp_path / "t-outage" / "checkpoint_000000" / "checkpoint.pt"
    torch.save({**torch.load(saved, weights_only=True), "epoch": 1}, saved)  # as a trial's, which the replay reads
    callback = MlflowTrialCallback(sweep, _describe, {}, epochs=1, buffer_dir=tmp_path / "buffer")
    callback.on_trial_start(iteration=0, trials=[trial], trial=trial)
    _report(callback, trial, 1)
    callback.on_trial_complete(iteration=1, trials=[trial], trial=trial)
    callback.on_experiment_end(trials=[trial])
    run_id = callback.run_ids()["t-outage"]
    assert callback.buffer.down and callback.buffer.pending == 3  # how it ended, the upload, then the run's end
    assert mlflow.get_run(run_id).info.status == "RUNNING"
    monkeypatch.undo()  # the server answers again
    assert callback.buffer.flush(force=True)
    run = mlflow.get_run(run_id)
    assert run.info.status == "FINISHED" and "tune.checkpoint" in run.data.tags
    assert run.data.tags["tune.status"] == "finished"
    assert [a.path for a in mlflow.list_artifacts(run_id, "checkpoint")] == ["checkpoint/checkpoint.pt"]


LOST_WORKER = """Failure # 1 (occurred at 2026-11-25_10-40-08)
The actor died unexpectedly before finishing this task.
\tclass_name: ImplicitFunc
"""
RAISED = """Failure # 2 (occurred at 2026-11-25_10-40-18)
ray::ImplicitFunc.train() (pid=1, ip=127.0.0.1, actor_id=a, repr=train_trial)
  File "trainable.py", line 9, in train_trial
pipeline.trial.trainable.InjectedFailure: failing once after epoch 1
"""


def test_lost_attempts_are_summed_up_per_trial_with_the_last_reason(client, tmp_path: Path) -> None:
    """One line per trial that lost attempts, from the error file Tune appends each failure to; a trial whose every
    attempt died before it started has no run, and is still known to have failed for good."""
    mlflow, experiment_id = client
    sweep = ParentRun(mlflow.tracking_uri, experiment_id, mlflow.create_run(experiment_id).info.run_id)
    callback = MlflowTrialCallback(sweep, _describe, {}, epochs=2)
    retried, dead = _Trial("t-retried"), _Trial("t-dead")
    retried.config, dead.config = {"variant": "v", "seed": 1}, {"variant": "v", "seed": 2}
    for trial in (retried, dead):
        trial.error_file = tmp_path / f"{trial.trial_id}.txt"
    callback.on_trial_start(iteration=0, trials=[retried], trial=retried)
    retried.error_file.write_text(LOST_WORKER)
    callback.on_trial_recover(iteration=1, trials=[retried], trial=retried)
    dead.error_file.write_text(LOST_WORKER)
    callback.on_trial_recover(iteration=1, trials=[dead], trial=dead)
    dead.error_file.write_text(LOST_WORKER + RAISED)
    callback.on_trial_error(iteration=2, trials=[dead], trial=dead)  # never started: no run to end
    assert callback.failures.summary() == [
        "v seed 1: 1 failed attempt, retried (last: The actor died unexpectedly before finishing this task.)",
        "v seed 2: 2 failed attempts, no retry left (last: pipeline.trial.trainable.InjectedFailure: failing once "
        "after epoch 1)",
    ]
    # Failed for good, found by its folder (its result has no config: no report): a failed trial, not a pending one.
    assert callback.failures.failed_config("t-dead") == {"variant": "v", "seed": 2}
    assert callback.failures.failed_config("t-retried") is None
