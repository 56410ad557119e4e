"""The store interface (``Store``) on a real sqlite store and against a server that is not there: a whole run written
through the buffer's path (the analysis run), its short retry budget, and the one health probe."""

from __future__ import annotations

import json
import math
import socket
import time
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from pipeline.sweep.tracking import Store, TrackingError
from pipeline.sweep.tracking.store import health, is_outage


def test_a_whole_run_is_written_and_reopened(store: tuple[MlflowClient, str], tmp_path: Path) -> None:
    client, experiment_id = store
    (tmp_path / "report.md").write_text("# report\n")
    table = pd.DataFrame({"variant": ["a", "b"], "test_acc": [0.5, math.nan], "seeds": [1, 2]})
    tags = {"analysis.role": "analysis"}
    metrics = {"test_acc.a": 0.5, "test_acc.b": math.nan}
    files = {"report": [tmp_path / "report.md"]}
    run_id = Store(client.tracking_uri).write_run(
        experiment_id, None, "analysis", tags, files, {"t.json": table}, metrics
    )
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "analysis" and run.data.tags["analysis.role"]
    assert run.data.metrics == {"test_acc.a": 0.5}  # the NaN is not logged
    assert {a.path for a in client.list_artifacts(run_id)} == {"report", "t.json"}
    logged = json.loads(Path(client.download_artifacts(run_id, "t.json", str(tmp_path))).read_text())
    assert logged["columns"] == ["variant", "test_acc", "seeds"] and [row[2] for row in logged["data"]] == [1, 2]
    again = Store(client.tracking_uri).write_run(experiment_id, run_id, "", tags, {}, {}, {"test_acc.a": 0.6})
    assert again == run_id and client.get_run(run_id).data.metrics == {"test_acc.a": 0.6}


@pytest.fixture
def nothing_listening() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_a_run_meets_a_dead_server_in_seconds(nothing_listening: str) -> None:
    """Written with MLflow's default budget (7 retries, backoff 2 s) this would take minutes; the buffer's path gives
    every request the sweep's short budget."""
    started = time.monotonic()
    with pytest.raises(TrackingError) as down:
        Store(nothing_listening).write_run("1", None, "analysis", {}, {}, {}, {})
    assert is_outage(down.value) and time.monotonic() - started < 5


def test_one_probe_answers_for_every_check(nothing_listening: str, tmp_path: Path) -> None:
    assert health(f"sqlite:///{tmp_path}/mlflow.db") is None  # a local store has no server to be down
    assert "Connection refused" in str(health(nothing_listening))
    assert not Store(nothing_listening).answers()
    with pytest.raises(ValueError, match=r"^tracking\.uri: no MLflow server answers at http://127\.0\.0\.1:\d+/health"):
        Store(nothing_listening).check_answers("tracking.uri")
