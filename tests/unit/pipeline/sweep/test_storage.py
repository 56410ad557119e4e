"""``sweep.storage_path`` as a folder or a bucket: the same driver code reads and writes both (``StoragePath``).

The bucket is real S3 over HTTP (a local S3-compatible server, ``bucket`` fixture), reached through pyarrow as Ray
Tune reaches it; every test that takes ``where`` runs once on a local folder and once on a bucket.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipeline.config import parse_params
from pipeline.sweep.checkpoints import newest_checkpoint, newest_loading_checkpoint
from pipeline.sweep.dry_run import dry_run_text
from pipeline.sweep.preflight import preflight
from pipeline.sweep.storage import DRIVER_DIR, StoragePath, check_storage, driver_dir, storage_dir


@pytest.fixture(params=["folder", "bucket"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> StoragePath:
    if request.param == "folder":
        return StoragePath(tmp_path / "ray")
    return StoragePath(request.getfixturevalue("bucket").uri("ray"))


def _checkpoints(into: Path, epochs: tuple[int, ...]) -> None:
    from pipeline.config import ModelConfig
    from pipeline.models import build_model
    from pipeline.trial.checkpoint import save_model_checkpoint

    cfg = ModelConfig(hidden=8, layers=1, ffn=16, heads=4, downsample=2)
    model = build_model(cfg, image_size=8, in_channels=3, num_classes=10)
    for epoch in epochs:
        folder = into / f"checkpoint_{epoch:06d}"
        save_model_checkpoint(folder, model, cfg, image_shape=(3, 8, 8), num_classes=10)
        import torch

        payload = torch.load(folder / "checkpoint.pt", weights_only=True)
        torch.save({**payload, "epoch": epoch}, folder / "checkpoint.pt")


def test_a_bucket_location_keeps_its_query_on_every_child() -> None:
    root = StoragePath("s3://b/ray?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1")
    trial = root / "tune-x" / "trial_1"
    assert str(trial) == "s3://b/ray/tune-x/trial_1?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1"
    assert (trial.name, trial.parent, trial.remote) == ("trial_1", root / "tune-x", True)
    assert trial.fs_path == "b/ray/tune-x/trial_1"
    assert root.fs_path == "b/ray" and (root / "tune-x").fs_path == StoragePath(str(root / "tune-x")).fs_path
    assert root.child_of_fs_path("b/ray/tune-x/trial_1/checkpoint_000001") == trial / "checkpoint_000001"
    local = StoragePath("/data/ray")
    assert (local / "tune-x").local == Path("/data/ray/tune-x") and not local.remote
    assert local.child_of_fs_path("/data/ray/tune-x") == StoragePath("/data/ray/tune-x")


def test_storage_path_takes_file_system_uris_as_they_are(tmp_path: Path) -> None:
    uri = "s3://bucket/ray?endpoint_override=minio:9000&scheme=http"
    for given in (uri, "gs://bucket/ray", "hdfs://namenode:8020/ray", "file:///mnt/shared/ray"):
        params = parse_params({"sweep": {"storage_path": given}})
        assert storage_dir(params, tmp_path) == StoragePath(given)
        assert driver_dir(storage_dir(params, tmp_path), tmp_path) == tmp_path / DRIVER_DIR
    relative = storage_dir(parse_params({"sweep": {"storage_path": "results/ray"}}), tmp_path)
    assert relative.local == (tmp_path / "results/ray").resolve() and driver_dir(relative, tmp_path) == relative.local


def test_files_folders_and_copies(where: StoragePath, tmp_path: Path) -> None:
    marker = where / "tune-x" / "mlflow_parent_run.json"
    assert not marker.is_file()
    marker.write_text('{"parent_run_id": "r"}')
    assert marker.is_file() and marker.read_text() == '{"parent_run_id": "r"}'
    _checkpoints(tmp_path / "local-trial", (1, 2))
    trial = where / "tune-x" / "trial_1"
    trial.upload(tmp_path / "local-trial")
    assert [d.name for d in trial.subdirs("checkpoint_")] == ["checkpoint_000001", "checkpoint_000002"]
    assert (trial / "checkpoint_000002" / "checkpoint.pt").is_file()
    with (trial / "checkpoint_000002").as_local() as local:
        assert (local / "checkpoint.pt").read_bytes() == (
            tmp_path / "local-trial/checkpoint_000002/checkpoint.pt"
        ).read_bytes()
    copy = (trial / "checkpoint_000001").download(tmp_path / "copy")
    assert (copy / "checkpoint.pt").is_file()
    marker.delete()
    assert not marker.is_file()
    marker.delete()  # nothing there: no error


def test_resume_and_upload_pick_the_newest_checkpoint_that_loads(where: StoragePath, tmp_path: Path) -> None:
    """The driver's look-ups of a trial's checkpoints (resume from an earlier sweep, a queued MLflow upload) skip a
    truncated one, in a bucket as in a folder."""
    _checkpoints(tmp_path / "trial", (1, 2, 3))
    newest = tmp_path / "trial/checkpoint_000003/checkpoint.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # a crash mid-write
    trial = where / "trial"
    trial.upload(tmp_path / "trial")
    assert newest_checkpoint(trial) == (trial / "checkpoint_000002", 2)
    assert newest_loading_checkpoint(trial / "checkpoint_000003", trial) == trial / "checkpoint_000002"
    assert newest_loading_checkpoint(trial / "checkpoint_000001", trial) == trial / "checkpoint_000001"


def test_the_preflight_proves_a_bucket_before_any_run(bucket, tmp_path: Path) -> None:
    """Writable: passes and leaves nothing. No such bucket, or nothing listening: fails in seconds naming the key."""
    check_storage(StoragePath(bucket.uri("ray")))
    assert bucket.keys() == []
    missing = bucket.uri("ray").replace(bucket.name, "no-such-bucket", 1)
    with pytest.raises(ValueError, match="sweep.storage_path: cannot write and read back a marker in s3://no-such"):
        preflight(parse_params({"sweep": {"storage_path": missing}}), tmp_path)
    refused = parse_params({"sweep": {"storage_path": bucket.uri("ray").replace(bucket.endpoint, "127.0.0.1:9", 1)}})
    started = time.monotonic()
    with pytest.raises(ValueError, match="sweep.storage_path: .*(NETWORK_CONNECTION|connect)"):
        preflight(refused, tmp_path)
    assert time.monotonic() - started < 30
    # the dry run prints its plan before the preflight's message: it says it cannot read the bucket, no traceback
    (tmp_path / "data/prepared").mkdir(parents=True)
    (tmp_path / "data/prepared/manifest.json").write_text('{"content_sha256": "ab" }')
    assert "(unknown: cannot read it (" in dry_run_text(refused, tmp_path)


def test_writes_left_buffered_travel_through_the_bucket(bucket, tmp_path: Path, monkeypatch) -> None:
    """A submitted job's disk goes with it: a stage ending with MLflow writes still buffered (the server down) parks
    the buffer beside its experiment in the bucket, and the next run, on another machine, takes it back."""
    import shutil
    import socket

    from mlflow.entities import Metric

    from pipeline.sweep.tracking.buffer import BUFFER_FILE, TrackingBuffer, flush_buffers, park_buffer

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with socket.socket() as probe:  # nothing listens there: the server is down
        probe.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{probe.getsockname()[1]}"
    storage = StoragePath(bucket.uri("ray"))
    job_disk = tmp_path / "job" / "tune-x"
    buffer = TrackingBuffer(job_disk / BUFFER_FILE, down)
    buffer.log_batch("run-1", metrics=[Metric("test_acc", 0.5, 0, 1)])
    buffer.set_terminated("run-1", "FINISHED")
    assert buffer.pending == 2
    park_buffer(buffer.path, storage / "tune-x")
    shutil.rmtree(tmp_path / "job")  # Ray deletes the job's folder
    workstation = tmp_path / "workstation"
    flush_buffers(storage, workstation)  # still down: the writes wait on this disk now
    assert TrackingBuffer(workstation / "tune-x" / BUFFER_FILE, down).pending == 2
    assert not (storage / "tune-x" / BUFFER_FILE).is_file()
