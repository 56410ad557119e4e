"""The MLflow write-ahead buffer against a server that is not there (a closed 127.0.0.1 port: connection refused) and a
real sqlite store (a refusal). The replay against a server that comes back is `integration/test_tracking_outage.py`."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import requests
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from pipeline.sweep.tracking.buffer import TrackingBuffer
from pipeline.sweep.tracking.store import CountingClient, is_outage, mlflow_client


@pytest.fixture
def nothing_listening(monkeypatch: pytest.MonkeyPatch) -> str:
    """An http URI where nothing listens, with a client retry budget of one try (no minutes of backoff)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_an_unreachable_server_is_an_outage_and_a_refused_request_is_not(
    nothing_listening: str, tmp_path: Path
) -> None:
    with pytest.raises(MlflowException) as down:
        MlflowClient(nothing_listening).get_run("0" * 32)
    assert is_outage(down.value)
    with pytest.raises(MlflowException) as refused:
        MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run("0" * 32)  # no such run: a request that cannot succeed
    assert not is_outage(refused.value)


def test_a_reply_cut_off_by_a_dying_server_is_an_outage() -> None:
    """MLflow's client wraps whatever ``requests`` raised in a bare MlflowException (the error is its context): a
    server killed while it answered a write raised ChunkedEncodingError, and the sweep crashed instead of buffering."""
    cut = requests.exceptions.ChunkedEncodingError("Connection broken: IncompleteRead(0 bytes read, 2 more expected)")
    with pytest.raises(MlflowException) as wrapped:
        try:
            raise cut
        except Exception as err:  # as mlflow.utils.rest_utils.http_request does
            raise MlflowException(f"API request failed with exception {err}")  # noqa: B904
    assert is_outage(wrapped.value)


def test_writes_queue_in_order_on_disk_without_a_client_call_each_while_down(
    nothing_listening: str, tmp_path: Path
) -> None:
    counting = CountingClient(MlflowClient(nothing_listening))
    path = tmp_path / "experiment" / "mlflow_buffer.jsonl"
    buffer = TrackingBuffer(path, nothing_listening, lambda: counting)
    buffer.log_batch("run-1", metrics=[Metric("test_acc", 0.25, 0, 1)])
    assert buffer.down and sum(counting.calls.values()) == 1  # the first write found the server down
    buffer.log_batch("run-1", metrics=[Metric("test_acc", 0.5, 0, 2)])
    buffer.set_terminated("run-1", "FINISHED")
    assert sum(counting.calls.values()) == 1  # the later ones queued behind it, no client retry loop each
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["op"] for e in entries] == ["log_batch", "log_batch", "set_terminated"]
    assert [e["metrics"][0][3] for e in entries[:2]] == [1, 2] and {e["uri"] for e in entries} == {nothing_listening}
    assert not buffer.flush(force=True)  # a probe finds nobody: everything stays, in order
    assert TrackingBuffer(path, nothing_listening).pending == 3  # what the next driver process finds


def test_a_refused_write_raises_and_is_not_buffered(tmp_path: Path) -> None:
    path = tmp_path / "mlflow_buffer.jsonl"
    buffer = TrackingBuffer(path, f"sqlite:///{tmp_path}/mlflow.db")
    with pytest.raises(MlflowException):
        buffer.set_terminated("0" * 32, "FINISHED")
    assert not path.exists() and not buffer.down


def test_a_half_written_last_line_is_dropped_and_an_edited_one_refused(tmp_path: Path) -> None:
    """A driver killed while appending leaves a partial last line: the writes before it still count."""
    path = tmp_path / "mlflow_buffer.jsonl"
    whole = json.dumps({"op": "set_terminated", "run_id": "r", "status": "FINISHED", "uri": "http://127.0.0.1:1"})
    path.write_text(f"{whole}\n{whole}\n{whole[:20]}")
    assert TrackingBuffer(path, "http://127.0.0.1:1").pending == 2
    path.write_text(f"{whole[:20]}\n{whole}\n")
    with pytest.raises(ValueError, match="line 1 is not JSON"):
        TrackingBuffer(path, "http://127.0.0.1:1").pending  # noqa: B018 - reading it is the point


def test_a_replayed_write_that_may_have_arrived_logs_no_epoch_twice(tmp_path: Path) -> None:
    """The write of epochs 1 and 2 was sent, the server stored epoch 1's point and the reply was lost; then the
    trial's end queued behind it. The replay (here into a real sqlite store) adds epoch 2 only, then ends the run."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("replay")).info.run_id
    client.log_batch(run_id, metrics=[Metric("test_acc", 0.25, 0, 1)])
    path = tmp_path / "mlflow_buffer.jsonl"
    sent = {
        "op": "log_batch",
        "run_id": run_id,
        "metrics": [["test_acc", 0.25, 0, 1], ["test_acc", 0.5, 0, 2]],
        "params": [],
        "tags": [],
        "uri": uri,
        "attempted": True,
    }
    ended = {"op": "set_terminated", "run_id": run_id, "status": "FINISHED", "uri": uri}
    path.write_text(f"{json.dumps(sent)}\n{json.dumps(ended)}\n")
    assert TrackingBuffer(path, uri).flush(force=True)
    assert sorted(m.step for m in client.get_metric_history(run_id, "test_acc")) == [1, 2]
    assert client.get_run(run_id).info.status == "FINISHED" and not path.exists()


def test_the_sweeps_writes_meet_a_dead_server_in_seconds_whatever_the_environment(
    nothing_listening: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow's default budget (7 retries, backoff 2 s: minutes on a dead server) stays for every other client; the
    sweep's writes (``short_budget``) fail within seconds as an outage, so the buffer takes over at once."""
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT")
    client = mlflow_client(nothing_listening, short_budget=True)
    started = time.monotonic()
    with pytest.raises(MlflowException) as down:
        client.set_tag("0" * 32, "k", "v")
    assert is_outage(down.value) and time.monotonic() - started < 5
    assert mlflow_client(nothing_listening)._tracking_client.store.__class__.__name__ == "RestStore"  # unchanged


def test_the_writer_thread_records_each_writes_lag_from_its_queueing() -> None:
    """Per write on the writer thread, the seconds from its queueing to its end: a write queued behind others waits
    for them too, so its lag holds theirs (what ``benchmarks.sweep_concurrency`` reports as the writer's lag)."""
    buffer = TrackingBuffer(None, "sqlite:///unused.db", background=True)
    for _ in range(3):
        buffer.serially(lambda: time.sleep(0.05))  # queued at once: the third waits for the first two
    buffer.stop_writer()
    lags = buffer.write_lags_s
    assert len(lags) == 3
    # the third waits for all of the second (the first may have begun before it was queued) and runs itself
    assert lags[0] >= 0.05 and lags[2] >= 0.10, lags
    buffer.serially(lambda: None)  # after the thread stopped, writes are made inline: no lag to record
    assert len(buffer.write_lags_s) == 3
